"""Vector-field workflows as a geophysicist or oceanographer first runs them (raw units, wrapped kernels)."""

import warnings

import gpytorch
import pytest
import torch
from gpytorch.kernels import ScaleKernel
from gpytorch.likelihoods import MultitaskGaussianLikelihood

import rfgp
from rfgp.applications.vector_fields import posterior_component_fields, posterior_field_samples, prior_field_samples
from rfgp.datasets import EARTH_RADIUS_KM, helmholtz_field, igrf_field_at, igrf_magnetic_field
from rfgp.kernels import (
    CurlFreeRBFKernel,
    MultiOutputFeatureSumKernel,
    SketchedCurlFreeKernel,
    SketchedDivFreeKernel,
)
from rfgp.models.multioutput import MultiOutputGPModel

F64 = torch.float64


def _igrf_box_km(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """IGRF at n points of a 5° × 5° × 400 km box over Europe: Earth-centred Cartesian km and nT (raw units)."""
    generator = torch.Generator().manual_seed(0)
    latitude, longitude = 45 + 5 * torch.rand(2, n, generator=generator, dtype=F64)
    radius = EARTH_RADIUS_KM + 400 * torch.rand(n, generator=generator, dtype=F64)
    theta, phi = torch.deg2rad(90 - latitude), torch.deg2rad(longitude)
    direction = torch.stack((theta.sin() * phi.cos(), theta.sin() * phi.sin(), theta.cos()), -1)
    positions = direction * radius.unsqueeze(-1)
    return positions, igrf_field_at(positions / EARTH_RADIUS_KM) * 1000.0


@pytest.mark.parametrize("family", ["curl_free", "divergence_free", "helmholtz"])
def test_fit_mll_warns_when_a_vector_field_kernel_starts_far_below_the_data_scale(family):
    """Positions in km at GPyTorch's initial lengthscale 0.69 lie a median of ~400 lengthscales apart.  Before, the
    data-scale check skipped the operator-valued maps: the IGRF box (N = 2000, F = 512, nT targets, 50 L-BFGS
    steps) trained without a word to ℓ = 0.17 km and a noise of 3·10⁷ nT², a white-noise model with an RMSE of
    24 000 nT at the training points (5 nT from scaled inputs and targets)."""
    x, y = _igrf_box_km(200)
    curl_free = ScaleKernel(SketchedCurlFreeKernel(32, input_dim=3, seed=0))
    div_free = ScaleKernel(SketchedDivFreeKernel(32, input_dim=3, seed=1))
    kernel = {"curl_free": curl_free, "divergence_free": div_free,
              "helmholtz": MultiOutputFeatureSumKernel(curl_free, div_free)}[family]
    model = MultiOutputGPModel(x, y, MultitaskGaussianLikelihood(num_tasks=3, rank=0), kernel).to(F64)
    with pytest.warns(rfgp.DataScaleWarning, match=r"Sketched(CurlFree|DivFree)Kernel lie a median \d+ lengthscales"):
        rfgp.fit_mll(model, num_iterations=1, progress=False)
    # the advice (inputs on the scale of the lengthscale) silences it
    scaled = (x - x.mean(0)) / 300.0
    model = MultiOutputGPModel(scaled, y / y.std(), MultitaskGaussianLikelihood(num_tasks=3, rank=0), kernel).to(F64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.DataScaleWarning)
        rfgp.fit_mll(model, num_iterations=1, progress=False)


def test_helmholtz_components_with_a_scale_kernel_around_the_sum():
    """ScaleKernel(MultiOutputFeatureSumKernel(...)) trains and predicts; its components were refused (TypeError).
    With root √s·[R₁, R₂] each component is √s·Rᵢ(x)E[θᵢ | y], and they sum to the posterior mean minus the prior
    mean."""
    data = helmholtz_field(80, input_dim=2, noise=0.05, seed=3)
    helmholtz = MultiOutputFeatureSumKernel(ScaleKernel(SketchedCurlFreeKernel(64, 2, seed=0)),
                                            ScaleKernel(SketchedDivFreeKernel(64, 2, seed=1)))
    kernel = ScaleKernel(helmholtz)
    kernel.outputscale = 3.0
    mean = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(), num_tasks=2)
    model = MultiOutputGPModel(data["x"], data["y"], MultitaskGaussianLikelihood(num_tasks=2, rank=0), kernel,
                               mean_module=mean).to(F64)
    mean.base_means[0].constant.data.fill_(0.3)
    probe = torch.rand(7, 2, dtype=F64) * 2 - 1
    curl_part, div_part = posterior_component_fields(model)
    with torch.no_grad():
        total = curl_part(probe) + div_part(probe) + model.mean_module(probe)
        torch.testing.assert_close(total, model(probe).mean, rtol=1e-10, atol=1e-10)
    assert curl_part(probe).abs().max() > 1e-2 and div_part(probe).abs().max() > 1e-2  # both parts carry signal
    with pytest.raises(TypeError, match="MultiOutputFeatureSumKernel .*, optionally inside ScaleKernel, "
                                        "got ScaleKernel around SketchedCurlFreeKernel"):
        posterior_component_fields(MultiOutputGPModel(data["x"], data["y"], MultitaskGaussianLikelihood(num_tasks=2),
                                                      ScaleKernel(SketchedCurlFreeKernel(64, 2))).to(F64))


