"""rfgp under mixed precision: an enclosing ``torch.autocast`` changes none of rfgp's numbers.

CPU autocast (bfloat16) lowers the same ops as CUDA autocast (matmul, mm, bmm, linear, linalg_vecdot, baddbmm); before
rfgp switched it off around its own computations, a float32 model's marginal likelihood, gradients and predictions
were computed from bfloat16 products (N = 500, F = 2048 curl-free field: loss 5e-4, gradients 4e-3 relative error) or
failed (dtype mismatches, a capacitance that is not positive definite), and GPyTorch's exact GP under the same autocast
gave a loss of 3010 instead of −0.73.  The references are the same models without autocast.
"""

from __future__ import annotations

import warnings

import gpytorch
import pytest
import torch
from gpytorch.kernels import MaternKernel, PeriodicKernel, RBFKernel, ScaleKernel

import rfgp
from rfgp.kernels import MaclaurinRBFKernel, SketchedCurlFreeKernel
from rfgp.models import ExactGPModel, MultiOutputGPModel

N_FEATURE_SPACE, N_KERNEL_SPACE, F = 300, 80, 256  # N > F: the F × F capacitance; N < F: the N × N kernel-space path


def _bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _no_autocast():
    return torch.autocast("cpu", enabled=False)


def _data(n: int, d: int, outputs: int | None):
    generator = torch.Generator().manual_seed(n)
    x = torch.rand(n, d, generator=generator) * 4 - 2
    if outputs is None:
        return x, torch.sin(2 * x).sum(-1) + 0.1 * torch.randn(n, generator=generator)
    return x, torch.cos(2 * x[:, :outputs]) + 0.1 * torch.randn(n, outputs, generator=generator)


KERNELS = {
    "rbf-orf": (lambda x: ScaleKernel(rfgp.sketch(RBFKernel(ard_num_dims=3), F, method="orf", seed=0)), None),
    "maclaurin": (lambda x: ScaleKernel(MaclaurinRBFKernel(F, ard_num_dims=3, seed=0)), None),
    "tree": (lambda x: rfgp.sketch(ScaleKernel(RBFKernel()) + ScaleKernel(PeriodicKernel() * RBFKernel()), F, seed=0),
             None),
    "nystrom": (lambda x: ScaleKernel(rfgp.sketch(MaternKernel(nu=2.5), min(F, x.shape[0]), method="nystrom",
                                                  x_sample=x, seed=0)), None),
    "curl-free": (lambda x: ScaleKernel(SketchedCurlFreeKernel(F, input_dim=2, method="orf", seed=0)), 2),
}


def _fit_and_predict(name: str, n: int, autocast: bool):
    make, outputs = KERNELS[name]
    x, y = _data(n, 3 if outputs is None else outputs, outputs)
    x_test = _data(40, x.shape[-1], None)[0] * 0.9
    if outputs is None:
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        model = ExactGPModel(x, y, likelihood, make(x))
    else:
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=outputs, rank=0)
        model = MultiOutputGPModel(x, y, likelihood, make(x))
    likelihood.noise = 1e-2
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation warnings of the Maclaurin map: the same with and without
        with _bf16() if autocast else _no_autocast():
            loss = -mll(model(x), y)
        loss.backward()  # outside autocast, as torch.autocast's recipe says
        model.eval()
        with torch.no_grad(), _bf16() if autocast else _no_autocast():
            predictive = likelihood(model(x_test))
            result = {"loss": loss.detach(), "mean": predictive.mean, "variance": predictive.variance,
                      "covariance": predictive.covariance_matrix}
    result["gradient"] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    uses_kernel_space = model.prediction_strategy.uses_kernel_space
    return result, uses_kernel_space


@pytest.mark.parametrize("n", [N_FEATURE_SPACE, N_KERNEL_SPACE], ids=["feature-space", "kernel-space"])
@pytest.mark.parametrize("name", list(KERNELS))
def test_autocast_changes_no_number(name, n):
    reference, kernel_space = _fit_and_predict(name, n, autocast=False)
    assert kernel_space == (n == N_KERNEL_SPACE)
    mixed, _ = _fit_and_predict(name, n, autocast=True)
    for key, value in reference.items():
        assert mixed[key].dtype == torch.float32, key
        torch.testing.assert_close(mixed[key], value, rtol=1e-5, atol=1e-6, msg=key)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.linear(x)


