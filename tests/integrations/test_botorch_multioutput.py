"""Multi-output BoTorch posteriors of rfgp models (``ModelListGP``, batched multi-output ``SingleTaskGP``) keep their
outputs' low-rank roots: ``rsample`` factorises nothing, and the joint mean and covariance are the dense values."""

import math

import pytest
import torch

botorch = pytest.importorskip("botorch")

from botorch.acquisition.multi_objective.logei import qLogNoisyExpectedHypervolumeImprovement  # noqa: E402
from botorch.acquisition.objective import ScalarizedPosteriorTransform  # noqa: E402
from botorch.models import ModelListGP, SingleTaskGP  # noqa: E402
from botorch.models.transforms.outcome import Standardize  # noqa: E402
from botorch.posteriors import GPyTorchPosterior  # noqa: E402
from botorch.sampling import SobolQMCNormalSampler  # noqa: E402
from botorch.utils.low_rank import extract_batch_covar  # noqa: E402
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal  # noqa: E402
from linear_operator.operators import BlockDiagLinearOperator, BlockInterleavedLinearOperator  # noqa: E402

import rfgp  # noqa: E402
from rfgp.inference.posterior_covariance import LowRankPosteriorAddedDiag, LowRankPosteriorCovariance  # noqa: E402
from rfgp.integrations.botorch_multioutput import (  # noqa: E402
    _botorch_scalarize_posterior_gpytorch,
    _gpytorch_from_independent_mvns,
)

D = 3
WIDTHS = (16, 8)  # different F per output: the narrower root is zero-padded


