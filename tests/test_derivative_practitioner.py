"""A practitioner's pass over GPs with derivative observations (GPyTorch's "GP regression with derivative
information" recipe with the kernel converted by ``rfgp.sketch``).

Layout, unbiasedness, Frobenius decay, conversion, state_dict and end-to-end training are in
``tests/kernels/test_derivative_kernels.py``; missing targets against the dense GP in
``tests/inference/test_multioutput_kernel_space.py``; chunked training in
``tests/inference/test_multioutput_chunked_training.py``.  Here: the posterior at the exact model's hyperparameters
as F grows, predicted gradients against autograd of the predicted values, gradient fields of posterior samples,
finite-difference MLL gradients with partial gradient observations, a BoTorch model, and trees that are refused.
"""

import gpytorch
import pytest
import torch
from gpytorch.kernels import (
    LinearKernel,
    Matern52KernelGrad,
    PolynomialKernelGrad,
    RBFKernel,
    RBFKernelGrad,
    RBFKernelGradGrad,
    ScaleKernel,
)

import rfgp

F64 = torch.float64


class DerivativeGP(gpytorch.models.ExactGP):
    """GPyTorch's derivative-observation model: ConstantMeanGrad (ConstantMeanGradGrad for 2d + 1 outputs)."""

    def __init__(self, x, y, likelihood, covar_module):
        super().__init__(x, y, likelihood)
        second = y.shape[-1] == 2 * x.shape[-1] + 1 and x.shape[-1] > 0 and y.shape[-1] > 2
        self.mean_module = gpytorch.means.ConstantMeanGradGrad() if second else gpytorch.means.ConstantMeanGrad()
        self.covar_module = covar_module

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))


def _data(n, d, outputs, seed=0):
    """f(x) = sin(wᵀx), w = (1, …, d), observed with its gradient (and diagonal second derivatives), noise 0.01."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=F64)
    w = torch.arange(1, d + 1, dtype=F64)
    columns = [torch.sin(x @ w).unsqueeze(-1), torch.cos(x @ w).unsqueeze(-1) * w]
    if outputs == 2 * d + 1:
        columns.append(-torch.sin(x @ w).unsqueeze(-1) * w**2)
    y = torch.cat(columns, -1)
    return x, y + 0.01 * torch.randn(y.shape, generator=g, dtype=F64)


def _model(covar_module, x, y, **likelihood_options):
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=y.shape[-1], **likelihood_options)
    return DerivativeGP(x, y, likelihood, covar_module).to(F64)


def _posterior_errors(exact, num_features, seed, x, y, test_x):
    """|ΔMLL|, max |Δ mean| of the values and of the gradients, max relative Δ predictive variance against the exact
    model, with the sketched model at the exact model's hyperparameters."""
    results = []
    for kernel in (exact, rfgp.sketch(exact, num_features, seed=seed)):
        model = _model(kernel, x, y)
        with torch.no_grad():
            model.likelihood.noise = 0.01
            model.likelihood.task_noises = torch.tensor([0.01, 0.02, 0.03], dtype=F64)
        model.train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        with torch.no_grad():
            value = mll(model(x), y)
            model.eval()
            predictive = model.likelihood(model(test_x))
        results.append((value, predictive.mean, predictive.variance))
    (value, mean, variance), (sketched_value, sketched_mean, sketched_variance) = results
    difference = (sketched_mean - mean).abs()
    return torch.stack([(sketched_value - value).abs(), difference[:, 0].max(), difference[:, 1:].max(),
                        ((sketched_variance - variance).abs() / variance).max()])


