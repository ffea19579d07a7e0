"""BoTorch pathwise (Matheron) sampling with rfgp kernels, using the kernel's own features.

Imported automatically once both rfgp and BoTorch are imported (:mod:`rfgp.integrations`);
importing it directly needs BoTorch.  It registers two entries with BoTorch's dispatchers, so
that ``botorch.sampling.pathwise.draw_matheron_paths`` and ``get_matheron_path_model`` (hence
pathwise Thompson sampling, ``optimize_posterior_samples``, …) work for any model whose
``covar_module`` is an rfgp feature kernel, optionally inside ``ScaleKernel``:

* ``gen_kernel_features`` for :class:`~rfgp.kernels.FeatureKernel` returns
  :class:`KernelFeatures`, the kernel's Φ itself (its fixed draws, not new random features;
  ``num_features`` of BoTorch's prior sampler is ignored because the model's kernel *is*
  k̂ = ΦᵀΦ).  BoTorch's own ``ScaleKernel`` generator adds the outputscale.
* ``gaussian_update`` for ``(ExactGP, GaussianLikelihood | FixedNoiseGaussianLikelihood)``
  computes Matheron's update f(·) + k̂(·, X)(K̂ + D)⁻¹(y − f(X) − ε) in weight space: with
  A = I + ΦᵀD⁻¹Φ (Woodbury), k̂(·, X)(K̂ + D)⁻¹r = Φ(·)ᵀA⁻¹ΦᵀD⁻¹r, an F × F solve from the
  feature statistics (chunked when the kernel's operator is), or Φ(·)ᵀ·Φᵀ(ΦΦᵀ + D)⁻¹r from the
  N × N factor when that is cheaper (N ≲ F), instead of BoTorch's dense Cholesky of K̂ + D and
  its N-point kernel evaluations per call.  For every other
  kernel the entry raises ``MDNotImplementedError``, which makes BoTorch's dispatcher run its
  own ``(ExactGP, _GaussianLikelihoodBase)`` update unchanged.

Prior path Φ(x)ᵀw plus update Φ(x)ᵀv is an exact draw of the posterior of the model's k̂
(Wilson et al. 2020, Eq. 13, with no feature approximation left).  Feature maps with a variance
bias (``has_variance_bias``) have a posterior variance larger by the diagonal c(x) =
k(x, x) − E[k̂(x, x)] (paper 000 §5.6), Nyström kernels by the FITC-style k(x, x) − ‖φ(x)‖² (in eval mode;
either inside a sum or product too); a function draw cannot carry an uncorrelated diagonal,
so BoTorch paths of such kernels sample the k̂ posterior without it and a warning says so
(:func:`rfgp.models.sampling.posterior_paths` can add it as per-point noise).  Kernels with several
outputs per input (operator-valued) and ``complex_posterior=True`` kernels are refused with
an error naming them, as are BoTorch's multi-task models (``MultiTaskGP``: no pathwise support in BoTorch for
its exact kernel either), whose error points to ``posterior(X).rsample``.
"""

from __future__ import annotations

import math

import torch
from botorch.exceptions.errors import UnsupportedError
from botorch.models.gpytorch import MultiTaskGPyTorchModel
from botorch.models.model import Model
from botorch.sampling.pathwise.features.generators import GenKernelFeatures, gen_kernel_features
from botorch.sampling.pathwise.features.maps import FeatureMap
from botorch.sampling.pathwise.paths import GeneralizedLinearPath
from botorch.sampling.pathwise.prior_samplers import DrawKernelFeaturePaths
from botorch.sampling.pathwise.update_strategies import GaussianUpdate
from botorch.sampling.pathwise.utils import TensorTransform, get_input_transform, get_train_inputs, get_train_targets
from botorch.utils.dispatcher import MDNotImplementedError
from botorch.utils.sampling import draw_sobol_normal_samples
from botorch.utils.transforms import is_ensemble
from gpytorch.likelihoods import FixedNoiseGaussianLikelihood, GaussianLikelihood
from gpytorch.models import ExactGP
from linear_operator.operators import DiagLinearOperator
from torch import Tensor
from torch.quasirandom import SobolEngine

