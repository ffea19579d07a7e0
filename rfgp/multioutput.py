"""Multi-output GPs with feature-space (Woodbury) training and prediction in O(N·p·F²).

A multi-output rfgp kernel returns the interleaved root R (N·p × F) of K̂ = RRᵀ.  With the
noise D of ``gpytorch.likelihoods.MultitaskGaussianLikelihood`` (rank 0: a diagonal
``KroneckerProductDiagLinearOperator``), K̂ + D is a
:class:`~rfgp.operators.FeatureRootAddedDiagLinearOperator`, whose marginal likelihood runs
through the F × F capacitance matrix A = I + RᵀD⁻¹R.  For prediction GPyTorch's multitask
path flattens the (N, p) targets and means, which the single-output
``LinearPredictionStrategy`` does not expect (GPyTorch #2659: multitask models otherwise end
in ``DefaultPredictionStrategy``, i.e. dense N·p × N·p algebra);
:class:`MultitaskFeatureSpacePredictionStrategy` keeps the weight-space form

    θ | y ~ N(A⁻¹RᵀD⁻¹(y − μ), A⁻¹),     f(x*) = R(x*)θ,

so the posterior mean costs O(N·p·F + F³) and the covariance is the root R(x*)L⁻ᵀ (LLᵀ = A).
"""

from __future__ import annotations

import gpytorch
import torch
from gpytorch.utils.memoize import cached
from linear_operator.operators import ConstantMulLinearOperator, RootLinearOperator, ZeroLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from ._validation import check_model_inputs, check_noise, check_targets, check_training_data
from .linalg import weighted_gram
from .operators import FeatureRootAddedDiagLinearOperator
from .prediction import FeatureSpacePredictionStrategy


def scaled_root(covar) -> Tensor | None:
    """The feature root of a (possibly constant-scaled) low-rank operator, constant folded in."""
    if hasattr(covar, "evaluate_kernel"):
        covar = covar.evaluate_kernel()
    if isinstance(covar, ConstantMulLinearOperator):
        inner = scaled_root(covar.base_linear_op)
        return None if inner is None else inner * covar.expanded_constant.sqrt().unsqueeze(-1).unsqueeze(-1)
    root = getattr(covar, "root", None)
    return None if root is None else root.to_dense()


class MultitaskFeatureSpacePredictionStrategy(FeatureSpacePredictionStrategy):
    """Woodbury prediction for multi-output feature kernels with a diagonal (multitask) Gaussian noise.

    Works with ``MultitaskMultivariateNormal`` (interleaved, the default) and
    ``MultitaskGaussianLikelihood(rank=0)`` or ``GaussianLikelihood``-style diagonal noise.
    """

    def __init__(self, train_inputs, train_prior_dist, train_labels, likelihood):
        super().__init__(train_inputs, train_prior_dist, train_labels, likelihood)
        if getattr(train_prior_dist, "_interleaved", True) is False:
            raise ValueError(
                "rfgp multi-output kernels use GPyTorch's interleaved layout; build the model output with "
                "MultitaskMultivariateNormal(mean, covar, interleaved=True) (the default)"
            )
        if not isinstance(self.lik_train_train_covar, FeatureRootAddedDiagLinearOperator):
            raise TypeError(
                "feature-space multi-output prediction needs a likelihood with diagonal noise (e.g. "
                "MultitaskGaussianLikelihood(num_tasks, rank=0)); got a noisy covariance of type "
                f"{type(self.lik_train_train_covar).__name__}"
            )

    @property
    @cached(name="mean_covar_cache")
    def mean_covar_cache(self) -> tuple[Tensor, Tensor]:
        """(E[θ | y] of shape (..., F, 1), Cholesky factor L of A = I + RᵀD⁻¹R)."""
        check_targets(self.train_labels, "the training targets y")
        features = scaled_root(self.train_prior_dist.lazy_covariance_matrix)
        noise = check_noise(self.lik_train_train_covar._diag_tensor.diagonal(dim1=-1, dim2=-2))
        weights = noise.reciprocal()
        capacitance = weighted_gram(features, weights)
        eye = torch.eye(capacitance.shape[-1], dtype=capacitance.dtype, device=capacitance.device)
        chol = psd_safe_cholesky(capacitance + eye)
        residual = self.train_labels - self.train_prior_dist.loc  # both flattened in interleaved order
        rhs = features.mT @ (residual * weights).unsqueeze(-1)
        return torch.cholesky_solve(rhs, chol), chol

    def exact_prediction(self, test_mean, test_test_covar, test_train_covar):
        features = scaled_root(test_test_covar)
        if features is None:
            raise TypeError(
                f"expected a low-rank feature operator for the test covariance, got {type(test_test_covar).__name__}"
            )
        weight_mean, chol = self.mean_covar_cache
        mean = (features @ weight_mean).squeeze(-1) + test_mean
        if gpytorch.settings.skip_posterior_variances.on():
            return mean, ZeroLinearOperator(*features.shape[:-1], features.shape[-2], dtype=mean.dtype, device=mean.device)
        return mean, RootLinearOperator(torch.linalg.solve_triangular(chol, features.mT, upper=False).mT)


