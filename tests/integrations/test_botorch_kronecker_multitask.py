"""BoTorch's KroneckerMultiTaskGP with its MultitaskKernel converted by rfgp.sketch, written as a BoTorch user would:
its posterior against the dense GP with covariance φφᵀ ⊗ A + Σ, against BoTorch's exact model, and in acquisition."""

import pytest
import torch

botorch = pytest.importorskip("botorch")

from botorch.models import KroneckerMultiTaskGP  # noqa: E402
from botorch.models.transforms.outcome import Standardize  # noqa: E402
from gpytorch.likelihoods import MultitaskGaussianLikelihood  # noqa: E402

import rfgp  # noqa: E402
from rfgp.inference.chunked_kronecker import ChunkedKroneckerFeatureOperator  # noqa: E402
from tests._cost import LargestTensor  # noqa: E402

F64 = torch.float64
NUM_TASKS = 3


def _data(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=gen, dtype=F64)
    y = torch.stack([torch.sin(5 * x[:, 0]), torch.cos(4 * x[:, 1]), x.sum(-1)], -1)
    return x, y + 0.1 * torch.randn(n, NUM_TASKS, generator=gen, dtype=F64)


def _likelihood(noise):
    """The task-noise variants of KroneckerMultiTaskGP: one shared σ², per-task noises (BoTorch's default, rank 0)
    and a rank-1 task noise covariance."""
    if noise == "shared":
        likelihood = MultitaskGaussianLikelihood(NUM_TASKS, has_task_noise=False)
    else:
        likelihood = MultitaskGaussianLikelihood(NUM_TASKS, rank=0 if noise in ("task", "equal task") else 1)
    with torch.no_grad():
        likelihood.noise = 0.05
        if noise == "task":
            likelihood.task_noises = torch.tensor([0.01, 0.2, 0.5])
        if noise == "correlated":
            likelihood.task_noise_covar_factor.copy_(torch.tensor([[0.3], [-0.2], [0.4]]))
    return likelihood.double()


def _model(x, y, noise, num_features=None, seed=0, data_only=False, standardize=False):
    """A KroneckerMultiTaskGP with set hyperparameters; its MultitaskKernel sketched (``num_features``), or only its
    data kernel (``data_only``: BoTorch's own posterior algebra on the same sketched covariance); ``standardize``:
    with BoTorch's ``Standardize`` outcome transform."""
    torch.manual_seed(0)
    transform = Standardize(m=NUM_TASKS) if standardize else None
    model = KroneckerMultiTaskGP(x, y, likelihood=_likelihood(noise), outcome_transform=transform)
    with torch.no_grad():
        model.covar_module.data_covar_module.lengthscale = 0.3
        task = model.covar_module.task_covar_module
        task.covar_factor.copy_(torch.tensor([[1.0, 0.2, 0.0], [0.7, -0.3, 0.1], [-0.4, 0.5, 0.3]], dtype=F64))
        task.var = torch.tensor([0.05, 0.1, 0.2], dtype=F64)
    if num_features is not None and data_only:
        module = model.covar_module
        module.data_covar_module = rfgp.sketch(module.data_covar_module, num_features, seed=seed)
    elif num_features is not None:
        model.covar_module = rfgp.sketch(model.covar_module, num_features, seed=seed)
    return model.eval()


def _dense_posterior(model, x, y, xs):
    """Mean and covariance of the GP with covariance K = k(x, x) ⊗ A + Σ (the model's kernel and noise, dense)."""
    with torch.no_grad():
        joint = model.covar_module(torch.cat([x, xs])).to_dense()
        n = x.shape[0] * NUM_TASKS
        noise = model.likelihood._shaped_noise_covar(x.shape).to_dense()
        train, cross, test = joint[:n, :n] + noise, joint[n:, :n], joint[n:, n:]
        residual = (y - model.mean_module(x)).reshape(-1)
        mean = model.mean_module(xs).reshape(-1) + cross @ torch.linalg.solve(train, residual)
        return mean, test - cross @ torch.linalg.solve(train, cross.mT)


def _sample_covariance(posterior):
    """The covariance of BoTorch's Matheron samples, exactly: they are affine in the base samples ε, s = c + Mε, so
    M's columns are the samples at the unit vectors minus the sample at ε = 0."""
    size = posterior.base_sample_shape.numel()
    eye = torch.eye(size, dtype=F64).reshape(size, *posterior.base_sample_shape)
    samples = posterior.rsample_from_base_samples(torch.Size([size]), eye).reshape(size, -1)
    offset = posterior.rsample_from_base_samples(torch.Size([1]), torch.zeros(1, *posterior.base_sample_shape,
                                                                                dtype=F64)).reshape(1, -1)
    return (samples - offset).mT @ (samples - offset), offset[0]


