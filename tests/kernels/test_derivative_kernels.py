"""Sketched derivative kernels against GPyTorch's exact RBFKernelGrad, RBFKernelGradGrad,
Matern52KernelGrad and PolynomialKernelGrad: layout, unbiasedness (Monte Carlo over seeds, SE
tolerance), error decay with F, conversion, state_dict, end-to-end training with gradient data.
"""

import gpytorch
import pytest
import torch

import rfgp
from rfgp.inference.multioutput import MultitaskFeatureSpacePredictionStrategy
from rfgp.kernels import (
    SketchedMatern52KernelGrad,
    SketchedPolynomialKernelGrad,
    SketchedRBFKernelGrad,
    SketchedRBFKernelGradGrad,
)


def _exact(name):
    if name == "polynomial":
        kernel = gpytorch.kernels.PolynomialKernelGrad(power=2)
        kernel.offset = 0.5
        return kernel
    cls = {"rbf": gpytorch.kernels.RBFKernelGrad, "rbf_gradgrad": gpytorch.kernels.RBFKernelGradGrad,
           "matern52": gpytorch.kernels.Matern52KernelGrad}[name]
    kernel = cls(ard_num_dims=2)
    kernel.lengthscale = torch.tensor([[0.8, 1.3]])
    return kernel.double()


def _inputs(name, n=4):
    x = torch.randn(n, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    return x / 3 if name == "polynomial" else x


NAMES = ["rbf", "rbf_gradgrad", "matern52", "polynomial"]
SKETCHED = {"rbf": SketchedRBFKernelGrad, "rbf_gradgrad": SketchedRBFKernelGradGrad,
            "matern52": SketchedMatern52KernelGrad, "polynomial": SketchedPolynomialKernelGrad}


@pytest.mark.parametrize("name", NAMES)
def test_converted_kernel_has_gpytorchs_layout_and_is_unbiased(name):
    exact = _exact(name)
    x = _inputs(name)
    target = exact(x).to_dense()
    sketched = rfgp.sketch(exact, num_features=128, seed=0).double()
    assert type(sketched) is SKETCHED[name]
    outputs = exact.num_outputs_per_input(x, x)
    assert sketched.num_outputs_per_input(x, x) == outputs
    assert sketched(x).shape == target.shape == (4 * outputs, 4 * outputs)
    draws = torch.stack([rfgp.sketch(exact, 128, seed=s).double()(x).to_dense() for s in range(120)])
    mean, se = draws.mean(0), draws.std(0) / draws.shape[0] ** 0.5
    assert bool(((mean - target).abs() <= 4 * se + 1e-12).all()), ((mean - target).abs() / se).max()
    # the diagonal (also in GPyTorch's interleaved order) and a cross-covariance agree with the dense matrix
    torch.testing.assert_close(sketched(x, diag=True), torch.diagonal(sketched(x).to_dense()))
    torch.testing.assert_close(exact(x, diag=True), torch.diagonal(target))
    y = _inputs(name, 3) + 0.1
    cross = sketched(x, y).to_dense()
    assert cross.shape == exact(x, y).shape
    root_x, root_y = sketched.featurize(x), sketched.featurize(y)
    torch.testing.assert_close(cross, root_x @ root_y.mT)


@pytest.mark.parametrize("name", ["rbf", "rbf_gradgrad", "polynomial"])
def test_frobenius_error_shrinks_with_num_features(name):
    exact = _exact(name)
    x = _inputs(name, 6)
    target = exact(x).to_dense()

    def error(width):
        errors = [(rfgp.sketch(exact, width, seed=s).double()(x).to_dense() - target).norm() / target.norm()
                  for s in range(10)]
        return torch.stack(errors).pow(2).mean().sqrt()

    small, large = error(64), error(1024)
    # relative error ∝ F^{−1/2}: 16× the width gives ≈ 4× less error
    assert 2.5 < small / large < 6.5, (small, large)


def test_hyperparameters_constraints_and_priors_carry_over():
    exact = gpytorch.kernels.RBFKernelGrad(ard_num_dims=2, lengthscale_prior=gpytorch.priors.GammaPrior(3.0, 6.0))
    exact.lengthscale = torch.tensor([[0.4, 2.0]])
    sketched = rfgp.sketch(gpytorch.kernels.ScaleKernel(exact), 64, method="orf", seed=0)
    inner = sketched.base_kernel
    assert type(inner) is SketchedRBFKernelGrad and inner.method == "orf"
    torch.testing.assert_close(inner.lengthscale, exact.lengthscale)
    assert any(name.endswith("lengthscale_prior") for name, *_ in inner.named_priors())
    polynomial = gpytorch.kernels.PolynomialKernelGrad(power=3)
    polynomial.offset = 2.0
    converted = rfgp.sketch(polynomial, 64, seed=0)
    assert converted.power == 3
    torch.testing.assert_close(converted.offset, polynomial.offset)


def test_unsupported_derivative_kernels_raise_type_error():
    class MyRBFKernelGrad(gpytorch.kernels.RBFKernelGrad):
        """A user's variant: another covariance, which must not be matched to its parent."""

    with pytest.raises(TypeError, match="MyRBFKernelGrad"):
        rfgp.sketch(MyRBFKernelGrad(), 64)

    class LinearKernelGrad(gpytorch.kernels.Kernel):
        def num_outputs_per_input(self, x1, x2):
            return x1.shape[-1] + 1

    with pytest.raises(TypeError, match="LinearKernelGrad"):
        rfgp.sketch(gpytorch.kernels.ScaleKernel(LinearKernelGrad()), 64)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="method"):
        SketchedRBFKernelGrad(64, method="maclaurin")
    with pytest.raises(ValueError, match="nu"):
        SketchedMatern52KernelGrad(64, nu=1.5)
    with pytest.raises(ValueError, match="input_normalization"):
        SketchedPolynomialKernelGrad(2, 64, input_normalization="normalize")


