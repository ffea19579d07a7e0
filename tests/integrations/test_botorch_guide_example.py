"""The BoTorch guide's opening example runs as printed (imports, names), at a smaller N."""

import pathlib
import re

import pytest

pytest.importorskip("botorch")

GUIDE = (pathlib.Path(__file__).parents[2] / "guide" / "botorch.md").read_text()


def test_opening_example_fits_and_draws_paths():
    source = re.search(r"```python\n(.*?)```", GUIDE, re.S).group(1)
    printed_size = "torch.rand(1000, d"
    assert printed_size in source
    namespace = {}
    exec(source.replace(printed_size, "torch.rand(120, d"), namespace)
    paths, train_X, model = namespace["paths"], namespace["train_X"], namespace["model"]
    values = paths(train_X[:5])
    assert values.shape == (16, 5) and bool(values.isfinite().all())
    # the paths are draws of the fitted posterior: their mean is near the posterior mean at the training inputs
    mean = model.posterior(train_X[:5]).mean.squeeze(-1)
    spread = values.std(0).clamp_min(1e-3)
    assert bool(((values.mean(0) - mean).abs() < 5 * spread / 16**0.5 + 1e-6).all())
