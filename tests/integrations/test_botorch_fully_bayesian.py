"""BoTorch's fully Bayesian SAAS models (``SaasFullyBayesianSingleTaskGP``, ``SaasFullyBayesianMultiTaskGP``) with rfgp
kernels, converted after fitting.

BoTorch 0.18 runs their NUTS in NumPyro on its own exact Matérn-5/2 kernel in JAX (``pip install
"botorch[fully_bayesian]"``), then ``load_mcmc_samples`` builds that kernel in GPyTorch as a batch of S models, one per
MCMC sample.  ``rfgp.sketch`` converts the batch at once.  As in ``test_botorch_acquisitions.py``, a Nyström map whose
landmarks are every point the kernel sees is the exact model up to its factor's round-off; ORF features approach it as
F grows.  One real NUTS run (tiny: 32 warm-up steps, 16 samples thinned to S = 4, tree depth 3); the multi-task model's
NUTS took twice as long as the single-task one's (42 s against 22 s on a shared core, each the first in its process),
so its samples are loaded as BoTorch's fit loads them (``load_mcmc_samples``).
"""

import copy

import pytest
import torch

botorch = pytest.importorskip("botorch")
pytest.importorskip("jax")
pytest.importorskip("numpyro")

from botorch.acquisition import qLogNoisyExpectedImprovement  # noqa: E402
from botorch.acquisition.bayesian_active_learning import qBayesianActiveLearningByDisagreement  # noqa: E402
from botorch.fit import fit_fully_bayesian_model_nuts  # noqa: E402
from botorch.models.fully_bayesian import SaasFullyBayesianSingleTaskGP  # noqa: E402
from botorch.models.fully_bayesian_multitask import SaasFullyBayesianMultiTaskGP  # noqa: E402
from botorch.sampling import SobolQMCNormalSampler  # noqa: E402
from botorch.sampling.pathwise import draw_matheron_paths  # noqa: E402
from gpytorch.kernels import MaternKernel, ScaleKernel  # noqa: E402

import rfgp  # noqa: E402

from ._converted_models import landmark_copy, sketched_copy  # noqa: E402
from .test_botorch_acquisitions import assert_same_value_and_grad, value_and_grad  # noqa: E402

F64 = torch.float64
D, S = 3, 4  # input columns; MCMC samples kept (16 thinned by 4)


def uniform(*shape, seed):
    return torch.rand(*shape, D, generator=torch.Generator().manual_seed(seed), dtype=F64)


def targets(x, seed):
    """A function of the first column only (the SAAS prior's case), standardised."""
    y = torch.sin(6 * x[..., :1]) + 0.1 * torch.randn(x.shape[0], 1, generator=torch.Generator().manual_seed(seed),
                                                      dtype=F64)
    return (y - y.mean()) / y.std()


def nuts(model):
    fit_fully_bayesian_model_nuts(model, warmup_steps=32, num_samples=16, thinning=4, max_tree_depth=3,
                                  disable_progbar=True, seed=0)
    return model


@pytest.fixture(scope="module")
def fitted():
    """(X, the SAAS model after NUTS) — tests copy the model, never change it.  The run costs 18–23 s of CPU time,
    mostly XLA compiling NumPyro's sampler."""
    x = uniform(20, seed=0)
    return x, nuts(SaasFullyBayesianSingleTaskGP(x, targets(x, 1)))


def mixture_moments(model, x):
    with torch.no_grad():
        posterior = model.posterior(x)
    return posterior.mean, posterior.variance, posterior.mixture_mean, posterior.mixture_variance


