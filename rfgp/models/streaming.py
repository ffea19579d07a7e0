"""Streaming (online) random-feature GP regression: add data without revisiting old data.

With fixed hyperparameters, the posterior of y = f + ε, f ~ GP(m, Φ(·)ᵀΦ(·)),
ε ~ N(0, σ²) depends on the data only through running sums (W = σ⁻²I, r = y − m(x)):

    G = ΦᵀWΦ (F × F),  B = ΦᵀWr (F),  q = rᵀWr,  ℓ = Σ log σ²,  n,

so a new batch (Φₖ, rₖ) is absorbed by G ← G + ΦₖᵀWΦₖ, B ← B + ΦₖᵀWrₖ, ... in O(k·F²)
and memory O(F²), whatever the number of points seen.  Points observed with known noise variances σᵢ² (sensors)
enter with W = diag(σᵢ⁻²) and ℓ = Σ log σᵢ² instead (``update(x, y, noise=...)``): the statistics of a GP whose
likelihood is ``FixedNoiseGaussianLikelihood`` on those points.
All five are summed in the factor's precision (float64 for
float32 inputs, :func:`~rfgp.core.dtypes.factor_dtype`: float32 sums of q and ℓ drifted by 2·10⁻⁶ and 2·10⁻⁴
relative over 2·10⁴ single-point updates, 31 nats of log p(y), and a float32 n stops counting at 2²⁴); a float32
batch's ΦₖᵀWΦₖ is formed in float32 while the stream's float32 rounding stays negligible, in float64 otherwise
(:mod:`rfgp.inference.statistics_precision`): see :meth:`StreamingFeatureGP.update`.  The posterior needs
L = chol(I + G) (:meth:`StreamingFeatureGP.cholesky`).  Once L exists, a small batch updates it
in O(k·F²) by the rank-k update LLᵀ + VVᵀ, V = ΦₖᵀW^½ (:func:`rfgp.inference.cholesky_update.cholesky_update`, see
:func:`takes_rank_update` for when); otherwise it is dropped and refactorised (O(F³)) the
first time it is needed:

    mean(x*) = m(x*) + Φ* L⁻ᵀL⁻¹B,   covar(x*) = (L⁻¹Φ*ᵀ)ᵀ(L⁻¹Φ*ᵀ) + diag c(x*),
    log p(y) = −½[q − ‖L⁻¹B‖² + 2Σ log Lᵢᵢ + ℓ + n log 2π].

These are the quantities of :func:`rfgp.inference.operators._statistics_inv_quad_logdet` and
:class:`rfgp.inference.prediction.FeatureSpacePredictionStrategy`, so the result equals a refit
on all the data.  :func:`fit_from_batches` feeds a ``DataLoader`` or any iterator of
``(x, y)`` batches.  Train hyperparameters first (e.g. on a subset, or with the chunked
``ExactGP`` path), then stream.

The statistics are only valid for the hyperparameters they were accumulated with (features,
lengthscale, outputscale, noise, mean): the model keeps a copy of every parameter and buffer of
its kernel, likelihood and mean module, and of the configuration fields of their rfgp modules (a Nyström kernel's
``jitter``), from its first update, and ``update``, the posterior and
the marginal likelihood raise ``RuntimeError`` once any of them changed, because old data would
be needed to recompute the statistics (``reset()`` and stream again, or restore them).  That copy is saved in
``state_dict`` beside the statistics, so a loaded model refuses them as the saved one did.
The streaming path runs without autograd.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel
from linear_operator.operators import DiagLinearOperator
from torch import Tensor, nn
from tqdm import tqdm  # plain text bar: tqdm.auto needs ipywidgets inside notebooks

from ..core.config_state import CONFIG_PREFIX, ConfigState, encode
from ..core.dtypes import factor_dtype, in_full_precision
from ..core.validation import (
    check_choice,
    check_finite,
    check_input_shape,
    check_same_dtype,
    check_tensor_dtype,
    module_dtype,
)
from ..inference.cholesky_update import cholesky_update
from ..inference.linalg import capacitance_cholesky, cholesky_solve, feature_statistics
from ..inference.multioutput import check_one_output_per_input
from ..inference.posterior_covariance import LowRankPosteriorCovariance
from ..inference.statistics_precision import statistics_dtype, weighted_square_norm
from ..kernels.combinations import is_feature_kernel, kernel_diag_moments, kernel_features, unwrap_scale
from ..kernels.input_columns import check_input_width

_STATISTICS = ("gram", "cross", "weighted_square", "noise_logdet", "count")
#: prefix of the state-dict keys holding the hyperparameters the statistics were summed with (written at save time)
_SNAPSHOT_PREFIX = "statistics_hyperparameters."

#: ``rank_update="auto"`` updates the factor for batches of k < F / RANK_UPDATE_DIVISOR points when
#: F ≥ RANK_UPDATE_MIN_FEATURES.  Measured (benchmarks/results/streaming_update.md, CPU time, one
#: thread): for k ≤ 16 the update takes 1.6–2.5× less time than refactorising at F = 1024 and
#: 2.8–4.4× less at F = 2048, it breaks even near k = F/16, and at F = 512 LAPACK's Cholesky matches
#: or beats it (the blocked update's per-block overhead dominates).
RANK_UPDATE_DIVISOR = 16
RANK_UPDATE_MIN_FEATURES = 1024


def takes_rank_update(rank: int, num_features: int, mode: str = "auto") -> bool:
    """Whether a batch of ``rank`` points updates an existing factor rather than dropping it.

    ``mode``: "auto" (k < F/16 and F ≥ 1024, the measured crossover), "always" or "never".
    """
    if mode == "auto":
        return num_features >= RANK_UPDATE_MIN_FEATURES and rank * RANK_UPDATE_DIVISOR < num_features
    return mode == "always"


class StreamingFeatureGP(nn.Module):
    """A random-feature GP posterior accumulated batch by batch from sufficient statistics.

    Args:
        covar_module: an rfgp feature kernel, optionally inside ``ScaleKernel`` (hyperparameters fixed), with one
            output per input and real features (``complex_posterior=True`` and derivative, operator-valued or
            multitask kernels are refused).
        likelihood: a ``gpytorch.likelihoods.GaussianLikelihood`` (its noise is fixed while streaming).
        mean_module: prior mean, default ``gpytorch.means.ZeroMean()``.
        rank_update: once the Cholesky factor exists, does a batch update it (O(k·F²)) or drop it
            for an O(F³) refactorisation: "auto" (see :func:`takes_rank_update`), "always", "never".

    Example:
        >>> import gpytorch, torch
        >>> import rfgp
        >>> from rfgp.models import StreamingFeatureGP, fit_from_batches
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> x = torch.rand(3000, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        >>> y = torch.sin(6 * x[:, 0])
        >>> kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(256, seed=0))
        >>> likelihood, mean = gpytorch.likelihoods.GaussianLikelihood(), gpytorch.means.ConstantMean()
        >>> gp = StreamingFeatureGP(kernel, likelihood, mean).double()
        >>> gp = fit_from_batches(gp, DataLoader(TensorDataset(x, y), batch_size=1000), progress=False)
        >>> prediction = gp.likelihood(gp(torch.rand(5, 1, dtype=torch.float64)))
        >>> prediction.mean.shape
        torch.Size([5])
    """

    def __init__(
        self, covar_module: Kernel, likelihood, mean_module=None, rank_update: str = "auto"
    ) -> None:
        super().__init__()
        if not is_feature_kernel(covar_module):
            raise TypeError(
                f"covar_module must be an rfgp feature kernel (optionally in ScaleKernel), got {type(covar_module).__name__}"
            )
        if getattr(unwrap_scale(covar_module)[0], "complex_posterior", False):
            raise ValueError(
                "covar_module has complex_posterior=True: its posterior is the complex-feature GP of paper 000 App. D, "
                "which the real feature statistics ΦᵀWΦ do not hold; build the kernel with complex_posterior=False"
            )
        check_one_output_per_input(covar_module, torch.zeros(1, 1), "StreamingFeatureGP",
                                   "use a single-output feature kernel")
        if not isinstance(likelihood, gpytorch.likelihoods.GaussianLikelihood):
            raise TypeError(f"likelihood must be a gpytorch GaussianLikelihood, got {type(likelihood).__name__}")
        self.covar_module = covar_module
        self.likelihood = likelihood
        self.mean_module = mean_module if mean_module is not None else gpytorch.means.ZeroMean()
        self.rank_update = check_choice(rank_update, "rank_update", ("auto", "always", "never"))
        for name in _STATISTICS:
            self.register_buffer(name, torch.zeros(0))
        self.register_buffer("factor", torch.zeros(0))  # L, empty for none: see _chol
        self._hyperparameters = None
        self.register_load_state_dict_post_hook(_snapshot_after_loading)

    @property
    def _chol(self) -> Tensor | None:
        """L = chol(I + G) as factorised or rank-updated so far (:meth:`cholesky`), ``None`` where it is to be
        refactorised.

        Kept in the buffer ``factor`` (empty for none), so that ``state_dict`` holds it: a rank-updated L differs from
        the refactorisation of the same G by rounding (10⁻¹⁵ in the means after 20 updates), and a model loaded
        without it predicted other values than the one saved.  A state dict without ``factor`` (saved before it was
        kept) loads with L refactorised from the statistics where it is needed.
        """
        return self.factor if self.factor.numel() else None

    @_chol.setter
    def _chol(self, value: Tensor | None) -> None:
        self.factor = self.factor.new_zeros(0) if value is None else value

    @property
    def num_data(self) -> int:
        """Number of points absorbed so far."""
        return int(self.count.reshape(-1)[0].item()) if self.count.numel() else 0

    def reset(self) -> StreamingFeatureGP:
        """Forget all data."""
        for name in _STATISTICS:
            setattr(self, name, torch.zeros(0))
        self._chol = None
        self._hyperparameters = None
        return self

    def _hyperparameter_state(self) -> dict[str, Tensor]:
        """Every parameter and buffer of the kernel, likelihood and mean module, and the configuration fields of their
        rfgp modules (``config_<field>``, as ``state_dict`` encodes them: a Nyström kernel's ``jitter`` changes Φ as a
        hyperparameter does, and a jitter set after streaming had been used with the stale statistics)."""
        modules = {"covar_module": self.covar_module, "likelihood": self.likelihood, "mean_module": self.mean_module}
        state = {
            f"{prefix}.{name}": tensor.detach()
            for prefix, module in modules.items()
            for name, tensor in [*module.named_parameters(), *module.named_buffers()]
        }
        for prefix, module in modules.items():
            for name, sub in module.named_modules(prefix=prefix):
                if isinstance(sub, ConfigState):
                    state.update({f"{name}.{CONFIG_PREFIX}{field}": encode(value)
                                  for field, value in sub.config().items()})
        return state

    def _check_hyperparameters(self) -> None:
        """Raise if a hyperparameter changed since the statistics were first accumulated."""
        if self._hyperparameters is None:
            return
        current = self._hyperparameter_state()
        changed = sorted(
            name
            for name in self._hyperparameters.keys() | current.keys()
            if name not in current
            or name not in self._hyperparameters
            or not _identical(current[name], self._hyperparameters[name])
        )
        if changed:
            conversions = sorted({
                f"from {self._hyperparameters[name].dtype} to {current[name].dtype}" for name in changed
                if name in current and name in self._hyperparameters
                and current[name].dtype != self._hyperparameters[name].dtype
                and current[name].is_floating_point() and self._hyperparameters[name].is_floating_point()
            })
            converted = (
                f" The model was converted {' and '.join(conversions)} after streaming, which draws seeded features "
                "anew in the new dtype (not the rounded draws the statistics were summed with): convert the model "
                "before streaming." if conversions else ""
            )
            raise RuntimeError(
                f"StreamingFeatureGP: {', '.join(changed)} changed after data were absorbed; the accumulated "
                "statistics hold the old hyperparameters and cannot be recomputed without the old data. "
                f"Restore them, or call reset() and stream the data again.{converted}"
            )

    @torch.no_grad()
    @in_full_precision
    def update(self, x: Tensor, y: Tensor, noise: Tensor | None = None) -> StreamingFeatureGP:
        """Absorb a batch: inputs ``(k, d)`` and targets ``(k,)``; O(k·F²) time, no old data needed.

        ``noise``: the observation noise variances of the batch's points ``(k,)`` (the shape of y, finite, > 0), known
        per point (sensors of different accuracy), used instead of the likelihood's σ² for them: W = diag(1/noise) in
        G, B and q, and ℓ sums their logarithms, so the posterior and log p(y) are those of the GP with
        ``FixedNoiseGaussianLikelihood`` noise on the points so absorbed (and σ² on the others).  ``None``: σ².  The
        likelihood's σ² is still the noise ``self.likelihood(self(x*))`` adds at test points.

        An empty batch (k = 0, e.g. from a filtering ``DataLoader``) leaves the model unchanged, after the same
        checks of its dtype, shape and (once data were absorbed) width as any batch.

        The Cholesky factor, if already computed, is updated by a rank-k update when
        :func:`takes_rank_update` says so, and dropped (refactorised when next needed) otherwise.

        The features Φₖ are evaluated in the inputs' dtype; G = ΣΦₖᵀWΦₖ and B = ΣΦₖᵀWrₖ are summed in
        :func:`~rfgp.core.dtypes.factor_dtype` (float64 for float32 inputs), as are q = ΣrₖᵀWrₖ, ℓ and n.  I + G has
        eigenvalues ≥ 1 in exact arithmetic, and the Gram matrix of the rounded float32 features, formed and summed in
        float64, keeps them ≥ 1 up to eps₆₄·‖G‖.  Formed in float32, ΦₖᵀWΦₖ carries errors of up to about u₃₂·tr(ΦₖᵀWΦₖ)
        (u₃₂ = 2⁻²⁴; measured 0.06–0.1 times that in spectral norm): at a high signal-to-noise ratio (the float32 IGRF
        fit of the tests, ‖G‖ = 2.3·10⁷, 291 eigenvalues of G below 1) float32 sums erred by 1.7 in spectral norm, and
        the smallest eigenvalue of the rounded I + G fell between −0.06 and 0.04 — the float64 factorisation then failed
        or not by chance.  So a float32 batch is formed in float32 only while u₃₂·tr(G) of the whole stream, this batch
        included, is within :class:`rfgp.settings.float32_statistics_tolerance` (10⁻¹: the float32 batches' errors then
        add up to at most 10⁻² beside the 1 of I, :mod:`rfgp.inference.statistics_precision`), and in float64 from then
        on (one host read per batch decides).  Only the accuracy depends on the choice, never the model. float64
        products cost time (1.1–2.0× a float32 update at F = 512–1024, batches of 64–2000, one CPU thread; 1.6–2.5× in
        an earlier run: ``benchmarks/results/streaming_float64_statistics.md``) and a k × F float64 copy of Φₖ; a benign
        stream (u₃₂·tr(G) ≤ 10⁻¹, e.g. N ≲ 1.7·10⁶ points at noise ≈ outputscale) keeps float32 products, and the
        decision costs 2–5 % of an update (0.1–0.8 ms there).
        """
        self._check_inputs(x)
        check_tensor_dtype(y, "y")
        check_same_dtype(y, "y", x.dtype, "x")
        if y.shape != x.shape[:-1]:
            raise ValueError(f"y must have shape {tuple(x.shape[:-1])} to match x of shape {tuple(x.shape)}, "
                             f"got {tuple(y.shape)}")
        check_finite(y, "y (the targets)", "remove or impute those rows before streaming them")
        if noise is not None:
            _check_point_noise(noise, y)
        self._check_hyperparameters()
        if x.shape[-2] == 0:
            return self._check_empty_batch(x)
        features = kernel_features(self.covar_module, x)
        # A NaN noise or prior mean (a diverged hyperparameter) had been summed into the statistics, and the next call
        # reported it as changed (NaN ≠ NaN) instead of naming it
        if noise is None:
            noise = self.likelihood.noise.to(features.dtype)  # (*likelihood batch, 1): a batch of its own broadcasts
            check_finite(noise, "likelihood.noise (the likelihood's noise variance)")
            noise = noise.expand(*torch.broadcast_shapes(features.shape[:-2], noise.shape[:-1]), x.shape[-2])
        mean = self.mean_module(x)
        check_finite(mean, "mean_module(x) (the prior mean at the batch's points)")
        residual = (y - mean).unsqueeze(-1)
        weights = noise.reciprocal()
        storage = factor_dtype(features.dtype, features.device)
        work = statistics_dtype(features.dtype, features.device,
                                lambda: weighted_square_norm(features, weights) + self._gram_trace())
        gram, cross = feature_statistics(features.to(work), weights.to(work), residual.to(work))
        gram, cross = gram.to(storage), cross.to(storage)
        batch = (  # q, ℓ and n summed in the factor's precision too: see the module's docstring
            gram,
            cross,
            (residual.squeeze(-1).to(storage).pow(2) * weights.to(storage)).sum(-1),
            noise.to(storage).log().sum(-1),
            torch.full(noise.shape[:-1], float(x.shape[-2]), dtype=storage, device=features.device),
        )
        if self.gram.numel() and gram.shape != self.gram.shape:
            raise ValueError(
                f"x has batch shape {tuple(x.shape[:-2])}, which gives statistics of batch shape "
                f"{tuple(gram.shape[:-2])}, but the data absorbed so far have batch shape "
                f"{tuple(self.gram.shape[:-2])}: every batch of a stream must have the same batch dimensions "
                "(broadcasting would add the earlier data to every new batch entry)"
            )
        chol = self._chol  # updated before anything of the model changes: an interrupted update leaves it as it was
        if chol is not None and takes_rank_update(x.shape[-2], features.shape[-1], self.rank_update):
            # V = ΦₖᵀW^½ formed in the factor's precision, as G is summed: a float32 product rounds each entry by u₃₂,
            # which moved LLᵀ off I + G by ‖A⁻¹ΔA‖₂ = 10⁻² at a high signal-to-noise ratio (the IGRF fit of the tests)
            vectors = (features.to(chol.dtype) * weights.to(chol.dtype).sqrt().unsqueeze(-1)).mT
            chol = cholesky_update(chol, vectors)
        else:
            chol = None
        for name, value in zip(_STATISTICS, batch):
            current = getattr(self, name)
            setattr(self, name, value if current.numel() == 0 else current + value)
        self._chol = chol
        if self._hyperparameters is None:  # after the first featurisation: lazily drawn features exist now
            self._hyperparameters = {name: t.clone() for name, t in self._hyperparameter_state().items()}
        return self

    def _check_empty_batch(self, x: Tensor) -> StreamingFeatureGP:
        """An empty batch adds nothing: state unchanged.  Once data were absorbed, its Φ (0 rows) checks its width
        against the features' draws as for any batch.  Before that, featurising it would fix the draws (and a fit to
        the first inputs) on no data, so its width is checked against the kernel tree alone — ``active_dims`` within
        its columns, each leaf's ``ard_num_dims`` or declared ``input_dim`` equal to the columns it sees
        (:func:`~rfgp.kernels.input_columns.check_input_width`; it reads the tree's structure only) — as the first
        non-empty batch would be."""
        if self._hyperparameters is not None:
            kernel_features(self.covar_module, x)
        else:
            check_input_width(self.covar_module, x, "x")
        return self

    def _gram_trace(self) -> Tensor | float:
        """tr(G) of the data absorbed so far (0 before any)."""
        return self.gram.diagonal(dim1=-2, dim2=-1).sum(-1) if self.gram.numel() else 0.0

    def _check_inputs(self, x) -> None:
        """x is a supported floating tensor of shape (..., k, d) in the model's dtype."""
        check_tensor_dtype(x, "x")
        check_input_shape(x, "x", None)  # a 1-D x was told its targets must have shape ()
        # Unlike a kernel call, streaming cannot follow type promotion: the statistics are sums of one model's
        # features, kept in its factor's precision (float64 for a float32 model), and buffers of the model.
        check_same_dtype(x, "x", module_dtype(self.covar_module), "the kernel's dtype",
                         "streaming statistics are sums kept in one dtype and accumulate in the model's dtype, as "
                         "buffers of the model (promoting them cannot restore the precision earlier batches were "
                         "summed in)")

    @in_full_precision
    def cholesky(self) -> Tensor:
        """L = chol(I + ΦᵀWΦ), refactorised once after each update (or rank-updated).

        L is kept in :func:`~rfgp.core.dtypes.factor_dtype` — float64 for float32 inputs — as G is (see
        :meth:`update`) and as the training MLL's capacitance is
        (:func:`~rfgp.inference.linalg.capacitance_cholesky`): at a high signal-to-noise ratio a float32
        factorisation breaks down although I + ΦᵀWΦ is positive definite.  A failure raises
        :class:`~rfgp.inference.linalg.CapacitanceNotPSDError`.
        """
        if self.num_data == 0:
            raise RuntimeError("StreamingFeatureGP has no data yet: call update(x, y) or fit_from_batches first")
        self._check_hyperparameters()
        if self._chol is None:
            self._chol = capacitance_cholesky(self.gram, self.likelihood.noise.detach())
        return self._chol

    @in_full_precision
    def log_marginal_likelihood(self) -> Tensor:
        """log p(y) of all absorbed data (a sum over points, not a per-point average), in the inputs' dtype.

        Formed in the factor's precision (float64 for float32 inputs): q − ‖L⁻¹B‖² cancels at a high
        signal-to-noise ratio.
        """
        chol = self.cholesky()
        work = chol.dtype
        projected = torch.linalg.solve_triangular(chol, self.cross.to(work), upper=False).pow(2).sum((-2, -1))
        logdet = 2.0 * torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1) + self.noise_logdet.to(work)
        value = self.weighted_square.to(work) - projected + logdet + self.count.to(work) * math.log(2 * math.pi)
        return (-0.5 * value).to(module_dtype(self.covar_module))

    @in_full_precision
    def forward(self, x: Tensor) -> MultivariateNormal:
        """Posterior of the latent f at ``x`` (apply ``self.likelihood`` for y)."""
        self._check_inputs(x)
        chol = self.cholesky()
        features = kernel_features(self.covar_module, x)
        # A⁻¹B in the factor's precision, rounded back; test features meet the rounded L, as in
        # FeatureSpacePredictionStrategy (L has the square root of A's condition number)
        weights = cholesky_solve(self.cross.to(chol.dtype), chol).to(features.dtype)
        mean = self.mean_module(x) + (features @ weights).squeeze(-1)
        half = torch.linalg.solve_triangular(chol.to(features.dtype), features.mT, upper=False)
        covar = LowRankPosteriorCovariance(half.mT)
        moments = kernel_diag_moments(self.covar_module, x)
        if moments is not None:
            covar = covar + DiagLinearOperator((moments[0] - moments[1]).clamp_min(0.0))
        return MultivariateNormal(mean, covar)

    def _apply(self, fn, *args, **kwargs):
        # the factor moves with the statistics (a rank-updated L differs from the refactorisation by rounding, which
        # moved the means of a model by 4·10⁻¹⁶ after a no-op .to("cpu") when it was dropped here)
        statistics = {name: getattr(self, name) for name in (*_STATISTICS, "factor")}
        super()._apply(fn, *args, **kwargs)
        # the sums stay in the new model's factor precision: model.float() must not round float64 sums to float32
        dtype = module_dtype(self.covar_module)
        for name, before in statistics.items():
            after = getattr(self, name)
            if dtype is not None and before.is_floating_point():
                setattr(self, name, before.to(device=after.device, dtype=factor_dtype(dtype, after.device)))
        return self

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        """The hyperparameters the statistics were summed with are saved beside them (keys
        ``statistics_hyperparameters.<name>``): a model whose hyperparameters changed after streaming, saved and
        loaded, had the snapshot taken anew from the changed ones and predicted from the stale statistics without a
        word."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, tensor in (self._hyperparameters or {}).items():
            destination[prefix + _SNAPSHOT_PREFIX + name] = tensor

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        self._chol = None  # without a saved factor: refactorised where it is needed
        # the saved shape, dtype and strides (a column-major L solves with other rounding than a row-major copy), on
        # this model's device (the factor's): a CPU state dict loaded into a GPU model had left them on the CPU
        for name in (*_STATISTICS, "factor"):
            saved = state_dict.get(prefix + name)
            if saved is not None:
                setattr(self, name, torch.empty_like(saved, device=self.factor.device))
        # read by _snapshot_after_loading: only loaded statistics belong to the loaded hyperparameters, or to the
        # saved snapshot where the state dict holds one
        self._statistics_loaded = all(prefix + name in state_dict for name in _STATISTICS)
        snapshot = prefix + _SNAPSHOT_PREFIX
        self._loaded_snapshot = {key[len(snapshot):]: value.detach().clone() for key, value in state_dict.items()
                                 if key.startswith(snapshot)}
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        unexpected_keys[:] = [key for key in unexpected_keys if not key.startswith(snapshot)]
        factor = prefix + "factor"
        if not self._statistics_loaded:
            self._chol = None  # the statistics kept are not those the saved factor factorises
        if factor not in state_dict and factor in missing_keys:  # saved before the factor was kept
            missing_keys.remove(factor)


def _check_point_noise(noise, y: Tensor) -> None:
    """``noise`` of :meth:`StreamingFeatureGP.update`: a tensor of y's dtype and shape, of finite variances > 0."""
    check_tensor_dtype(noise, "noise")
    check_same_dtype(noise, "noise", y.dtype, "y")
    if noise.shape != y.shape:
        raise ValueError(f"noise must hold one noise variance per point, of the shape of y {tuple(y.shape)}, got "
                         f"{tuple(noise.shape)}")
    check_finite(noise, "noise (the batch's noise variances)")
    if noise.numel() and not bool((noise > 0).all()):
        raise ValueError(f"noise must hold noise variances > 0 (each point's data weighs 1/noise), got the minimum "
                         f"{float(noise.min()):.6g}")


