"""Physics checks: prior samples of curl-free GPs have zero curl, of div-free GPs zero divergence."""

import gpytorch
import pytest
import torch
from gpytorch.likelihoods import MultitaskGaussianLikelihood

from rfgp.applications.vector_fields import (
    curl,
    divergence,
    jacobian,
    posterior_field_samples,
    posterior_mean_field,
    prior_field_samples,
)
from rfgp.datasets import helmholtz_field, igrf_field_at, igrf_magnetic_field
from rfgp.inference.multioutput import MultitaskFeatureSpacePredictionStrategy
from rfgp.kernels import CurlFreeRBFKernel, DivFreeRBFKernel, SketchedCurlFreeKernel, SketchedDivFreeKernel
from rfgp.models.multioutput import MultiOutputGPModel

F64 = torch.float64


def test_jacobian_divergence_curl_on_known_fields():
    x = torch.randn(7, 3, dtype=F64)
    rotation = lambda z: torch.stack((-z[..., 1], z[..., 0], torch.zeros_like(z[..., 0])), -1)  # noqa: E731
    torch.testing.assert_close(curl(rotation, x), torch.tensor([0.0, 0.0, 2.0], dtype=F64).expand(7, 3))
    torch.testing.assert_close(divergence(rotation, x), torch.zeros(7, dtype=F64))
    radial = lambda z: z * 3.0  # noqa: E731
    torch.testing.assert_close(divergence(radial, x), torch.full((7,), 9.0, dtype=F64))
    torch.testing.assert_close(jacobian(radial, x), 3.0 * torch.eye(3, dtype=F64).expand(7, 3, 3))
    with pytest.raises(ValueError, match="d = 2 or 3"):
        curl(lambda z: z, torch.randn(3, 4))
    with pytest.raises(ValueError, match="as many outputs"):
        divergence(lambda z: z[..., :2], torch.randn(3, 3))


@pytest.mark.parametrize("check", [jacobian, divergence, curl])
def test_a_field_that_is_not_callable_is_refused_by_name(check):
    """A tensor of field values instead of the field used to fail with Python's "'Tensor' object is not callable"."""
    x = torch.randn(5, 2, dtype=F64)
    with pytest.raises(TypeError, match=r"field must be a callable x -> f\(x\).*got Tensor"):
        check(x * 2, x)


@pytest.mark.parametrize("check", [jacobian, divergence, curl])
def test_points_without_an_n_axis_are_refused_by_name(check):
    """x of shape (d,) read as one point without its n axis: divergence(identity, x) of 5 values returned the 5-D
    identity's divergence 5 (a scalar, not one value per point), curl said "got d=5" of what the user meant as five
    1-D points."""
    with pytest.raises(ValueError, match=r"x must hold points as \(\.\.\., n, d\), got shape \(5,\): pass "
                                         r"x.reshape\(1, -1\) for one point"):
        check(lambda z: z, torch.randn(5, dtype=F64))


def _relative(values, jac):
    return (values.abs().max() / jac.abs().max()).item()


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("exact", [True, False])
def test_prior_samples_satisfy_the_constraint(d, exact):
    """max|curl| (curl-free) and max|div| (div-free) ≤ 1e-8·max|J|; the other operator is O(1)."""
    generator = torch.Generator().manual_seed(d)
    anchors = torch.rand(15, d, generator=generator, dtype=F64) * 2 - 1
    probe = torch.rand(40, d, generator=generator, dtype=F64) * 2 - 1
    if exact:
        curl_kernel, div_kernel = CurlFreeRBFKernel(d).to(F64), DivFreeRBFKernel(d).to(F64)
    else:
        curl_kernel = SketchedCurlFreeKernel(256, d, seed=0).to(F64)
        div_kernel = SketchedDivFreeKernel(256 * (d - 1), d, method="orf", seed=0).to(F64)
    for kernel in (curl_kernel, div_kernel):
        kernel.lengthscale = 0.5
    curl_field = prior_field_samples(curl_kernel, 4, anchors=anchors, generator=generator)
    div_field = prior_field_samples(div_kernel, 4, anchors=anchors, generator=generator)
    curl_jac, div_jac = jacobian(curl_field, probe), jacobian(div_field, probe)
    assert curl_jac.shape == (4, 40, d, d)
    assert _relative(curl_jac - curl_jac.mT, curl_jac) < 1e-8
    assert _relative(div_jac.diagonal(dim1=-2, dim2=-1).sum(-1), div_jac) < 1e-8
    # the complementary quantities are not zero: the checks can fail
    assert _relative(div_jac - div_jac.mT, div_jac) > 1e-2
    assert _relative(curl_jac.diagonal(dim1=-2, dim2=-1).sum(-1), curl_jac) > 1e-2
    torch.testing.assert_close(divergence(div_field, probe), div_jac.diagonal(dim1=-2, dim2=-1).sum(-1))