def test_half_precision_network_output_is_computed_in_float32():
    """Deep kernel learning: under autocast the network in front of the GP returns bfloat16; the kernel computes in
    float32 from those values (type promotion with its float32 parameters), exactly as from ``h.float()``."""
    torch.manual_seed(0)
    net, kernel = _Net(), ScaleKernel(rfgp.sketch(RBFKernel(), F, method="orf", seed=0))
    x, _ = _data(50, 3, None)
    with _bf16():
        h = net(x)
        assert h.dtype == torch.bfloat16
        covariance = kernel(h).to_dense()
        diagonal = kernel(h, diag=True)
    reference = kernel(h.detach().float()).to_dense()
    assert covariance.dtype == diagonal.dtype == torch.float32
    torch.testing.assert_close(covariance, reference, rtol=0, atol=0)
    torch.testing.assert_close(diagonal, reference.diagonal(), rtol=1e-6, atol=1e-6)
    covariance.sum().backward()
    assert net.linear.weight.grad is not None and torch.isfinite(net.linear.weight.grad).all()


def test_half_precision_network_output_in_a_model():
    """The same inside a GPyTorch model's marginal likelihood (the kernel evaluated lazily, after its call)."""

    class DeepKernelGP(gpytorch.models.ExactGP):
        def __init__(self, x, y, likelihood):
            super().__init__(x, y, likelihood)
            self.net, self.mean_module = _Net(), gpytorch.means.ConstantMean()
            self.covar_module = ScaleKernel(rfgp.sketch(RBFKernel(), F, method="orf", seed=0))

        def forward(self, x):
            h = self.net(x)
            if h.dtype != torch.float32:  # the reference: the same bfloat16 values, no autocast
                h = h.float()
            return gpytorch.distributions.MultivariateNormal(self.mean_module(h), self.covar_module(h))

    torch.manual_seed(0)
    x, y = _data(N_FEATURE_SPACE, 3, None)
    model = DeepKernelGP(x, y, gpytorch.likelihoods.GaussianLikelihood())
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    with _bf16():
        mixed = -mll(model(x), y)
    net_in_bf16 = model.net.linear.weight.bfloat16(), model.net.linear.bias.bfloat16()
    with torch.no_grad():
        model.net.linear.weight.copy_(net_in_bf16[0].float())
        model.net.linear.bias.copy_(net_in_bf16[1].float())
    model.net.forward = lambda z: torch.nn.functional.linear(z.bfloat16(), *net_in_bf16)  # the same bfloat16 matmul
    reference = -mll(model(x), y)
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, reference, rtol=1e-6, atol=1e-6)


def test_half_precision_input_outside_autocast_is_still_refused():
    kernel = rfgp.sketch(RBFKernel(), F, seed=0)
    with pytest.raises(TypeError, match="bfloat16.*under torch.autocast"):
        kernel(_data(5, 3, None)[0].bfloat16()).to_dense()


def test_botorch_posterior_and_paths_under_autocast():
    botorch = pytest.importorskip("botorch")
    from botorch.sampling.pathwise import draw_matheron_paths

    x, y = _data(N_FEATURE_SPACE, 3, None)
    x, x_test = (x + 2) / 4, torch.rand(30, 3, generator=torch.Generator().manual_seed(1))
    results = []
    for context in (_no_autocast, _bf16):
        model = botorch.models.SingleTaskGP(x, y.unsqueeze(-1), covar_module=rfgp.sketch(
            ScaleKernel(RBFKernel(ard_num_dims=3)), F, method="orf", seed=0))
        model.eval()
        with context():
            posterior = model.posterior(x_test)
            torch.manual_seed(5)
            paths = draw_matheron_paths(model, torch.Size([4]))
            results.append((posterior.mean, posterior.variance, paths(x_test)))
    for mixed, reference in zip(results[1], results[0]):
        assert mixed.dtype == torch.float32
        torch.testing.assert_close(mixed, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [N_FEATURE_SPACE, N_KERNEL_SPACE], ids=["feature-space", "kernel-space"])
def test_backward_inside_cpu_autocast_raises(n):
    """On the CPU autograd runs backward on the calling thread, where autocast lowers the built-in ops' derivatives
    too (out of rfgp's reach: gradients about 3e-3 off); rfgp's statistics refuse that instead of a wrong gradient."""
    x, y = _data(n, 3, None)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = ExactGPModel(x, y, likelihood, KERNELS["rbf-orf"][0](x))
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with _bf16(), pytest.raises(RuntimeError, match="after leaving the autocast block"):
        (-mll(model(x), y)).backward()


