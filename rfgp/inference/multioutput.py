"""Multi-output GPs with feature-space (Woodbury) training and prediction in O(N·p·F²).

A multi-output rfgp kernel returns the interleaved root R (N·p × F) of K̂ = RRᵀ.  With the
noise D of ``gpytorch.likelihoods.MultitaskGaussianLikelihood`` (rank 0: a diagonal
``KroneckerProductDiagLinearOperator``), K̂ + D is a
:class:`~rfgp.inference.operators.FeatureRootAddedDiagLinearOperator`, whose marginal likelihood runs
through the F × F capacitance matrix A = I + RᵀD⁻¹R; with correlated task noise (rank ≥ 1:
D = I_N ⊗ Σ_T) it is a :class:`~rfgp.inference.task_noise.FeatureRootAddedTaskNoiseLinearOperator`,
and R, y are whitened per point by Σ_T's Cholesky factor first (D becomes I).  A sketched ``MultitaskKernel``
(R = φ ⊗ B) under a noise D_N ⊗ Σ_T forms RᵀD⁻¹R and RᵀD⁻¹y from the Kronecker factors instead, in O(N·F² + F²·m²)
(:mod:`rfgp.inference.kronecker_statistics`), for the marginal likelihood and the posterior caches.  For
prediction GPyTorch's multitask path flattens the (N, p) targets and means, which the single-output
``LinearPredictionStrategy`` does not expect (GPyTorch #2659: multitask models otherwise end
in ``DefaultPredictionStrategy``, i.e. dense N·p × N·p algebra);
:class:`MultitaskFeatureSpacePredictionStrategy` keeps the weight-space form

    θ | y ~ N(A⁻¹RᵀD⁻¹(y − μ), A⁻¹),     f(x*) = R(x*)θ,

so the posterior mean costs O(N·p·F² + F³) and the covariance is the root R(x*)L⁻ᵀ (LLᵀ = A).  When the
N·p × N·p matrix RRᵀ + D is cheaper (N·p ≲ F, the marginal likelihood's flop rule of
:func:`~rfgp.inference.kernel_space.prefers_kernel_space`; ``uses_kernel_space`` says which), the same
E[θ | y] = Rᵀ(RRᵀ + D)⁻¹(y − μ) and covariance root R*(I − WᵀQ) (W = L⁻¹R, Q = (L + D^{1/2})⁻¹R, LLᵀ = RRᵀ + D;
:class:`~rfgp.inference.kernel_space.KernelSpaceFactor`) come from its Cholesky factor in O((N·p)²F + (N·p)³),
with no F × F matrix (whitened R̃, r̃ and D = I under correlated noise; missing entries' rows dropped).
Either square matrix is checked against the available memory first (:func:`rfgp.core.memory.check_solve`).
Training and test roots over :class:`rfgp.settings.memory_budget` are evaluated a block of points at a time
(:mod:`rfgp.inference.multioutput_chunking`; a chunked training root always takes the F × F capacitance; a sketched
``MultitaskKernel`` keeps its Kronecker statistics, :mod:`rfgp.inference.chunked_kronecker`).
Independent outputs under diagonal noise (GPyTorch's batch-independent GP, :mod:`rfgp.inference.independent_tasks`)
predict through the single-output strategy of their T systems instead
(:attr:`MultitaskFeatureSpacePredictionStrategy.task_strategy`), with cross-output covariances 0.
"""

from __future__ import annotations

import math

import gpytorch
import torch
from gpytorch.utils.memoize import cached
from linear_operator.operators import (
    BlockInterleavedLinearOperator,
    ConstantMulLinearOperator,
    DiagLinearOperator,
    LinearOperator,
    ZeroLinearOperator,
)
from torch import Tensor

