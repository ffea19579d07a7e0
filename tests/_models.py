"""Models and kernels that several test modules build the same way."""

import gpytorch
import torch
from gpytorch.kernels import ScaleKernel

from rfgp.kernels import (
    MultiOutputFeatureSumKernel,
    SketchedCurlFreeKernel,
    SketchedDecomposableKernel,
    SketchedDivFreeKernel,
    SketchedRBFKernel,
)


class UserGP(gpytorch.models.ExactGP):
    """The ExactGP a GPyTorch user writes: Gaussian likelihood, constant mean, the given kernel."""

    def __init__(self, x, y, kernel):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class UserSVGP(gpytorch.models.ApproximateGP):
    """GPyTorch's SVGP tutorial model: Cholesky variational distribution, whitened strategy with learned inducing
    points, constant mean, the given kernel."""

    def __init__(self, covar_module, inducing_points):
        distribution = gpytorch.variational.CholeskyVariationalDistribution(inducing_points.shape[-2])
        super().__init__(gpytorch.variational.VariationalStrategy(self, inducing_points, distribution,
                                                                 learn_inducing_locations=True))
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = covar_module

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class LikelihoodGP(gpytorch.models.ExactGP):
    """An ExactGP of the given kernel and likelihood with constant means of ``batch_shape`` (GPyTorch's batch GP
    regression for a batch; any Gaussian likelihood: fixed, heteroskedastic, batched)."""

    def __init__(self, x, y, kernel, likelihood, batch_shape=torch.Size()):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch_shape)
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class MultitaskGP(gpytorch.models.ExactGP):
    """GPyTorch's multitask tutorial model: T = ``y.shape[-1]`` constant means (``MultitaskMean``), the given
    multitask kernel and likelihood, a ``MultitaskMultivariateNormal`` over the interleaved outputs."""

    def __init__(self, x, y, likelihood, kernel):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(), num_tasks=y.shape[-1])
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))


class BatchIndependentGP(gpytorch.models.ExactGP):
    """GPyTorch's "Batch Independent Multioutput GP": T = ``likelihood.num_tasks`` constant means and the batch kernel's
    T covariances, joined by ``MultitaskMultivariateNormal.from_batch_mvn``."""

    def __init__(self, x, y, kernel, likelihood):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=torch.Size([likelihood.num_tasks]))
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal.from_batch_mvn(
            gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x)))


def vector_field_kernel(kind: str, width: int, d: int = 2):
    """A multi-output feature kernel on d inputs with d outputs: ``"curl_free"``, ``"helmholtz"`` (curl- plus
    divergence-free) or, otherwise, decomposable (RBF ⊗ rank-1 task covariance)."""
    if kind == "curl_free":
        return ScaleKernel(SketchedCurlFreeKernel(width, input_dim=d, seed=0))
    if kind == "helmholtz":
        return MultiOutputFeatureSumKernel(ScaleKernel(SketchedCurlFreeKernel(width, d, seed=0)),
                                           ScaleKernel(SketchedDivFreeKernel(width * (d - 1), d, seed=1)))
    return SketchedDecomposableKernel(SketchedRBFKernel(width, seed=0), num_tasks=d, rank=1)


def fit_mll_failing_at(call: int):
    """(a stand-in for ``rfgp.fit_mll`` that raises linear_operator's ``NotPSDError`` at its ``call``-th call and
    trains as ``rfgp.fit_mll`` otherwise, the list of its calls): a fit whose covariance fails, for the estimators'
    restarts."""
    from linear_operator.utils.errors import NotPSDError

    import rfgp

    calls = []

    def fit_mll(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise NotPSDError("Matrix not positive definite after repeatedly adding jitter")
        return rfgp.fit_mll(*args, **kwargs)

    return fit_mll, calls