def test_helmholtz_components_of_a_sketched_exact_helmholtz_kernel():
    """rfgp.sketch of an exact Helmholtz kernel (GPyTorch's sum of curl- and divergence-free kernels) is a
    FeatureSumKernel of the sketched parts; posterior_component_fields refused it (TypeError naming
    MultiOutputFeatureSumKernel), though its root is the same [R_curl, R_div].  Its parts are each exactly curl- or
    divergence-free and sum to the posterior mean (rounding)."""
    data = helmholtz_field(60, input_dim=3, noise=0.05, seed=3)
    exact = gpytorch.kernels.AdditiveKernel(ScaleKernel(CurlFreeRBFKernel(3)),
                                            ScaleKernel(rfgp.kernels.DivFreeRBFKernel(3)))
    model = MultiOutputGPModel(data["x"], data["y"], MultitaskGaussianLikelihood(num_tasks=3, rank=0),
                               rfgp.sketch(exact, 3 * 64)).to(F64)
    probe = torch.rand(7, 3, dtype=F64, generator=torch.Generator().manual_seed(1)) * 2 - 1
    curl_part, div_part = posterior_component_fields(model)
    with torch.no_grad():
        torch.testing.assert_close(curl_part(probe) + div_part(probe), model(probe).mean, rtol=1e-10, atol=1e-10)
    assert curl_part(probe).abs().max() > 1e-2 and div_part(probe).abs().max() > 1e-2
    assert rfgp.applications.vector_fields.curl(curl_part, probe).abs().max() < 1e-12
    assert rfgp.applications.vector_fields.divergence(div_part, probe).abs().max() < 1e-12


def test_posterior_field_samples_of_a_gpytorch_sum_name_the_feature_sum():
    """ScaleKernel(curl) + ScaleKernel(div), GPyTorch's sum, trains and predicts (through GPyTorch's generic
    strategy), but has no weight space to sample: the error said "for exact kernels sample model(x)" although every
    part is an rfgp kernel; now it names MultiOutputFeatureSumKernel."""
    data = helmholtz_field(30, input_dim=2, noise=0.05, seed=3)
    kernel = ScaleKernel(SketchedCurlFreeKernel(32, 2, seed=0)) + ScaleKernel(SketchedDivFreeKernel(32, 2, seed=1))
    model = MultiOutputGPModel(data["x"], data["y"], MultitaskGaussianLikelihood(num_tasks=2), kernel).to(F64)
    with pytest.raises(TypeError, match=r"got AdditiveKernel: GPyTorch's k₁ \+ k₂ of rfgp kernels; use "
                                        r"MultiOutputFeatureSumKernel\(k₁, k₂\)"):
        posterior_field_samples(model, 2)
    exact = MultiOutputGPModel(data["x"], data["y"], MultitaskGaussianLikelihood(num_tasks=2),
                               ScaleKernel(CurlFreeRBFKernel(2))).to(F64)
    with pytest.raises(TypeError, match="got ScaleKernel: for exact kernels sample model"):
        posterior_field_samples(exact, 2)


