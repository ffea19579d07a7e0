"""Maclaurin features, their gradients and a Maclaurin GP's marginal likelihood against numbers saved from main.

``data/maclaurin_reference.pt`` holds, for every case of :func:`_cases`, the features Φ(x), the gradients of
⟨Φ(x), W⟩ (W fixed) w.r.t. x and the polynomial offset, and, for a ``MaclaurinRBFKernel`` GP, the negative
marginal log likelihood with its lengthscale/noise gradients and the posterior mean and variance, computed by
main at 3e93386 (the per-degree loop, before the degrees were batched into one transform and one gather product):

    PYTHONPATH=<main checkout> python tests/features/test_maclaurin_reference.py

The two ``random-*`` entries were made again when RandomMaclaurin's sketches stopped sharing random numbers with its
degree draw (new draws for the same seed; the feature computation they check is unchanged).

Compared with a tolerance (≤ 1e-12 relative), as the saved numbers may come from another CPU's BLAS; the two
TensorSRHT paths are compared with each other on this machine, real-weight features bit for bit (the batched path
keeps every product in the same order; complex products may round in the last bit, and the gradients w.r.t. x sum
the degrees' contributions in another order).
"""

from __future__ import annotations

import pathlib

import pytest
import torch

from rfgp.features import OptimizedMaclaurin, RandomMaclaurin, dot_product, maclaurin

DATA = pathlib.Path(__file__).parent / "data" / "maclaurin_reference.pt"


def _cases() -> dict:
    """name -> (map, x, offset or None): every projection, weight type, block layout and batch shape the
    Maclaurin maps take, with widths that skip degrees."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64) - 0.3

    gaussian = dot_product.gaussian()
    cases = {}
    for projection in ("srht", "rademacher", "gaussian"):
        for weights in ("ctr", "real", "complex"):
            for blocks in ("tiled", "independent"):
                if projection != "srht" and blocks == "independent":
                    continue
                for d, widths in ((2, (2, 0, 5, 9, 1)), (6, (3, 6, 8, 14, 22))):
                    total = sum(widths)
                    width = 1 + (2 if weights != "real" else 1) * total
                    phi = OptimizedMaclaurin(gaussian, width, input_dim=d, projection=projection, weights=weights,
                                             srht_blocks=blocks, widths=widths, seed=3).double()
                    cases[f"{projection}-{weights}-{blocks}-d{d}"] = (phi, rand(7, d), None)
    phi = OptimizedMaclaurin(gaussian, 1 + 2 * 40, input_dim=3, widths=(4, 9, 11, 16), seed=1).double()
    cases["batched-input"] = (phi, rand(2, 5, 3), None)
    polynomial = OptimizedMaclaurin(dot_product.polynomial(3, 1.0), 1 + 2 * 20, input_dim=4, widths=(5, 7, 8),
                                    seed=2).double()
    cases["polynomial-offset"] = (polynomial, rand(6, 4), torch.tensor([0.7], dtype=torch.float64))
    cases["polynomial-batched-offset"] = (polynomial, rand(2, 6, 4), torch.tensor([[0.7], [1.3]], dtype=torch.float64))
    for projection in ("rademacher", "srht"):
        phi = RandomMaclaurin(dot_product.polynomial(4, 1.0), 60, input_dim=5, projection=projection, seed=4).double()
        cases[f"random-{projection}"] = (phi, rand(8, 5), None)
    return cases


def _evaluate(phi, x, offset) -> dict:
    x = x.clone().requires_grad_(True)
    inputs = [x]
    if offset is not None:
        offset = offset.clone().requires_grad_(True)
        inputs.append(offset)
    features = phi(x) if offset is None else phi(x, offset)
    weight = torch.linspace(-1, 1, features.numel(), dtype=torch.float64).reshape(features.shape)
    grads = torch.autograd.grad((features * weight).sum(), inputs)
    return {"features": features.detach(), **{f"grad{i}": g for i, g in enumerate(grads)}}


def _gp() -> dict:
    import gpytorch

    from rfgp.kernels import MaclaurinRBFKernel

    gen = torch.Generator().manual_seed(5)
    x = torch.rand(30, 2, generator=gen, dtype=torch.float64)
    y = torch.sin(6 * x).sum(-1)

    class GP(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(MaclaurinRBFKernel(255, input_dim=2, seed=0))

        def forward(self, z):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(z), self.covar_module(z))

    model = GP().double()
    # the float32-rounded 0.4 the saved numbers were computed at (rfgp's setters then made a Python float float32
    # first, as GPyTorch's do; they now take it in the kernel's dtype)
    model.covar_module.base_kernel.lengthscale = torch.tensor(0.4, dtype=torch.float32).double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()
    loss = -mll(model(x), y)
    loss.backward()
    raw = model.covar_module.base_kernel.raw_lengthscale
    result = {"loss": loss.detach(), "grad_lengthscale": raw.grad.clone(),
              "grad_noise": model.likelihood.raw_noise.grad.clone(),
              "widths": torch.tensor(model.covar_module.base_kernel.feature_map.widths)}
    model.eval()
    with torch.no_grad():
        test = torch.rand(9, 2, generator=gen, dtype=torch.float64)
        posterior = model(test)
        result["mean"], result["variance"] = posterior.mean, posterior.variance
    return result


def _compute() -> dict:
    return {"features": {name: _evaluate(*case) for name, case in _cases().items()}, "gp": _gp()}


@pytest.fixture(scope="module")
def reference():
    return torch.load(DATA, weights_only=True)


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("name", sorted(_cases()))
def test_features_and_gradients_equal_main(reference, name, batched, monkeypatch):
    """Both TensorSRHT paths: every degree at once (few rows) and degree by degree (many rows)."""
    if not batched:
        monkeypatch.setattr(maclaurin, "BATCHED_DEGREES_MAX_ROWS", 0)
    saved = reference["features"][name]
    phi, x, offset = _cases()[name]
    now = _evaluate(phi, x, offset)
    assert set(now) == set(saved)
    for key in saved:  # a tolerance, not bit equality: the saved numbers may come from another CPU's BLAS
        torch.testing.assert_close(now[key], saved[key], rtol=1e-12, atol=1e-12 * float(saved[key].abs().max()))


@pytest.mark.parametrize("name", sorted(_cases()))
def test_batched_degrees_equal_degree_by_degree(name, monkeypatch):
    """The two TensorSRHT paths on this machine: real products in the same order (bit for bit); complex ones may
    round in the last bit (vectorised), and the gradients sum the degrees in another order."""
    phi, x, offset = _cases()[name]
    batched = _evaluate(phi, x, offset)
    monkeypatch.setattr(maclaurin, "BATCHED_DEGREES_MAX_ROWS", 0)
    by_degree = _evaluate(phi, x, offset)
    if phi.weights == "real":
        assert torch.equal(batched["features"], by_degree["features"])
    for key in by_degree:
        torch.testing.assert_close(batched[key], by_degree[key], rtol=1e-12,
                                   atol=1e-12 * float(by_degree[key].abs().max()))


def test_gp_marginal_likelihood_gradients_and_posterior_equal_main(reference):
    saved, now = reference["gp"], _gp()
    assert torch.equal(now["widths"], saved["widths"])
    for key in saved:
        torch.testing.assert_close(now[key], saved[key], rtol=1e-12, atol=1e-12 * float(saved[key].abs().max()))


if __name__ == "__main__":
    torch.save(_compute(), DATA)
    print(f"wrote {DATA}")
