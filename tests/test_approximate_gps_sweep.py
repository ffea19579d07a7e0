"""GPyTorch's approximate-GP tutorial patterns with rfgp kernels, each against the same model with the exact kernel.

Every model is built twice with the same variational parameters and hyperparameters (distinct per batch member, so a
batch kernel that mixed its members' hyperparameters would show): once with GPyTorch's exact kernel, once converted by
``rfgp.sketch``.  The ELBO (or the objective named), the gradient of a lengthscale and the predictions approach the
exact ones as F grows (random-feature error ∝ 1/√F: a 256× wider map has 16× smaller errors on average, so the tests
ask for less than half the narrow map's error and a bound at the wide one), and a Nyström kernel whose landmarks are
all the points agrees to its jitter.  Monte-Carlo objectives draw the same standard normals in both models (GPyTorch
samples the marginals in training: N(μ, σ²) from the same seed), so the comparison is not drowned in sampling noise.
"""

import gpytorch
import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from gpytorch.models import ApproximateGP
from gpytorch.variational import (
    CholeskyVariationalDistribution,
    VariationalStrategy,
)

import rfgp
from rfgp.core.validation import NonFiniteError

F64 = torch.float64
N, M, D = 50, 10, 2


def data(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(N, D, generator=gen, dtype=F64)
    f = 2 * torch.sin(4 * x[:, 0]) + x[:, 1]
    return x, f, torch.rand(20, D, generator=gen, dtype=F64), gen


def exact_kernel(batch_shape=torch.Size([]), nu=None):
    """ScaleKernel(RBF or Matérn-ν, ARD) with lengthscales 0.2–0.5 and outputscales 0.7–1.6 spread over the batch."""
    base = RBFKernel if nu is None else (lambda **kw: MaternKernel(nu=nu, **kw))
    kernel = ScaleKernel(base(ard_num_dims=D, batch_shape=batch_shape), batch_shape=batch_shape).double()
    count = batch_shape.numel()
    kernel.base_kernel.lengthscale = torch.linspace(0.2, 0.5, D * count, dtype=F64).reshape(*batch_shape, 1, D)
    kernel.outputscale = torch.linspace(0.7, 1.6, count, dtype=F64).reshape(batch_shape)
    return kernel


def raw_lengthscale(kernel):
    return next(p for name, p in kernel.named_parameters() if name.endswith("raw_lengthscale"))


def set_variational(strategy, seed=3):
    """A fixed, non-trivial q(u) for any of GPyTorch's variational distributions (GPyTorch would otherwise initialise
    it to the prior at the first call): means N(0, 0.25), covariances S = CCᵀ with C = 0.4·I + 0.3·strict-tril(ε)."""
    gen = torch.Generator().manual_seed(seed)
    distribution = strategy._variational_distribution
    for name, param in distribution.named_parameters():
        noise = torch.randn(param.shape, generator=gen, dtype=F64)
        if param.dim() >= 2 and param.shape[-1] == param.shape[-2]:
            chol = 0.3 * noise.tril(-1) + 0.4 * torch.eye(param.shape[-1], dtype=F64)
            if name == "natural_mat":  # NaturalVariationalDistribution: −S⁻¹/2
                param.data = -0.5 * torch.cholesky_inverse(chol)
            elif name == "natural_tril_mat":  # TrilNaturalVariationalDistribution: L with LLᵀ = S⁻¹
                param.data = torch.linalg.cholesky(torch.cholesky_inverse(chol))
            else:
                param.data = chol
        else:
            param.data = 0.5 * noise
    strategy.variational_params_initialized.fill_(1)


class SVGP(ApproximateGP):
    """GPyTorch's SVGP tutorial model, with the distribution, strategy and batch shape as arguments."""

    def __init__(self, covar_module, inducing_points, distribution=CholeskyVariationalDistribution,
                 strategy=VariationalStrategy, batch_shape=torch.Size([]), learn_inducing_locations=True):
        inducing_points = inducing_points.expand(*batch_shape, *inducing_points.shape).clone()
        q_u = distribution(inducing_points.shape[-2], batch_shape=batch_shape)
        super().__init__(strategy(self, inducing_points, q_u, learn_inducing_locations=learn_inducing_locations))
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch_shape)
        self.covar_module = covar_module

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def test_nan_inducing_point_is_named_as_the_kernels_x1():
    """A NaN inducing point (a diverged training step) first reaches the kernel in K(Z, x), a lazy cross-covariance
    whose rows are checked block by block; building it probes Z's first row, and that probe's error named the feature
    map's argument "x" with its 2 entries ("x contains NaN ... of 2"), as if the data were at fault."""
    x, f, _, _ = data()
    model = SVGP(rfgp.sketch(exact_kernel(), 64, seed=0), x[:M].clone()).double()
    model.variational_strategy.inducing_points.data[0, 1] = float("nan")
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    with pytest.raises(NonFiniteError, match=r"^x1 contains NaN or Inf entries \(1 NaN and 0 ±Inf of 20, the first "
                                             r"at index \(0, 1\)\)"):
        gpytorch.mlls.VariationalELBO(likelihood, model, num_data=N)(model(x), f)
    kernel = rfgp.kernels.SketchedRBFKernel(64, seed=0, ard_num_dims=D).double()
    z = x[:M].clone()
    z[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"^x1 contains NaN or Inf entries \(0 NaN and 1 ±Inf of 20"):
        kernel(z, x).to_dense()
    x = x.clone()
    x[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"^x2 contains NaN or Inf entries \(1 NaN and 0 ±Inf of 100"):
        kernel(z[1:], x).to_dense()
