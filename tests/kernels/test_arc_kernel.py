"""GPyTorch's ArcKernel converted to its base kernel's features on the arc embedding (rfgp/kernels/arc.py):
unbiased against GPyTorch, gradients in angle/radius, carried parameters/priors/state_dict, trees and training."""

import gpytorch
import pytest
import torch
from gpytorch.kernels import ArcKernel, MaternKernel, ProductKernel, ProductStructureKernel, RBFKernel, ScaleKernel
from gpytorch.priors import GammaPrior

import rfgp
from rfgp.kernels import SketchedArcKernel
from rfgp.models import ExactGPModel
from tests._conversion_checks import assert_copied_constraint
from tests._spectral_checks import assert_unbiased

F64 = torch.float64
X = torch.rand(10, 3, dtype=F64, generator=torch.Generator().manual_seed(0)) * 2


def relevant_first_two(x):
    """Columns 0 and 1 are relevant where column 2 is below 1 (a conditional parameter space)."""
    mask = torch.ones_like(x)
    mask[..., :2] = (x[..., 2:] < 1).to(x)
    return mask


def exact_arc(delta_func=None, batch_shape=torch.Size([])):
    arc = ArcKernel(MaternKernel(nu=2.5), delta_func=delta_func, angle_prior=GammaPrior(0.5, 1.0),
                    radius_prior=GammaPrior(3.0, 2.0), ard_num_dims=3, batch_shape=batch_shape)
    kernel = ScaleKernel(arc, batch_shape=batch_shape).double()
    generator = torch.Generator().manual_seed(1)
    arc.angle = 0.15 + 0.7 * torch.rand(*batch_shape, 1, 3, dtype=F64, generator=generator)
    arc.radius = 0.5 + torch.rand(*batch_shape, 1, 3, dtype=F64, generator=generator)
    arc.lengthscale = 0.5 + torch.rand(*batch_shape, 1, 3, dtype=F64, generator=generator)
    return kernel


@pytest.mark.parametrize("delta_func", [None, relevant_first_two], ids=["default", "conditional"])
def test_converted_arc_kernel_is_unbiased_for_gpytorchs(delta_func):
    exact = exact_arc(delta_func, batch_shape=torch.Size([2]))
    sketched = rfgp.sketch(exact, 128, seed=0)
    assert type(sketched.base_kernel) is SketchedArcKernel and sketched.base_kernel.num_features == 128
    assert_unbiased(lambda seed: rfgp.sketch(exact, 128, seed=seed)(X).to_dense(), exact(X).to_dense().detach(),
                    num_seeds=60, num_se=4.0)


def test_gradients_in_angle_and_radius_match_finite_differences_and_gpytorchs_in_expectation():
    exact = exact_arc()
    weights = torch.randn(10, 10, dtype=F64, generator=torch.Generator().manual_seed(2))

    def loss(kernel):
        return (kernel(X).to_dense() * weights).sum()

    arc = rfgp.sketch(exact, 64, seed=0).base_kernel
    for name in ("raw_angle", "raw_radius"):
        raw = getattr(arc, name)
        gradient = torch.autograd.grad(loss(arc), raw)[0]
        for i in range(3):
            step = torch.zeros_like(raw)
            step[..., i] = 1e-6
            with torch.no_grad():
                raw += step
                up = loss(arc)
                raw -= 2 * step
                down = loss(arc)
                raw += step
            assert torch.isclose(gradient[..., i].squeeze(), (up - down) / 2e-6, rtol=1e-6, atol=1e-8)
    parameters = ("raw_angle", "raw_radius", "raw_lengthscale")
    target = torch.cat([g.flatten() for g in torch.autograd.grad(loss(exact.base_kernel),
                                                                 [getattr(exact.base_kernel, p) for p in parameters])])
    draws = torch.stack([torch.cat([g.flatten() for g in torch.autograd.grad(
        loss(sketched.base_kernel), [getattr(sketched.base_kernel, p) for p in parameters])])
        for sketched in (rfgp.sketch(exact, 128, seed=seed) for seed in range(60))])
    mean, se = draws.mean(0), draws.std(0) / 60**0.5
    assert ((mean - target).abs() <= 4.0 * se).all(), ((mean - target) / se)


