"""End to end: an ExactGP with a sketched kernel trains with ExactMarginalLogLikelihood and its
posterior converges to the exact GP's as the number of features F grows."""

import math

import gpytorch
import pytest
import torch

import rfgp
from rfgp.kernels import SketchedRBFKernel
from rfgp.models import ExactGPModel


def problem(d, n=200, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen, dtype=torch.float64) * 6 - 3
    y = torch.sin(2 * x).sum(-1) + 0.5 * torch.cos(x.prod(-1)) + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    xs = torch.rand(100, d, generator=gen, dtype=torch.float64) * 7 - 3.5
    return x, y, xs


def posterior(covar_module, x, y, xs, device):
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = ExactGPModel(x, y, likelihood, gpytorch.kernels.ScaleKernel(covar_module)).double().to(device)
    model.covar_module.outputscale = 1.0
    model.covar_module.base_kernel.lengthscale = 1.0
    model.likelihood.noise = 0.1
    model.eval()
    with torch.no_grad():
        pred = model(xs)
        return pred.mean, pred.variance


def test_posterior_converges_to_exact_gp(device):
    # Fixed 2-D problem and hyperparameters; ORF features, two independent draws per width.
    x, y, xs = problem(2, n=100)
    x, y, xs = x.to(device), y.to(device), xs.clamp(-3, 3).to(device)
    exact_mean, exact_var = posterior(gpytorch.kernels.RBFKernel(), x, y, xs, device)
    widths = [64, 256, 1024, 4096]
    mean_errors, var_errors = [], []
    for num_features in widths:
        m_err = v_err = 0.0
        for seed in range(2):
            mean, var = posterior(SketchedRBFKernel(num_features, method="orf", seed=seed), x, y, xs, device)
            m_err += ((mean - exact_mean).pow(2).mean().sqrt() / y.std()).item() / 2
            v_err += ((var - exact_var).abs().mean() / exact_var.mean()).item() / 2
        mean_errors.append(m_err)
        var_errors.append(v_err)
    # Measured (CPU, float64): mean 0.47, 0.22, 0.093, 0.039; variance 0.47, 0.19, 0.092, 0.025.
    for errors in (mean_errors, var_errors):
        assert all(b < a for a, b in zip(errors, errors[1:])), errors
        slope = (math.log(errors[-1]) - math.log(errors[0])) / (math.log(widths[-1]) - math.log(widths[0]))
        assert slope < -0.4, (errors, slope)  # Monte-Carlo rate: error ∝ F^{−1/2}
    assert mean_errors[-1] < 0.08, mean_errors
    assert var_errors[-1] < 0.08, var_errors


def test_training_decreases_loss_and_matches_exact_gp(device):
    x, y, xs = (t.to(device) for t in problem(2, n=150, seed=1))

    def trained(kernel):
        model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), gpytorch.kernels.ScaleKernel(kernel))
        model = model.double().to(device)
        losses = rfgp.fit_mll(model, num_iterations=40, lr=0.1, progress=False, optimizer="adam")
        return model, losses

    exact, exact_losses = trained(gpytorch.kernels.RBFKernel(ard_num_dims=2))
    sketched, losses = trained(SketchedRBFKernel(512, method="orf", ard_num_dims=2, seed=0))
    assert losses[-1] < losses[0] - 0.3, (losses[0], losses[-1])
    assert all(math.isfinite(v) for v in losses)
    assert abs(losses[-1] - exact_losses[-1]) < 0.15, (losses[-1], exact_losses[-1])
    with torch.no_grad():
        rmse = (sketched(xs).mean - exact(xs).mean).pow(2).mean().sqrt() / y.std()
    assert rmse < 0.15


def test_sketched_conversion_of_a_trained_exact_model(device):
    x, y, xs = (t.to(device) for t in problem(1))
    exact = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(),
                         gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())).double().to(device)
    rfgp.fit_mll(exact, num_iterations=20, lr=0.1, progress=False, optimizer="adam")
    sketched = ExactGPModel(x, y, exact.likelihood, rfgp.sketch(exact.covar_module, 2048, method="orf", seed=0))
    sketched = sketched.double().to(device)
    sketched.mean_module.load_state_dict(exact.mean_module.state_dict())
    sketched.eval()
    with torch.no_grad():
        error = (sketched(xs).mean - exact(xs).mean).abs().max() / y.std()
    assert error < 0.1


def test_float32_training_stays_finite(device):
    x, y, _ = problem(2, n=100)
    x, y = x.float().to(device), y.float().to(device)
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(),
                         gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, method="sorf", seed=0))).to(device)
    losses = rfgp.fit_mll(model, num_iterations=15, lr=0.1, progress=False, optimizer="adam")
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    with torch.no_grad():
        pred = model(x[:10])
    assert pred.mean.dtype == torch.float32 and bool(torch.isfinite(pred.variance).all())


def test_one_dimensional_train_x_is_refused_with_the_reshape_to_use():
    """GPyTorch's tutorials keep one input column as x of shape (n,); rfgp's ExactGPModel checks (n, d) and says how."""
    x = torch.linspace(0, 1, 20, dtype=torch.float64)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(16, seed=0)).double()
    with pytest.raises(ValueError, match=r"one input column: train_x.unsqueeze\(-1\)"):
        ExactGPModel(x, torch.sin(x), gpytorch.likelihoods.GaussianLikelihood().double(), kernel)
    ExactGPModel(x.unsqueeze(-1), torch.sin(x), gpytorch.likelihoods.GaussianLikelihood().double(), kernel)
