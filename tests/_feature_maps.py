"""Test doubles: feature maps with a known, deliberate defect."""

import torch

from rfgp.features import FeatureMap


class ShrunkFourierFeatures(FeatureMap):
    """RFF scaled by √shrink: E[Φ(x)ᵀΦ(x)] = shrink < k(x, x) = 1, so the variance is biased."""

    has_variance_bias = True

    def __init__(self, num_features, shrink, **kwargs):
        self.shrink = shrink
        super().__init__(num_features, **kwargs)

    def _draw(self, input_dim, generator):
        return {"frequencies": torch.randn(self.num_features // 2, input_dim, generator=generator, dtype=torch.float64)}

    def _features(self, x):
        projection = x @ self._buffer("frequencies", x).mT
        scale = (self.shrink / projection.shape[-1]) ** 0.5
        return torch.cat((projection.cos(), projection.sin()), -1) * scale

    def target_diag(self, x):
        return torch.ones(x.shape[:-1], dtype=x.dtype, device=x.device)

    def expected_diag(self, x):
        return torch.full(x.shape[:-1], self.shrink, dtype=x.dtype, device=x.device)
