"""SpectralProductKernel (ω = Σωᵢ) and SketchedProductKernel (TensorSRHT): width F, unbiased Gram of the
product (mean over seeds within 4 standard errors), importance weights, gradients vs finite differences,
state_dict round trips."""

import math

import gpytorch
import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

from rfgp.features import random
from rfgp.features.tensor_product import TensorProductSketch
from rfgp.kernels import (
    SketchedMaternKernel,
    SketchedPeriodicKernel,
    SketchedPolynomialKernel,
    SketchedProductKernel,
    SketchedRBFKernel,
    SpectralProductKernel,
    has_spectral_protocol,
)

F64 = torch.float64


def assert_unbiased(estimates: torch.Tensor, exact: torch.Tensor) -> None:
    """|mean − exact| ≤ 4 SE entrywise (off the exactly-known diagonal too), estimates stacked on dim 0."""
    mean, se = estimates.mean(0), estimates.std(0) / math.sqrt(estimates.shape[0])
    assert bool(((mean - exact).abs() <= 4 * se + 1e-10).all()), ((mean - exact).abs() / se).max()


def rbf_matern(active_dims=(None, None)):
    a = SketchedRBFKernel(2, ard_num_dims=None if active_dims[0] is None else len(active_dims[0]),
                          active_dims=active_dims[0], seed=0)
    b = ScaleKernel(SketchedMaternKernel(2, nu=1.5, active_dims=active_dims[1], seed=1))
    a.lengthscale = 0.8 if active_dims[0] is None else torch.tensor([[0.8, 1.5]])
    b.base_kernel.lengthscale = 1.3
    b.outputscale = 2.0
    return a.double(), b.double()


def exact_rbf_matern(a, b, x):
    exact_a = RBFKernel(ard_num_dims=a.ard_num_dims, active_dims=a.active_dims).double()
    exact_a.lengthscale = a.lengthscale
    exact_b = MaternKernel(nu=1.5, active_dims=b.base_kernel.active_dims).double()
    exact_b.lengthscale = b.base_kernel.lengthscale
    return (exact_a(x).to_dense() * exact_b(x).to_dense() * b.outputscale).detach()


@pytest.mark.parametrize("active_dims", [(None, None), ([0, 1], [2]), ([0, 1], [1, 2])],
                         ids=["same", "disjoint", "overlapping"])
def test_spectral_product_gram_is_unbiased(active_dims):
    a, b = rbf_matern(active_dims)
    x = torch.randn(6, 3 if active_dims[0] is not None else 2, dtype=F64)
    kernel = SpectralProductKernel(a, b, num_features=16, seed=0).double()
    assert kernel.num_features == 16 and kernel(x).evaluate_kernel().root.shape == (6, 16)
    generator = torch.Generator().manual_seed(1)
    estimates = []
    for _ in range(200):
        kernel.resample(generator)
        estimates.append(kernel(x).to_dense().detach())
    estimates = torch.stack(estimates)
    assert_unbiased(estimates, exact_rbf_matern(a, b, x))
    # k̂(x, x) = amplitude exactly (no importance weights)
    torch.testing.assert_close(estimates[0].diagonal(), torch.full((6,), 2.0, dtype=F64))


def test_width_is_even_and_at_most_f_and_follows_batches(device):
    a = SketchedRBFKernel(2, batch_shape=torch.Size([3]), seed=0)
    kernel = SpectralProductKernel(a, SketchedMaternKernel(2, seed=1), num_features=11, seed=0).to(device)
    assert kernel.num_features == 10
    x = torch.randn(5, 2, device=device)
    assert kernel(x).evaluate_kernel().root.shape == (3, 5, 10)
    assert kernel(x, diag=True).shape == (3, 5)


class ImportanceRBFKernel(SketchedRBFKernel):
    """An RBF factor whose frequencies come from the wider proposal N(0, s²I)/ℓ with weights p/q (E_q[w] = 1)."""

    proposal_scale = 1.5

    def spectral_draws(self, num_frequencies, input_dim, generator):
        return {"normal": random.normal((num_frequencies, input_dim), generator)}

    def spectral_frequencies(self, draws):
        return draws["normal"] * self.proposal_scale / self.lengthscale

    def spectral_weights(self, draws):
        s, g2 = self.proposal_scale, draws["normal"].pow(2).sum(-1)
        return s ** draws["normal"].shape[-1] * torch.exp(-0.5 * g2 * (s**2 - 1))


