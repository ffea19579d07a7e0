"""``torch.compile`` (default backend, inductor) of rfgp's custom autograd: the same numbers as eager.

``cpp.vec_isa_ok=False`` makes inductor emit scalar C++ instead of probing the CPU's vector ISAs
by compiling test programs (~13 s on a cold cache); what is compiled is unchanged otherwise.
"""

import pytest
import torch
import torch._inductor.config

from rfgp.inference.kernel_space import _batched_dot, _covariance_gradient

DTYPE = torch.float64


@pytest.fixture(autouse=True)
def _fresh_compile_cache():
    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        yield
    torch._dynamo.reset()


def test_compiled_kernel_space_gradient_equals_eager():
    """The backward of the kernel-space marginal likelihood (N ≤ F), compiled, equals eager.

    Its outputscale gradient is ⟨S, ΦΦᵀ⟩ of S = ḡ_l K⁻¹ − α diag(ḡ_q) αᵀ, the LAPACK inverse
    updated in place; inductor could not lower the flattened dot product of its transpose
    ("Cannot view a tensor with shape [N, N] and strides (1, N)"), so compiling any training step
    of an rfgp model with N ≤ F failed.  (A whole GPyTorch training step compiles into several
    graphs, ~30 s; this is the graph that failed.)
    """
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(6, 6, generator=generator, dtype=DTYPE)
    chol = torch.linalg.cholesky(a @ a.mT + 6 * torch.eye(6, dtype=DTYPE))
    solve = torch.randn(6, 2, generator=generator, dtype=DTYPE)
    grad_inv_quad, grad_logdet = torch.tensor([1.0, -0.5], dtype=DTYPE), torch.tensor(0.7, dtype=DTYPE)
    features = torch.randn(6, 8, generator=generator, dtype=DTYPE)

    def outputscale_gradient(chol, solve, features):
        sym = _covariance_gradient(chol, solve, grad_inv_quad, grad_logdet)
        return _batched_dot(sym.mT, features @ features.mT)

    expected = outputscale_gradient(chol, solve, features)
    compiled = torch.compile(outputscale_gradient, fullgraph=True)(chol, solve, features)
    torch.testing.assert_close(compiled, expected, rtol=1e-12, atol=1e-14)


def test_compiled_backward_through_complex_maclaurin_features_equals_eager():
    """A training step through a Maclaurin map with its default complex (CtR) weights, compiled: TorchDynamo's fake
    tensors failed in the TensorSRHT gather products' backward on complex values ("Tensor must have a last dimension
    of size 2"), so no CtR Maclaurin model compiled a training step; the products run as plain torch there now."""
    from rfgp.features import OptimizedMaclaurin, dot_product

    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0), dtype=DTYPE)
    phi = OptimizedMaclaurin(dot_product.gaussian(), 33, input_dim=3, widths=(4, 6, 6), seed=0).double()
    lengthscale = torch.tensor(1.3, dtype=DTYPE, requires_grad=True)

    def step(x):
        loss = phi(x / lengthscale).abs().pow(2).sum()
        loss.backward()
        return loss

    expected = step(x).detach()
    expected_grad, lengthscale.grad = lengthscale.grad.clone(), None
    compiled = torch.compile(step, backend="eager")(x)
    torch.testing.assert_close(compiled.detach(), expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(lengthscale.grad, expected_grad, rtol=1e-12, atol=0)
