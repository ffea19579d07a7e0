"""A random-feature GP in weight space as a Pyro model, for any likelihood.

With features Φ (k̂(x, y) = Φ(x)ᵀΦ(y)), a GP prior is exactly the Bayesian linear model

    f_l(x) = m + σ Φ(x/ℓ)ᵀ w_l,   w_l ~ N(0, I_F),   l = 1..L,

(weight-space view, Rasmussen & Williams 2006 §2.1; Rahimi & Recht 2007), with
Cov(f_l(x), f_l(y)) = σ² k̂(x, y).  The F·L weights are the only latent function
variables, so any likelihood p(y | f) becomes a small parametric model that SVI or
NUTS handle directly, at O(N·F·L) per likelihood evaluation.

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

from ..core.validation import check_features_input
from ..features.base import FeatureMap
from .hyperparameter import hyperparameter_value, is_random, register_hyperparameter
from .likelihoods import Likelihood

#: names of the likelihood wrappers, for error messages
LIKELIHOODS = ("Gaussian", "StudentT", "HeteroscedasticGaussian", "Bernoulli", "Categorical", "Poisson", "CustomLikelihood")


class RandomFeatureGP(PyroModule):
    r"""f = m + σ Φ(x/ℓ) wᵀ with w ~ N(0, I) of shape (L, F), and y ~ p(y | f).

    Args:
        feature_map: any :class:`~rfgp.features.FeatureMap` (its draws stay fixed).
        likelihood: an :mod:`rfgp.pyro.likelihoods` likelihood; it fixes L = ``num_latents``.
        lengthscale: ℓ, a number, a ``(d,)`` tensor (ARD) or a prior (event shape ``()`` or ``(d,)``).
        outputscale: σ², a number or a prior.
        mean: the constant mean m, a number or a prior (real support).

    Example:
        >>> from rfgp.features import RandomFourierFeatures
        >>> from rfgp.pyro import Bernoulli, weight_guide
        >>> model = RandomFeatureGP(RandomFourierFeatures(128, input_dim=2, seed=0), Bernoulli(),
        ...                         lengthscale=dist.Gamma(4.0, 4.0))
        >>> guide = weight_guide(model, family="full_rank", hyperparameters="map")
    """

    max_plate_nesting = 1

    def __init__(self, feature_map: FeatureMap, likelihood: Likelihood, lengthscale=1.0, outputscale=1.0, mean=0.0):
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
        register_hyperparameter(self, "lengthscale", lengthscale)
        register_hyperparameter(self, "outputscale", outputscale)
        register_hyperparameter(self, "mean", mean, positive=False)
        # A scalar lengthscale divides every input dimension; a (d,) one is ARD.
        self._scalar_lengthscale = self._event_ndim("lengthscale", lengthscale) == 0

    @staticmethod
    def _event_ndim(name: str, spec) -> int:
        shape = spec.event_shape if isinstance(spec, dist.Distribution) else getattr(spec, "shape", ())
        if len(shape) > 1:
            raise ValueError(f"{name} must be a scalar or a (d,) vector, got shape {tuple(shape)}")
        return len(shape)

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
        outputscale = hyperparameter_value(self, "outputscale", x).unsqueeze(-1)
        mean = hyperparameter_value(self, "mean", x).unsqueeze(-1)
        features = self.feature_map(x / lengthscale)  # (*S, n, F)
        prior = dist.Normal(x.new_zeros(()), x.new_ones(()))
        weights = pyro.sample("w", prior.expand((self.num_latents, self.feature_map.num_features)).to_event(2))
        if weights.dim() > 2:
            # Sample dims are (*S, 1): the trailing 1 is the data plate's slot.
            if weights.shape[-3] != 1:
                raise ValueError(
                    f"w has batch shape {tuple(weights.shape[:-2])}; RandomFeatureGP expects vectorised "
                    "sample dimensions left of its data plate (dim -1), i.e. max_plate_nesting=1"
                )
            weights = weights.squeeze(-3)
        return mean + outputscale.sqrt() * (features @ weights.mT)

    def forward(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """The generative model.  ``num_data`` > n rescales a minibatch's likelihood to the full data."""
        check_features_input(x, "x", self.feature_map.input_dim)
        if x.dim() != 2:
            raise ValueError(f"x must have shape (n, d), got {tuple(x.shape)}")
        n = x.shape[-2]
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