def test_fitted_saas_model_converts_every_mcmc_sample_at_once(fitted):
    """The fitted model's ScaleKernel(Matérn-5/2) has batch shape (S,): its conversion keeps the batch and every
    sample's lengthscales and outputscale, BoTorch's accessors read it, and the posterior — S Gaussians and their
    mixture — is the exact one with landmarks (seen 2e-7) and approaches it as F grows (ORF, largest error of the
    mixture mean, mean over 3 seeds: 0.32 at F = 16, 0.027 at F = 4096)."""
    x, exact = fitted
    assert exact.covar_module.batch_shape == (S,) and isinstance(exact.covar_module.base_kernel, MaternKernel)
    lengthscale = exact.covar_module.base_kernel.lengthscale
    assert (lengthscale.std(0) > 0).all()  # distinct samples
    xs = uniform(6, seed=2)
    expected = mixture_moments(exact, xs)
    assert expected[0].shape == (S, 6, 1) and expected[2].shape == (6, 1)

    sketched = sketched_copy(exact, 64)
    base = sketched.covar_module.base_kernel
    assert isinstance(base, rfgp.kernels.SketchedMaternKernel) and sketched.covar_module.batch_shape == (S,)
    torch.testing.assert_close(base.lengthscale, lengthscale, rtol=0, atol=0)
    torch.testing.assert_close(sketched.covar_module.outputscale, exact.covar_module.outputscale, rtol=0, atol=0)
    assert sketched.num_mcmc_samples == S and sketched.batch_shape == (S,)
    torch.testing.assert_close(sketched.median_lengthscale, exact.median_lengthscale, rtol=0, atol=0)

    for actual, wanted in zip(mixture_moments(landmark_copy(exact, x, xs), xs), expected):
        torch.testing.assert_close(actual, wanted, rtol=1e-5, atol=1e-5)
    errors = {width: torch.stack([(mixture_moments(sketched_copy(exact, width, seed), xs)[2] - expected[2]).abs().max()
                                  for seed in range(3)]).mean() for width in (16, 4096)}
    assert errors[4096] < 0.1 and errors[4096] < 0.25 * errors[16], errors


def test_acquisitions_on_the_converted_model_are_the_exact_ones(fitted):
    """qLogNEI (its mixture of S samples' improvements) and BALD, which accepts only models marked
    ``_is_fully_bayesian`` (as the SAAS model is), give the exact values and gradients with landmarks (seen: values
    within 1e-6, gradients of up to 12 within 3e-5) and approach them with ORF features (largest value error, mean
    over 3 seeds — qLogNEI: 2.0 at F = 16, 0.25 at F = 2048; BALD: 0.33 and 0.015)."""
    x, exact = fitted

    def nei(model):
        return qLogNoisyExpectedImprovement(model, X_baseline=x, prune_baseline=False,
                                            sampler=SobolQMCNormalSampler(torch.Size([64]), seed=0))

    def bald(model):
        return qBayesianActiveLearningByDisagreement(model, sampler=SobolQMCNormalSampler(torch.Size([64]), seed=0))

    pairs = uniform(64, 2, seed=3)
    # the 4 best pairs: log EI near -2.5 (far from the incumbent, below -40: all noise); BALD 0.016–0.067
    with torch.no_grad():
        X = pairs[nei(exact)(pairs).topk(4).indices]
    for acquisition in (nei, bald):
        expected = value_and_grad(acquisition(exact), X)
        assert torch.isfinite(expected[0]).all() and expected[0].abs().min() > 5e-3
        assert_same_value_and_grad(value_and_grad(acquisition(landmark_copy(exact, x, X)), X), expected,
                                   rtol=1e-3, atol=1e-4)
        with torch.no_grad():
            errors = {width: torch.stack([(acquisition(sketched_copy(exact, width, seed))(X) - expected[0]).abs().max()
                                          for seed in range(3)]).mean() for width in (16, 2048)}
        assert errors[2048] < 0.3 * errors[16], (acquisition.__name__, errors)


