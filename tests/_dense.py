"""The dense matrix of a kernel as a GPyTorch kernel: reference models on exactly the same covariance."""

from __future__ import annotations

import gpytorch


class DenseKernel(gpytorch.kernels.Kernel):
    """The dense ΦΦᵀ of an rfgp kernel, so that GPyTorch's generic algebra (DefaultPredictionStrategy, dense
    Cholesky, dense elementwise products) runs on the same covariance as the rfgp model it is compared with."""

    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel

    def forward(self, x1, x2, diag=False, **params):
        covar = self.kernel(x1, x2).to_dense()
        return covar.diagonal(dim1=-2, dim2=-1) if diag else covar