from ..core.dtypes import in_full_precision
from ..core.memory import check_solve
from ..core.validation import check_noise
from . import distributed
from .chunked_kronecker import ChunkedKroneckerFeatureOperator
from .independent_tasks import IndependentTasksAddedDiagLinearOperator, join_tasks, split_tasks
from .kernel_evaluation import evaluated_covariance
from .kronecker_posterior import ChunkedKroneckerPosteriorCovariance, kronecker_mean, kronecker_posterior_covariance
from .linalg import accumulated_project, capacitance_solve, weighted_gram
from .multioutput_chunking import (
    ChunkedMultiOutputFeatureOperator,
    ChunkedPosteriorCovariance,
    chunked_training_statistics,
    is_chunked_training_covariance,
)
from .operators import ChunkedFeatureRootAddedDiagLinearOperator, FeatureRootAddedDiagLinearOperator
from .posterior_covariance import feature_posterior_covariance
from .prediction import FeatureSpacePredictionStrategy, observed_residual, operator_variance_correction
from .statistics_precision import statistics_dtype, weighted_square_norm
from .task_noise import FeatureRootAddedTaskNoiseLinearOperator


def scaled_root(covar) -> Tensor | None:
    """The feature root of a (possibly constant-scaled) low-rank operator, constant folded in."""
    if hasattr(covar, "evaluate_kernel"):
        covar = evaluated_covariance(covar)
    if isinstance(covar, ConstantMulLinearOperator):
        inner = scaled_root(covar.base_linear_op)
        return None if inner is None else inner * covar.expanded_constant.sqrt().unsqueeze(-1).unsqueeze(-1)
    root = getattr(covar, "root", None)
    return None if root is None else root.to_dense()


class SystemNoise(gpytorch.likelihoods.Likelihood):
    """y = f + ε, ε ~ N(0, D) for a given diagonal noise operator D: the likelihood of the T systems Φ_tΦ_tᵀ + D_t of
    independent outputs (:meth:`~rfgp.inference.independent_tasks.IndependentTasksAddedDiagLinearOperator.task_system`),
    whose marginal adds D itself (one value per output where GPyTorch's noise is: no N × F weighting pass)."""

    def __init__(self, noise: LinearOperator) -> None:
        super().__init__()
        self.noise_operator = noise

    def forward(self, function_samples: Tensor, *args, **kwargs):
        noise = self.noise_operator.diagonal(dim1=-1, dim2=-2)
        return gpytorch.distributions.base_distributions.Normal(function_samples, noise.sqrt())

    def marginal(self, function_dist, *args, **kwargs):
        return function_dist.__class__(function_dist.mean, function_dist.lazy_covariance_matrix + self.noise_operator)