def test_batch_shape_and_state_dict_round_trip():
    kernel = SketchedRBFKernelGradGrad(32, method="sorf", ard_num_dims=2, batch_shape=torch.Size([3]), seed=0)
    x = torch.randn(3, 5, 2)
    assert kernel(x).shape == (3, 25, 25)
    kernel.lengthscale = torch.rand(3, 1, 2) + 0.5
    state = kernel.state_dict()
    clone = SketchedRBFKernelGradGrad(32, method="sorf", ard_num_dims=2, batch_shape=torch.Size([3]), seed=7)
    clone.load_state_dict(state)
    torch.testing.assert_close(clone(x).to_dense(), kernel(x).to_dense(), rtol=0, atol=0)


def _franke_like(x):
    """f(x) = sin(2x₁)cos(3x₂) + x₁²/2 and its gradient: the observation columns [f, ∂₁f, ∂₂f]."""
    f = torch.sin(2 * x[:, 0]) * torch.cos(3 * x[:, 1]) + 0.5 * x[:, 0] ** 2
    grad = torch.stack((2 * torch.cos(2 * x[:, 0]) * torch.cos(3 * x[:, 1]) + x[:, 0],
                        -3 * torch.sin(2 * x[:, 0]) * torch.sin(3 * x[:, 1])), dim=-1)
    return torch.cat((f.unsqueeze(-1), grad), dim=-1)


class GradientGP(gpytorch.models.ExactGP):
    """GPyTorch's "GP regression with derivative information" model, kernel passed in."""

    def __init__(self, x, y, likelihood, kernel):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMeanGrad()
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel)

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))


def _fit(kernel, x, y, iterations=40):
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=3)
    model = GradientGP(x, y, likelihood, kernel).double()
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    for _ in range(iterations):
        optimizer.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        optimizer.step()
    model.eval()
    return model