from ..core.dtypes import in_full_precision
from ..core.user_warnings import warn as warn_user
from ..inference.kernel_evaluation import evaluated_covariance
from ..inference.kernel_space import kernel_cholesky
from ..inference.linalg import capacitance_solve, cholesky_solve
from ..inference.operators import FeatureRootAddedDiagLinearOperator, adaptive_feature_statistics, noise_weights
from ..kernels.combinations import holds_feature_kernel, is_feature_kernel, kernel_features
from ..kernels.nystrom import NystromKernel
from ..kernels.random_feature_kernel import FeatureKernel
from ..models.kernel_inputs import covar_module_inputs
from ..models.sampling import check_path_kernel


class _Identity(TensorTransform):
    """The output transform BoTorch's ``ScaleKernel`` generator chains the outputscale onto."""

    def forward(self, values: Tensor) -> Tensor:
        return values


class KernelFeatures(FeatureMap):
    """Φ of an rfgp feature kernel as a BoTorch pathwise feature map (``active_dims`` applied, no new draws)."""

    def __init__(self, kernel: FeatureKernel, num_inputs: int) -> None:
        super().__init__()
        self.kernel = kernel
        self.input_transform = None
        self.output_transform = _Identity()
        self._num_outputs = getattr(kernel, "num_features", None)
        if self._num_outputs is None:  # combined kernels: probe (their leaves' draws exist by now)
            with torch.no_grad():
                probe = kernel_features(kernel, torch.ones(1, num_inputs, dtype=kernel.dtype, device=kernel.device))
            self._num_outputs = probe.shape[-1]

    def forward(self, x: Tensor) -> Tensor:
        return kernel_features(self.kernel, x)

    @property
    def num_outputs(self) -> int:
        return self._num_outputs

    @property
    def batch_shape(self) -> torch.Size:
        return self.kernel.batch_shape


@GenKernelFeatures.register(FeatureKernel)
def _gen_kernel_features_rfgp(kernel: FeatureKernel, *, num_inputs: int, num_outputs: int) -> KernelFeatures:
    check_path_kernel(kernel, "kernel")
    probe = torch.zeros(1, num_inputs)
    outputs = kernel.num_outputs_per_input(probe, probe)
    if outputs != 1:
        raise UnsupportedError(
            f"{type(kernel).__name__} has {outputs} outputs per input (a derivative or operator-valued kernel, "
            "interleaved rows); BoTorch's pathwise sampling expects one output per input (multi-output models are "
            "batched). Use rfgp.models.sampling.posterior_paths for derivative and operator-valued kernels"
        )
    if adds_variance_correction(kernel):
        warn_user(
            f"{type(kernel).__name__} has a variance bias: BoTorch paths sample the posterior of k̂ = ΦᵀΦ without the "
            "diagonal correction c(x) = k(x, x) − E[k̂(x, x)] (Nyström: k(x, x) − ‖φ(x)‖²) that the model's posterior "
            "variance adds (rfgp.models.sampling.posterior_paths adds it as per-point noise, also under BoTorch input "
            "and outcome transforms)",
            UserWarning,
        )
    return KernelFeatures(kernel, num_inputs)


def adds_variance_correction(kernel) -> bool:
    """Whether the posterior variance of ``kernel`` adds a diagonal c(x) that its features do not carry: a feature map
    with ``has_variance_bias`` (c(x) = k(x, x) − E[k̂(x, x)]) or a Nyström kernel in eval mode (k(x, x) − ‖φ(x)‖²)
    anywhere in the kernel tree (inside sums, products, ``ScaleKernel``).  Read from the modules, not by evaluating
    the kernel: a map fitted on its first inputs (optimized Maclaurin) has not seen the training data yet here."""
    return any(getattr(module, "has_variance_bias", False) is True
               or (isinstance(module, NystromKernel) and not module.training) for module in kernel.modules())


#: BoTorch's prior-path sampler for exact GPs, which :func:`_draw_kernel_feature_paths_rfgp` wraps
_botorch_exact_gp_prior_paths = DrawKernelFeaturePaths.funcs[(ExactGP,)]