@pytest.mark.parametrize("noise", ["shared", "equal task", "task", "correlated"])
@pytest.mark.parametrize("num_features", [8, 64])  # data rank below and above the 20 training points
def test_the_posterior_is_the_gp_of_the_sketched_kronecker_covariance(noise, num_features):
    """Before: model.posterior raised an AttributeError (a feature root has no Kronecker factors).  Mean and Matheron
    samples are the dense GP's for every task noise; the variance is BoTorch's formula, the dense GP's where the task
    noise is c·I (BoTorch's exact model adds per-task noises to the eigenvalues of the task covariance, a different
    matrix: it errs the same way, so there the sketched model matches BoTorch's exact model of the same sketched
    kernel, which works for F ≥ N)."""
    x, y = _data(20)
    xs = torch.rand(4, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    model = _model(x, y, noise, num_features)
    posterior = model.posterior(xs)
    mean, covariance = _dense_posterior(model, x, y, xs)
    with torch.no_grad():
        torch.testing.assert_close(posterior.mean.reshape(-1), mean, rtol=1e-8, atol=1e-8)
        sample_covariance, sample_mean = _sample_covariance(posterior)
        torch.testing.assert_close(sample_mean, mean, rtol=1e-8, atol=1e-8)
        torch.testing.assert_close(sample_covariance, covariance, rtol=1e-8, atol=1e-8)
        if noise in ("shared", "equal task"):
            torch.testing.assert_close(posterior.variance.reshape(-1), covariance.diagonal(), rtol=1e-8, atol=1e-8)
        if num_features > x.shape[0]:  # BoTorch's own algebra on the sketched data kernel (it fails for rank F < N)
            reference = _model(x, y, noise, num_features, data_only=True).posterior(xs)
            torch.testing.assert_close(posterior.variance, reference.variance, rtol=1e-8, atol=1e-8)
            torch.testing.assert_close(posterior.mean, reference.mean, rtol=1e-8, atol=1e-8)
        assert posterior.rsample(torch.Size([5])).shape == (5, 4, NUM_TASKS)
        batched = model.posterior(xs.reshape(2, 2, 2))  # t-batches, as acquisition functions evaluate
        assert batched.rsample(torch.Size([5])).shape == (5, 2, 2, NUM_TASKS)
        torch.testing.assert_close(batched.mean.reshape(-1), mean, rtol=1e-8, atol=1e-8)


def test_the_posterior_approaches_the_exact_kronecker_multitask_gp_as_the_width_grows():
    x, y = _data(30)
    xs = torch.rand(10, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    exact = _model(x, y, "shared").posterior(xs)
    errors = {}
    for num_features in (32, 2048):
        mean_errors, variance_errors = [], []
        for seed in range(4):
            with torch.no_grad():
                sketched = _model(x, y, "shared", num_features, seed=seed).posterior(xs)
                mean_errors.append((sketched.mean - exact.mean).abs().max())
                variance_errors.append((sketched.variance - exact.variance).abs().max())
        errors[num_features] = (torch.stack(mean_errors).mean(), torch.stack(variance_errors).mean())
    # Monte-Carlo error ∝ 1/√F: 64 times the width, about an eighth of the error
    assert errors[2048][0] < errors[32][0] / 4 and errors[2048][1] < errors[32][1] / 4
    assert errors[2048][0] < 0.05 and errors[2048][1] < 0.01


def test_the_posterior_builds_no_n_cubed_factorisation_and_nothing_beyond_botorchs_padded_eigenvectors():
    """Factorisations (eigh, SVD, Cholesky, QR, solves) see no matrix whose smaller side exceeds F, where the exact
    model eigendecomposes N × N and its sampler factorises the (N·p) × (N·p) covariance; the largest tensor is the N × N
    matrix of zero-padded eigenvectors that BoTorch's product with the test–train covariance densifies, the exact
    model's (N·p)²."""
    x, y = _data(300)
    xs = torch.rand(3, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    factorisations = ("eigh", "svd", "cholesky", "qr", "linalg_solve", "lu")

    class Factorisations(LargestTensor):
        def __init__(self):
            super().__init__()
            self.size = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(name in func.__name__ for name in factorisations):
                self.size = max(self.size, min(args[0].shape[-2:]))
            return super().__torch_dispatch__(func, types, args, kwargs)

    sizes = {}
    for num_features in (None, 16):
        model = _model(x, y, "task", num_features)
        with torch.no_grad(), Factorisations() as cost:
            model.posterior(xs).rsample(torch.Size([4]))
        sizes[num_features] = cost.size, cost.numel
    assert sizes[None][0] == 900 and sizes[16][0] <= 16  # the exact sampler factorises K_XX ⊗ K_TT + Σ densely
    assert sizes[16][1] <= 300 * 300 < sizes[None][1]



def test_botorchs_posterior_pads_no_eigenvectors_and_forms_one_n_by_n_matrix(monkeypatch):
    """The data factor's eigenvectors come square with implicit zero columns, so BoTorch's posterior no longer pads
    them (before: an N × (N − F) zero tensor and its N × N concatenation); its product with the test–train covariance
    still forms one N × N matrix (linear_operator's MatmulLinearOperator.to_dense).  Mean, variance and Matheron
    samples are those of the (N, F) eigenvectors that BoTorch pads itself, to rounding."""
    from linear_operator.operators import DenseLinearOperator

    from rfgp.inference.kronecker_tasks import DataFeatureRootLinearOperator
    from tests._cost import TensorsOfSize

    num_data, num_features = 300, 16
    x, y = _data(num_data)
    xs = torch.rand(3, 2, generator=torch.Generator().manual_seed(1), dtype=F64)

    def unpadded_diagonalization(self, method=None):
        evals, evecs = self.range_eigenpairs()
        return evals.to(self.dtype), DenseLinearOperator(evecs.to(self.dtype))

    def statistics(model):
        with torch.no_grad():
            posterior = model.posterior(xs)
            return posterior.mean, posterior.variance, *_sample_covariance(posterior)

    for noise in ("shared", "task"):  # the posterior's diagonal-noise branch
        model = _model(x, y, noise, num_features)
        with torch.no_grad(), TensorsOfSize(num_data * (num_data - num_features), F64) as cost:
            model.posterior(xs).variance
        assert cost.count == 1
        padded = statistics(model)
        with monkeypatch.context() as patch:  # the (N, r) eigenvectors, padded by BoTorch
            patch.setattr(DataFeatureRootLinearOperator, "diagonalization", unpadded_diagonalization)
            model.train()
            unpadded = statistics(model.eval())
        for new, old in zip(padded, unpadded):
            torch.testing.assert_close(new, old, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("noise", ["task", "correlated"])
def test_a_root_over_the_memory_budget_keeps_its_kronecker_factors_for_botorchs_posterior(noise):
    """Before: with the N·p × F·2p training root over ``rfgp.settings.memory_budget`` (N = 20 000, F = 256 at the
    default 1 GiB) the covariance was a chunked root and BoTorch's posterior failed on a bare ``AttributeError``
    (``linear_ops``).  Where φ (N × F) fits the budget the chunked covariance hands over the same factors, detached as
    BoTorch detaches its training covariance: the posterior equals the unchunked one; a φ over the budget too is
    refused by name."""
    x, y = _data(200)
    xs = torch.rand(4, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    reference = _model(x, y, noise, 64).posterior(xs)
    with rfgp.settings.memory_budget(2**20):  # the root (600 × 384) is over it, φ (200 × 64) is not
        model = _model(x, y, noise, 64)
        covariance = model.covar_module(x).evaluate_kernel()
        assert isinstance(covariance, ChunkedKroneckerFeatureOperator) and covariance.data_chunk_size is None
        posterior = model.posterior(xs)
        with torch.no_grad():
            torch.testing.assert_close(posterior.mean, reference.mean, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(posterior.variance, reference.variance, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(_sample_covariance(posterior)[0], _sample_covariance(reference)[0],
                                       rtol=1e-8, atol=1e-8)
    with rfgp.settings.memory_budget(2**14):  # φ is over it too
        with pytest.raises(AttributeError, match="no Kronecker factors.*memory_budget"):
            _model(x, y, noise, 64).posterior(xs)


def _fitted_model(num_features=64, seed=0):
    from botorch.fit import fit_gpytorch_mll
    from gpytorch.mlls import ExactMarginalLogLikelihood

    x, y = _data(30)
    torch.manual_seed(0)
    model = KroneckerMultiTaskGP(x, y)  # BoTorch's defaults: per-task noise, Standardize
    model.covar_module = rfgp.sketch(model.covar_module, num_features, seed=seed)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model), optimizer_kwargs={"options": {"maxiter": 30}})
    return model.eval(), x, y


def _central_difference(function, point, step=1e-6):
    grad = torch.zeros_like(point)
    for index in range(point.numel()):
        shift = torch.zeros_like(point).view(-1)
        shift[index] = step
        shift = shift.view_as(point)
        grad.view(-1)[index] = (function(point + shift) - function(point - shift)).sum() / (2 * step)
    return grad


def test_monte_carlo_acquisitions_take_values_and_gradients_of_the_sketched_posterior():
    """qLogNEI on a linear objective of the outputs and qLogEHVI over the three outputs optimise through the sketched
    posterior: their gradients are the central differences of the same (fixed-sample) values, and qSimpleRegret of
    one point is its posterior mean."""
    from botorch.acquisition import qSimpleRegret
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement
    from botorch.acquisition.multi_objective.logei import qLogExpectedHypervolumeImprovement
    from botorch.acquisition.objective import LinearMCObjective
    from botorch.sampling import SobolQMCNormalSampler
    from botorch.utils.multi_objective.box_decompositions.non_dominated import FastNondominatedPartitioning

    model, x, y = _fitted_model()
    weights = torch.tensor([1.0, 0.5, -0.3], dtype=F64)
    objective = LinearMCObjective(weights)
    candidates = torch.rand(2, 2, 2, generator=torch.Generator().manual_seed(3), dtype=F64)
    reference = y.min(0).values
    acquisitions = [
        qLogNoisyExpectedImprovement(model, x, objective=objective, sampler=SobolQMCNormalSampler(torch.Size([32]),
                                                                                                  seed=0)),
        qLogExpectedHypervolumeImprovement(model, ref_point=reference,
                                           partitioning=FastNondominatedPartitioning(reference, y),
                                           sampler=SobolQMCNormalSampler(torch.Size([32]), seed=0)),
    ]
    for acquisition in acquisitions:
        point = candidates.clone().requires_grad_(True)
        value = acquisition(point)
        assert value.shape == (2,) and torch.isfinite(value).all()
        (grad,) = torch.autograd.grad(value.sum(), point)
        with torch.no_grad():
            expected = _central_difference(acquisition, candidates, step=1e-7)
        torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))
    regret = qSimpleRegret(model, objective=objective, sampler=SobolQMCNormalSampler(torch.Size([4096]), seed=0))
    with torch.no_grad():
        posterior = model.posterior(candidates[:, :1])
        value = regret(candidates[:, :1])
        standard_error = ((posterior.variance * weights.square()).sum(-1).squeeze(-1) / 4096).sqrt()
    assert ((value - posterior.mean.squeeze(-2) @ weights).abs() < 4 * standard_error).all()


def test_a_loaded_state_gives_the_same_posterior_bit_for_bit():
    model, x, y = _fitted_model()
    xs = torch.rand(5, 2, generator=torch.Generator().manual_seed(4), dtype=F64)
    with torch.no_grad():
        posterior = model.posterior(xs)
        torch.manual_seed(7)
        samples = posterior.rsample(torch.Size([3]))
    fresh = KroneckerMultiTaskGP(x, y)
    fresh.covar_module = rfgp.sketch(fresh.covar_module, 64, seed=123)  # other draws, replaced by the state's
    fresh.load_state_dict(model.state_dict())
    fresh.eval()
    with torch.no_grad():
        loaded = fresh.posterior(xs)
        torch.manual_seed(7)
        assert torch.equal(loaded.rsample(torch.Size([3])), samples)
    assert torch.equal(loaded.mean, posterior.mean) and torch.equal(loaded.variance, posterior.variance)


def test_a_conditioned_model_predicts_after_train_and_its_stale_cache_is_named():
    """condition_on_observations keeps BoTorch's cached train_full_covar of the data before conditioning (for the
    exact model GPyTorch's fantasy strategy already fails, on shapes); cat_rows names that, and after .train() the
    conditioned model's posterior is that of the model built on all the data."""
    x, y = _data(30)
    model = _model(x, y, "task", 64)
    xs = torch.rand(4, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    new_x, new_y = torch.rand(3, 2, dtype=F64), torch.randn(3, NUM_TASKS, dtype=F64)
    with torch.no_grad():
        model.posterior(xs)
        model(xs)  # GPyTorch conditions only a model that has predicted
        conditioned = model.condition_on_observations(new_x, new_y)
        with pytest.raises(ValueError, match="condition_on_observations.*call .train\\(\\) on the conditioned model"):
            conditioned.posterior(xs)
        conditioned.train()
        posterior = conditioned.posterior(xs)
        mean, covariance = _dense_posterior(conditioned, torch.cat([x, new_x]), torch.cat([y, new_y]), xs)
    torch.testing.assert_close(posterior.mean.reshape(-1), mean, rtol=1e-8, atol=1e-8)


def test_a_posterior_differentiated_through_the_training_caches_is_refused_by_name():
    """Under detach_test_caches(False) BoTorch keeps the graph of the training covariance; its eigenpairs (an SVD,
    whose gradient is NaN where singular values repeat) are computed without one, so the call is refused."""
    import gpytorch

    x, y = _data(20)
    model = _model(x, y, "task", 8)
    with gpytorch.settings.detach_test_caches(False):
        with pytest.raises(RuntimeError, match="requires a gradient.*detach_test_caches"):
            model.posterior(x[:2])
        with torch.no_grad():
            assert model.posterior(x[:2]).mean.shape == (2, NUM_TASKS)


@pytest.mark.parametrize("noise", ["shared", "task"])
@pytest.mark.parametrize("num_landmarks", [8, 20])  # a joint root [[φ, 0], [φ*, C*^½]] narrow enough, and narrowed
@pytest.mark.parametrize("standardize", [False, True])
def test_nystrom_posterior_adds_the_fitc_variance_correction(noise, num_landmarks, standardize):
    """Before, BoTorch's posterior of a Nyström data kernel lacked c(x) = k(x, x) − ‖φ(x)‖²: at x = (5, 5), far from
    the landmarks in [0, 1]², its variance was 10⁻¹⁰ instead of the prior k(x, x)·A_ii = A_ii.  Now the mean and the
    Matheron samples' covariance are the dense GP's whose test prior is (φ*φ*ᵀ + diag c(x*)) ⊗ A, and the variance is
    its diagonal (where BoTorch's variance formula is the dense GP's: task noise c·I)."""
    x, y = _data(20)
    xs = torch.cat([torch.rand(3, 2, generator=torch.Generator().manual_seed(1), dtype=F64),
                    torch.full((1, 2), 5.0, dtype=F64)])
    model = _model(x, y, noise, standardize=standardize)
    model.covar_module = rfgp.sketch(model.covar_module, num_landmarks, method="nystrom", x_sample=x, seed=0)
    model.eval()
    posterior = model.posterior(xs)
    with torch.no_grad():
        mean, covariance = _dense_posterior(model, x, model.train_targets, xs)
        task = model.covar_module.output_covariance
        correction = model.covar_module.data_covar_module(xs).evaluate_kernel().variance_correction
        assert float(correction[-1]) > 0.99  # ‖φ(x)‖² ≈ 0 far from the landmarks
        covariance = covariance + torch.kron(torch.diag(correction), task)
        scale = torch.ones(NUM_TASKS, dtype=F64)
        if standardize:  # BoTorch untransforms the posterior: mean·σ + μ, covariance scaled by σσᵀ per task
            scale = model.outcome_transform.stdvs.reshape(-1)
            mean = (mean.reshape(-1, NUM_TASKS) * scale + model.outcome_transform.means.reshape(-1)).reshape(-1)
        scales = scale.repeat(xs.shape[0])
        covariance = covariance * scales[:, None] * scales[None, :]
        torch.testing.assert_close(posterior.mean.reshape(-1), mean, rtol=1e-8, atol=1e-8)
        sample_covariance, sample_mean = _sample_covariance(posterior)
        torch.testing.assert_close(sample_mean, mean, rtol=1e-8, atol=1e-8)
        torch.testing.assert_close(sample_covariance, covariance, rtol=1e-7, atol=1e-8)
        if noise == "shared":
            torch.testing.assert_close(posterior.variance.reshape(-1), covariance.diagonal(), rtol=1e-7, atol=1e-8)
        # far from the data the exact GP's prior variance k(x, x)·A_ii (k(x, x) = 1)
        torch.testing.assert_close(posterior.variance[-1], task.diagonal() * scale ** 2, rtol=1e-6, atol=1e-8)
