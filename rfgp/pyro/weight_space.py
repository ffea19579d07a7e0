"""A random-feature GP in weight space as a Pyro model, for any likelihood.

With features Φ (k̂(x, y) = Φ(x)ᵀΦ(y)), a GP prior is exactly the Bayesian linear model

    f_l(x) = m + σ Φ(x/ℓ)ᵀ w_l,   w_l ~ N(0, I_F),   l = 1..L,

(weight-space view, Rasmussen & Williams 2006 §2.1; Rahimi & Recht 2007), with
Cov(f_l(x), f_l(y)) = σ² k̂(x, y).  The F·L weights are the only latent function
variables, so any likelihood p(y | f) becomes a small parametric model that SVI or
NUTS handle directly, at O(N·F·L) per likelihood evaluation.

With a Matérn-½ map (:class:`~rfgp.features.RandomFourierFeatures` with ``MaternSpectralDensity(0.5)``) and a
lengthscale prior, ℓ enters through anchored importance weights rather than the frequencies, as in
:class:`~rfgp.kernels.SketchedMaternKernel`: see :meth:`RandomFeatureGP.features`.

Sites: ``"w"`` (shape ``(L, F)``), the hyperparameters that have priors
(``"lengthscale"``, ``"outputscale"``, ``"mean"``, ``"likelihood.<name>"``), the
deterministic ``"f"`` (shape ``(n, L)``) and the observed ``"y"``.  The model has one
plate (the data, dim −1), so ``max_plate_nesting = 1``.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from torch import Tensor

from ..core.dtypes import in_full_precision
from ..core.validation import check_features_input, check_finite
from ..features.base import FeatureMap
from ..features.fourier import RandomFourierFeatures
from ..features.spectral import MaternSpectralDensity
from ..features.weighted_fourier import scale_sincos_pairs
from .hyperparameter import hyperparameter_value, is_random, prior_median, register_hyperparameter
from .likelihoods import Likelihood

#: names of the likelihood wrappers, for error messages
LIKELIHOODS = ("Gaussian", "StudentT", "HeteroscedasticGaussian", "Bernoulli", "Categorical", "Poisson", "CustomLikelihood")


class RandomFeatureGP(PyroModule):
    r"""f = m + σ Φ(x/ℓ) wᵀ with w ~ N(0, I) of shape (L, F), and y ~ p(y | f).

    Args:
        feature_map: any :class:`~rfgp.features.FeatureMap` (its draws stay fixed).
        likelihood: an :mod:`rfgp.pyro.likelihoods` likelihood; it fixes L = ``num_latents``.
        lengthscale: ℓ, a number, a ``(d,)`` tensor (ARD) or a prior (batch shape ``()``, event shape ``()`` or
            ``(d,)``: ``prior.expand([d]).to_event(1)``).
        outputscale: σ², a number or a prior (scalars, as are the mean and the likelihood's hyperparameters).
        mean: the constant mean m, a number or a prior (real support).
        lengthscale_anchor: ℓ₀ of a Matérn-½ map with a lengthscale prior (see :meth:`features`), a positive
            number or a tensor of ℓ's shape; default the prior's median.  Other models have no anchor.

    Example:
        >>> import pyro.distributions as dist
        >>> from rfgp.features import RandomFourierFeatures
        >>> from rfgp.pyro import Bernoulli, RandomFeatureGP, weight_guide
        >>> model = RandomFeatureGP(RandomFourierFeatures(128, input_dim=2, seed=0), Bernoulli(),
        ...                         lengthscale=dist.Gamma(4.0, 4.0))
        >>> guide = weight_guide(model, family="full_rank", hyperparameters="map")
    """

    max_plate_nesting = 1

    def __init__(self, feature_map: FeatureMap, likelihood: Likelihood, lengthscale=1.0, outputscale=1.0, mean=0.0,
                 lengthscale_anchor=None):
        super().__init__()
        if not isinstance(feature_map, FeatureMap):
            raise TypeError(f"feature_map must be a rfgp.features.FeatureMap, got {type(feature_map).__name__}")
        if not isinstance(likelihood, Likelihood):
            raise TypeError(
                f"likelihood must be one of rfgp.pyro.{', '.join(LIKELIHOODS)}; got {likelihood!r}. "
                "Wrap any other Pyro distribution in CustomLikelihood(lambda f: ..., num_latents)."
            )
        self.feature_map = feature_map
        self.likelihood = likelihood
        register_hyperparameter(self, "lengthscale", lengthscale, max_ndim=1)
        register_hyperparameter(self, "outputscale", outputscale)
        register_hyperparameter(self, "mean", mean, positive=False)
        # A scalar lengthscale divides every input dimension; a (d,) one is ARD.
        shape = lengthscale.event_shape if isinstance(lengthscale, dist.Distribution) else self.lengthscale.shape
        self._scalar_lengthscale = len(shape) == 0
        #: d of an ARD lengthscale (None for a scalar one), checked against x's at every call (lazy feature maps)
        self._ard_dim = None if self._scalar_lengthscale else shape[0]
        if self._ard_dim is not None and feature_map.input_dim not in (None, self._ard_dim):
            raise ValueError(f"an ARD lengthscale must have the feature map's input_dim={feature_map.input_dim} "
                             f"entries, got shape {tuple(shape)}")
        anchored = is_random(self, "lengthscale") and _is_matern_half(feature_map)
        if not anchored and lengthscale_anchor is not None:
            raise ValueError(
                f"lengthscale_anchor={lengthscale_anchor!r} was given, but only a Matérn-½ feature map "
                "(RandomFourierFeatures with MaternSpectralDensity(0.5)) with a lengthscale prior has an anchor"
            )
        if anchored:
            if isinstance(lengthscale_anchor, dist.Distribution):
                raise TypeError("lengthscale_anchor must be a positive number or tensor (a fixed ℓ₀), not a prior")
            if lengthscale_anchor is None:
                lengthscale_anchor = prior_median(lengthscale)
            register_hyperparameter(self, "lengthscale_anchor", lengthscale_anchor, max_ndim=1)
            if self.lengthscale_anchor.shape != lengthscale.event_shape:
                raise ValueError(
                    f"lengthscale_anchor must have the lengthscale's shape {tuple(lengthscale.event_shape)}, "
                    f"got {tuple(self.lengthscale_anchor.shape)}"
                )

    def _load_from_state_dict(self, state_dict, prefix, *args) -> None:
        """Refuse, with ``strict=False`` too and before loading anything of this model, a state without the anchor of
        an anchored model (see :meth:`features`): one saved before rfgp had anchors, whose model computed Φ(x/ℓ) — a
        different model, whose guide or samples do not carry over, where this one would keep its default ℓ₀."""
        key = prefix + "lengthscale_anchor"
        if self.is_anchored and key not in state_dict:
            raise RuntimeError(
                f"{key!r} is missing from the state_dict. This RandomFeatureGP (a Matérn-½ map with a lengthscale "
                "prior) computes its features at an anchor ℓ₀ — frequencies ξ/ℓ₀, pairs weighted by "
                "√(p_ℓ(ω)/p_ℓ₀(ω)) — and a state without one was saved by an rfgp version before the anchor, whose "
                "model computed Φ(x/ℓ) (frequencies ξ/ℓ, lengthscale gradients that did not converge as F grows): a "
                "different model, whose guide or NUTS samples do not carry over. Fit them again with this model; to "
                f"load the old draws into it anyway, add the anchor to the state first: state_dict[{key!r}] = "
                "model.lengthscale_anchor (the prior's median, the default) or the ℓ₀ of your choice"
            )
        super()._load_from_state_dict(state_dict, prefix, *args)

    @property
    def is_anchored(self) -> bool:
        """Whether ℓ enters through anchored importance weights (Matérn-½ map, ℓ with a prior)."""
        return hasattr(self, "lengthscale_anchor")

    @property
    def num_latents(self) -> int:
        return self.likelihood.num_latents

    @property
    def num_weights(self) -> int:
        return self.num_latents * self.feature_map.num_features

    def hyperparameter_sites(self) -> list[str]:
        """Names of the sample sites of the hyperparameters that have priors."""
        own = [name for name in ("lengthscale", "outputscale", "mean") if is_random(self, name)]
        return own + [f"likelihood.{name}" for name in self.likelihood._pyro_samples]

    def latent(self, x: Tensor) -> Tensor:
        """Sample the weights and return f = m + σ Φ(x/ℓ) wᵀ, shape ``(*sample, n, L)``.

        Vectorised sample dimensions (``Predictive(parallel=True)``, vectorised ELBO
        particles) arrive left of the data plate, i.e. hyperparameters of shape
        ``(S, 1, ...)``; they are broadcast against the ``n`` data points.
        """
        lengthscale = hyperparameter_value(self, "lengthscale", x)
        if self._scalar_lengthscale:
            lengthscale = lengthscale.unsqueeze(-1)
        else:
            _check_sample_layout("lengthscale", lengthscale, event_ndim=1)
        outputscale = hyperparameter_value(self, "outputscale", x).unsqueeze(-1)
        mean = hyperparameter_value(self, "mean", x).unsqueeze(-1)
        features = self.features(x, lengthscale)  # (*S, n, F)
        prior = dist.Normal(x.new_zeros(()), x.new_ones(()))
        weights = pyro.sample("w", prior.expand((self.num_latents, self.feature_map.num_features)).to_event(2))
        _check_sample_layout("w", weights, event_ndim=2)
        if weights.dim() > 2:
            weights = weights.squeeze(-3)  # the data plate's slot
        return mean + outputscale.sqrt() * (features @ weights.mT)

    def features(self, x: Tensor, lengthscale: Tensor) -> Tensor:
        r"""Φ_ℓ(x), ``(*S, n, F)``, for ``lengthscale`` of shape ``(d or 1)`` or ``(*S, 1, d or 1)``.

        Φ(x/ℓ), i.e. frequencies ω = ξ/ℓ, except for a Matérn-½ map with a lengthscale prior: its ξ are
        multivariate Cauchy (E‖ξ‖ = ∞), so the ℓ-derivative of a feature of ω = ξ/ℓ, (ξᵀx/ℓ²)·sin(ξᵀx/ℓ), has no
        finite mean, and the log joint's ℓ-gradient did not approach the exact GP's as F grew (that of the
        marginal over w: RMS error 25–40 % of it at every F from 256 to 65 536).  There the frequencies stay at
        ω = ξ/ℓ₀ for the anchor ℓ₀ (buffer ``lengthscale_anchor``) and pair j is scaled by √r_j,
        r_j = p_ℓ(ω_j)/p_ℓ₀(ω_j) (:meth:`~rfgp.features.MaternSpectralDensity.lengthscale_log_weights`), as in
        :class:`~rfgp.kernels.SketchedMaternKernel`: E[Φ_ℓ(x)ᵀΦ_ℓ(y)] = k_ℓ(x, y) for every ℓ, and r, ∂r/∂ℓ are
        bounded, so the gradient error falls like 1/√F.  The weights' variance grows with ℓ/ℓ₀ away from 1
        (E[r²] = 1.9 at 1/3, 2.7 at 3 for d = 2): pass ``lengthscale_anchor`` near where the posterior sits.
        """
        if not self.is_anchored:
            return self.feature_map(x / lengthscale)
        anchor = self.lengthscale_anchor.to(lengthscale)
        features = self.feature_map(x / anchor)  # (n, F): one set for every sample of ℓ
        ratio = lengthscale / anchor
        if ratio.dim() == 1:
            ratio = ratio.unsqueeze(0)
        unit_frequencies = self.feature_map.frequency_matrix().to(features)
        log_weights = self.feature_map.spectral_density.lengthscale_log_weights(unit_frequencies, ratio)
        # x/ℓ₀ is finite whatever ℓ is: this check stands in for the feature map's check of x/ℓ
        check_finite(log_weights, "the Matérn-½ importance weights log r(ℓ/ℓ₀)", "the lengthscale ℓ is NaN, 0 or ∞")
        return scale_sincos_pairs(features, (0.5 * log_weights).exp())

    @in_full_precision
    def forward(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """The generative model.  ``num_data`` > n rescales a minibatch's likelihood to the full data."""
        check_features_input(x, "x", self.feature_map.input_dim)
        if x.dim() != 2:
            raise ValueError(f"x must have shape (n, d), got {tuple(x.shape)}")
        if self._ard_dim not in (None, x.shape[-1]):
            raise ValueError(f"x has {x.shape[-1]} input dimensions, but the ARD lengthscale has {self._ard_dim}")
        n = x.shape[-2]
        if n == 0:
            raise ValueError(f"x must have at least one row, got shape {tuple(x.shape)}")
        if y is not None:
            self.likelihood.check_targets(y, n)
        if num_data is not None and (isinstance(num_data, bool) or not isinstance(num_data, int) or num_data < n):
            raise ValueError(f"num_data must be an integer ≥ the batch size {n}, got {num_data!r}")
        f = self.latent(x)
        # Built outside the plate so that likelihood hyperparameters are global, not per point.
        likelihood = self.likelihood(f)
        size = num_data if num_data is not None else n
        with pyro.plate("data", size, subsample=torch.arange(n, device=x.device), dim=-1):
            pyro.deterministic("f", f, event_dim=1)
            return pyro.sample("y", likelihood, obs=y)


def _check_sample_layout(site: str, value: Tensor, event_ndim: int) -> None:
    """Vectorised samples of a global site with event dimensions must be ``(*S, 1, *event)``: the 1 is the data
    plate's slot (dim −1).  ``pyro.infer.Predictive(parallel=True)`` lays posterior samples of such sites out as
    ``(S, *event)``, which would broadcast S against the data points."""
    if value.dim() > event_ndim and value.shape[-event_ndim - 1] != 1:
        raise ValueError(
            f"{site} has batch shape {tuple(value.shape[:-event_ndim])}; RandomFeatureGP expects vectorised sample "
            "dimensions left of its data plate (dim -1), i.e. (*S, 1) with max_plate_nesting=1. "
            "pyro.infer.Predictive(parallel=True) misplaces them for sites with event dimensions (w, an ARD "
            "lengthscale): use rfgp.pyro.posterior_predictive, or Predictive with parallel=False"
        )


def _is_matern_half(feature_map: FeatureMap) -> bool:
    density = getattr(feature_map, "spectral_density", None)
    return isinstance(feature_map, RandomFourierFeatures) and isinstance(density, MaternSpectralDensity) \
        and density.nu == 0.5
