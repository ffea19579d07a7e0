"""k̂(x, x) = ‖Φ(x)‖² in closed form for sin/cos maps: a kernel call with ``diag=True`` does not featurise x.

An SVGP step evaluates K(Z, x) and, by a separate call with ``diag=True``, k̂(x, x): before the closed form, x was
featurised twice per step (13–45 % of an ELBO and gradient at F = 1024).  The closed form must equal the features'
‖Φ(x)‖², gradients included (Matérn-½'s anchored weights make it depend on ℓ), and still name a bad hyperparameter.
"""

import gpytorch
import pytest
import torch
from gpytorch.kernels import MaternKernel, PeriodicKernel, RBFKernel, ScaleKernel, SpectralMixtureKernel

import rfgp
from rfgp.core.validation import NonFiniteHyperparameterError
from rfgp.features.base import FeatureMap
from rfgp.kernels import (
    ConstantFeatureKernel,
    CosineFeatureKernel,
    FeatureProductKernel,
    FeatureSumKernel,
    IndexFeatureKernel,
    LinearFeatureKernel,
    SketchedCategoricalKernel,
    SketchedMaternKernel,
    SketchedPeriodicKernel,
    SketchedProductKernel,
    SketchedRBFKernel,
    SketchedRQKernel,
    SketchedSpectralMixtureKernel,
    SketchedSphericalPolynomialKernel,
    SpectralProductKernel,
)
from rfgp.kernels.random_feature_kernel import FeatureKernel

from .._models import UserSVGP

CLOSED_FORM = {
    "rff": lambda: SketchedRBFKernel(32, method="rff", ard_num_dims=3, seed=0),
    "orf": lambda: SketchedRBFKernel(32, method="orf", ard_num_dims=3, seed=1),
    "sorf_batch": lambda: SketchedRBFKernel(32, method="sorf", ard_num_dims=3, batch_shape=torch.Size([2]), seed=2),
    "matern_half": lambda: SketchedMaternKernel(32, nu=0.5, ard_num_dims=3, seed=3),
    "matern_half_batch": lambda: SketchedMaternKernel(32, nu=0.5, ard_num_dims=3, batch_shape=torch.Size([2]), seed=4),
    "matern_three_halves": lambda: SketchedMaternKernel(32, nu=1.5, ard_num_dims=3, seed=5),
}


def feature_map_rows(kernel):
    """A list that records the number of rows of every feature-map forward call under ``kernel``."""
    rows = []
    for module in kernel.modules():
        if isinstance(module, FeatureMap):
            module.register_forward_hook(lambda mod, args, out: rows.append(args[0].shape[-2]))
    return rows