def test_posterior_paths_under_autocast():
    """``rfgp.sampling.posterior_paths``: Φ(x)W was a bfloat16 matmul under autocast (2e-3 relative error)."""
    x, y = _data(N_FEATURE_SPACE, 3, None)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = ExactGPModel(x, y, likelihood, KERNELS["rbf-orf"][0](x))
    model.eval()
    values = []
    for context in (_no_autocast, _bf16):
        with context(), torch.no_grad():
            paths = rfgp.sampling.posterior_paths(model, 8, generator=torch.Generator().manual_seed(0))
            values.append(paths(x[:50]))
    assert values[1].dtype == torch.float32
    torch.testing.assert_close(values[1], values[0], rtol=1e-5, atol=1e-6)


def test_vector_field_samples_under_autocast():
    from rfgp.applications.vector_fields import posterior_field_samples

    x, y = _data(N_FEATURE_SPACE, 2, 2)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=0)
    model = MultiOutputGPModel(x, y, likelihood, KERNELS["curl-free"][0](x))
    model.eval()
    values = []
    for context in (_no_autocast, _bf16):
        with context(), torch.no_grad():
            field = posterior_field_samples(model, 4, generator=torch.Generator().manual_seed(0))
            values.append(field(x[:50]))
    assert values[1].dtype == torch.float32
    torch.testing.assert_close(values[1], values[0], rtol=1e-5, atol=1e-6)


def test_streaming_model_under_autocast():
    """``StreamingFeatureGP.update`` accumulated its statistics ΦᵀWΦ in bfloat16 under autocast (kept as buffers)."""
    from rfgp.models import StreamingFeatureGP

    x, y = _data(N_FEATURE_SPACE, 3, None)
    results = []
    for context in (_no_autocast, _bf16):
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        likelihood.noise = 1e-2
        model = StreamingFeatureGP(KERNELS["rbf-orf"][0](x), likelihood)
        with context(), torch.no_grad():
            for rows in (slice(0, 100), slice(100, None)):
                model.update(x[rows], y[rows])
            predictive = model(x[:40])
            results.append((model.gram, model.log_marginal_likelihood(), predictive.mean, predictive.variance))
    for mixed, reference, dtype in zip(results[1], results[0], (torch.float64, torch.float32, torch.float32,
                                                              torch.float32)):
        assert mixed.dtype == dtype  # ΦᵀWΦ of float32 features summed in float64 (StreamingFeatureGP.update)
        torch.testing.assert_close(mixed, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make", [
    lambda: rfgp.features.RandomFourierFeatures(F, input_dim=3, sampler="orthogonal", seed=0),
    lambda: rfgp.features.PolynomialSketch(3, F, input_dim=3, projection="srht", seed=0),
], ids=["orf", "tensor-srht"])
def test_feature_maps_called_directly_under_autocast(make):
    """A feature map called by itself (Pyro models, user code) returned bfloat16 features under autocast (RFF:
    8e-3 relative error); every map's ``forward`` now computes in its input's dtype."""
    feature_map, x = make(), _data(50, 3, None)[0]
    reference = feature_map(x)
    with _bf16():
        mixed = feature_map(x)
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, reference, rtol=1e-5, atol=1e-6)


def test_autocast_flags_before_torch_2_4(monkeypatch):
    """torch < 2.4 (rfgp accepts torch ≥ 2.1) has no device argument to ``torch.is_autocast_enabled``."""
    from rfgp.core import dtypes

    current = torch.is_autocast_enabled

    def legacy(*args):
        if args:
            raise TypeError("is_autocast_enabled() takes 0 positional arguments but 1 was given")
        return current("cuda")

    with monkeypatch.context() as patch:
        patch.setattr(torch, "is_autocast_enabled", legacy)
        flags = dtypes._autocast_flags()
    assert set(flags) == {"cpu", "cuda"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.is_autocast_cpu_enabled is deprecated in new torch
        assert not flags["cpu"]() and not flags["cuda"]()
        with _bf16():
            assert flags["cpu"]() and not flags["cuda"]()


def test_fit_mll_under_autocast():
    """``rfgp.fit_mll`` runs its own backward passes: inside an autocast block they raised (CPU) or, before, ran
    through bfloat16 statistics; now training under autocast gives the same hyperparameters."""
    x, y = _data(N_FEATURE_SPACE, 3, None)
    trained = []
    for context in (_no_autocast, _bf16):
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        model = ExactGPModel(x, y, likelihood, KERNELS["rbf-orf"][0](x))
        with context():
            rfgp.fit_mll(model, num_iterations=3, progress=False)
        trained.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(trained[1], trained[0], rtol=1e-5, atol=1e-6)
