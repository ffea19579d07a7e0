"""The README's set-up commands and its "swap your kernel" example stay true."""

import pathlib
import re

import gpytorch
import torch

README = (pathlib.Path(__file__).parents[1] / "README.md").read_text()


def test_readme_shows_exactly_two_commands_that_ci_runs():
    first_block = re.search(r"```\n(.*?)```", README, re.S).group(1).strip().splitlines()
    assert first_block == ['pip install -e . && python -m rfgp demo', 'pip install -e ".[test]" && python -m pytest -n auto']
    ci = (pathlib.Path(__file__).parents[1] / ".ci" / "run").read_text()
    assert "grep -m1 '^pip install -e \"\\.\\[test\\]\"' README.md" in ci


def test_swap_your_kernel_example_trains_in_feature_space():
    source = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    namespace = {}
    exec(source, namespace)
    torch.manual_seed(0)
    x = torch.rand(300, 2, dtype=torch.float64)
    y = torch.sin(4 * x[:, 0]) + 0.05 * torch.randn(300, dtype=torch.float64)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = namespace["GP"](x, y, likelihood).double()
    covar = likelihood(model(x)).lazy_covariance_matrix.evaluate_kernel()
    assert type(covar).__name__ == "FeatureRootAddedDiagLinearOperator"
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    loss = -mll(model(x), y)
    loss.backward()
    assert torch.isfinite(loss)
    assert model.covar_module.base_kernel.raw_lengthscale.grad.abs().sum() > 0