@pytest.mark.parametrize("name", sorted(CLOSED_FORM))
def test_closed_form_diagonal_equals_the_features_squared_norm_with_its_gradient(name):
    kernel = CLOSED_FORM[name]().double()
    x = torch.rand(7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    kernel(x[:2]).to_dense()  # first evaluation: draws, and Matérn-½'s anchor ℓ₀ at the initial lengthscale
    # away from the anchor, so that Matérn-½'s weights r(ℓ/ℓ₀) ≠ 1 and ‖Φ‖² depends on ℓ
    kernel.lengthscale = torch.tensor([0.4, 0.9, 1.7], dtype=torch.float64).expand(*kernel.batch_shape, 1, 3)
    rows = feature_map_rows(kernel)
    diagonal = kernel(x, diag=True)
    assert rows == []  # the closed form featurises nothing, not even a probe row
    reference = kernel.featurize(x).pow(2).sum(-1)
    assert diagonal.shape == reference.shape == (*kernel.batch_shape, 7)
    torch.testing.assert_close(diagonal, reference, rtol=0, atol=1e-12)
    weights = torch.rand(reference.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (expected,) = torch.autograd.grad((weights * reference).sum(), kernel.raw_lengthscale)
    if diagonal.requires_grad:
        (got,) = torch.autograd.grad((weights * diagonal).sum(), kernel.raw_lengthscale)
    else:  # unit-weight sin/cos: ‖Φ‖² = 1 for every ℓ, so the features' gradient is zero up to rounding
        got = torch.zeros_like(expected)
    if name.startswith("matern_half"):
        assert expected.abs().max() > 1e-3  # the weights do depend on ℓ here
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["rff", "matern_half"])
def test_closed_form_diagonal_names_a_non_finite_lengthscale(name):
    kernel = CLOSED_FORM[name]().double()
    x = torch.rand(5, 3, dtype=torch.float64)
    kernel(x).to_dense()
    kernel.raw_lengthscale.data.fill_(float("nan"))
    with pytest.raises(NonFiniteHyperparameterError, match="lengthscale"):
        kernel(x, diag=True)


@pytest.mark.parametrize("base", [
    RBFKernel, lambda: MaternKernel(nu=0.5), lambda: SpectralMixtureKernel(num_mixtures=2, ard_num_dims=2),
    lambda: RBFKernel(active_dims=[0]) * PeriodicKernel(active_dims=[1]),
], ids=["rbf", "matern_half", "spectral_mixture", "spectral_product"])
def test_svgp_elbo_step_featurises_the_minibatch_once(base):
    """K(Z, x) featurises x; the diagonal k̂(x, x) reads the closed form (before: a probe row and x once more)."""
    n, m = 40, 6
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(n, 2, dtype=torch.float64, generator=gen), torch.randn(n, dtype=torch.float64, generator=gen)
    covar = rfgp.sketch(ScaleKernel(base()), num_features=64, seed=0).double()
    model = UserSVGP(covar, x[:m].clone()).double()
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=n)
    model.train()
    likelihood.train()
    mll(model(x), y)  # first evaluation
    rows = featurize_rows(covar)
    (-mll(model(x), y)).backward()
    # K(Z, x): probe, Z, x; K(Z, Z): Z (its probe's shape reused from the first evaluation)
    assert sorted(rows) == [1, m, m, n]


def test_a_chunked_diagonal_without_a_closed_form_featurises_each_chunk_once():
    """Before, each chunk of k̂(x, x) was featurised twice (once as x1, once as x2: the same rows)."""
    kernel = SketchedRBFKernel(32, method="maclaurin", input_dim=3, seed=0).double()
    x = torch.rand(7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    kernel(x[:2]).to_dense()
    rows = feature_map_rows(kernel)
    with rfgp.settings.chunk_size(3):
        diagonal = kernel(x, diag=True)
    assert sorted(rows) == [1, 1, 3, 3]  # the probe row, then the chunks of 3, 3 and 1 rows
    torch.testing.assert_close(diagonal, kernel.featurize(x).pow(2).sum(-1), rtol=0, atol=1e-12)


def test_maps_without_a_closed_form_still_featurise_the_diagonal():
    kernel = SketchedRBFKernel(32, method="maclaurin", input_dim=3, seed=0).double()
    x = torch.rand(7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rows = feature_map_rows(kernel)
    diagonal = kernel(x, diag=True)
    assert 7 in rows
    torch.testing.assert_close(diagonal, kernel.featurize(x).pow(2).sum(-1), rtol=0, atol=1e-12)


# --------------------------------------------------------------- other sin/cos families and feature-kernel trees
def _spherical_kernel():
    return SketchedSphericalPolynomialKernel(2, 32, input_dim=3, seed=6)


FAMILIES = {
    "spectral_mixture": lambda: SketchedSpectralMixtureKernel(3, 32, ard_num_dims=3, seed=0),
    "spectral_mixture_batch": lambda: SketchedSpectralMixtureKernel(2, 32, ard_num_dims=3, seed=1,
                                                                     batch_shape=torch.Size([2])),
    "periodic": lambda: SketchedPeriodicKernel(32, ard_num_dims=3, seed=2),
    "rational_quadratic": lambda: SketchedRQKernel(32, ard_num_dims=3, seed=3),
    "spectral_product": lambda: SpectralProductKernel(
        ScaleKernel(SketchedRBFKernel(2, active_dims=[0])), SketchedMaternKernel(2, nu=0.5, active_dims=[1, 2]),
        SketchedPeriodicKernel(2, active_dims=[2]), num_features=32, seed=4),
    "spherical": _spherical_kernel,
    "sum": lambda: FeatureSumKernel(
        ScaleKernel(SketchedMaternKernel(16, nu=0.5, ard_num_dims=3, seed=5)),
        SketchedSpectralMixtureKernel(2, 16, ard_num_dims=3, seed=6), LinearFeatureKernel(input_dim=3),
        ConstantFeatureKernel()),
    "multitask_product": lambda: FeatureProductKernel(  # GPyTorch's Hadamard multitask pattern
        ScaleKernel(SketchedRBFKernel(8, ard_num_dims=2, active_dims=[0, 1], seed=8)),
        IndexFeatureKernel(num_tasks=3, rank=2, active_dims=[2])),
    "product": lambda: FeatureProductKernel(
        ScaleKernel(SketchedRQKernel(8, ard_num_dims=2, active_dims=[0, 1], seed=7)),
        CosineFeatureKernel(active_dims=[2])),
}

#: hyperparameters the closed form must depend on (its gradient in them is checked to be non-zero)
WEIGHTED = {
    "spectral_mixture": "raw_mixture_weights", "spectral_mixture_batch": "raw_mixture_weights",
    "periodic": "raw_lengthscale", "rational_quadratic": "raw_alpha", "spectral_product": "raw_lengthscale",
    "sum": "raw_mixture_weights", "product": "raw_alpha", "multitask_product": "covar_factor",
}


def featurize_rows(kernel):
    """Like :func:`feature_map_rows`, for every feature kernel's ``featurize`` under ``kernel`` (maps or not), and its
    ``amplitude_features`` (the featurisation with a ScaleKernel's outputscale folded in)."""
    rows = []
    for module in kernel.modules():
        if isinstance(module, FeatureKernel):
            def spy(x, _featurize=module.featurize):
                rows.append(x.shape[-2])
                return _featurize(x)

            def amplitude_spy(x, log_amplitude, _features=module.amplitude_features):
                rows.append(x.shape[-2])
                return _features(x, log_amplitude)
            module.featurize, module.amplitude_features = spy, amplitude_spy
    return rows


def _perturbed(kernel, first):
    """The kernel after its first evaluation (on ``first``), with every raw hyperparameter moved off its default
    (weights ≠ 1)."""
    gen = torch.Generator().manual_seed(0)
    kernel(first).to_dense()  # draws (proposals at the defaults)
    with torch.no_grad():
        for parameter in kernel.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, dtype=parameter.dtype, generator=gen))
    return kernel