def test_exact_prior_samples_interpolate_and_have_the_kernel_covariance():
    anchors = torch.rand(6, 2, dtype=F64)
    kernel = CurlFreeRBFKernel(2).to(F64)
    field = prior_field_samples(kernel, 4000, anchors=anchors, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        values = field(anchors[:2]).reshape(4000, -1)
        target = kernel(anchors[:2]).to_dense()
    empirical = values.T @ values / values.shape[0]
    stderr = (target.diagonal().outer(target.diagonal()) + target**2).sqrt() / 4000**0.5
    assert ((empirical - target).abs() <= 4 * stderr).all()


@pytest.mark.parametrize("kernel_space", [True, False])
def test_posterior_samples_and_mean_field(kernel_space, monkeypatch):
    """In either algebra of the prediction strategy (N·p = 120 rows, F = 128: kernel space is the cheaper)."""
    monkeypatch.setattr(MultitaskFeatureSpacePredictionStrategy, "uses_kernel_space", property(lambda _: kernel_space))
    data = helmholtz_field(60, input_dim=2, noise=0.02, seed=1)
    kernel = gpytorch.kernels.ScaleKernel(SketchedCurlFreeKernel(128, 2, seed=0))
    likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=0)
    model = MultiOutputGPModel(data["x"], data["curl_free"], likelihood, kernel).to(F64)
    kernel.base_kernel.lengthscale = 0.4
    probe = torch.rand(30, 2, dtype=F64) * 2 - 1
    mean_field = posterior_mean_field(model)
    assert curl(mean_field, probe).abs().max() < 1e-8 * jacobian(mean_field, probe).abs().max()
    samples = posterior_field_samples(model, 3000, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        values = samples(probe[:3])
        posterior = model(probe[:3])
    assert values.shape == (3000, 3, 2)
    stderr_mean = posterior.variance.sqrt() / 3000**0.5
    assert ((values.mean(0) - posterior.mean).abs() <= 4 * stderr_mean).all()
    ratio = values.var(0) / posterior.variance
    assert ((ratio - 1).abs() < 4 * (2 / 2999) ** 0.5).all()
    few = posterior_field_samples(model, 3, generator=torch.Generator().manual_seed(1))
    assert curl(few, probe).abs().max() < 1e-8 * jacobian(few, probe).abs().max()


def test_physics_checks_inside_autocast_are_the_full_precision_ones():
    """divergence/curl under ``torch.autocast`` (e.g. a mixed-precision script) used to raise rfgp's
    "backward() was called inside torch.autocast … call loss.backward() after leaving" from jacobian's own
    autograd.grad, a call the user never made; the derivatives are now taken in full precision."""
    data = helmholtz_field(40, input_dim=2, noise=0.02, seed=1, dtype=torch.float32)
    kernel = gpytorch.kernels.ScaleKernel(SketchedDivFreeKernel(128, 2, seed=0))
    model = MultiOutputGPModel(data["x"], data["divergence_free"], MultitaskGaussianLikelihood(num_tasks=2, rank=0),
                               kernel)
    mean_field = posterior_mean_field(model)
    probe = data["x"][:10]
    reference = jacobian(mean_field, probe)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        jac = jacobian(mean_field, probe)
        div = divergence(mean_field, probe)
    torch.testing.assert_close(jac, reference)
    assert jac.dtype == torch.float32
    assert div.abs().max() < 1e-5 * reference.abs().max()


def test_igrf_field_is_curl_free_and_physical():
    positions, field = igrf_magnetic_field(200, altitude_km=(0.0, 0.0), seed=0)
    assert positions.shape == field.shape == (200, 3)
    torch.testing.assert_close(positions.norm(dim=-1), torch.ones(200, dtype=F64))
    strength = field.norm(dim=-1)
    assert 20.0 < strength.min() and strength.max() < 70.0  # µT at the surface
    # Around a small closed loop the circulation of B (a gradient field) vanishes.
    angles = torch.linspace(0, 2 * torch.pi, 401, dtype=F64)[:-1]
    center = torch.tensor([0.3, 0.5, 0.9], dtype=F64)
    loop = center / center.norm() * 1.05 + 0.01 * torch.stack((angles.cos(), angles.sin(), 0 * angles), -1)
    b = igrf_field_at(loop)
    tangent = torch.roll(loop, -1, 0) - loop
    circulation = (0.5 * (b + torch.roll(b, -1, 0)) * tangent).sum()
    assert circulation.abs() < 1e-4 * b.norm(dim=-1).mean() * tangent.norm(dim=-1).sum()
    torch.testing.assert_close(igrf_field_at(positions[:5]), field[:5])


def test_dataset_bad_input():
    with pytest.raises(ValueError, match="input_dim must be 2 or 3"):
        helmholtz_field(10, input_dim=4)
    with pytest.raises(ValueError, match="max_degree"):
        igrf_magnetic_field(10, max_degree=20)


def test_field_samples_on_a_grid_over_the_memory_budget_are_featurised_block_by_block():
    """Before: a field sample featurised the whole grid at once (10⁵ points in 3-D at F = 1024: 4.7 GiB peak under a
    1 GiB budget); now ≤ chunk points at a time, with the same values, and still differentiable (curl ≈ 0)."""
    import rfgp

    generator = torch.Generator().manual_seed(0)
    x = torch.rand(30, 3, generator=generator, dtype=F64) * 2 - 1
    y = torch.randn(30, 3, generator=generator, dtype=F64)
    kernel = gpytorch.kernels.ScaleKernel(SketchedCurlFreeKernel(64, input_dim=3, seed=0))
    model = MultiOutputGPModel(x, y, MultitaskGaussianLikelihood(num_tasks=3, rank=0), kernel).to(F64)
    grid = torch.rand(200, 3, generator=generator, dtype=F64) * 2 - 1
    field = posterior_field_samples(model, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = field(grid)
    sizes = []
    featurize = kernel.base_kernel.featurize
    kernel.base_kernel.featurize = lambda z: sizes.append(z.shape[-2]) or featurize(z)
    with rfgp.settings.chunk_size(30), torch.no_grad():  # 30 root rows: 10 points per block
        blocked = field(grid)
    assert max(sizes) <= 10 and sum(sizes) == 200
    torch.testing.assert_close(blocked, whole, rtol=1e-12, atol=1e-12)
    with rfgp.settings.chunk_size(30):
        assert curl(field, grid[:20]).abs().max() < 1e-10


def test_field_blocks_of_a_batch_kernel_count_every_batch_member_against_the_memory_budget():
    """Before: a field of a kernel with batch_shape B sized its blocks by the batch of x alone, so at x (n, d) the
    (*B, n·p, F) features of all n points were made at once, B times over rfgp.settings.memory_budget."""
    import rfgp
    from rfgp.core.settings import WORKING_COPIES

    kernel = SketchedCurlFreeKernel(64, input_dim=3, seed=0, batch_shape=torch.Size([8])).to(F64)
    x = torch.rand(100, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    field = prior_field_samples(kernel, 2, anchors=x[:5], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = field(x)
    sizes = []
    featurize = kernel.featurize
    kernel.featurize = lambda z: sizes.append(z.shape[-2]) or featurize(z)
    # room for the 300 × 64 root of 2 of the 8 batch members: blocks of at most 25 points
    with rfgp.settings.memory_budget(WORKING_COPIES * 64 * 300 * 8 * 2), torch.no_grad():
        blocked = field(x)
    assert max(sizes) <= 25 and sum(sizes) == 100
    torch.testing.assert_close(blocked, whole, rtol=1e-12, atol=1e-12)


def test_prior_field_samples_of_a_feature_kernel_size_the_features_on_one_anchor():
    """Before: the anchors, documented as a probe that sizes the features, were featurised whole (the unchunked
    n·p × F root of every point passed, e.g. all training inputs); now one point sizes them, with the same draws."""
    kernel = SketchedDivFreeKernel(64, input_dim=3, seed=0).to(F64)
    x = torch.rand(50, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    sizes = []
    featurize = kernel.featurize
    kernel.featurize = lambda z: sizes.append(z.shape[-2]) or featurize(z)
    field = prior_field_samples(kernel, 3, anchors=x, generator=torch.Generator().manual_seed(1))
    assert sizes == [1]
    weights = torch.randn(3, 64, generator=torch.Generator().manual_seed(1), dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(field(x), (featurize(x) @ weights.mT).mT.reshape(3, 50, 3), rtol=1e-12, atol=1e-12)