@DrawKernelFeaturePaths.register(ExactGP)
def _draw_kernel_feature_paths_rfgp(model: ExactGP, **kwargs) -> GeneralizedLinearPath:
    """BoTorch's prior paths, with prior weights that exist at any feature width (multi-task models refused).

    BoTorch draws the weights w ~ N(0, I_F) as scrambled Sobol normals, and ``SobolEngine`` stops at
    21 201 dimensions: an rfgp map wider than that (over all batch members) gets i.i.d. normal weights (exact draws,
    without the quasi-Monte-Carlo stratification).  Up to that width the weights are Sobol normals with one point per
    sample for all batch members (:func:`_prior_weights`; for an unbatched kernel BoTorch's own draws).  For every
    other kernel BoTorch's sampler runs unchanged.
    """
    covar_module = getattr(model, "covar_module", None)
    sketched = is_feature_kernel(covar_module)
    # MultiTaskGP(covar_module=rfgp.sketch(k)) builds the product of the sketched data kernel and an exact
    # IndexKernel, not itself a feature kernel (BoTorch raised "Could not find signature for gen_kernel_features")
    if isinstance(model, MultiTaskGPyTorchModel) and holds_feature_kernel(covar_module):
        raise UnsupportedError(
            f"BoTorch's pathwise sampling has no {type(model).__name__} support (with its exact kernel it raises "
            "NotImplementedError): its ExactGP path adds model.mean_module(x), here a MultitaskMean of one column per "
            "task, and conditions on one noise level, not the per-task noise of HadamardGaussianLikelihood. Sample "
            "with model.posterior(X).rsample() (e.g. MaxPosteriorSampling for Thompson sampling over candidates), or "
            "draw paths from one SingleTaskGP per task (a ModelListGP)"
        )
    if not sketched:
        return _botorch_exact_gp_prior_paths(model, **kwargs)
    refuse_transforming_forward(model)
    if "weight_generator" not in kwargs:
        kwargs["weight_generator"] = _prior_weights(model.covar_module)
    path = _botorch_exact_gp_prior_paths(model, **kwargs)
    return FullPrecisionPath(feature_map=path.feature_map, weight=path.weight, bias_module=path.bias_module,
                             input_transform=path.input_transform, output_transform=path.output_transform,
                             is_ensemble=path.is_ensemble, ensemble_as_batch=path.ensemble_as_batch)


class FullPrecisionPath(GeneralizedLinearPath):
    """BoTorch's path x ↦ Φ(x)w + b(x), evaluated in the features' dtype under an enclosing ``torch.autocast``:
    autocast would run its product Φ(x)w in bfloat16/float16 (5e-3 relative error at F = 256 with bfloat16)."""

    forward = in_full_precision(GeneralizedLinearPath.forward)


def refuse_transforming_forward(model: ExactGP) -> None:
    """Raise ``UnsupportedError`` where ``model.forward`` passes its inputs to ``covar_module`` transformed other than
    by the model's BoTorch input transform (deep kernel learning's network, a warping written into ``forward``).

    BoTorch's paths evaluate the kernel's features, and the update its covariance, on the (input-transformed)
    training inputs X themselves, so their draws would be of a GP on X, not on the network's outputs g(X) that the
    model's posterior conditions on (measured, a one-layer tanh network, N = 40: path means 5.6-43 posterior
    standard deviations off the posterior's, standard deviations 1.2-1.8 times too large).
    The check runs ``model.forward`` on the training inputs once, without a gradient and stopped at its
    ``covar_module`` call (:func:`~rfgp.models.kernel_inputs.covar_module_inputs`), and compares the kernel's input
    with BoTorch's transformed training inputs.  BoTorch's own paths of an exact kernel skip such a network the same
    way (no check there); :func:`rfgp.sampling.posterior_paths` refuses such models too.
    """
    inputs = model.train_inputs[0]  # what forward receives: for BoTorch models, transformed in eval mode only
    # what the paths' features receive (a GPyTorch ExactGP has no input transform)
    transformed = get_train_inputs(model, transformed=True)[0] if isinstance(model, Model) else inputs
    seen = covar_module_inputs(model, inputs)
    if seen is transformed or (seen.shape == transformed.shape and torch.equal(seen, transformed)):
        return
    raise UnsupportedError(
        f"{type(model).__name__}.forward passes its inputs to covar_module transformed beyond its input_transform (a "
        "deep kernel's network, an input warping): BoTorch's pathwise sampling evaluates covar_module on the "
        "training inputs themselves, so its paths would skip that transformation (BoTorch's paths of an exact kernel "
        "skip it the same way). Sample the posterior at the candidates instead, model.posterior(X).rsample() (e.g. "
        "MaxPosteriorSampling for Thompson sampling), move the transformation into a BoTorch input transform, or "
        "build the model on the transformed inputs"
    )