def test_parameters_priors_and_state_dict_carry_over():
    exact = exact_arc()
    sketched = rfgp.sketch(exact, 64, seed=0)
    arc = sketched.base_kernel
    for name in ("angle", "radius", "lengthscale"):
        assert torch.equal(getattr(arc, name), getattr(exact.base_kernel, name))
        assert_copied_constraint(getattr(arc, f"raw_{name}_constraint"),
                                 getattr(exact.base_kernel, f"raw_{name}_constraint"))
    assert {n for n, *_ in sketched.named_priors()} == {n for n, *_ in exact.named_priors()}
    assert not arc.base_kernel.raw_lengthscale.requires_grad  # GPyTorch fixes the base lengthscale at 1
    fresh = rfgp.sketch(exact_arc(), 64, seed=0)
    with torch.no_grad():
        fresh.base_kernel.raw_angle.zero_()
        fresh.base_kernel.raw_radius.zero_()
    result = fresh.load_state_dict(exact.state_dict(), strict=False)
    assert result.unexpected_keys == [] and all("config_" in key for key in result.missing_keys)
    assert torch.equal(fresh(X).to_dense(), sketched(X).to_dense())
    again = rfgp.sketch(exact_arc(), 64, seed=7)
    again(X)
    again.load_state_dict(sketched.state_dict())
    assert torch.equal(again(X).to_dense(), sketched(X).to_dense())


def test_method_and_x_sample_reach_the_base_kernel_on_the_embedding():
    exact = exact_arc()
    assert rfgp.sketch(exact, 64, method="orf", seed=0).base_kernel.base_kernel.method == "orf"
    with pytest.raises(ValueError, match="methods of the kernels in this tree: MaternKernel.*got 'sketch'"):
        rfgp.sketch(exact, 64, method="sketch")
    wrong = ArcKernel(RBFKernel(ard_num_dims=3), ard_num_dims=3)  # the base sees 2·3 embedded columns
    with pytest.raises(ValueError, match="RBFKernel\\(ard_num_dims=3\\) sees 6 columns"):
        rfgp.sketch(wrong, 64, x_sample=X)


def test_arc_kernels_in_trees_and_the_structure_kernel_refusal():
    base = MaternKernel(nu=2.5)
    product = ProductKernel(*(ArcKernel(base, active_dims=[i]) for i in range(3))).double()
    assert_unbiased(lambda seed: rfgp.sketch(product, 256, seed=seed)(X).to_dense(), product(X).to_dense().detach(),
                    num_seeds=40, num_se=4.0)
    total = (exact_arc() + ScaleKernel(RBFKernel())).double()
    assert_unbiased(lambda seed: rfgp.sketch(total, 128, seed=seed)(X).to_dense(), total(X).to_dense().detach(),
                    num_seeds=40, num_se=4.0)
    with pytest.raises(TypeError, match="does not convert ProductStructureKernel over an ArcKernel: GPyTorch's "
                                        "ArcKernel.forward drops last_dim_is_batch"):
        rfgp.sketch(ProductStructureKernel(ScaleKernel(ArcKernel(base)), num_dims=3), 64)


def test_exact_gp_with_the_converted_arc_kernel_trains_its_angle_and_radius():
    generator = torch.Generator().manual_seed(4)
    x = torch.rand(50, 3, dtype=F64, generator=generator) * 2
    y = torch.sin(3 * x[:, 0]) * (x[:, 2] < 1) + 0.1 * torch.randn(50, dtype=F64, generator=generator)
    covar = rfgp.sketch(exact_arc(relevant_first_two), 256, seed=0)
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), covar).double()
    before = covar.base_kernel.angle.detach().clone(), covar.base_kernel.radius.detach().clone()
    history = rfgp.fit_mll(model, num_iterations=10)
    assert history.losses[-1] < history.losses[0]
    assert not torch.equal(covar.base_kernel.angle, before[0]) and not torch.equal(covar.base_kernel.radius, before[1])


def test_set_num_features_refits_a_data_dependent_base_on_the_embedding():
    exact = ArcKernel(RBFKernel(), ard_num_dims=3).double()
    resized = rfgp.sketch(exact, 64, method="maclaurin", x_sample=X, seed=0)
    rfgp.set_num_features(resized, 128, x_sample=X)
    built = rfgp.sketch(exact, 128, method="maclaurin", x_sample=X, seed=0)  # fitted on the embedded x_sample
    assert resized.base_kernel.feature_map.widths == built.base_kernel.feature_map.widths
    assert torch.equal(resized(X).to_dense(), built(X).to_dense())