def test_importance_weights_keep_the_product_unbiased():
    a, b = ImportanceRBFKernel(2, seed=0).double(), SketchedMaternKernel(2, nu=2.5, seed=1).double()
    a.lengthscale, b.lengthscale = 0.7, 1.1
    x = torch.randn(5, 2, dtype=F64)
    exact = (RBFKernel().double().initialize(lengthscale=0.7)(x).to_dense()
             * MaternKernel(nu=2.5).double().initialize(lengthscale=1.1)(x).to_dense()).detach()
    kernel = SpectralProductKernel(a, b, num_features=32, seed=0).double()
    generator = torch.Generator().manual_seed(2)
    estimates = []
    for _ in range(200):
        kernel.resample(generator)
        estimates.append(kernel(x).to_dense().detach())
    assert_unbiased(torch.stack(estimates), exact)


def test_a_product_of_cosine_kernels_is_unbiased():
    """A cosine factor draws ω = ±π/p with a random sign: with +π/p always, CosineKernel × CosineKernel converted to
    cos((π/p₁ + π/p₂)τ) at every width and seed (relative Frobenius error 0.96).  The estimate's entries move
    together (each frequency is one of two), so the test is on the whole matrix: ‖mean − K‖ ≈ rms error / √S."""
    import rfgp

    first, second = gpytorch.kernels.CosineKernel(), gpytorch.kernels.CosineKernel()
    first.period_length, second.period_length = 0.7, 1.3
    exact = (first * second).to(F64)
    x = 3 * torch.rand(12, 1, dtype=F64, generator=torch.Generator().manual_seed(0))
    gram = exact(x).to_dense().detach()
    seeds = 24
    grams = torch.stack([rfgp.sketch(exact, 1024, seed=seed)(x).to_dense().detach() for seed in range(seeds)])
    errors = (grams - gram).flatten(1).norm(dim=1) / gram.norm()
    standard_error = float(errors.pow(2).mean().sqrt()) / math.sqrt(seeds)
    assert float((grams.mean(0) - gram).norm() / gram.norm()) < 4 * standard_error
    assert float(errors.pow(2).mean().sqrt()) < 0.15  # 1/√F: 0.08 at F = 1024


def test_float32_product_with_a_spectral_mixture_over_many_dimensions_has_finite_gradients():
    # the product's amplitude a = (Σw)^50 = 0.05^50 underflowed float32: log a = −inf made the mixture weights' gradient
    # NaN; the amplitude is now a sum of logs
    import rfgp

    dims = 50
    mixture = gpytorch.kernels.SpectralMixtureKernel(num_mixtures=2, ard_num_dims=dims)
    mixture.mixture_weights = torch.tensor([0.02, 0.03])
    product = rfgp.sketch(mixture * RBFKernel(), 64, seed=0).float()
    x = torch.rand(3, dims, generator=torch.Generator().manual_seed(0)) * 0.01
    product(x).to_dense().sum().backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in product.parameters())


def test_float32_product_with_a_periodic_factor_over_many_dimensions_has_finite_gradients():
    # the product of the factors' importance weights underflowed float32 (50 periodic dimensions, ℓ moved away from
    # the proposal): log 0 made the lengthscale's gradient NaN; the weights are now multiplied as a sum of logs
    import rfgp

    dims = 50
    periodic = gpytorch.kernels.PeriodicKernel(ard_num_dims=dims)
    periodic.lengthscale = 0.1
    product = rfgp.sketch(periodic * RBFKernel(), 1024, seed=0).float()
    x = torch.rand(3, dims, generator=torch.Generator().manual_seed(0))
    product(x).to_dense()
    product.kernels[0].lengthscale = 0.3
    product(x).to_dense().sum().backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in product.parameters())


def test_factors_without_the_protocol_are_refused():
    poly = SketchedPolynomialKernel(2, num_features=8, seed=0)
    assert not has_spectral_protocol(poly) and has_spectral_protocol(ScaleKernel(SketchedRBFKernel(2)))
    with pytest.raises(TypeError, match=r"kernels\[1\] \(SketchedPolynomialKernel\).*SketchedProductKernel"):
        SpectralProductKernel(SketchedRBFKernel(2), poly, num_features=8)
    with pytest.raises(ValueError, match="num_features must be ≥ 2"):
        SpectralProductKernel(SketchedRBFKernel(2), num_features=1)


