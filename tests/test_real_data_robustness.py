"""Real data as users hand it over: raw scales, float32/float64 mixing, duplicates, training that leaves the draws.

Data sets shipped in installed packages (statsmodels, scikit-learn), subsampled to a few hundred rows;
``benchmarks/raw_data_sweep.py`` runs the full sweep against the exact GP.
"""

from __future__ import annotations

import math

import gpytorch
import numpy as np
import pytest
import torch
from gpytorch.kernels import PeriodicKernel, ScaleKernel

import rfgp
from rfgp.core.validation import DrawCoverageError

sm = pytest.importorskip("statsmodels.api")


def _elnino(n: int = 120) -> tuple[torch.Tensor, torch.Tensor]:
    """Monthly sea temperature against decimal years (raw time), the target standardised."""
    nino = sm.datasets.elnino.load_pandas().data
    t = (nino["YEAR"].to_numpy()[:, None] + np.arange(12)[None, :] / 12.0).ravel()
    v = nino.iloc[:, 1:].to_numpy().ravel()
    idx = np.random.default_rng(0).permutation(len(t))[:n]
    x, y = torch.tensor(t[idx])[:, None], torch.tensor(v[idx])
    return x, (y - y.mean()) / y.std()


class _GP(gpytorch.models.ExactGP):
    def __init__(self, x, y, kernel):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _periodic_model(x, y) -> _GP:
    """A sketched periodic GP whose lengthscale prior pulls ℓ far below the draws' proposal (centred at ℓ₀ = 0.69)."""
    periodic = PeriodicKernel(lengthscale_prior=gpytorch.priors.LogNormalPrior(math.log(1e-3), 0.1))
    periodic.period_length = 1.0
    return _GP(x, y, rfgp.sketch(ScaleKernel(periodic), 64, seed=0)).double()


def test_fit_mll_steps_back_from_a_trial_point_beyond_the_periodic_draws():
    # standardised co2 with ScaleKernel(RBF) + ScaleKernel(Periodic) (benchmarks/raw_data_sweep.py): L-BFGS tried a
    # periodic lengthscale of 0.0046 where the draws cover ℓ ≳ 0.04; fit_mll raised the map's ValueError from inside
    # the line search and left the model at the trial point.  It now steps back as for a failed factorisation.
    x, y = _elnino()
    model = _periodic_model(x, y)
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning, match="DrawCoverageError"):
        history = rfgp.fit_mll(model, optimizer="adam", lr=2.0, num_iterations=3, progress=False)
    assert history.restarts and all(r.error.startswith("DrawCoverageError") for r in history.restarts)
    assert all(math.isfinite(loss) for loss in history.losses)
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    assert math.isfinite(mll(model(x), y).item())  # the kept point is one the draws cover


def test_fit_mll_restores_the_hyperparameters_when_it_gives_up_on_a_draw_coverage_error():
    x, y = _elnino()
    model = _periodic_model(x, y)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    with pytest.raises(DrawCoverageError, match="resample") as info:
        rfgp.fit_mll(model, optimizer="adam", lr=5.0, num_iterations=3, max_restarts=0, progress=False)
    assert isinstance(info.value, ValueError)  # what it was before
    assert any("restored" in note for note in info.value.__notes__)
    for key, value in model.named_parameters():
        assert torch.equal(value.detach(), before[key]), key


def test_draw_coverage_error_is_not_an_invalid_value():
    # samplers reject InvalidValueError points as zero density; a lengthscale beyond the draws is a valid point
    from rfgp.core.validation import InvalidValueError

    assert not issubclass(DrawCoverageError, InvalidValueError)
    assert issubclass(DrawCoverageError, ValueError)
