"""k̂(x, x) = ‖Φ(x)‖² in closed form for sin/cos maps: a kernel call with ``diag=True`` does not featurise x.

An SVGP step evaluates K(Z, x) and, by a separate call with ``diag=True``, k̂(x, x): before the closed form, x was
featurised twice per step (13–45 % of an ELBO and gradient at F = 1024).  The closed form must equal the features'
‖Φ(x)‖², gradients included (Matérn-½'s anchored weights make it depend on ℓ), and still name a bad hyperparameter.
"""

import gpytorch
import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

import rfgp
from rfgp.core.validation import NonFiniteHyperparameterError
from rfgp.features.base import FeatureMap
from rfgp.kernels import SketchedMaternKernel, SketchedRBFKernel

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


@pytest.mark.parametrize("base", [RBFKernel, lambda: MaternKernel(nu=0.5)], ids=["rbf", "matern_half"])
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
    rows = feature_map_rows(covar)
    (-mll(model(x), y)).backward()
    assert sorted(rows) == [1, 1, m, m, n]  # K(Z, x): probe, Z, x; K(Z, Z): probe, Z


def test_maps_without_a_closed_form_still_featurise_the_diagonal():
    kernel = SketchedRBFKernel(32, method="maclaurin", input_dim=3, seed=0).double()
    x = torch.rand(7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rows = feature_map_rows(kernel)
    diagonal = kernel(x, diag=True)
    assert 7 in rows
    torch.testing.assert_close(diagonal, kernel.featurize(x).pow(2).sum(-1), rtol=0, atol=1e-12)