def test_posterior_at_the_exact_hyperparameters_approaches_the_exact_gp_as_f_grows():
    """MLL, predicted values, predicted gradients and predictive variances of GPyTorch's RBFKernelGrad model, with
    the kernel converted at the same hyperparameters: errors ∝ F^{−1/2}, so 64× the width gives ≈ 8× less."""
    x, y = _data(30, 2, 3)
    test_x, _ = _data(8, 2, 3, seed=1)
    exact = ScaleKernel(RBFKernelGrad(ard_num_dims=2)).to(F64)
    with torch.no_grad():
        exact.base_kernel.lengthscale = torch.tensor([0.6, 0.9], dtype=F64)
        exact.outputscale = 1.5
    small = torch.stack([_posterior_errors(exact, 256, seed, x, y, test_x) for seed in range(4)]).mean(0)
    large = torch.stack([_posterior_errors(exact, 16384, seed, x, y, test_x) for seed in range(4)]).mean(0)
    assert bool((large < small / 3).all()), (small, large)
    # at F = 16384: 0.0019 of MLL per observation, 4e-4 and 0.0045 in the means of f and ∇f (scale 1–2), 4.4 %
    assert bool((large < torch.tensor([4e-3, 1e-3, 0.01, 0.09], dtype=F64)).all()), large


def _sketched(name, d):
    if name == "polynomial":
        return rfgp.sketch(ScaleKernel(PolynomialKernelGrad(power=3)), 128, seed=0)
    kernel = {"rbf": RBFKernelGrad, "rbf_gradgrad": RBFKernelGradGrad, "matern52": Matern52KernelGrad}[name]
    return rfgp.sketch(ScaleKernel(kernel(ard_num_dims=d)), 128, seed=0)