def data(n=30, num_outputs=2, dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(n, D, generator=gen, dtype=dtype)
    y = torch.stack([5.0 + (k + 2) * torch.sin(3 * x).sum(-1) for k in range(num_outputs)], -1)  # S ≠ I
    return x, y + 0.1 * torch.randn(y.shape, generator=gen, dtype=dtype)


def rfgp_model(x, y, num_features=16, standardize=True):
    batch = torch.Size([y.shape[-1]]) if y.shape[-1] > 1 else torch.Size()
    kernel = rfgp.kernels.SketchedRBFKernel(num_features=num_features, method="orf", seed=0, ard_num_dims=D,
                                            batch_shape=batch)
    transform = Standardize(y.shape[-1], batch_shape=y.shape[:-2]) if standardize else None
    return SingleTaskGP(x, y, covar_module=kernel, outcome_transform=transform).to(x.dtype).eval()


def model_list(standardize=True, widths=WIDTHS, dtype=torch.float64):
    x, y = data(dtype=dtype)
    return ModelListGP(*[rfgp_model(x, y[:, k : k + 1], f, standardize) for k, f in enumerate(widths)]).eval()


def candidates(*shape, seed=1, dtype=torch.float64):
    return torch.rand(*shape, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def batched_reference(model, xs, observation_noise=False):
    """The batched model's per-output posterior covariances (*batch, m, n, n), dense, untransformed by hand."""
    inputs = model.transform_inputs(xs).unsqueeze(-3).expand(*xs.shape[:-2], model.num_outputs, *xs.shape[-2:])
    with torch.no_grad():
        latent = model(inputs)
        if observation_noise:
            latent = model.likelihood(latent, inputs)
    covariance = latent.covariance_matrix
    if getattr(model, "outcome_transform", None) is not None:
        stdvs = model.outcome_transform.stdvs.squeeze(-2)  # (m,)
        covariance = stdvs.pow(2)[:, None, None] * covariance
    return covariance


def block_diag(blocks):
    """(*batch, m, n, n) blocks -> (*batch, m·n, m·n), output-major (GPyTorch's non-interleaved layout)."""
    *batch, m, n, _ = blocks.shape
    eye = torch.eye(m, dtype=blocks.dtype)
    return (eye[:, None, :, None] * blocks.unsqueeze(-2)).reshape(*batch, m * n, m * n)


@pytest.mark.parametrize("observation_noise", [False, True])
@pytest.mark.parametrize("standardize", [False, True])
def test_model_list_joint_covariance_is_the_stacked_roots_with_dense_values(standardize, observation_noise):
    gp = model_list(standardize)
    xs = candidates(40)  # n = 40 > F
    with torch.no_grad():
        posterior = gp.posterior(xs, observation_noise=observation_noise)
        singles = [m.posterior(xs, observation_noise=observation_noise).distribution for m in gp.models]
    covariance = posterior.distribution.lazy_covariance_matrix
    assert isinstance(covariance, BlockDiagLinearOperator)
    blocks = covariance.base_linear_op
    assert isinstance(blocks, LowRankPosteriorAddedDiag if observation_noise else LowRankPosteriorCovariance)
    root = blocks.low_rank_root if not observation_noise else blocks._linear_op.root.to_dense()
    assert root.shape == (2, 40, max(WIDTHS))  # m × n × max F, not a factor of an (m·n) × (m·n) matrix
    dense = block_diag(torch.stack([s.covariance_matrix for s in singles]))
    torch.testing.assert_close(covariance.to_dense(), dense, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(posterior.mean, torch.stack([s.mean for s in singles], -1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(posterior.variance, torch.stack([s.variance for s in singles], -1), rtol=1e-10,
                               atol=1e-12)


@pytest.mark.filterwarnings("ignore:The model inputs are of type torch.float32")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", ["list", "batched"])
def test_rsample_over_many_candidates_factorises_nothing_and_lies_in_the_roots_span(factorised, kind, dtype):
    x, y = data(dtype=dtype)
    gp = model_list(dtype=dtype) if kind == "list" else rfgp_model(x, y)
    xs = candidates(60, dtype=dtype)  # n = 60 > F: a dense Cholesky factor needs jitter and leaves the span
    with torch.no_grad():
        posterior = gp.posterior(xs)
        factorised.clear()
        samples = posterior.rsample(torch.Size([8]))
    assert samples.shape == (8, 60, 2) and not factorised
    roots = posterior.distribution.lazy_covariance_matrix.base_linear_op.low_rank_root  # (m, n, F)
    centred = (samples - posterior.mean).permute(2, 1, 0)  # (8, n, m) -> (m, n, 8): each output's draws
    residual = centred - roots @ torch.linalg.lstsq(roots.double(), centred.double()).solution.to(dtype)
    assert residual.abs().max() < (1e-10 if dtype == torch.float64 else 1e-3) * centred.abs().max()


def test_model_list_samples_have_the_dense_covariance():
    gp = model_list()
    xs = candidates(5)
    num_samples = 40_000
    with torch.no_grad():
        posterior = gp.posterior(xs)
        torch.manual_seed(0)
        samples = posterior.rsample(torch.Size([num_samples]))
    flat = (samples - posterior.mean).mT.reshape(num_samples, -1)  # output-major, as the joint covariance
    empirical = flat.mT @ flat / num_samples
    dense = posterior.distribution.covariance_matrix
    standard_error = (dense.diagonal().outer(dense.diagonal()) + dense.pow(2)).sqrt() / math.sqrt(num_samples)
    assert ((empirical - dense).abs() < 5 * standard_error).all()


@pytest.mark.parametrize("observation_noise", [False, True])
@pytest.mark.parametrize("standardize", [False, True])
def test_batched_multi_output_model_keeps_the_root_with_dense_values(standardize, observation_noise):
    x, y = data()
    gp = rfgp_model(x, y, standardize=standardize)
    xs = candidates(4, 7)  # a q-batch b × q × d
    with torch.no_grad():
        posterior = gp.posterior(xs, observation_noise=observation_noise)
    covariance = posterior.distribution.lazy_covariance_matrix
    assert isinstance(covariance, BlockDiagLinearOperator)
    assert isinstance(covariance.base_linear_op,
                      LowRankPosteriorAddedDiag if observation_noise else LowRankPosteriorCovariance)
    expected = block_diag(batched_reference(gp, xs, observation_noise))
    torch.testing.assert_close(covariance.to_dense(), expected, rtol=1e-10, atol=1e-12)
    assert posterior.rsample(torch.Size([3])).shape == (3, 4, 7, 2)


def test_model_list_over_q_batches_and_t_batched_models():
    x, y = data()
    x_batch, y_batch = torch.stack([x, x.flip(0)]), torch.stack([y, y.flip(0)])  # two t-batched training sets
    gp = ModelListGP(rfgp_model(x_batch, y_batch[..., :1], 16), rfgp_model(x_batch, y_batch[..., 1:], 8)).eval()
    xs = candidates(3, 2, 5)  # 3 × 2 q-batches against the models' batch of 2
    with torch.no_grad():
        posterior = gp.posterior(xs)
        singles = [m.posterior(xs).distribution.covariance_matrix for m in gp.models]
    covariance = posterior.distribution.lazy_covariance_matrix
    assert isinstance(covariance.base_linear_op, LowRankPosteriorCovariance)
    assert covariance.base_linear_op.low_rank_root.shape == (3, 2, 2, 5, 16)
    torch.testing.assert_close(covariance.to_dense(), block_diag(torch.stack(singles, -3)), rtol=1e-10, atol=1e-12)
    assert posterior.rsample(torch.Size([4])).shape == (4, 3, 2, 5, 2)


def test_mixed_model_list_keeps_gpytorchs_joint_with_the_same_values():
    x, y = data()
    exact = SingleTaskGP(x, y[:, 1:]).double().eval()
    gp = ModelListGP(rfgp_model(x, y[:, :1]), exact).eval()
    xs = candidates(20)
    with torch.no_grad():
        posterior = gp.posterior(xs)
        singles = [m.posterior(xs).distribution.covariance_matrix for m in gp.models]
        samples = posterior.rsample(torch.Size([2]))
    assert not isinstance(posterior.distribution.lazy_covariance_matrix.base_linear_op, LowRankPosteriorCovariance)
    torch.testing.assert_close(posterior.distribution.covariance_matrix, block_diag(torch.stack(singles)),
                               rtol=1e-10, atol=1e-12)
    assert samples.shape == (2, 20, 2) and torch.isfinite(samples).all()


def test_interleaved_joint_under_standardize_keeps_the_root_in_the_interleaved_order():
    """GPyTorch's ``from_batch_mvn`` (BoTorch's batched posterior under ``torch.jit`` tracing) interleaves outputs."""
    gen = torch.Generator().manual_seed(3)
    root = torch.randn(2, 6, 4, generator=gen, dtype=torch.float64)  # 2 outputs, n = 6, F = 4
    mean = torch.randn(2, 6, generator=gen, dtype=torch.float64)
    joint = MultitaskMultivariateNormal.from_batch_mvn(MultivariateNormal(mean, LowRankPosteriorCovariance(root)))
    assert joint._interleaved
    transform = Standardize(2)
    transform(torch.randn(10, 2, generator=gen, dtype=torch.float64) * torch.tensor([1.0, 7.0]) + 3.0)
    transform.eval()
    posterior = transform.untransform_posterior(GPyTorchPosterior(joint))
    covariance = posterior.distribution.lazy_covariance_matrix
    assert isinstance(covariance, BlockInterleavedLinearOperator)
    assert isinstance(covariance.base_linear_op, LowRankPosteriorCovariance)
    stdvs = transform.stdvs.squeeze(0)
    blocks = stdvs.pow(2)[:, None, None] * (root @ root.mT)  # (m, n, n)
    expected = torch.zeros(6, 2, 6, 2, dtype=torch.float64)  # point-major: index i·m + k
    for k in range(2):
        expected[:, k, :, k] = blocks[k]
    torch.testing.assert_close(covariance.to_dense(), expected.reshape(12, 12), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(posterior.mean, transform.means + stdvs * mean.mT, rtol=1e-12, atol=1e-12)


def test_qlognehvi_on_a_model_list_uses_the_stacked_roots_with_the_dense_value(monkeypatch):
    x, y = data()
    gp = model_list()
    acquisition_points = candidates(4, 2, seed=5)

    def values():
        acquisition = qLogNoisyExpectedHypervolumeImprovement(
            gp, ref_point=y.min(0).values.tolist(), X_baseline=x, prune_baseline=False,
            sampler=SobolQMCNormalSampler(torch.Size([128]), seed=0))
        # cached root: per output the square lower-triangular factor at the 30 baseline points, as for exact GPs
        assert acquisition._cache_root and acquisition._baseline_L.shape == (2, 30, 30)
        torch.testing.assert_close(acquisition._baseline_L, acquisition._baseline_L.tril())
        with torch.no_grad():
            return acquisition(acquisition_points)

    with torch.no_grad():
        baseline = extract_batch_covar(gp.posterior(x).distribution)  # the blocks that qLogNEHVI's cached root factors
    assert isinstance(baseline, LowRankPosteriorCovariance)
    low_rank = values()
    monkeypatch.setattr(MultitaskMultivariateNormal, "from_independent_mvns",
                        classmethod(_gpytorch_from_independent_mvns))  # GPyTorch's dense joint
    with torch.no_grad():
        assert not isinstance(extract_batch_covar(gp.posterior(x).distribution), LowRankPosteriorCovariance)
    dense = values()
    assert torch.isfinite(low_rank).all()
    torch.testing.assert_close(low_rank, dense, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("observation_noise", [False, True])
@pytest.mark.parametrize("kind", ["list", "batched"])
def test_scalarized_multi_output_posterior_is_one_root_of_all_outputs_with_botorchs_values(
    factorised, kind, observation_noise
):
    """ScalarizedPosteriorTransform: Σₖ wₖ²Σₖ with root [w₁R₁ … w_mR_m] instead of BoTorch's SumLinearOperator."""
    x, y = data()
    gp = model_list() if kind == "list" else rfgp_model(x, y)
    weights = torch.tensor([1.0, -0.5], dtype=torch.float64)
    xs = candidates(40)
    with torch.no_grad():
        joint = gp.posterior(xs, observation_noise=observation_noise)
        posterior = ScalarizedPosteriorTransform(weights, offset=2.0)(joint)
        expected_mean, expected = _botorch_scalarize_posterior_gpytorch(joint, weights, 2.0)
        factorised.clear()
        samples = posterior.rsample(torch.Size([5]))
    covariance = posterior.distribution.lazy_covariance_matrix
    assert isinstance(covariance, LowRankPosteriorAddedDiag if observation_noise else LowRankPosteriorCovariance)
    assert samples.shape == (5, 40, 1) and not factorised
    torch.testing.assert_close(posterior.mean.squeeze(-1), expected_mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(covariance.to_dense(), expected.to_dense(), rtol=1e-10, atol=1e-12)