def test_end_to_end_fit_with_gradient_observations_matches_exact_gp():
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(40, 2, dtype=torch.float64, generator=generator)
    y = _franke_like(x) + 0.02 * torch.randn(40, 3, dtype=torch.float64, generator=generator)
    test_x = torch.rand(30, 2, dtype=torch.float64, generator=generator)
    exact = _fit(gpytorch.kernels.RBFKernelGrad(ard_num_dims=2), x, y)
    sketched = _fit(rfgp.sketch(gpytorch.kernels.RBFKernelGrad(ard_num_dims=2), 512, method="orf", seed=0), x, y)
    with torch.no_grad():
        exact_pred = exact.likelihood(exact(test_x))
        sketched_pred = sketched.likelihood(sketched(test_x))
    assert isinstance(sketched.prediction_strategy, MultitaskFeatureSpacePredictionStrategy)
    assert sketched_pred.mean.shape == exact_pred.mean.shape == (30, 3)
    truth = _franke_like(test_x)
    exact_rmse = (exact_pred.mean - truth).pow(2).mean(0).sqrt()
    sketched_rmse = (sketched_pred.mean - truth).pow(2).mean(0).sqrt()
    # f and ∇f both predicted about as well as by the exact GP (and far better than the data's scale ~1)
    assert bool((sketched_rmse < 2 * exact_rmse + 0.02).all()), (sketched_rmse, exact_rmse)
    assert bool((sketched_pred.mean - exact_pred.mean).abs().max() < 0.1)
    assert bool((sketched_pred.variance > 0).all())


def test_sum_of_derivative_kernels_adds_their_joint_covariances():
    """AdditiveKernel(RBFKernelGrad, Matern52KernelGrad) converts to a sum whose root stacks the parts' roots."""
    tree = (gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernelGrad())
            + gpytorch.kernels.ScaleKernel(gpytorch.kernels.Matern52KernelGrad()))
    sketched = rfgp.sketch(tree, 256, seed=0).double()
    x = torch.randn(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    covar = sketched(x).to_dense()
    assert covar.shape == tree(x.float()).shape == (18, 18)
    parts = sum(part(x).to_dense() for part in sketched.kernels)
    torch.testing.assert_close(covar, parts, rtol=1e-12, atol=1e-12)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=3).double()
    y = torch.cat([x.sin().sum(-1, keepdim=True), x.cos()], -1)

    class Model(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(x, y, likelihood)
            self.mean_module, self.covar_module = gpytorch.means.ConstantMeanGrad(), sketched

        def forward(self, z):
            return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(z), self.covar_module(z))

    model = Model().double().eval()
    with torch.no_grad():
        mean = model(x[:3]).mean
    assert isinstance(model.prediction_strategy, MultitaskFeatureSpacePredictionStrategy)
    assert mean.shape == (3, 3) and bool(torch.isfinite(mean).all())


def test_derivative_kernels_on_active_dims_count_their_outputs_in_sums_scales_and_models():
    """Derivatives along columns [0, 2] of 3: 3 outputs per input.  The count was taken from all 3 columns (4) when
    a ScaleKernel, a sum or MultiOutputGPModel asked: the sum raised GPyTorch's "expected shape of the kernel was
    [4, 4], but got [3, 3]" and the model refused 3-column targets (asking for 4)."""
    columns = {"active_dims": [0, 2], "ard_num_dims": 2}
    tree = (gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernelGrad(**columns))
            + gpytorch.kernels.ScaleKernel(gpytorch.kernels.Matern52KernelGrad(**columns)))
    sketched = rfgp.sketch(tree, 256, seed=0).double()
    x = torch.rand(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert sketched.num_outputs_per_input(x, x) == sketched.kernels[0].num_outputs_per_input(x, x) == 3
    covar = sketched(x).to_dense()
    assert covar.shape == (15, 15)
    torch.testing.assert_close(covar, sum(part(x).to_dense() for part in sketched.kernels), rtol=1e-12, atol=1e-12)
    # the derivative rows are along columns 0 and 2: the parts on those columns alone give the same covariance
    torch.testing.assert_close(covar, rfgp.sketch(
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernelGrad(ard_num_dims=2))
        + gpytorch.kernels.ScaleKernel(gpytorch.kernels.Matern52KernelGrad(ard_num_dims=2)), 256, seed=0).double()(
        x[:, [0, 2]]).to_dense(), rtol=1e-12, atol=1e-12)
    y = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=3).double()
    model = rfgp.models.MultiOutputGPModel(x, y, likelihood, sketched.kernels[0]).eval()
    with torch.no_grad():
        assert model(x[:2]).mean.shape == (2, 3)


