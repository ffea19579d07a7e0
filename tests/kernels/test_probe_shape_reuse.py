"""FeatureKernel.featurizer reuses the width and batch shape of an earlier probe row for evaluations that featurise
every row next (a training covariance, a test–test covariance, a diagonal), and probes again after every change that
can change them; values and errors are those of a probe at every call."""

import copy

import gpytorch
import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel

import rfgp
from rfgp.features import FeatureMap
from rfgp.kernels import SketchedRBFKernel
from rfgp.models.regression import ExactGPModel

DTYPE = torch.float64


def feature_map_rows(kernel):
    rows = []
    for module in kernel.modules():
        if isinstance(module, FeatureMap):
            module.register_forward_hook(lambda mod, args, out: rows.append(tuple(args[0].shape[:-1])))
    return rows


def data(n=12, d=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen, dtype=DTYPE)
    return x, torch.sin(5 * x).sum(-1)


@pytest.mark.parametrize("method", ["rff", "maclaurin"])
def test_marginal_likelihood_step_probes_once_and_is_unchanged(method):
    x, y = data()
    kernel = rfgp.sketch(ScaleKernel(RBFKernel(ard_num_dims=2)).to(DTYPE), 64, method=method, seed=0)
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(DTYPE)
    fresh = copy.deepcopy(model)
    rows = feature_map_rows(kernel)

    def step(m):
        m.train()
        m.zero_grad()
        loss = -gpytorch.mlls.ExactMarginalLogLikelihood(m.likelihood, m)(m(x), y)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in m.parameters()]

    first = step(model)
    assert rows == [(1,), (12,)]  # the probe row, then the training rows
    second = step(model)
    assert rows == [(1,), (12,), (12,)]  # its shape reused: no probe
    reference = step(fresh)
    for result in (first, second):
        assert torch.equal(result[0], reference[0])
        assert all(torch.equal(a, b) for a, b in zip(result[1], reference[1]))


def test_probe_again_after_width_batch_train_eval_and_dimension_changes():
    x, _ = data()
    kernel = SketchedRBFKernel(64, method="rff", seed=0).to(DTYPE)
    rows = feature_map_rows(kernel)
    kernel(x).to_dense()
    kernel(x).to_dense()
    assert rows.count((1,)) == 1
    rfgp.set_num_features(kernel, 32)  # a redraw at another width: the featurizer must say F = 32
    featurizer = kernel.featurizer(x, reuse_shape=True)
    assert featurizer.num_features == 32 and kernel(x).to_dense().shape == (12, 12)
    assert rows.count((1,)) == 2
    batched = x.expand(3, 12, 2)
    featurizer = kernel.featurizer(batched, reuse_shape=True)
    assert featurizer.batch_shape == (3,) and rows[-1] == (3, 1)
    kernel.eval()
    kernel.featurizer(x, reuse_shape=True)
    assert rows[-1] == (1,)  # a train/eval switch changes the kernel's settings: probed again
    before = len(rows)
    kernel.featurizer(x, reuse_shape=True)
    assert len(rows) == before and rows.count((1,)) == 3  # the eval-mode shape reused
    other = SketchedRBFKernel(32, method="rff", seed=1).to(DTYPE).eval()
    other(x).to_dense()  # its own probe shape, at other draws
    other.load_state_dict(kernel.state_dict())
    assert torch.equal(other(x).to_dense(), kernel(x).to_dense())


def test_errors_unchanged_when_the_probe_is_skipped():
    x, _ = data()
    kernel = SketchedRBFKernel(64, method="rff", seed=0).to(DTYPE)
    kernel(x).to_dense()
    bad = x.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="x1"):
        kernel(bad).to_dense()
    with torch.no_grad():
        kernel.raw_lengthscale.fill_(float("nan"))
    with pytest.raises(ValueError, match="lengthscale"):
        kernel(x).to_dense()