def test_tensor_srht_product_gram_is_unbiased():
    """Polynomial × RBF: E[S(Φ₁ ⊗ Φ₂)ᵀS(Φ₁ ⊗ Φ₂)] = k̂₁·k̂₂ given the factors, so the Gram is unbiased."""
    x = torch.nn.functional.normalize(torch.randn(5, 3, dtype=F64), dim=-1)
    poly_exact = gpytorch.kernels.PolynomialKernel(2).double().initialize(offset=0.5)
    exact = (poly_exact(x).to_dense() * RBFKernel().double().initialize(lengthscale=1.0)(x).to_dense()).detach()
    estimates = []
    for seed in range(120):
        poly = SketchedPolynomialKernel(2, num_features=16, seed=3 * seed).double().initialize(offset=0.5)
        rbf = SketchedRBFKernel(16, seed=3 * seed + 1).double()
        rbf.lengthscale = 1.0
        kernel = SketchedProductKernel(poly, rbf, num_features=16, seed=3 * seed + 2).double()
        estimates.append(kernel(x).to_dense().detach())
    assert kernel.num_features == 16
    assert_unbiased(torch.stack(estimates), exact)


def test_tensor_product_sketch_pads_factors_and_validates():
    sketch = TensorProductSketch(2, 64, seed=0).double()
    u, v = torch.randn(2, 4, 32, dtype=F64), torch.randn(4, 8, dtype=F64)
    assert sketch([u, v]).shape == (2, 4, 64) and sketch.input_dim == 32
    with pytest.raises(ValueError, match="factors must hold 2"):
        sketch([u])
    with pytest.raises(ValueError, match="exceed input_dim=32"):
        sketch([torch.randn(4, 40, dtype=F64), v])
    with pytest.raises(ValueError, match="num_factors must be ≥ 2"):
        TensorProductSketch(1, 8)


@pytest.mark.parametrize("kind", ["spectral", "tensor_srht"])
def test_gradients_match_finite_differences(kind):
    a, b = rbf_matern(([0, 1], [1, 2]))
    if kind == "spectral":
        kernel = SpectralProductKernel(a, b, num_features=8, seed=0).double()
    else:
        b.base_kernel.feature_map.resample(torch.Generator().manual_seed(0))
        kernel = SketchedProductKernel(a, SketchedPolynomialKernel(2, num_features=6, seed=2).double(), b,
                                       num_features=8, seed=0).double()
    x, y = torch.randn(4, 3, dtype=F64), torch.randn(3, 3, dtype=F64)
    dense = DenseGram(kernel)
    names = ["kernel.kernels.0.raw_lengthscale", "kernel.kernels.2.raw_outputscale" if kind != "spectral"
             else "kernel.kernels.1.raw_outputscale"]
    params = dict(dense.named_parameters())

    def gram(*raw):
        return torch.func.functional_call(dense, dict(zip(names, raw)), (x, y))

    inputs = tuple(params[name].detach().clone().requires_grad_(True) for name in names)
    assert torch.autograd.gradcheck(gram, inputs, eps=1e-6, atol=1e-7)


class DenseGram(torch.nn.Module):
    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel

    def forward(self, x, y):
        return self.kernel(x, y).to_dense()