def _prior_weights(kernel):
    """Prior weights w ~ N(0, I) of shape ``sample_shape × kernel.batch_shape × F``: one scrambled Sobol sequence of
    normals over the samples, each point holding every batch member's F weights (for an unbatched kernel BoTorch's
    own call), or i.i.d. normals beyond Sobol's 21 201 dimensions.

    BoTorch draws one sequence of ``samples · members`` F-dimensional points and reshapes it, so that each member (each
    output of a multi-output ``SingleTaskGP``) gets every ``members``-th point: a strided subsequence of a Sobol
    sequence is not a quasi-random set (with 2 members every point of member 0 has its first coordinate in one half
    of the scrambled unit interval, i.e. w₁ of one sign, mean ±0.8), which biased the paths' means by up to 10
    posterior standard errors at 20 000 paths.  Separately scrambled sequences per member are no cure: they share the
    Sobol points' order, so the members' weights are correlated (0.6), where the posterior's outputs are independent.
    """
    def draw(shape: torch.Size) -> Tensor:
        members, width = kernel.batch_shape.numel(), shape[-1]
        if members * width > SobolEngine.MAXDIM:
            return torch.randn(shape, device=kernel.device, dtype=kernel.dtype)
        samples = math.prod(shape[:-1]) // members
        return draw_sobol_normal_samples(n=samples, d=members * width, device=kernel.device,
                                         dtype=kernel.dtype).reshape(shape)  # samples × members × F

    return draw


@GaussianUpdate.register(ExactGP, (GaussianLikelihood, FixedNoiseGaussianLikelihood))
def _gaussian_update_feature_space(
    model: ExactGP,
    likelihood,
    *,
    sample_values: Tensor,
    target_values: Tensor | None = None,
    points: Tensor | None = None,
    noise_covariance=None,
    scale_tril=None,
) -> GeneralizedLinearPath:
    """Matheron's update Φ(·)ᵀA⁻¹ΦᵀD⁻¹(y − f(X) − ε) for rfgp kernels; BoTorch's own update otherwise."""
    kernel = getattr(model, "covar_module", None)
    if kernel is None or not is_feature_kernel(kernel) or scale_tril is not None:
        raise MDNotImplementedError  # BoTorch's (ExactGP, _GaussianLikelihoodBase) update runs instead
    refuse_transforming_forward(model)
    if points is None:
        (points,) = get_train_inputs(model, transformed=True)
    if target_values is None:
        target_values = get_train_targets(model, transformed=True)
    if noise_covariance is None:
        # the likelihood's whole noise: a FixedNoiseGaussianLikelihood's learned second_noise too (its noise_covar
        # alone, which BoTorch's own update reads, left the paths' variance at the fixed noise: 1e-4 under a
        # learned 0.5, path variances 0.3–1 % of the posterior's)
        noise_covariance = _conditioned_likelihood(model, likelihood, points)._shaped_noise_covar(points.shape[:-1])
    if not isinstance(noise_covariance, DiagLinearOperator):
        raise MDNotImplementedError  # a non-diagonal noise: BoTorch's dense update handles it
    with torch.no_grad():  # the update is a function of x only, like the prior draws
        weight = _update_weights(kernel, points, target_values, sample_values, noise_covariance)
    feature_map = gen_kernel_features(kernel, num_inputs=points.shape[-1], num_outputs=weight.shape[-1])
    # an ensemble (a fully Bayesian model's batch of MCMC samples) evaluates its members on inputs without their axis
    return FullPrecisionPath(feature_map=feature_map, weight=weight, input_transform=get_input_transform(model),
                             is_ensemble=is_ensemble(model))