class MultitaskFeatureSpacePredictionStrategy(FeatureSpacePredictionStrategy):
    """Woodbury prediction for multi-output feature kernels with a diagonal (multitask) Gaussian noise.

    Works with ``MultitaskMultivariateNormal`` (interleaved, the default) and
    ``MultitaskGaussianLikelihood`` of any rank (rank ≥ 1 through the whitening of
    :mod:`rfgp.inference.task_noise`) or ``GaussianLikelihood``-style diagonal noise.  Fantasies recompute from
    all points (its caches are not the single-output F × F ones that the rank-q update extends).
    """

    updates_fantasies = False

    def __init__(self, train_inputs, train_prior_dist, train_labels, likelihood):
        super().__init__(train_inputs, train_prior_dist, train_labels, likelihood)
        if getattr(train_prior_dist, "_interleaved", True) is False:
            raise ValueError(
                "rfgp multi-output kernels use GPyTorch's interleaved layout; build the model output with "
                "MultitaskMultivariateNormal(mean, covar, interleaved=True) (the default)"
            )
        if not isinstance(self.lik_train_train_covar, (FeatureRootAddedDiagLinearOperator,
                                                        ChunkedFeatureRootAddedDiagLinearOperator,
                                                        FeatureRootAddedTaskNoiseLinearOperator,
                                                        IndependentTasksAddedDiagLinearOperator)):
            raise TypeError(
                "feature-space multi-output prediction needs a likelihood with diagonal noise or GPyTorch's "
                "interleaved multitask noise I_N ⊗ Σ_T (e.g. MultitaskGaussianLikelihood(num_tasks, rank)); got a "
                f"noisy covariance of type {type(self.lik_train_train_covar).__name__}"
            )

    @property
    def num_tasks(self) -> int | None:
        """T, the outputs per training point of a ``MultitaskMultivariateNormal`` prior (the flattened targets' entry
        n·T + t is point n's output t), which errors about the targets name as (point, task); ``None`` for another
        distribution (flat indices)."""
        prior = self.train_prior_dist
        return prior.num_tasks if isinstance(prior, gpytorch.distributions.MultitaskMultivariateNormal) else None

    @property
    def independent_tasks(self) -> bool:
        """Whether the outputs are independent (:mod:`rfgp.inference.independent_tasks`: a batch-independent kernel
        with diagonal noise), so that the posterior is the T outputs' single-output posteriors
        (:attr:`task_strategy`)."""
        return isinstance(self.lik_train_train_covar, IndependentTasksAddedDiagLinearOperator)

    @property
    def task_strategy(self) -> FeatureSpacePredictionStrategy:
        """The single-output strategy of the T independent outputs' batch of systems Φ_tΦ_tᵀ + D_t (missing entries
        decoupled, :meth:`~rfgp.inference.independent_tasks.IndependentTasksAddedDiagLinearOperator.task_system`),
        per ``observation_nan_policy``."""
        return self.cache(type(self)._task_strategy, gpytorch.settings.observation_nan_policy.value())

    @cached(name="task_strategy")
    def _task_strategy(self, nan_policy: str) -> FeatureSpacePredictionStrategy:
        residual, observed = observed_residual(self.train_labels, self.train_prior_dist.loc, nan_policy, self.num_tasks)
        noisy = self.lik_train_train_covar
        system, tasks = noisy.task_system(observed), noisy.num_tasks
        mean = split_tasks(self.train_prior_dist.loc, tasks)
        prior = gpytorch.distributions.MultivariateNormal(mean, system._linear_op)
        strategy = FeatureSpacePredictionStrategy(self.train_inputs, prior, split_tasks(residual, tasks) + mean,
                                                  SystemNoise(system._diag_tensor))
        strategy.caches_follow_new_data = self.caches_follow_new_data
        # its caches' graph is this strategy's: rebuilt from this one's kernel and likelihood, evaluated again
        strategy.graph_origin = (lambda: type(self)._task_strategy.__wrapped__(self.graph_source(), nan_policy),
                                 self.graph_inputs)
        return strategy

    def _task_prediction(self, test_mean: Tensor, test_test_covar):
        """Mean and covariance of independent outputs: the T single-output posteriors, joined (cross-output
        covariances 0: GPyTorch's ``BlockInterleavedLinearOperator`` of the T covariances)."""
        tasks = getattr(test_test_covar, "tasks", None)
        if tasks is None:
            raise TypeError("the test covariance of independent outputs must come from the same batch-independent "
                            f"kernel as the training covariance, got {type(test_test_covar).__name__}")
        self.check_features(tasks)
        mean, covar = self.task_strategy.exact_prediction(split_tasks(test_mean, tasks.shape[-3]), tasks, None)
        mean = join_tasks(mean)
        if gpytorch.settings.skip_posterior_variances.on():
            return mean, ZeroLinearOperator(*mean.shape, mean.shape[-1], dtype=mean.dtype, device=mean.device)
        return mean, BlockInterleavedLinearOperator(covar)

    @property
    def weight_mean(self) -> Tensor:
        """E[θ | y] ``(..., F, 1)``; for independent outputs the T outputs' weights stacked (θ of the interleaved
        root's columns s·F + f)."""
        if self.independent_tasks:
            return self.task_strategy.weight_mean.flatten(-3, -2)
        return super().weight_mean

    def weight_samples(self, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
        if self.independent_tasks:
            return self.task_strategy.weight_samples(num_samples, generator).flatten(-3, -2)
        return super().weight_samples(num_samples, generator)

    @property
    def uses_kernel_space(self) -> bool:
        """Whether the posterior caches come from the N·T × N·T matrix ΦΦᵀ + D (whitened: Φ̃Φ̃ᵀ + I).

        The marginal likelihood's choice (:func:`rfgp.inference.kernel_space.prefers_kernel_space` on the N·T
        training rows and F features, batches counted): O((NT)²F + (NT)³) instead of O(NT·F² + F³).  A training
        root over the memory budget (chunked) stays in feature space.  Independent outputs: whether their T systems
        run in kernel space (N × N each).
        """
        if self.independent_tasks:
            return self.task_strategy.uses_kernel_space
        noisy = self.lik_train_train_covar
        return not is_chunked_training_covariance(noisy) and noisy.uses_kernel_space()

    def _training_system(self, nan_policy: str) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """(R, the noise diagonal d ``(..., N·T)`` or ``(..., 1)``, y − μ, the observed mask), interleaved.

        With correlated task noise R and y − μ are whitened (d = 1, module docstring); a missing entry's
        whitened row is 0 (task_noise docstring).
        """
        residual, observed = observed_residual(self.train_labels, self.train_prior_dist.loc, nan_policy, self.num_tasks)
        features = scaled_root(self.train_prior_dist.lazy_covariance_matrix)
        noisy = self.lik_train_train_covar
        if isinstance(noisy, FeatureRootAddedTaskNoiseLinearOperator):  # whitened: Φ̃ = WΦ, r̃ = Wr, D = I
            features = noisy.whiten(features, observed)
            residual = noisy.whiten(residual.unsqueeze(-1), observed).squeeze(-1)
            return features, features.new_ones(*features.shape[:-2], 1), residual, observed
        return features, check_noise(noisy._diag_tensor.diagonal(dim1=-1, dim2=-2)), residual, observed

    @cached(name="mean_covar_cache")
    @in_full_precision
    def _mean_covar_cache(self, nan_policy: str) -> tuple[Tensor, Tensor]:
        """(E[θ | y] of shape (..., F, 1), Cholesky factor L of A = I + RᵀD⁻¹R).

        Under ``observation_nan_policy("mask")``/``("fill")`` a NaN target (one task at one input, in
        GPyTorch's interleaved order) gets weight 0: A and RᵀD⁻¹r are those of the observed entries.  A training
        root over the memory budget gives its statistics block by block
        (:func:`~rfgp.inference.multioutput_chunking.chunked_training_statistics`), except a sketched
        ``MultitaskKernel`` under a noise D_N ⊗ Σ_T, whose statistics come from its Kronecker factors, chunked or
        not (:mod:`rfgp.inference.chunked_kronecker`).
        """
        kronecker = self._kronecker_statistics(nan_policy)
        if kronecker is not None:
            return kronecker
        if is_chunked_training_covariance(self.lik_train_train_covar):
            residual, observed = observed_residual(self.train_labels, self.train_prior_dist.loc, nan_policy,
                                                   self.num_tasks)
            statistics = chunked_training_statistics(self.lik_train_train_covar, residual, observed)
            return capacitance_solve(*distributed.reduce_statistics(*statistics), dtype=residual.dtype)
        features, noise, residual, observed = self._training_system(nan_policy)
        weights = noise.reciprocal()
        if observed is not None and weights.shape[-1] != 1:
            weights = weights * observed.to(weights.dtype)
        num_rows, num_features = features.shape[-2:]
        batch = math.prod(torch.broadcast_shapes(features.shape[:-2], weights.shape[:-1]))
        check_solve(num_rows, num_features, batch, features.dtype, features.device, size=num_features)
        dtype = features.dtype  # float32 statistics where their rounding is negligible (statistics_precision)
        work = statistics_dtype(dtype, features.device,
                                lambda: distributed.reduce_statistics(weighted_square_norm(features, weights))[0])
        features, weights, residual = features.to(work), weights.to(work), residual.to(work)
        rhs = accumulated_project(features, (residual * weights).unsqueeze(-1))  # float64 partial sums of float32 rows
        return capacitance_solve(*distributed.reduce_statistics(weighted_gram(features, weights), rhs), dtype=dtype)

    def _kronecker_statistics(self, nan_policy: str) -> tuple[Tensor, Tensor] | None:
        """:meth:`_mean_covar_cache` from the Kronecker factors of a sketched ``MultitaskKernel`` under a noise
        D_N ⊗ Σ_T (:mod:`rfgp.inference.kronecker_statistics`: O(N·F² + F²·m²) instead of the whitened root's
        O(N·T·F²·m²)); ``None`` where they do not apply (another kernel or noise, missing targets)."""
        noisy = self.lik_train_train_covar
        if not hasattr(noisy, "kronecker_statistics"):
            return None
        residual, observed = observed_residual(self.train_labels, self.train_prior_dist.loc, nan_policy, self.num_tasks)
        if observed is not None:
            return None
        if noisy.uses_kernel_space():
            return None
        statistics = noisy.kronecker_statistics(residual.unsqueeze(-1))  # refuses F·m × F·m that cannot fit
        if statistics is None:
            return None
        gram, cross, _, dtype = statistics
        return capacitance_solve(gram, cross, dtype=dtype)

    @in_full_precision
    def exact_prediction(self, test_mean, test_test_covar, test_train_covar):
        self.check_draws()
        if hasattr(test_test_covar, "evaluate_kernel"):
            test_test_covar = evaluated_covariance(test_test_covar)
        if self.independent_tasks:
            return self._task_prediction(test_mean, test_test_covar)
        if isinstance(test_test_covar, ChunkedMultiOutputFeatureOperator):
            return self._chunked_prediction(test_mean, test_test_covar)
        factors = kronecker_test_factors(test_test_covar)
        features = scaled_root(test_test_covar) if factors is None else None
        if factors is None and features is None:
            raise TypeError(
                f"expected a low-rank feature operator for the test covariance, got {type(test_test_covar).__name__}"
            )
        self.check_features(features if factors is None else factors[0])
        kernel_space = self.uses_kernel_space
        weight_mean, factor = self.kernel_space_cache if kernel_space else self.mean_covar_cache
        if factors is None:
            mean = (features @ weight_mean).squeeze(-1) + test_mean
        else:  # φ*·W·Bᵀ, never the n*·T × F·m root (rfgp.inference.kronecker_posterior)
            mean = kronecker_mean(*factors, weight_mean) + test_mean
        if gpytorch.settings.skip_posterior_variances.on():
            shape = (*mean.shape, mean.shape[-1])
            return mean, ZeroLinearOperator(*shape, dtype=mean.dtype, device=mean.device)
        if factors is not None:
            features = scaled_root(test_test_covar)
        if factors is None or kernel_space:
            covar = feature_posterior_covariance(features, factor, kernel_space)
        else:
            covar = kronecker_posterior_covariance(features, factor, *factors)
        # a Nyström data kernel's k(x, x) − ‖φ(x)‖², times A_ii
        correction = operator_variance_correction(test_test_covar)
        if correction is not None:
            covar = covar + DiagLinearOperator(correction.expand(covar.shape[:-1]))
        return mean, covar

    def _chunked_prediction(self, test_mean: Tensor, test_test_covar: ChunkedMultiOutputFeatureOperator):
        """Mean and covariance of a test root over :class:`~rfgp.settings.memory_budget`, a block of points at a time.

        The mean is Φ*_c E[θ | y] per block; the covariance a
        :class:`~rfgp.inference.multioutput_chunking.ChunkedPosteriorCovariance` whose root rows Φ*_cL⁻ᵀ (or the
        kernel-space root) are recomputed per block for variances, joint samples and products.
        """
        kernel_space = self.uses_kernel_space
        weight_mean, factor = self.kernel_space_cache if kernel_space else self.mean_covar_cache
        kronecker = isinstance(test_test_covar, ChunkedKroneckerFeatureOperator)
        blocks = []
        chunks = test_test_covar.data_chunks() if kronecker else test_test_covar.feature_chunks()
        for _, features in chunks:
            self.check_features(features)
            if kronecker:  # φ*_c·W·Bᵀ, never the block's c·T × F·m root (rfgp.inference.kronecker_posterior)
                blocks.append(kronecker_mean(features, test_test_covar.task_factor, weight_mean))
            else:
                blocks.append((features @ weight_mean).squeeze(-1))
        mean = torch.cat(blocks, -1) + test_mean
        if gpytorch.settings.skip_posterior_variances.on():
            shape = (*mean.shape, mean.shape[-1])
            return mean, ZeroLinearOperator(*shape, dtype=mean.dtype, device=mean.device)

        def root(features: Tensor) -> Tensor:
            return feature_posterior_covariance(features, factor, kernel_space).low_rank_root

        # a Nyström data kernel's (k(x, x) − ‖φ(x)‖²)·A_ii
        correction = operator_variance_correction(test_test_covar)
        if correction is not None:
            correction = correction.expand(mean.shape)
        # an unbatched kernel's Φ* under batched targets or noise (an expanded training covariance): the mean's batch
        batch = mean.shape[:-1]
        if kronecker and not kernel_space:
            return mean, ChunkedKroneckerPosteriorCovariance(test_test_covar, root=root, noise=correction, chol=factor,
                                                             batch_shape=batch)
        return mean, ChunkedPosteriorCovariance(test_test_covar, root=root, noise=correction, batch_shape=batch)


def kronecker_test_factors(covar) -> tuple[Tensor, Tensor] | None:
    """(φ*, B) of a sketched ``MultitaskKernel``'s test covariance (φ* ⊗ B)(φ* ⊗ B)ᵀ that carries its Kronecker
    factors (:class:`~rfgp.inference.kronecker_tasks.KroneckerFeatureRootLinearOperator`, ``ScaleKernel`` folded
    into φ*), ``None`` for any other test covariance."""
    data, task = getattr(covar, "data_features", None), getattr(covar, "task_factor", None)
    return (data, task) if torch.is_tensor(data) and torch.is_tensor(task) else None


def kernel_num_outputs(kernel, x: Tensor) -> int:
    outputs = kernel.num_outputs_per_input(x, x)
    if isinstance(outputs, tuple):
        raise ValueError(f"kernel {type(kernel).__name__} has different row/column output counts {outputs}")
    return int(outputs)


def check_one_output_per_input(kernel, x: Tensor, owner: str, advice: str) -> None:
    """Refuse ``kernel`` (a model's ``covar_module``) if it has several outputs per input at ``x``: a derivative,
    operator-valued or multitask kernel, whose n·p × n·p covariance does not fit a model of one target per input row.

    One check for every such model (:class:`~rfgp.models.ExactGPModel`,
    :class:`~rfgp.models.streaming.StreamingFeatureGP`): a ``TypeError`` naming ``owner``, the kernel, its count and
    ``advice`` (formatted with ``outputs``, the count).  The two raised a ``ValueError`` and a ``TypeError`` for the
    same kernel.
    """
    outputs = kernel_num_outputs(kernel, x)
    if outputs != 1:
        raise TypeError(
            f"covar_module ({type(kernel).__name__}) has {outputs} outputs per input (a derivative, operator-valued "
            f"or multitask kernel), but {owner} models one output per input row: {advice.format(outputs=outputs)}"
        )