def test_fit_mll_warns_when_the_targets_vary_less_than_the_noise_floor():
    """The IGRF field in tesla (variance ~10⁻⁹) under GPyTorch's noise floor (2·10⁻⁴ for independent task noises):
    before, a curl-free GP "converged" without a word to a posterior mean of ≈ 0 (relative RMSE 1.0 at the training
    points).  The same field in µT (variance ~600) trains without the warning."""
    positions, field = igrf_magnetic_field(100, seed=0)
    kernel = ScaleKernel(SketchedCurlFreeKernel(32, input_dim=3, seed=0))
    kernel.base_kernel.lengthscale = 0.6
    tesla = MultiOutputGPModel(positions, field * 1e-6, MultitaskGaussianLikelihood(num_tasks=3, rank=0), kernel)
    with pytest.warns(rfgp.DataScaleWarning, match=r"targets of outputs 0, 1, 2 vary with a variance of \d\.\d+e-10 or "
                                                   r"less, below the smallest noise variance the likelihood allows "
                                                   r"\(0\.0002"):
        rfgp.fit_mll(tesla.to(F64), num_iterations=1, progress=False)
    micro = MultiOutputGPModel(positions, field, MultitaskGaussianLikelihood(num_tasks=3, rank=0), kernel).to(F64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.DataScaleWarning)
        rfgp.fit_mll(micro, num_iterations=1, progress=False)
    # one output under the floor is named; NaN targets left out under observation_nan_policy("mask")
    mixed = field.clone()
    mixed[:, 2] = 1e-3 * mixed[:, 2] / mixed[:, 2].std()
    mixed[::4, 2] = float("nan")
    with gpytorch.settings.observation_nan_policy("mask"):
        model = MultiOutputGPModel(positions, mixed, MultitaskGaussianLikelihood(num_tasks=3, rank=1), kernel).to(F64)
        with pytest.warns(rfgp.DataScaleWarning, match=r"targets of output 2 vary with a variance of 1\.\d+e-06 or "
                                                       r"less, below .* \(0\.0001,"):
            rfgp.fit_mll(model, num_iterations=1, progress=False)


def test_single_output_targets_below_the_noise_floor_warn_too():
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(50, 1, generator=generator, dtype=F64)
    y = 1e-4 * torch.sin(6 * x[:, 0])
    kernel = ScaleKernel(rfgp.kernels.SketchedRBFKernel(32, seed=0))
    model = rfgp.models.ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(F64)
    with pytest.warns(rfgp.DataScaleWarning, match=r"training targets vary with a variance of 5\.\d+e-09 or less"):
        rfgp.fit_mll(model, num_iterations=1, progress=False)
    # a constant target carries no signal to lose: no warning
    model = rfgp.models.ExactGPModel(x, torch.full_like(y, 3.0), gpytorch.likelihoods.GaussianLikelihood(), kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.DataScaleWarning)
        rfgp.fit_mll(model.to(F64), num_iterations=1, progress=False)


@pytest.mark.parametrize("redraw", ["resample", "set_num_features"])
def test_field_samples_refuse_features_redrawn_after_them(redraw):
    """A posterior field is f(x) = μ(x) + Φ(x)θ with θ drawn for the features of its day.  Before, after
    ``feature_map.resample()`` the field paired θ with the new features without a word (an RMSE of 1.6 against the
    field's 0.26), and after ``rfgp.set_num_features`` it failed in a matrix product ("mat1 and mat2 shapes cannot be
    multiplied"); now both raise and say what to do, and a field drawn again is fine."""
    data = helmholtz_field(60, input_dim=2, noise=0.02, seed=1)
    kernel = ScaleKernel(SketchedCurlFreeKernel(64, 2, seed=0))
    model = MultiOutputGPModel(data["x"], data["curl_free"], MultitaskGaussianLikelihood(num_tasks=2), kernel).to(F64)
    probe = torch.rand(5, 2, dtype=F64)
    field = posterior_field_samples(model, 2, generator=torch.Generator().manual_seed(0))
    prior = prior_field_samples(kernel, 2, anchors=probe)
    (curl_part,) = posterior_component_fields(MultiOutputGPModel(
        data["x"], data["curl_free"], MultitaskGaussianLikelihood(num_tasks=2), MultiOutputFeatureSumKernel(kernel)))
    with torch.no_grad():
        field(probe), prior(probe), curl_part(probe)
        kernel.load_state_dict(kernel.state_dict())  # the same draws: still fine
        field(probe)
    if redraw == "resample":
        kernel.base_kernel.feature_map.resample(torch.Generator().manual_seed(7))
    else:
        rfgp.set_num_features(model, 128)
    for stale in (field, prior, curl_part):
        with pytest.raises(RuntimeError, match="re-drawn after this field was drawn .* draw the field again"):
            stale(probe)
    model.train()  # the model's own cache belongs to the old draws too (rfgp.set_num_features clears it itself)
    with torch.no_grad():
        assert posterior_field_samples(model, 2)(probe).shape == (2, 5, 2)


