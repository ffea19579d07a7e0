"""The dense matrix of a kernel as a GPyTorch kernel: reference models on exactly the same covariance."""

from __future__ import annotations

import gpytorch
import torch


class DenseKernel(gpytorch.kernels.Kernel):
    """The dense ΦΦᵀ of an rfgp kernel, so that GPyTorch's generic algebra (DefaultPredictionStrategy, dense
    Cholesky, dense elementwise products) runs on the same covariance as the rfgp model it is compared with."""

    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel

    def forward(self, x1, x2, diag=False, **params):
        covar = self.kernel(x1, x2).to_dense()
        return covar.diagonal(dim1=-2, dim2=-1) if diag else covar


def assert_eager_kernels_keep_the_strategy(model, test_x, strategy_type, tolerance: float) -> None:
    """Under ``gpytorch.settings.lazily_evaluate_kernels(False)`` an rfgp model (eval mode) still predicts through
    its own ``strategy_type`` and gives the posterior it gives with lazy kernels: GPyTorch's ExactGP asks the kernel
    for a strategy only for a lazily evaluated covariance, and otherwise takes its generic DefaultPredictionStrategy
    (dense algebra, without rfgp's variance correction and cache checks)."""
    with torch.no_grad():
        expected = model(test_x)
        model.train()
        model.eval()
        with gpytorch.settings.lazily_evaluate_kernels(False):
            posterior = model(test_x)
    assert isinstance(model.prediction_strategy, strategy_type)
    torch.testing.assert_close(posterior.mean, expected.mean, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(posterior.covariance_matrix, expected.covariance_matrix, rtol=tolerance,
                               atol=tolerance)


class SameFeaturesKernel(gpytorch.kernels.Kernel):
    """s·Φ(x1/ℓ)Φ(x2/ℓ)ᵀ as a dense tensor, Φ the feature map's own ``forward``, of ``rfgp.sketch(ScaleKernel(
    RBFKernel(...)), F)`` (its outputscale s, lengthscales ℓ and random draws): a reference on the same random
    features that bypasses the rfgp kernel's forward and operators (feature roots, lazy cross-covariances), so that a
    model on it differs from the rfgp model by rounding only, not by the random-feature error."""

    def __init__(self, sketched):
        super().__init__()
        self.sketched = sketched

    def forward(self, x1, x2, diag=False, **params):
        base = self.sketched.base_kernel
        phi1 = base.feature_map(x1 / base.lengthscale)
        phi2 = base.feature_map(x2 / base.lengthscale)
        scale = self.sketched.outputscale[..., None]
        return scale * (phi1 * phi2).sum(-1) if diag else scale[..., None] * (phi1 @ phi2.mT)
