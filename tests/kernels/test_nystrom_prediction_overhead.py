"""NystromKernel's per-prediction work: L = chol(K(Z, Z) + εI) is reused between graph-free calls while Z, the base
kernel and dtype are unchanged (rfgp.core.state_cache), with the same predictions as a freshly factorised L, and
refactorised after every change of what L depends on; an eval-mode covariance featurises its inputs once."""

import copy

import gpytorch
import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

import rfgp
from rfgp.kernels import NystromKernel
from rfgp.models.regression import ExactGPModel

DTYPE = torch.float64


def setting(n=30, m=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=gen, dtype=DTYPE)
    y = torch.sin(4 * x[:, 0]) + 0.1 * torch.randn(n, generator=gen, dtype=DTYPE)
    kernel = rfgp.sketch(ScaleKernel(RBFKernel(ard_num_dims=2)).to(DTYPE), m, method="nystrom", x_sample=x, seed=0)
    return x, y, kernel


def counting(monkeypatch):
    calls = []
    factorise = NystromKernel._landmark_cholesky

    def counted(self, dtype):
        calls.append(dtype)
        return factorise(self, dtype)

    monkeypatch.setattr(NystromKernel, "_landmark_cholesky", counted)
    return calls


def test_repeated_predictions_factorise_once_and_equal_a_fresh_factor(monkeypatch):
    x, y, kernel = setting()
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(DTYPE).eval()
    fresh = copy.deepcopy(model)
    calls = counting(monkeypatch)
    tests = [torch.rand(7, 2, dtype=DTYPE) for _ in range(4)]
    with torch.no_grad():
        cached = [model(t) for t in tests]
        cached = [(p.mean, p.variance) for p in cached]
    assert len(calls) == 1
    for test, (mean, variance) in zip(tests, cached):
        with torch.no_grad():  # every prediction from scratch, with its own factor
            p = copy.deepcopy(fresh)(test)
        assert torch.equal(p.mean, mean) and torch.equal(p.variance, variance)


def _fresh(nystrom, dtype=DTYPE):
    return nystrom._landmark_cholesky(dtype)


@pytest.mark.parametrize("change", [
    "lengthscale_setter", "raw_in_place", "landmarks_in_place", "landmarks_replaced", "load_state_dict",
    "reselect", "dtype", "jitter", "train_eval",
])
def test_every_change_of_what_L_depends_on_refactorises(change, monkeypatch):
    x, _, kernel = setting()
    nystrom = kernel.base_kernel
    with torch.no_grad():
        before = nystrom.landmark_cholesky()
    dtype = DTYPE
    calls = counting(monkeypatch)
    with torch.no_grad():
        if change == "lengthscale_setter":  # GPyTorch writes through .data: no version-counter bump
            nystrom.base_kernel.lengthscale = torch.tensor([0.3, 0.9], dtype=DTYPE)
        elif change == "raw_in_place":
            nystrom.base_kernel.raw_lengthscale.add_(0.25)
        elif change == "landmarks_in_place":
            nystrom.landmarks.mul_(1.5)
        elif change == "landmarks_replaced":
            nystrom.landmarks = nystrom.landmarks.flip(0).clone() * 0.5
        elif change == "load_state_dict":
            other = setting(seed=1)[2]
            other.base_kernel.base_kernel.lengthscale = torch.tensor([0.2, 2.0], dtype=DTYPE)
            kernel.load_state_dict(other.state_dict())
        elif change == "reselect":
            nystrom.reselect_landmarks(nystrom.num_features, x.flip(0) * 0.7)
        elif change == "dtype":
            dtype = torch.float32
        elif change == "jitter":
            nystrom.jitter = 1e-2
        elif change == "train_eval":
            kernel.eval()
        after = nystrom.landmark_cholesky(dtype)
        again = nystrom.landmark_cholesky(dtype)
    assert len(calls) == 1  # refactorised once, then reused
    assert again is after
    assert torch.equal(after, _fresh(nystrom, dtype))
    if change != "train_eval":
        assert not torch.equal(after.to(before), before)