@pytest.mark.parametrize("name", ["rbf", "rbf_gradgrad", "matern52", "polynomial"])
@pytest.mark.parametrize("d", [1, 3])
def test_predicted_gradients_are_the_derivatives_of_the_predicted_values(name, d):
    """With k̂ = ΦᵀΦ the posterior mean of ∂ⱼf is ∂ⱼ of the posterior mean of f (ℓⱼ⁻¹ chain factors, scale)."""
    outputs = 2 * d + 1 if name == "rbf_gradgrad" else d + 1
    x, y = _data(20, d, outputs)
    model = _model(_sketched(name, d), x, y / 2 if name == "polynomial" else y)
    with torch.no_grad():
        model.covar_module.outputscale = 1.7
        if name != "polynomial":
            model.covar_module.base_kernel.lengthscale = torch.linspace(0.4, 1.2, d, dtype=F64)
    model.eval()
    test_x = torch.rand(5, d, dtype=F64, generator=torch.Generator().manual_seed(4), requires_grad=True)
    mean = model(test_x).mean
    (gradient,) = torch.autograd.grad(mean[:, 0].sum(), test_x, create_graph=True)
    torch.testing.assert_close(gradient, mean[:, 1:d + 1], atol=1e-10, rtol=1e-10)
    if name == "rbf_gradgrad":
        second = torch.stack([torch.autograd.grad(gradient[:, j].sum(), test_x, retain_graph=True)[0][:, j]
                              for j in range(d)], -1)
        torch.testing.assert_close(second, mean[:, d + 1:], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("prior", [False, True])
def test_sampled_gradient_fields_are_the_derivatives_of_the_sampled_functions(prior):
    """Joint samples at x and x + h·eⱼ: the sampled ∂ⱼf is the finite difference of the sampled f (one draw of the
    posterior's low-rank root for all rows, in prior mode too)."""
    x, y = _data(40, 2, 3)
    model = _model(_sketched("rbf", 2), x, y)
    with torch.no_grad():
        model.covar_module.base_kernel.lengthscale = torch.tensor([0.3, 0.5], dtype=F64)
    model.eval()
    h = 1e-6
    start = torch.rand(4, 2, dtype=F64, generator=torch.Generator().manual_seed(5))
    points = torch.cat([start, start + torch.tensor([h, 0.0], dtype=F64), start + torch.tensor([0.0, h], dtype=F64)])
    torch.manual_seed(0)
    with torch.no_grad(), gpytorch.settings.prior_mode(prior):
        samples = model(points).rsample(torch.Size([3]))
    values = samples[..., 0]
    differences = torch.stack([values[:, 4:8] - values[:, :4], values[:, 8:] - values[:, :4]], -1) / h
    assert samples[:, :4, 1:].abs().max() > 0.5  # a gradient field, not zeros
    torch.testing.assert_close(differences, samples[:, :4, 1:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("chunk_rows", [None, 5 * 7])
def test_partial_gradient_observations_train_with_the_exact_gradient(chunk_rows):
    """Values everywhere, second derivatives and some gradient components at some points only (NaN targets under
    observation_nan_policy("mask")), correlated task noise: the MLL's gradient in every hyperparameter is the
    central finite difference of the MLL, with and without a chunked root."""
    x, y = _data(20, 2, 5)
    y[::3, 1] = float("nan")
    y[5:12, 1:] = float("nan")
    model = _model(rfgp.sketch(ScaleKernel(RBFKernelGradGrad(ard_num_dims=2)), 64, seed=0), x, y, rank=1)
    with torch.no_grad():
        model.likelihood.task_noise_covar_factor.copy_(torch.tensor([[0.3], [0.1], [-0.2], [0.05], [0.1]]))
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    parameters = list(model.parameters())

    def loss():
        with gpytorch.settings.observation_nan_policy("mask"), rfgp.settings.chunk_size(chunk_rows):
            return -mll(model(x), y)

    gradients = torch.autograd.grad(loss(), parameters)
    for parameter, gradient in zip(parameters, gradients):
        for i in range(parameter.numel()):
            with torch.no_grad():
                parameter.view(-1)[i] += 1e-6
                up = loss()
                parameter.view(-1)[i] -= 2e-6
                down = loss()
                parameter.view(-1)[i] += 1e-6
            torch.testing.assert_close(gradient.reshape(-1)[i], (up - down) / 2e-6, atol=1e-7, rtol=1e-5)


def test_a_botorch_model_with_gradient_observations():
    """BoTorch has no model with derivative observations; a GPyTorchModel around the recipe (d + 1 outputs) fits with
    fit_gpytorch_mll, its posterior is the model's, and condition_on_observations equals the model on all the data."""
    pytest.importorskip("botorch")
    from botorch.fit import fit_gpytorch_mll
    from botorch.models.gpytorch import GPyTorchModel

    class GradientModel(DerivativeGP, GPyTorchModel):
        _num_outputs = 3

    x, y = _data(20, 2, 3)
    test_x, _ = _data(6, 2, 3, seed=1)
    model = GradientModel(x, y, gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=3),
                          rfgp.sketch(ScaleKernel(RBFKernelGrad(ard_num_dims=2)), 256, seed=0)).to(F64)
    fit_gpytorch_mll(gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model))
    model.eval()
    posterior = model.posterior(test_x)
    with torch.no_grad():
        direct = model(test_x)
    assert posterior.mean.shape == (6, 3)
    torch.testing.assert_close(posterior.mean, direct.mean)
    torch.testing.assert_close(posterior.variance, direct.variance)
    new_x, new_y = _data(4, 2, 3, seed=2)
    conditioned = model.condition_on_observations(new_x, new_y).posterior(test_x)
    everything = GradientModel(torch.cat([x, new_x]), torch.cat([y, new_y]), model.likelihood, model.covar_module)
    everything.mean_module = model.mean_module
    reference = everything.eval().posterior(test_x)
    torch.testing.assert_close(conditioned.mean, reference.mean)
    torch.testing.assert_close(conditioned.variance, reference.variance)


@pytest.mark.parametrize("other, outputs", [(lambda: ScaleKernel(RBFKernel()), 1),
                                            (lambda: ScaleKernel(LinearKernel()), 1),
                                            (lambda: RBFKernelGradGrad(), 5)])
def test_a_sum_of_a_derivative_kernel_and_another_output_count_is_refused_by_name(other, outputs):
    """RBFKernelGrad + RBFKernel (a trend on the values, say) cannot add covariances of 3 and 1 outputs per input
    (GPyTorch's exact sum fails too); the converted sum raised torch.cat's "Sizes of tensors must match"."""
    sketched = rfgp.sketch(ScaleKernel(RBFKernelGrad()) + other(), 256, seed=0)
    with pytest.raises(ValueError, match=rf"have \[3, {outputs}\] outputs per input .* need the same outputs"):
        sketched(torch.rand(5, 2, dtype=F64)).to_dense()


@pytest.mark.parametrize("first, second", [([0], [1]), ([0, 1], [1, 0])])
def test_a_sum_of_derivative_kernels_on_other_columns_is_refused_by_name(first, second):
    """A derivative kernel's rows are ∂/∂x of the columns its active_dims select: parts on [0] and [1] have as many
    rows each, and the converted sum added ∂/∂x₀ rows to ∂/∂x₁ rows silently (GPyTorch's exact sum does so for
    [0, 1] + [1, 0] too).  The same columns in another spelling (None on two columns, [0, 1]) still add."""
    x = torch.rand(5, 2, dtype=F64)
    sketched = rfgp.sketch(ScaleKernel(RBFKernelGrad(active_dims=first)) + RBFKernelGrad(active_dims=second), 64,
                           seed=0)
    with pytest.raises(ValueError, match=r"see the input columns .* same active_dims"):
        sketched(x).to_dense()
    same = rfgp.sketch(ScaleKernel(RBFKernelGrad(active_dims=[0, 1])) + RBFKernelGrad(), 64, seed=0)
    assert same(x).to_dense().shape == (15, 15)


def test_a_sum_of_multitask_kernels_on_other_columns_still_adds():
    """The derivative-column check is for rows that are derivatives along the columns: a multitask (LCM-style) sum
    whose parts see other columns has the same tasks in its rows, and GPyTorch adds them; it was refused as
    "derivatives along its own columns".  Against the exact sum, to Monte-Carlo error at F = 8192."""
    x = torch.rand(6, 2, dtype=F64)
    exact = (gpytorch.kernels.MultitaskKernel(RBFKernel(), num_tasks=2, rank=1, active_dims=[0])
             + gpytorch.kernels.MultitaskKernel(gpytorch.kernels.MaternKernel(), num_tasks=2, rank=1,
                                                active_dims=[1])).to(F64)
    sketched = rfgp.sketch(exact, 8192, seed=0).to(F64)
    with torch.no_grad():
        torch.testing.assert_close(sketched(x).to_dense(), exact(x).to_dense(), atol=0.05, rtol=0)


@pytest.mark.parametrize("kernel", [RBFKernelGrad, lambda: ScaleKernel(Matern52KernelGrad())])
def test_nystrom_of_a_derivative_kernel_points_to_random_features(kernel):
    """method="nystrom" refused a derivative kernel saying to use SketchedDecomposableKernel (a multitask kernel,
    another model), and only after choosing landmarks (with fewer points than F: a landmark-count error first)."""
    x = torch.rand(20, 2, dtype=F64)
    with pytest.raises(TypeError, match="3 outputs per input.*without method='nystrom'") as raised:
        rfgp.sketch(kernel(), 64, method="nystrom", x_sample=x)
    assert "SketchedDecomposableKernel" not in str(raised.value)


@pytest.mark.parametrize("method", ["maclaurin", "random_maclaurin"])
def test_polynomial_gradient_kernel_refuses_the_maclaurin_maps_by_name(method):
    """SketchedPolynomialKernelGrad(2, F, method="maclaurin") was built, then its first evaluation raised
    "AttributeError: 'OptimizedMaclaurin' object has no attribute 'input_derivatives'"."""
    with pytest.raises(ValueError, match=f"method must be one of 'sketch'; got '{method}'"):
        rfgp.kernels.SketchedPolynomialKernelGrad(2, 64, method=method)


def test_exact_gp_model_refuses_a_derivative_kernel_by_name():
    """rfgp.models.ExactGPModel (one output per input) took a derivative kernel, then its first call failed in
    GPyTorch with "Attempting to broadcast a dimension of length 8 ... broadcastable to [24, 24]"."""
    kernel, train_x = rfgp.sketch(ScaleKernel(RBFKernelGrad()), 64, seed=0), torch.rand(8, 2, dtype=F64)
    with pytest.raises(TypeError, match=r"covar_module \(ScaleKernel\) has 3 outputs per input .*"
                                        r"MultiOutputGPModel with \(n, 3\) targets"):
        rfgp.models.ExactGPModel(train_x, torch.rand(8, dtype=F64), gpytorch.likelihoods.GaussianLikelihood(), kernel)