@pytest.mark.parametrize("other", [gpytorch.kernels.RBFKernelGrad, gpytorch.kernels.RBFKernel,
                                   lambda: gpytorch.kernels.PolynomialKernel(2)])
def test_products_with_a_derivative_kernel_are_refused(other):
    """The product of derivative kernels is not the derivative kernel of the product: never a silent scalar product."""
    with pytest.raises(TypeError, match="multiplies scalar kernels only"):
        rfgp.sketch(gpytorch.kernels.RBFKernelGrad() * other(), 256)


def test_a_sum_on_active_dims_counts_its_derivative_outputs_on_its_columns():
    """A FeatureSumKernel of derivative kernels with active_dims [0, 2] of 3 columns has 3 outputs per input.  Asked
    with all 3 columns (by a ScaleKernel, MultiOutputGPModel or a prediction strategy) its parts counted them all (4),
    so MultiOutputGPModel refused its 3-column targets ("covar_module has num_outputs_per_input=4")."""
    from rfgp.kernels import FeatureSumKernel

    def parts():
        return SketchedRBFKernelGrad(128, seed=0), SketchedMatern52KernelGrad(128, seed=1)

    x = torch.rand(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    on_columns = FeatureSumKernel(*parts(), active_dims=[0, 2]).double()
    alone = FeatureSumKernel(*parts()).double()
    assert on_columns.num_outputs_per_input(x, x) == 3
    assert gpytorch.kernels.ScaleKernel(on_columns).num_outputs_per_input(x, x) == 3
    torch.testing.assert_close(on_columns(x).to_dense(), alone(x[:, [0, 2]]).to_dense(), rtol=1e-12, atol=1e-12)
    means = []
    for kernel, inputs in ((on_columns, x), (alone, x[:, [0, 2]])):
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=3).double()
        model = rfgp.models.MultiOutputGPModel(inputs, y, likelihood, kernel).eval()
        with torch.no_grad():
            means.append(model(inputs[:2]).mean)
    torch.testing.assert_close(means[0], means[1], rtol=1e-10, atol=1e-10)


def test_nested_sums_of_derivative_kernels_on_active_dims_agree_by_their_parts_columns():
    """ScaleKernel(RBFKernelGrad + Matern52KernelGrad) + RBFKernelGrad, every derivative kernel on columns [0, 2]: the
    inner sum has no active_dims of its own, and its rows were taken to follow all 3 columns, so the valid tree was
    refused ("see the input columns [[0, 1, 2], [0, 2]]").  Parts on other columns are still refused."""
    kernels = gpytorch.kernels

    def tree(last_columns):
        columns = {"active_dims": [0, 2], "ard_num_dims": 2}
        inner = kernels.ScaleKernel(kernels.RBFKernelGrad(**columns) + kernels.Matern52KernelGrad(**columns))
        return inner + kernels.RBFKernelGrad(active_dims=last_columns, ard_num_dims=2)

    x = torch.rand(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    sketched = rfgp.sketch(tree([0, 2]), 256, seed=0).double()
    assert sketched.num_outputs_per_input(x, x) == 3
    covar = sketched(x).to_dense()
    assert covar.shape == (15, 15)
    torch.testing.assert_close(covar, sum(part(x).to_dense() for part in sketched.kernels), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"see the input columns \[\[0, 2\], \[2, 0\]\]"):
        rfgp.sketch(tree([2, 0]), 256, seed=0)(x).to_dense()
