"""The README's set-up commands and its "swap your kernel" example stay true."""

import pathlib
import re
import types

import gpytorch
import torch

import rfgp

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


def _python_blocks(text=README):
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_any_kernel_tree_example_converts_to_the_stated_widths():
    namespace = {}
    exec(_python_blocks()[0], namespace)  # imports gpytorch and rfgp, as a reader has them by then
    exec(_python_blocks()[1], namespace)
    assert namespace["sketched"].num_features == 2048
    mixed = namespace["mixed"]
    assert mixed.num_features == 1024
    assert [type(k.base_kernel if hasattr(k, "base_kernel") else k).__name__ for k in mixed.kernels] == [
        "SketchedRBFKernel", "SketchedPolynomialKernel"]
    assert mixed.kernels[0].base_kernel.method == "orf"
    grad = namespace["grad"]
    assert type(grad).__name__ == "SketchedRBFKernelGrad" and grad.num_features == 1024
    assert grad(torch.rand(5, 2)).shape == (15, 15)  # f and both partial derivatives at every point


def test_train_small_predict_big_example_keeps_hyperparameters_and_widens():
    namespace = {}
    exec(_python_blocks()[0], namespace)
    torch.manual_seed(0)
    x = torch.rand(60, 2, dtype=torch.float64)
    y = torch.sin(4 * x[:, 0]) + 0.05 * torch.randn(60, dtype=torch.float64)
    model = namespace["GP"](x, y, gpytorch.likelihoods.GaussianLikelihood()).double()
    assert model.covar_module.base_kernel.num_features == 1024
    trained = {}

    def keep_trained(module, num_features):  # the hyperparameters right before the re-draw
        trained.update({k: v.clone() for k, v in model.named_parameters()})
        return rfgp.set_num_features(module, num_features)

    namespace.update(model=model, test_x=torch.rand(7, 2, dtype=torch.float64),
                     rfgp=types.SimpleNamespace(fit_mll=rfgp.fit_mll, set_num_features=keep_trained))
    exec(_python_blocks()[2], namespace)
    history = namespace["history"]
    assert history.converged and history.stop_reason.startswith("converged")
    assert model.covar_module.base_kernel.num_features == 4 * 1024  # 4× the swap-your-kernel model's width
    assert all(torch.equal(v, trained[k]) for k, v in model.named_parameters())
    posterior = namespace["posterior"]
    assert posterior.mean.shape == (7,) and torch.isfinite(posterior.variance).all()


def test_staged_nystrom_recipe_runs_as_printed_at_smaller_widths():
    """The block names everything it uses but the reader's data and kernel (M = 512/1024/4096 shrunk 16×)."""
    source = _python_blocks()[3]
    for wide, small in (("4096", "256"), ("1024", "64"), ("512", "32")):
        source = source.replace(wide, small)
    torch.manual_seed(0)
    train_x = torch.rand(400, 2, dtype=torch.float64)
    namespace = {"rfgp": rfgp, "train_x": train_x,
                 "train_y": torch.sin(4 * train_x[:, 0]) + 0.05 * torch.randn(400, dtype=torch.float64),
                 "likelihood": gpytorch.likelihoods.GaussianLikelihood().double(),
                 "kernel": gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)).double()}
    exec(source, namespace)
    model = namespace["model"]
    assert model.covar_module.base_kernel.landmarks.shape == (256, 2)
    model.eval()
    assert torch.isfinite(model.likelihood(model(train_x[:5])).mean).all()


def test_botorch_example_fits_and_draws_paths_from_the_kernels_features():
    import botorch
    from gpytorch.mlls import ExactMarginalLogLikelihood

    torch.manual_seed(0)
    namespace = {"torch": torch, "botorch": botorch, "rfgp": rfgp,
                 "ExactMarginalLogLikelihood": ExactMarginalLogLikelihood, "d": 3,
                 "train_X": torch.rand(20, 3, dtype=torch.float64), "train_Y": torch.randn(20, 1, dtype=torch.float64)}
    exec(_python_blocks()[4], namespace)
    model = namespace["model"]
    assert model.covar_module is namespace["kernel"]
    assert type(model.covar_module).__name__ == "SketchedRBFKernel" and model.covar_module.num_features == 1024
    samples = namespace["paths"](torch.rand(5, 3, dtype=torch.float64))
    assert samples.shape == (16, 5) and torch.isfinite(samples).all()


def test_bad_input_table_size_stated_in_readme_and_conventions_is_the_tables():
    from tests.reliability.test_bad_inputs import CASES

    conventions = (pathlib.Path(__file__).parents[1] / "guide" / "conventions.md").read_text()
    for text in (README, conventions):
        assert re.findall(r"holds a (\d+)-row bad-input table", text) == [str(len(CASES))]