def _grads(output, parameters, weights):
    grads = torch.autograd.grad((weights * output).sum(), parameters, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(parameters, grads)]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_closed_form_squared_norm_of_every_sincos_family_and_tree(name):
    """‖Φ(x)‖² in closed form equals the explicit features' to 1e-12 in value and in the gradient of every
    hyperparameter (mixture weights, periodic ℓ, RQ α, Matérn-½'s anchored ℓ, outputscales), featurising nothing."""
    x = torch.nn.functional.normalize(torch.rand(7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2)),
                                      dim=-1)  # unit rows for the spherical kernel
    if name == "multitask_product":
        x[:, 2] = torch.tensor([0.0, 1, 2, 2, 1, 0, 1])  # the task column
    kernel = _perturbed(FAMILIES[name]().double(), x[:2])
    rows = featurize_rows(kernel)
    diagonal = kernel(x, diag=True)
    assert rows == []
    reference = kernel.featurize(x).pow(2).sum(-1)
    assert set(rows) == {7}  # the spy sees the explicit featurisation (of the tree and its parts)
    assert diagonal.shape == reference.shape == (*kernel.batch_shape, 7)
    torch.testing.assert_close(diagonal, reference, rtol=0, atol=1e-12)
    if name == "spherical":  # no hyperparameters: ‖Φ‖² = c, the fitted density's mass
        return
    names, parameters = zip(*kernel.named_parameters())
    weights = torch.rand(reference.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = _grads(reference, parameters, weights)
    got = _grads(diagonal, parameters, weights) if diagonal.requires_grad else [torch.zeros_like(p) for p in parameters]
    for parameter_name, g, e in zip(names, got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12, msg=lambda m, n=parameter_name: f"{n}: {m}")
    if name in WEIGHTED:
        dependence = max(e.abs().max() for n, e in zip(names, expected) if n.endswith(WEIGHTED[name]))
        assert dependence > 1e-3


NO_CLOSED_FORM = {
    "tensor_srht_product": lambda: SketchedProductKernel(
        SketchedRBFKernel(16, ard_num_dims=3, seed=0), SketchedPeriodicKernel(16, seed=1), num_features=16, seed=2),
    "sum_with_maclaurin": lambda: FeatureSumKernel(SketchedRBFKernel(16, method="maclaurin", input_dim=3, seed=3),
                                                   SketchedRQKernel(16, seed=4)),
    "categorical": lambda: SketchedCategoricalKernel(16, ard_num_dims=3, seed=5),
}


@pytest.mark.parametrize("name", sorted(NO_CLOSED_FORM))
def test_kernels_without_a_closed_form_norm_featurise_the_diagonal(name):
    """A TensorSRHT product (‖S(Φ₁ ⊗ Φ₂)‖² is random), a sum with a Maclaurin part, categorical features
    (‖Φ‖² depends on the hashes of x): the diagonal still comes from the features."""
    kernel = NO_CLOSED_FORM[name]().double()
    x = torch.rand(7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    if name == "categorical":
        x = x.mul(3).floor()
    kernel(x[:2]).to_dense()
    rows = featurize_rows(kernel)
    diagonal = kernel(x, diag=True)
    assert 7 in rows
    torch.testing.assert_close(diagonal, kernel.featurize(x).pow(2).sum(-1), rtol=0, atol=1e-12)


NON_FINITE = {
    "periodic": (lambda: SketchedPeriodicKernel(16, seed=0), "raw_period_length", "period_length"),
    "spectral_mixture": (lambda: SketchedSpectralMixtureKernel(2, 16, ard_num_dims=3, seed=0), "raw_mixture_weights",
                         "mixture_weights"),
    "rational_quadratic": (lambda: SketchedRQKernel(16, seed=0), "raw_alpha", "alpha"),
    "spectral_product": (lambda: SpectralProductKernel(SketchedRBFKernel(2), SketchedPeriodicKernel(2),
                                                       num_features=16, seed=0), "kernels.1.raw_period_length",
                         "period_length"),
    "cosine": (lambda: FeatureProductKernel(SketchedRBFKernel(16, seed=0), CosineFeatureKernel(active_dims=[0])),
               "kernels.1.raw_period_length", "period_length"),
}


@pytest.mark.parametrize("diag", [True, False], ids=["diag", "full"])
@pytest.mark.parametrize("name", sorted(NON_FINITE))
def test_a_non_finite_spectral_hyperparameter_is_named(name, diag):
    """Before, a NaN period, mixture weight or α gave NaN features silently (and the closed-form diagonal of a
    periodic kernel, which does not read the period, would have given a finite one)."""
    build, raw, shown = NON_FINITE[name]
    kernel = build().double()
    x = torch.rand(5, 3, dtype=torch.float64)
    kernel(x).to_dense()
    kernel.get_parameter(raw).data.fill_(float("nan"))
    with pytest.raises(NonFiniteHyperparameterError, match=shown):
        kernel(x, diag=True) if diag else kernel(x).to_dense()


def test_spherical_closed_form_checks_unit_rows_as_the_features_do():
    kernel = _spherical_kernel().double()
    with pytest.raises(ValueError, match="unit"):
        kernel(torch.full((4, 3), 0.9, dtype=torch.float64), diag=True)


@pytest.mark.parametrize("combination", [gpytorch.kernels.AdditiveKernel, gpytorch.kernels.ProductKernel])
def test_gpytorch_combinations_of_rfgp_kernels_use_their_closed_forms(combination):
    """GPyTorch's AdditiveKernel/ProductKernel evaluate a diagonal from their children's diagonals: no featurisation."""
    kernel = combination(SketchedRBFKernel(16, active_dims=[0], seed=0),
                         SketchedSpectralMixtureKernel(2, 16, ard_num_dims=1, active_dims=[1], seed=1)).double()
    x = torch.rand(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    dense = kernel(x).to_dense()
    rows = featurize_rows(kernel)
    diagonal = kernel(x, diag=True)
    assert rows == []
    torch.testing.assert_close(diagonal, dense.diagonal(), rtol=0, atol=1e-12)