class _BatchFieldGP(gpytorch.models.ExactGP):
    """A batch of independent vector fields (e.g. one ocean-current map per day), the user's own ExactGP."""

    def __init__(self, x, y, kernel):
        batch, outputs = x.shape[:-2], y.shape[-1]
        super().__init__(x, y, MultitaskGaussianLikelihood(num_tasks=outputs, rank=0, batch_shape=batch))
        self.mean_module = gpytorch.means.MultitaskMean(gpytorch.means.ZeroMean(batch_shape=batch), num_tasks=outputs)
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))


@pytest.mark.parametrize("outer_scale", [False, True])
def test_helmholtz_components_of_a_batch_of_fields(outer_scale):
    """Two days of a 2-D flow in one batched model: the components sliced E[θ | y] along its batch axis instead of
    its feature axis (a matmul error); with a batched ScaleKernel around the sum its (2,) outputscales would have
    multiplied the p = 2 components instead of the batch members."""
    generator = torch.Generator().manual_seed(0)
    batch = torch.Size([2])
    x = torch.rand(2, 40, 2, generator=generator, dtype=F64)
    y = torch.randn(2, 40, 2, generator=generator, dtype=F64)
    kernel = MultiOutputFeatureSumKernel(
        ScaleKernel(SketchedCurlFreeKernel(64, 2, seed=0, batch_shape=batch), batch_shape=batch),
        ScaleKernel(SketchedDivFreeKernel(64, 2, seed=1, batch_shape=batch), batch_shape=batch))
    if outer_scale:
        kernel = ScaleKernel(kernel, batch_shape=batch)
        kernel.outputscale = torch.tensor([2.0, 5.0])
    model = _BatchFieldGP(x, y, kernel).to(F64)
    probe = torch.rand(2, 5, 2, generator=generator, dtype=F64)
    parts = posterior_component_fields(model)
    with torch.no_grad():
        total = sum(part(probe) for part in parts)
        torch.testing.assert_close(total, model(probe).mean, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("exact", [True, False])
def test_prior_samples_of_a_batched_kernel_have_each_members_covariance(exact):
    """A kernel with batch_shape (2,) (two lengthscales): before, the S weight draws met the batch axis — S = 2 returned
    (2, n, p) pairing sample s with member s (exact kernels: (2, 2, n, p) mixing one member's cross-covariance with the
    other's coefficients), other S failed in a broadcast.  Now (S, 2, n, p), each member's samples with its
    covariance."""
    batch = torch.Size([2])
    kernel = (CurlFreeRBFKernel(2, batch_shape=batch) if exact
              else SketchedCurlFreeKernel(64, 2, seed=0, batch_shape=batch)).to(F64)
    kernel.lengthscale = torch.tensor([0.3, 1.0], dtype=F64).view(2, 1, 1)
    anchors = torch.rand(6, 2, dtype=F64, generator=torch.Generator().manual_seed(0))
    num_samples = 4000
    field = prior_field_samples(kernel, num_samples, anchors=anchors, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        values = field(anchors[:2]).reshape(num_samples, 2, 4)  # (S, member, 2 points × 2 components)
        target = kernel(anchors[:2]).to_dense()  # (member, 4, 4)
    assert field(anchors[:3]).shape == (num_samples, 2, 3, 2)
    empirical = torch.einsum("sbi,sbj->bij", values, values) / num_samples
    diagonal = target.diagonal(dim1=-2, dim2=-1)
    stderr = (diagonal.unsqueeze(-1) * diagonal.unsqueeze(-2) + target**2).sqrt() / num_samples**0.5
    assert ((empirical - target).abs() <= 4 * stderr).all()
    assert target[0].diagonal().mean() > 5 * target[1].diagonal().mean()  # the members differ (K(x, x) = I/ℓ²)