@pytest.mark.parametrize("kind", ["spectral", "tensor_srht"])
def test_state_dict_round_trip_reproduces_the_gram(kind):
    def build(seed):
        a = SketchedRBFKernel(8, seed=seed)
        b = SketchedMaternKernel(8, seed=seed + 1) if kind == "spectral" else SketchedPolynomialKernel(
            2, num_features=8, seed=seed + 1)
        cls = SpectralProductKernel if kind == "spectral" else SketchedProductKernel
        return cls(a, b, num_features=8, seed=seed + 2).double()

    x = torch.randn(5, 2, dtype=F64)
    original = build(0)
    original.kernels[0].lengthscale = 0.4
    expected = original(x).to_dense().detach()
    fresh = build(10)  # other seeds, draws not made yet
    fresh.load_state_dict(original.state_dict())
    torch.testing.assert_close(fresh(x).to_dense().detach(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("called", [False, True], ids=["fresh", "already-called"])
def test_state_of_a_periodic_factor_drawn_at_another_lengthscale_loads(called):
    """A periodic factor draws K harmonics, K from its lengthscale at draw time (ℓ = 0.05: K = 208,
    the default ℓ = 0.69: K = 55); the state of a product drawn after training (or converted from a
    trained exact tree) must load into one built afresh, whose own draws have the other K."""
    def build(lengthscale=None):
        periodic = SketchedPeriodicKernel(8, seed=0)
        if lengthscale is not None:
            periodic.lengthscale = lengthscale
        return SpectralProductKernel(periodic, SketchedRBFKernel(8, seed=1), num_features=16, seed=2).double()

    x = torch.rand(6, 1, dtype=F64)
    trained = build(0.05)
    expected = trained(x).to_dense().detach()
    fresh = build()
    if called:
        fresh(x)
    fresh.load_state_dict(trained.state_dict())
    assert fresh.draws0_harmonic_orders.shape == trained.draws0_harmonic_orders.shape == (208,)
    torch.testing.assert_close(fresh(x).to_dense().detach(), expected, rtol=0, atol=0)



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_draws_made_at_the_first_call_follow_the_module_device():
    # Draws are made lazily with a CPU generator; the integer ones (a periodic factor's harmonic indices) stayed on
    # the CPU of a module already moved to the GPU and were copied to it at every call (a host synchronisation).
    kernel = SpectralProductKernel(SketchedPeriodicKernel(num_features=16, seed=0), SketchedRBFKernel(16, seed=1),
                                   num_features=16, seed=0).cuda()
    kernel(torch.randn(5, 1, device="cuda"), torch.randn(5, 1, device="cuda")).to_dense()
    kinds = {name: (buffer.device.type, buffer.dtype) for name, buffer in kernel.named_buffers(recurse=False)}
    assert any(not dtype.is_floating_point for _, dtype in kinds.values()), kinds
    assert all(device == "cuda" for device, _ in kinds.values()), kinds


def test_features_are_the_plain_formula_with_its_first_and_second_derivatives():
    """SpectralProductKernel's features through the custom sin/cos Function equal √(a/m)[√w cos P, √w sin P] built
    plainly from its spectrum, with the same gradients and second derivatives in x and every hyperparameter (a
    periodic factor gives importance weights, a ScaleKernel an outputscale)."""
    periodic = ScaleKernel(SketchedPeriodicKernel(2, active_dims=[0], seed=3)).double()
    periodic.outputscale = 1.7
    kernel = SpectralProductKernel(SketchedRBFKernel(2, seed=0).double(), periodic, num_features=16, seed=0).double()
    x = torch.randn(6, 1, dtype=F64, requires_grad=True)
    kernel(x[:2].detach()).to_dense()

    def plain(x):
        terms, log_amplitude, log_weights = kernel.spectrum(x)
        projection = sum(u @ w.mT for u, w in terms)
        features = torch.cat((projection.cos(), projection.sin()), -1) * (log_amplitude.exp() / 8).sqrt()
        root_weights = (0.5 * log_weights).exp()
        return features * torch.cat((root_weights, root_weights), -1)

    leaves = [x, *kernel.parameters()]
    out, ref = kernel.featurize(x), plain(x)
    assert type(out.grad_fn).__name__ == "_WeightedSinCosFeaturesBackward"
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-13)
    probe = torch.randn(out.shape, dtype=F64)
    pairs = []
    for value in (out, ref):
        grads = torch.autograd.grad((value * probe).sum(), leaves, create_graph=True)
        pairs.append((*grads, *torch.autograd.grad(sum((g * g).sum() for g in grads), leaves)))
    for got, want in zip(*pairs):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-12)


def test_resample_under_inference_mode_keeps_the_product_trainable():
    # Draws made by resample() under torch.inference_mode() were inference tensors: the next training step raised
    # "Inference tensors cannot be saved for backward".
    kernel = SpectralProductKernel(*rbf_matern(), num_features=16, seed=0).double()
    x = torch.randn(6, 2, dtype=torch.float64)
    kernel(x).to_dense()
    with torch.inference_mode():
        kernel.resample(torch.Generator().manual_seed(0))
    assert not any(buffer.is_inference() for buffer in kernel.buffers())
    kernel(x).to_dense().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in kernel.parameters() if p.grad is not None)
