"""BoTorch's loo_cv for rfgp models: the leave-one-out predictions through the F × F capacitance.

The reference is BoTorch's own helper (``_botorch_compute_loo_predictions``, the dense N × N Cholesky path) on the
same model, so means and variances agree to rounding (1e-10 in float64).  The exact model's results with a Nyström
map on every training point are checked in ``test_botorch_loops.py::test_efficient_loo_cv_is_the_exact_models``.
"""

import pytest
import torch

botorch = pytest.importorskip("botorch")

import botorch.cross_validation as cross_validation  # noqa: E402
from botorch.cross_validation import ensemble_loo_cv, loo_cv  # noqa: E402
from botorch.models import SingleTaskGP  # noqa: E402
from botorch.models.map_saas import EnsembleMapSaasSingleTaskGP  # noqa: E402

import rfgp  # noqa: E402
from rfgp.integrations import botorch_cross_validation  # noqa: E402

F64 = torch.float64


def regression_data(n, outputs=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=F64)
    Y = torch.cat([torch.sin((3 + k) * X).sum(-1, keepdim=True) for k in range(outputs)], -1)
    return X, Y + 0.1 * torch.randn(n, outputs, generator=g, dtype=F64)


def sketched(model, num_features):
    model.covar_module = rfgp.sketch(model.covar_module, num_features, method="orf", seed=0)
    return model.eval()


def dense_loo_cv(model, **kwargs):
    """loo_cv through BoTorch's own helper."""
    original = cross_validation._compute_loo_predictions
    cross_validation._compute_loo_predictions = botorch_cross_validation._botorch_compute_loo_predictions
    try:
        return loo_cv(model, **kwargs)
    finally:
        cross_validation._compute_loo_predictions = original


def assert_same_results(actual, expected):
    assert actual.posterior.mean.shape == expected.posterior.mean.shape
    torch.testing.assert_close(actual.posterior.mean, expected.posterior.mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(actual.posterior.variance, expected.posterior.variance, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(actual.observed_Y, expected.observed_Y, rtol=0, atol=0)


@pytest.mark.parametrize("observation_noise", [True, False])
@pytest.mark.parametrize("outputs", [1, 2])
def test_loo_cv_is_the_dense_paths_without_an_n_by_n_factor(outputs, observation_noise, factorised):
    """Single and batched outputs, with and without observation noise: BoTorch's results, and nothing larger than
    F × F factorised (BoTorch's helper factorises the N × N covariance)."""
    X, Y = regression_data(50, outputs)
    model = sketched(SingleTaskGP(X, Y), 16)
    actual = loo_cv(model, observation_noise=observation_noise)
    assert max(factorised) <= 16
    expected = dense_loo_cv(model, observation_noise=observation_noise)
    assert max(factorised) == 50
    assert actual.posterior.mean.shape == (50, 1, outputs)
    assert_same_results(actual, expected)


def test_fixed_noise_and_kernel_space_are_the_dense_paths():
    """train_Yvar (D is each point's noise) with N ≤ F, where the N × N factor is the cheaper one."""
    X, Y = regression_data(20)
    model = sketched(SingleTaskGP(X, Y, train_Yvar=torch.linspace(0.01, 0.2, 20, dtype=F64).unsqueeze(-1)), 64)
    actual = loo_cv(model)
    assert actual.observed_Yvar is not None
    assert_same_results(actual, dense_loo_cv(model))


def test_ensemble_members_are_the_dense_paths(factorised):
    X, Y = regression_data(40)
    model = EnsembleMapSaasSingleTaskGP(X, Y, num_taus=3, taus=torch.tensor([0.05, 0.1, 0.3], dtype=F64))
    model = sketched(model, 16)
    actual = ensemble_loo_cv(model)
    assert max(factorised) <= 16
    original = cross_validation._compute_loo_predictions
    cross_validation._compute_loo_predictions = botorch_cross_validation._botorch_compute_loo_predictions
    try:
        expected = ensemble_loo_cv(model)
    finally:
        cross_validation._compute_loo_predictions = original
    assert actual.posterior.mean.shape == (40, 3, 1, 1)
    torch.testing.assert_close(actual.posterior.mixture_mean, expected.posterior.mixture_mean, rtol=1e-10,
                               atol=1e-10)
    torch.testing.assert_close(actual.posterior.mixture_variance, expected.posterior.mixture_variance,
                               rtol=1e-10, atol=1e-12)


def test_other_models_are_botorchs():
    X, Y = regression_data(20)
    model = SingleTaskGP(X, Y).eval()
    assert_same_results(loo_cv(model), dense_loo_cv(model))


def test_a_model_without_rfgp_kernels_is_evaluated_only_by_botorch(monkeypatch):
    """Before, the wrapper ran model.forward and the likelihood (its kernel evaluated: O(N²·d)) before handing a
    model without rfgp kernels to BoTorch, which evaluated them again: twice per loo_cv call instead of once."""
    from gpytorch.kernels import RBFKernel

    calls = []
    forward = RBFKernel.forward

    def spy(self, x1, x2, **kwargs):
        calls.append(x1.shape)
        return forward(self, x1, x2, **kwargs)

    monkeypatch.setattr(RBFKernel, "forward", spy)
    X, Y = regression_data(20)
    model = SingleTaskGP(X, Y).eval()  # BoTorch's default kernel, an RBF
    expected = dense_loo_cv(model)
    without_rfgp = len(calls)
    assert without_rfgp >= 1
    calls.clear()
    assert_same_results(loo_cv(model), expected)
    assert len(calls) == without_rfgp


def test_non_finite_targets_are_refused():
    X, Y = regression_data(20)
    model = sketched(SingleTaskGP(X, Y), 8)
    model.train_targets[4] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        loo_cv(model)


def test_batched_outputs_in_kernel_space_are_the_dense_paths():
    """Two outputs (a batch of two N × N factors, N ≤ F) with their own noise levels."""
    X, Y = regression_data(20, outputs=2)
    model = sketched(SingleTaskGP(X, Y), 64)
    model.likelihood.noise = torch.tensor([[0.01], [0.1]], dtype=F64)
    assert_same_results(loo_cv(model, observation_noise=False), dense_loo_cv(model, observation_noise=False))