def kernel_num_outputs(kernel, x: Tensor) -> int:
    outputs = kernel.num_outputs_per_input(x, x)
    if isinstance(outputs, tuple):
        raise ValueError(f"kernel {type(kernel).__name__} has different row/column output counts {outputs}")
    return int(outputs)


class MultiOutputGPModel(gpytorch.models.ExactGP):
    """f ~ GP(μ, K) with p outputs per input; y = f + ε, ``MultitaskMultivariateNormal`` output.

    With an rfgp multi-output kernel (sketched curl/div-free or decomposable) training and
    prediction stay in feature space (O(N·p·F²)); exact operator-valued kernels work too
    (dense, for validation).

    Args:
        train_x: ``(n, d)`` inputs.
        train_y: ``(n, p)`` targets; p must equal the kernel's ``num_outputs_per_input``.
        likelihood: e.g. ``gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=p, rank=0)``.
        covar_module: the matrix-valued kernel (optionally inside ``ScaleKernel``).
        mean_module: defaults to ``MultitaskMean(ZeroMean(), p)`` (vector fields are usually centred).

    Example:
        >>> from gpytorch.likelihoods import MultitaskGaussianLikelihood
        >>> from rfgp.kernels import SketchedCurlFreeKernel
        >>> x = torch.randn(50, 2, generator=torch.Generator().manual_seed(0))
        >>> y = -2 * x                                   # the gradient field of −‖x‖²: curl-free
        >>> kernel = gpytorch.kernels.ScaleKernel(SketchedCurlFreeKernel(1024, input_dim=2, seed=0))
        >>> model = MultiOutputGPModel(x, y, MultitaskGaussianLikelihood(num_tasks=2, rank=0), kernel)
        >>> _ = model.eval()
        >>> model(torch.zeros(3, 2)).mean.shape          # (points, components)
        torch.Size([3, 2])
    """

    def __init__(self, train_x: Tensor, train_y: Tensor, likelihood, covar_module, mean_module=None) -> None:
        if not torch.is_tensor(train_y) or train_y.dim() != 2:
            shape = tuple(train_y.shape) if torch.is_tensor(train_y) else type(train_y).__name__
            raise ValueError(f"train_y must be an (n, p) tensor of vector observations, got {shape}")
        check_training_data(train_x, train_y, target_axis=-2)
        num_outputs = kernel_num_outputs(covar_module, train_x[..., :1, :])
        if train_y.shape[-1] != num_outputs:
            raise ValueError(
                f"train_y has {train_y.shape[-1]} outputs (columns) but covar_module has num_outputs_per_input="
                f"{num_outputs}; they must match"
            )
        if train_y.shape[0] != train_x.shape[-2]:
            raise ValueError(f"train_x has {train_x.shape[-2]} points but train_y has {train_y.shape[0]} rows")
        tasks = getattr(likelihood, "num_tasks", num_outputs)
        if tasks != num_outputs:
            raise ValueError(f"likelihood has num_tasks={tasks} but the kernel has {num_outputs} outputs")
        super().__init__(train_x, train_y, likelihood)
        self.num_outputs = num_outputs
        if mean_module is None:
            mean_module = gpytorch.means.MultitaskMean(gpytorch.means.ZeroMean(), num_tasks=num_outputs)
        self.mean_module = mean_module
        self.covar_module = covar_module

    def __call__(self, *inputs, **kwargs):
        check_model_inputs(self, inputs)
        return super().__call__(*inputs, **kwargs)

    def forward(self, x: Tensor) -> gpytorch.distributions.MultitaskMultivariateNormal:
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))