def test_base_kernel_setting_refactorises(monkeypatch):
    x = torch.rand(20, 2, dtype=DTYPE)
    nystrom = NystromKernel(MaternKernel(nu=2.5).to(DTYPE), landmarks=x[:8])
    with torch.no_grad():
        before = nystrom.landmark_cholesky()
        nystrom.base_kernel.nu = 0.5
        after = nystrom.landmark_cholesky()
    assert torch.equal(after, _fresh(nystrom)) and not torch.equal(after, before)


def test_with_gradients_L_is_recomputed_with_its_graph():
    x, y, kernel = setting()
    nystrom = kernel.base_kernel
    with torch.no_grad():
        nystrom.landmark_cholesky()  # a cached graph-free factor must not be handed to a call that differentiates
    gradients = []
    for _ in range(2):  # two backward passes through two factors (one cached graph would be freed by the first)
        chol = nystrom.landmark_cholesky()
        assert chol.requires_grad
        (gradient,) = torch.autograd.grad(chol.sum(), nystrom.base_kernel.raw_lengthscale)
        gradients.append(gradient)
    assert torch.equal(gradients[0], gradients[1]) and gradients[0].abs().sum() > 0


def test_marginal_likelihood_gradient_unchanged_after_cached_predictions():
    x, y, kernel = setting()
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(DTYPE)
    reference = copy.deepcopy(model)

    def gradient(m):
        m.train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(m.likelihood, m)
        loss = -mll(m(x), y)
        return torch.autograd.grad(loss, m.covar_module.base_kernel.base_kernel.raw_lengthscale)[0]

    model.eval()
    with torch.no_grad():
        model(torch.rand(5, 2, dtype=DTYPE)).variance
    assert torch.equal(gradient(model), gradient(reference))


@pytest.mark.parametrize("grad", [False, True])
def test_eval_covariance_featurises_once_with_the_same_root_and_correction(grad, monkeypatch):
    x, _, kernel = setting()
    nystrom = kernel.base_kernel.eval()
    test = torch.rand(9, 2, dtype=DTYPE)
    with torch.set_grad_enabled(grad):
        expected_root, expected_correction = nystrom.feature_root(test).features, nystrom.variance_correction(test)
        crosses = []
        cross = NystromKernel._cross

        def counted(self, rows):
            crosses.append(rows.shape[-2])
            return cross(self, rows)

        monkeypatch.setattr(NystromKernel, "_cross", counted)
        covariance = nystrom.training_covariance(test)
    assert crosses == [9]  # before: K(x, Z) and its solve once for the root, once more for the correction
    assert torch.equal(covariance.root.features, expected_root)
    assert torch.equal(covariance.variance_correction, expected_correction)
    assert torch.equal(nystrom.train().training_covariance(test).variance_correction, expected_correction)



@pytest.mark.parametrize("recorder", ["torch.jit.is_tracing", "torch.compiler.is_compiling"])
def test_no_reuse_while_a_trace_or_compilation_records(recorder, monkeypatch):
    """A reused factor would enter a traced or compiled program as a constant, which later hyperparameters miss."""
    _, _, kernel = setting()
    nystrom = kernel.base_kernel
    with torch.no_grad():
        nystrom.landmark_cholesky()
        calls = counting(monkeypatch)
        monkeypatch.setattr(recorder, lambda: True)
        nystrom.landmark_cholesky()
        nystrom.landmark_cholesky()
    assert len(calls) == 2


def test_a_factor_from_inference_mode_is_not_reused_under_autograd():
    """L factorised under torch.inference_mode is an inference tensor, which autograd refuses to save for backward: a
    later gradient w.r.t. test inputs (frozen hyperparameters, a BoTorch acquisition optimisation) refactorises."""
    x, y, kernel = setting()
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(DTYPE).eval()
    model.requires_grad_(False)
    test = torch.rand(5, 2, dtype=DTYPE)
    with torch.inference_mode():
        expected = model(test).mean
    model.train()
    model.eval()  # GPyTorch's prediction caches dropped: only the landmark factor is kept
    test.requires_grad_()
    mean = model(test).mean
    mean.sum().backward()
    assert torch.allclose(mean.detach(), expected) and torch.isfinite(test.grad).all() and test.grad.abs().sum() > 0