def test_a_kernel_set_before_fitting_is_replaced_by_botorchs_exact_kernel():
    """``fit_fully_bayesian_model_nuts`` calls ``model.train()``, which sets ``covar_module`` to None, and
    ``load_mcmc_samples`` builds BoTorch's exact Matérn kernel: a kernel converted before fitting is dropped without a
    word (rfgp cannot see it happen without patching BoTorch), so convert after fitting."""
    x = uniform(20, seed=0)
    model = SaasFullyBayesianSingleTaskGP(x, targets(x, 1))
    model.covar_module = rfgp.sketch(ScaleKernel(MaternKernel(ard_num_dims=D)).to(F64), 64, seed=0)
    model.train()
    assert model.covar_module is None
    model.load_mcmc_samples({"mean": torch.zeros(S, dtype=F64), "noise": torch.full((S,), 0.1, dtype=F64),
                             "outputscale": torch.ones(S, dtype=F64), "lengthscale": torch.ones(S, D, dtype=F64)})
    assert type(model.covar_module.base_kernel) is MaternKernel


@pytest.mark.parametrize("method", ["orf", "nystrom"])
def test_converted_model_restores_from_its_state_dict(fitted, method):
    """The guide's recipe: load the state into a new model with ``strict=False`` (BoTorch's ``load_state_dict`` rebuilds
    its exact kernel from placeholder samples and loads the state into it), convert again, then load the state strictly
    (``torch.nn.Module.load_state_dict``, past BoTorch's override): the same hyperparameters and draws, the same
    posterior bit for bit.  Converting again with the same seed alone restores random features (their hyperparameter
    keys are the exact kernel's), not a Nyström map: its base kernel's keys (under ``base_kernel.base_kernel``) are
    not the exact kernel's, BoTorch's ``load_state_dict`` neither raises nor returns unmatched keys, and the placeholder
    lengthscales (1) stay."""
    x, exact = fitted
    xs = uniform(6, seed=2)

    def convert(model):
        options = {"x_sample": x} if method == "nystrom" else {}
        model.covar_module = rfgp.sketch(model.covar_module, 20 if method == "nystrom" else 64, method=method, seed=3,
                                         **options)
        return model.eval()

    original = convert(copy.deepcopy(exact))
    expected, state = mixture_moments(original, xs), original.state_dict()
    restored = SaasFullyBayesianSingleTaskGP(x, targets(x, 1))
    assert restored.load_state_dict(state, strict=False) is None  # BoTorch returns no missing/unexpected keys
    convert(restored)
    placeholder = restored.covar_module.base_kernel
    placeholder = placeholder.base_kernel if method == "nystrom" else placeholder
    same_seed_only = mixture_moments(restored, xs)
    if method == "orf":
        for actual, wanted in zip(same_seed_only, expected):
            torch.testing.assert_close(actual, wanted, rtol=0, atol=0)
    else:
        torch.testing.assert_close(placeholder.lengthscale, torch.ones(S, 1, D, dtype=F64))
        assert (same_seed_only[2] - expected[2]).abs().max() > 1e-2
    torch.nn.Module.load_state_dict(restored, state)  # strict
    restored.eval()
    for actual, wanted in zip(mixture_moments(restored, xs), expected):
        torch.testing.assert_close(actual, wanted, rtol=0, atol=0)


def multitask_model():
    """A SaasFullyBayesianMultiTaskGP (2 tasks, task column last) with S samples loaded as its NUTS fit loads them."""
    gen = torch.Generator().manual_seed(1)
    x = uniform(20, seed=0)[:, :2]
    task = (torch.arange(20) % 2).to(F64)[:, None]
    model = SaasFullyBayesianMultiTaskGP(torch.cat([x, task], -1), targets(x, 1) + 0.3 * task, task_feature=-1)

    def positive(*shape, low):
        return low + torch.rand(*shape, generator=gen, dtype=F64)

    model.load_mcmc_samples({"mean": torch.randn(S, 2, generator=gen, dtype=F64), "noise": positive(S, low=0.01) / 20,
                             "outputscale": positive(S, low=1.0), "lengthscale": positive(S, 2, low=0.3),
                             "task_lengthscale": positive(S, 2, low=0.5),
                             "latent_features": torch.randn(S, 2, 2, generator=gen, dtype=F64)})
    return model.eval()


