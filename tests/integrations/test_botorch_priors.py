"""BoTorch's MAP-SAAS model (``add_saas_prior``: τ and its priors registered on a Matérn kernel instance) converts with
its shrinkage prior: the sketched model's MAP objective has the same prior terms and τ trains."""

import pytest
import torch

botorch = pytest.importorskip("botorch")

from botorch.models.map_saas import get_map_saas_model  # noqa: E402
from gpytorch.mlls import ExactMarginalLogLikelihood  # noqa: E402

import rfgp  # noqa: E402


def log_prior(model):
    return {name: prior.log_prob(closure(module)).sum() for name, module, prior, closure, _ in model.named_priors()}


@pytest.mark.parametrize("tau", [None, 0.1])  # τ inferred (raw_tau, tau_prior) or fixed (only τ/ℓ² ~ HC(1))
def test_map_saas_model_converts_with_its_shrinkage_prior(tau):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(20, 5, generator=gen, dtype=torch.float64)
    y = torch.sin(4 * x[:, :1]) + 0.05 * torch.randn(20, 1, generator=gen, dtype=torch.float64)
    model = get_map_saas_model(x, y, tau=tau)
    with torch.no_grad():
        model.covar_module.base_kernel.lengthscale = torch.linspace(0.3, 3.0, 5, dtype=torch.float64)
    exact_prior, exact_state = log_prior(model), model.covar_module.state_dict()
    model.covar_module = rfgp.sketch(model.covar_module, 64, seed=0)
    assert "inv_lengthscale_prior" in model.covar_module.base_kernel._priors
    sketched_prior = log_prior(model)
    assert sketched_prior.keys() == exact_prior.keys()
    for name, value in exact_prior.items():
        torch.testing.assert_close(sketched_prior[name], value, rtol=1e-12, atol=1e-12)
    assert not model.covar_module.load_state_dict(exact_state, strict=False).unexpected_keys  # τ included
    if tau is None:
        model.train()
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        (-mll(model(*model.train_inputs), model.train_targets)).backward()
        assert model.covar_module.base_kernel.raw_tau.grad.abs() > 0