def _conditioned_likelihood(model: ExactGP, likelihood, points: Tensor):
    """The likelihood whose noise the model's posterior conditions its ``points`` on.

    A ``GaussianLikelihood`` model conditioned with ``noise=`` (``condition_on_observations(X, Y, noise)``,
    ``fantasize(X, sampler, observation_noise)``) keeps its homoscedastic likelihood, while its prediction strategy
    conditions on a ``FixedNoiseGaussianLikelihood`` of the N training noises followed by the given ones
    (:func:`rfgp.inference.prediction.fantasy_noise_likelihood`).  The update takes that one; with the model's
    likelihood its paths had the new points at the model's noise (N = 10 at noise 0.05, one point conditioned at
    noise 1e-4: path means 0.2-0.5 off the posterior's, variance 0.037 where the posterior's is 0.0004).
    """
    conditioned = getattr(getattr(model, "prediction_strategy", None), "likelihood", None)
    if (isinstance(conditioned, FixedNoiseGaussianLikelihood) and conditioned is not likelihood
            and conditioned.noise.shape[-1] == points.shape[-2]):
        return conditioned
    return likelihood


@in_full_precision
def _update_weights(kernel, points: Tensor, targets: Tensor, sample_values: Tensor,
                    noise_covariance: DiagLinearOperator) -> Tensor:
    """v = Φᵀ(ΦΦᵀ + D)⁻¹(y − f(X) − ε) with ε ~ N(0, D), shape ``sample_shape × batch × F``.

    In the cheaper of the posterior's two algebras (:meth:`~rfgp.inference.operators.FeatureRootAddedDiagLinearOperator.
    uses_kernel_space`): A⁻¹ΦᵀD⁻¹r from the F × F feature statistics (chunked when the kernel's operator is; float32
    features' formed in float64 where :mod:`rfgp.inference.statistics_precision` says so, A factorised in float64), or,
    when N ≲ F (a Bayesian-optimisation loop's few observations under a wide map), Φᵀ(ΦΦᵀ + D)⁻¹r from the N × N
    Cholesky factor — the same vector (push-through identity) without an F × F matrix.
    """
    operator = evaluated_covariance(kernel(points))
    if not hasattr(operator, "feature_statistics"):
        raise TypeError(f"expected an rfgp feature operator from {type(kernel).__name__}, got {type(operator).__name__}")
    weights = noise_weights(noise_covariance)
    noise = torch.randn(sample_values.shape, dtype=sample_values.dtype, device=sample_values.device)
    residual = targets - sample_values - noise * weights.reciprocal().sqrt()
    # the leading dimensions beyond the model's batch (the kernel's and the noise's): targets may lack the batch, as
    # a fully Bayesian model's (N,) under its S MCMC samples
    batch = torch.broadcast_shapes(operator.shape[:-2], noise_covariance.shape[:-2])
    sample_dims = residual.dim() - 1 - len(batch)
    # sample dimensions become right-hand-side columns: (batch, N, S)
    rhs = residual.flatten(0, sample_dims - 1).movedim(0, -1) if sample_dims else residual.unsqueeze(-1)
    noisy = operator + noise_covariance
    if isinstance(noisy, FeatureRootAddedDiagLinearOperator) and noisy.uses_kernel_space():
        features = operator.root.to_dense()  # the outputscale folded in
        chol = kernel_cholesky(features, weights.reciprocal())  # float64 for float32 features at a high SNR
        work = rhs.to(chol.dtype).expand(*chol.shape[:-2], *rhs.shape[-2:])
        solved = (features.to(chol.dtype).mT @ cholesky_solve(work, chol)).to(rhs.dtype)
    else:
        # float32 features' statistics in float64 where their rounding matters and A = I + ΦᵀD⁻¹Φ factorised in
        # float64, as the training MLL's (adaptive_feature_statistics, capacitance_solve)
        gram, cross, dtype = adaptive_feature_statistics(operator, weights, rhs)
        solved = capacitance_solve(gram, cross, weights.reciprocal(), dtype)[0]  # (batch, F, S)
    return solved.movedim(-1, 0).unflatten(0, residual.shape[:sample_dims]) if sample_dims else solved.squeeze(-1)