def test_multitask_saas_model_converts_to_a_feature_product_with_exact_task_features():
    """Its kernel, ScaleKernel(Matérn-5/2 on the data columns) × IndexKernel (the Cholesky factor of a Matérn kernel of
    sampled latent task features, var = 0), batch shape (S,), becomes a feature product whose task factor has exact
    features: with landmarks at every point the posterior of every task is the exact one (seen 4e-8; one Nyström map of
    the whole tree has no factors, so BoTorch's accessors that read them fail), with ORF features
    it approaches it (largest error of the mixture mean, mean over 3 seeds: 0.74 at F = 64, 0.05 at F = 16384, of
    which the Matérn factor has 16 and 4096 frequencies)."""
    exact = multitask_model()
    train_x = exact.train_inputs[0]
    xs = uniform(5, seed=2)[:, :2]
    expected = mixture_moments(exact, xs)
    assert expected[2].shape == (5, 2)  # both tasks

    sketched = sketched_copy(exact, 64)
    data_factor, task_factor = sketched.covar_module.kernels
    assert isinstance(data_factor.base_kernel, rfgp.kernels.SketchedMaternKernel)
    assert isinstance(task_factor, rfgp.kernels.IndexFeatureKernel) and sketched.covar_module.batch_shape == (S,)
    exact_task_covariance = exact.covar_module.kernels[1].covar_matrix.to_dense()
    torch.testing.assert_close(task_factor.covar_matrix.to_dense(), exact_task_covariance, rtol=0, atol=0)
    assert sketched.num_mcmc_samples == S
    torch.testing.assert_close(sketched.median_lengthscale, exact.median_lengthscale, rtol=0, atol=0)

    tasks = [torch.cat([xs, torch.full((5, 1), float(t), dtype=F64)], -1) for t in (0, 1)]
    landmarks = landmark_copy(exact, train_x, *tasks)
    for actual, wanted in zip(mixture_moments(landmarks, xs), expected):
        torch.testing.assert_close(actual, wanted, rtol=1e-5, atol=1e-5)
    with pytest.raises(AttributeError, match="batch_shape"):  # read off covar_module.kernels[0] (the guide)
        landmarks.batch_shape  # noqa: B018
    errors = {width: torch.stack([(mixture_moments(sketched_copy(exact, width, seed), xs)[2] - expected[2]).abs().max()
                                  for seed in range(3)]).mean() for width in (64, 16384)}
    assert errors[16384] < 0.1 and errors[16384] < 0.25 * errors[64], errors


def test_nystrom_conversion_keeps_median_lengthscale():
    """The whole-tree Nyström map keeps the ScaleKernel on top, so BoTorch's ``median_lengthscale`` (read off
    ``covar_module.base_kernel``) is the exact model's; it raised ``AttributeError`` when the map wrapped the tree."""
    x = uniform(20, seed=0)
    model = SaasFullyBayesianSingleTaskGP(x, targets(x, seed=1))
    samples = {"mean": torch.zeros(4, dtype=torch.float64), "outputscale": torch.ones(4, dtype=torch.float64),
               "noise": torch.full((4,), 0.1, dtype=torch.float64), "lengthscale": 0.5 + uniform(4, seed=2)}
    model.load_mcmc_samples(samples)
    exact = model.median_lengthscale
    model.covar_module = rfgp.sketch(model.covar_module, 20, method="nystrom", x_sample=x, seed=0)
    torch.testing.assert_close(model.median_lengthscale, exact, rtol=0, atol=0)