def _snapshot_after_loading(module: StreamingFeatureGP, incompatible_keys) -> None:
    # Runs after the kernel, likelihood and mean were loaded: the loaded statistics belong to the saved snapshot, or
    # (a state dict saved before the snapshot was) to the loaded hyperparameters.  Statistics kept through a partial
    # load (strict=False) keep the snapshot of their own hyperparameters, so that a hyperparameter the load changed
    # raises where they are used.
    saved = module.__dict__.pop("_loaded_snapshot", {})
    if not module.__dict__.pop("_statistics_loaded", True):
        return
    if not module.num_data:
        module._hyperparameters = None
    elif saved:
        module._hyperparameters = saved
    else:
        module._hyperparameters = {name: t.clone() for name, t in module._hyperparameter_state().items()}


def _identical(current: Tensor, saved: Tensor) -> bool:
    # Moving the model (.to(device) or .to(dtype)) moves the statistics too: compare values only.
    return current.shape == saved.shape and torch.equal(current, saved.to(current))


def fit_from_batches(
    model: StreamingFeatureGP, batches: Iterable, progress: bool | None = None, description: str = "streaming"
) -> StreamingFeatureGP:
    """Absorb every ``(x, y)`` or ``(x, y, noise)`` batch of ``batches`` (a ``DataLoader`` or any iterator) into
    ``model`` (:meth:`StreamingFeatureGP.update`).

    Args:
        model: the :class:`StreamingFeatureGP` to update (its existing data is kept).
        batches: yields ``(x, y)`` pairs, or ``(x, y, noise)`` triples with the points' noise variances (e.g. a
            ``DataLoader`` of ``TensorDataset(x, y, noise)``).
        progress: tqdm progress bar; ``None`` shows it only on a terminal.
        description: label of the progress bar.
    """
    if not isinstance(model, StreamingFeatureGP):
        raise TypeError(f"model must be a StreamingFeatureGP, got {type(model).__name__}")
    if progress is None:
        progress = sys.stderr.isatty()
    for batch in tqdm(batches, desc=description, disable=not progress, leave=False):
        if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
            given = f"a {type(batch).__name__} of length {len(batch)}" if isinstance(batch, (tuple, list)) else (
                type(batch).__name__)
            raise ValueError(f"each batch must be an (x, y) pair or an (x, y, noise) triple, got {given}")
        model.update(*batch)
    return model