@pytest.mark.parametrize("num_features", [8, 64])  # the update in feature space (F < N) and in kernel space
def test_matheron_paths_of_the_converted_model_are_one_path_per_mcmc_sample(num_features):
    """``draw_matheron_paths`` of the converted SAAS model gives, as for the exact one, paths of shape
    ``paths × S × n`` whose mean and variance per MCMC sample are that sample's posterior's (4 standard errors).
    The update path lacked BoTorch's ``is_ensemble`` flag, so it evaluated the S members' updates on the inputs
    without an ensemble axis (its weights ``paths × S × S × F``: BoTorch's targets of shape (N,) were taken for the
    batch shape): the sum had shape ``paths × S × S × n`` (4 × 4 × 4 × 5 for 4 paths), other numbers of paths raised
    'The size of tensor a (500) must match the size of tensor b (4)', and so did ``get_optimal_samples``."""
    x = uniform(20, seed=0)
    model = SaasFullyBayesianSingleTaskGP(x, targets(x, seed=1))
    samples = {"mean": torch.zeros(S, dtype=F64), "outputscale": 1 + uniform(S, seed=3)[:, 0],
               "noise": 0.01 + 0.01 * uniform(S, seed=4)[:, 0], "lengthscale": 0.3 + uniform(S, seed=2)}
    model.load_mcmc_samples(samples)
    model = sketched_copy(model.eval(), num_features)
    xs, num_paths = uniform(5, seed=5), 3000
    with torch.no_grad():
        draws = draw_matheron_paths(model, torch.Size([num_paths]))
        paths = draws(xs)
        posterior = model.posterior(xs)
        # points per path (as optimize_posterior_samples evaluates them): the update evaluated them without the
        # ensemble axis, 3000 batches of points against 4 members ('size of tensor a (3000) must match ... b (4)')
        per_path = draws(xs.expand(num_paths, 5, D))
    assert paths.shape == (num_paths, S, 5)
    torch.testing.assert_close(per_path, paths, rtol=1e-12, atol=1e-12)
    mean, variance = posterior.mean.squeeze(-1), posterior.variance.squeeze(-1)
    assert ((paths.mean(0) - mean).abs() <= 4 * (variance / num_paths).sqrt()).all()
    assert ((paths.var(0) / variance - 1).abs() <= 4 * (2 / num_paths) ** 0.5).all()


def test_conditioning_the_converted_model_with_noise_conditions_every_mcmc_sample_on_it():
    """``condition_on_observations(X, Y, noise=...)`` (qJointEntropySearch's conditioning on sampled optima) of the
    converted SAAS model gives every MCMC sample the posterior of a GP fitted with its own noise at the training
    points and ``noise`` at the new ones (the dense formulas with BoTorch's kernel; landmarks at every point).  The
    S samples' (S, N) training noise and the (m,) new noise raised 'expand(torch.DoubleTensor{[4, 20]}, size=[20])'
    inside GPyTorch's fixed-noise likelihood."""
    x = uniform(20, seed=0)
    y = targets(x, seed=1)
    model = SaasFullyBayesianSingleTaskGP(x, y)
    model.load_mcmc_samples({"mean": uniform(S, seed=3)[:, 0], "outputscale": 1 + uniform(S, seed=4)[:, 0],
                             "noise": 0.01 + 0.1 * uniform(S, seed=5)[:, 0], "lengthscale": 0.3 + uniform(S, seed=2)})
    exact = model.eval()
    xs, new_x, new_y = uniform(5, seed=6), uniform(2, seed=7), torch.tensor([[1.0], [-1.0]], dtype=F64)
    landmarks = landmark_copy(exact, x, xs, new_x)
    landmarks.posterior(xs)
    conditioned = landmarks.condition_on_observations(new_x, new_y, noise=torch.full((2, 1), 0.2, dtype=F64))
    with torch.no_grad():
        posterior = conditioned.posterior(xs)
        points = torch.cat([x, new_x])
        noise = torch.cat([exact.likelihood.noise.expand(S, 20), torch.full((S, 2), 0.2, dtype=F64)], -1)
        kernel = exact.covar_module
        train_cov = kernel(points).to_dense() + torch.diag_embed(noise)
        cross = kernel(xs, points).to_dense()
        mean = exact.mean_module.constant.reshape(S, 1)
        residual = torch.cat([y, new_y]) - mean[..., None]
        expected_mean = mean + (cross @ torch.linalg.solve(train_cov, residual)).squeeze(-1)
        expected_variance = kernel(xs, diag=True) - (cross * torch.linalg.solve(train_cov, cross.mT).mT).sum(-1)
    torch.testing.assert_close(posterior.mean.squeeze(-1), expected_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(posterior.variance.squeeze(-1), expected_variance, rtol=1e-6, atol=1e-6)
