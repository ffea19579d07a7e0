"""K̂ ∘ B (GPyTorch's Hadamard multitask form ``covar_module(x).mul(task_covar_module(i))``) keeps a feature root:
the same matrix, MLL, gradients and posterior as the dense product, in feature and kernel space."""

import warnings

import gpytorch
import pytest
import torch
from linear_operator.operators import MulLinearOperator

import rfgp
from rfgp.inference.operators import FeatureRootLinearOperator
from rfgp.kernels import NystromKernel, SketchedRBFKernel

from .._dense import DenseKernel

F64 = torch.float64
NUM_TASKS = 3


class HadamardGP(gpytorch.models.ExactGP):
    """GPyTorch's Hadamard multitask tutorial model, data kernel swapped."""

    def __init__(self, train_x, train_i, train_y, likelihood, kernel, task_first=False):
        super().__init__((train_x, train_i), train_y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel
        self.task_covar_module = gpytorch.kernels.IndexKernel(num_tasks=NUM_TASKS, rank=1)
        self.task_first = task_first

    def forward(self, x, i):
        covar_x, covar_i = self.covar_module(x), self.task_covar_module(i)
        covar = covar_i.mul(covar_x) if self.task_first else covar_x.mul(covar_i)
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), covar)


def _data(points_per_task, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(points_per_task * NUM_TASKS, 1, generator=g, dtype=F64)
    i = torch.arange(NUM_TASKS).repeat_interleave(points_per_task).unsqueeze(-1)
    y = torch.sin(6 * x[:, 0] + i[:, 0]) + 0.1 * torch.randn(x.shape[0], generator=g, dtype=F64)
    return x, i, y


def _model(x, i, y, kernel, task_first=False):
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = HadamardGP(x, i, y, likelihood, kernel, task_first).to(F64)
    with torch.no_grad():
        likelihood.noise = 0.05
        model.task_covar_module.covar_factor.copy_(torch.tensor([[0.9], [-0.4], [0.6]], dtype=F64))
        model.task_covar_module.var = torch.tensor([0.3, 0.5, 0.2], dtype=F64)
    return model, likelihood


def _mll_and_grads(model, likelihood, x, i, y):
    model.train()
    model.zero_grad()
    value = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)(model(x, i), y)
    value.backward()
    return value.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("points_per_task, num_features", [(60, 16), (10, 64)], ids=["feature_space", "kernel_space"])
@pytest.mark.parametrize("task_first", [False, True], ids=["data_kernel_first", "task_kernel_first"])
def test_hadamard_model_keeps_a_feature_root_and_equals_the_dense_product(points_per_task, num_features, task_first):
    x, i, y = _data(points_per_task)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, seed=0)).to(F64)
    with torch.no_grad():
        kernel.outputscale, kernel.base_kernel.lengthscale = 1.3, 0.3
    model, likelihood = _model(x, i, y, kernel, task_first)
    model.train()
    covar = model(x, i).lazy_covariance_matrix
    assert isinstance(covar, FeatureRootLinearOperator)
    assert covar.root.shape[-1] == num_features * NUM_TASKS  # Φ • R, R the rows of chol(B)
    dense_product = kernel(x).to_dense() * model.task_covar_module(i).to_dense()
    torch.testing.assert_close(covar.to_dense(), dense_product, rtol=1e-12, atol=1e-12)
    noisy = likelihood(model(x, i)).lazy_covariance_matrix
    assert noisy.uses_kernel_space() == (num_features * NUM_TASKS > y.shape[0])

    value, grads = _mll_and_grads(model, likelihood, x, i, y)
    reference, reference_likelihood = _model(x, i, y, DenseKernel(kernel), task_first)
    reference.load_state_dict(model.state_dict(), strict=False)
    with gpytorch.settings.max_cholesky_size(10**6):
        expected, expected_grads = _mll_and_grads(reference, reference_likelihood, x, i, y)
    torch.testing.assert_close(value, expected, rtol=1e-10, atol=1e-10)
    for name, grad in grads.items():
        dense_name = "covar_module.kernel." + name.removeprefix("covar_module.") if name.startswith("covar_") else name
        torch.testing.assert_close(grad, expected_grads[dense_name], rtol=1e-7, atol=1e-9, msg=name)

    test_x, test_i = torch.rand(8, 1, dtype=F64), torch.arange(NUM_TASKS).repeat(3)[:8].unsqueeze(-1)
    model.eval(), reference.eval()
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(10**6):
        posterior, expected_posterior = model(test_x, test_i), reference(test_x, test_i)
        torch.testing.assert_close(posterior.mean, expected_posterior.mean, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(posterior.covariance_matrix, expected_posterior.covariance_matrix,
                                   rtol=1e-8, atol=1e-9)


def test_variance_correction_is_scaled_by_the_task_diagonal():
    """A Nyström data kernel's FITC diagonal k(x, x) − Φ(x)ᵀΦ(x) (eval mode) becomes (k − ΦᵀΦ)·Bᵢᵢ: the product's
    own diagonal."""
    x, i, _ = _data(20)
    base = gpytorch.kernels.RBFKernel().to(F64)
    kernel = NystromKernel(base, landmarks=x[::7]).eval()
    task = gpytorch.kernels.IndexKernel(num_tasks=NUM_TASKS, rank=1).to(F64)
    covar = kernel(x).mul(task(i))
    assert isinstance(covar, FeatureRootLinearOperator) and covar.variance_correction is not None
    task_diagonal = task(i).to_dense().diagonal()
    torch.testing.assert_close(covar.variance_correction, kernel.variance_correction(x) * task_diagonal)
    torch.testing.assert_close(covar.to_dense().diagonal() + covar.variance_correction,
                               base(x, diag=True) * task_diagonal)


def test_products_without_a_cheap_exact_root_are_the_dense_product():
    x, i, _ = _data(10)
    kernel = SketchedRBFKernel(16, seed=0).to(F64)
    task = gpytorch.kernels.IndexKernel(num_tasks=NUM_TASKS, rank=1).to(F64)
    other_i = i.flip(0)  # a cross covariance: different indices on the two sides
    product = kernel(x).mul(task(i, other_i))
    assert not isinstance(product, FeatureRootLinearOperator)
    torch.testing.assert_close(product.to_dense(), kernel(x).to_dense() * task(i, other_i).to_dense())
    exact = gpytorch.kernels.RBFKernel().to(F64)
    assert not isinstance(exact(x).mul(task(i)), FeatureRootLinearOperator)  # nothing rfgp in it


def test_a_singular_task_matrix_gets_the_dense_product_and_says_so():
    """An IndexKernel whose task variances underflowed (B = wwᵀ, rank 1) has no Cholesky factor: the product is the
    exact dense one (an eigendecomposition root has no gradient at B's repeated zero eigenvalues), with a warning
    naming the O(N³) cost; before, the dense product came without a word."""
    x, i, _ = _data(10)
    kernel = SketchedRBFKernel(16, seed=0).to(F64)
    task = gpytorch.kernels.IndexKernel(num_tasks=NUM_TASKS, rank=1).to(F64)
    with torch.no_grad():
        task.raw_var.fill_(-200.0)  # softplus: 1e-87
    with pytest.warns(rfgp.SingularTaskMatrixWarning, match="no Cholesky factor"):
        product = kernel(x).mul(task(i))
    assert not isinstance(product, FeatureRootLinearOperator)
    torch.testing.assert_close(product.to_dense(), kernel(x).to_dense() * task(i).to_dense())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a positive definite B keeps the feature root, quietly
        task.var = torch.full((NUM_TASKS,), 0.1, dtype=F64)
        assert isinstance(kernel(x).mul(task(i)), FeatureRootLinearOperator)


@pytest.mark.parametrize("num_test", [30, 4], ids=["same-size", "test-train"])
def test_cross_covariance_products_are_the_dense_product(num_test):
    """``covar_module(x1, x2).mul(task_covar_module(i1, i2))`` at x₁ ≠ x₂ (an rfgp cross covariance, of either size):
    the dense product, as for an exact kernel.  Before: linear_operator's generic product multiplied root
    decompositions of both operands, 5.7 off at one size (silently), and raised a RuntimeError at two."""
    x, i, _ = _data(10)
    g = torch.Generator().manual_seed(3)
    x_test, i_test = torch.rand(num_test, 1, generator=g, dtype=F64), torch.randint(0, NUM_TASKS, (num_test, 1),
                                                                                    generator=g)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(32, seed=0)).to(F64)
    task = gpytorch.kernels.IndexKernel(num_tasks=NUM_TASKS, rank=2).to(F64)
    expected = kernel(x_test, x).to_dense() * task(i_test, i).to_dense()
    torch.testing.assert_close(kernel(x_test, x).mul(task(i_test, i)).to_dense(), expected)
    torch.testing.assert_close(task(i_test, i).mul(kernel(x_test, x)).to_dense(), expected)
    second = SketchedRBFKernel(8, seed=1).to(F64)  # two sketched kernels' cross covariances
    torch.testing.assert_close(kernel(x_test, x).mul(second(x_test, x)).to_dense(),
                               kernel(x_test, x).to_dense() * second(x_test, x).to_dense())


def test_eagerly_evaluated_cross_covariance_products_are_dense_or_refused():
    """Under ``lazily_evaluate_kernels(False)`` the rfgp cross covariance multiplies into the dense product; an
    ``IndexKernel`` operator multiplied by it (linear_operator's generic product, which root-decomposes both) is
    refused by name.  Before: both gave a MulLinearOperator up to 1.8 off the dense product."""
    x, i, _ = _data(10)
    other_x = torch.rand(x.shape, generator=torch.Generator().manual_seed(5), dtype=F64)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(32, seed=0)).to(F64)
    task = gpytorch.kernels.IndexKernel(num_tasks=NUM_TASKS, rank=2).to(F64)
    with gpytorch.settings.lazily_evaluate_kernels(False):
        cross, tasks = kernel(x, other_x), task(i)
        torch.testing.assert_close(cross.mul(tasks).to_dense(), cross.to_dense() * tasks.to_dense())
        with pytest.raises(ValueError, match=r"root_decomposition of a \(30, 30\) rfgp cross covariance"):
            tasks.mul(cross)


def test_a_root_over_the_memory_budget_warns_and_keeps_the_generic_product():
    x, i, _ = _data(10)
    kernel = SketchedRBFKernel(64, seed=0).to(F64)
    task = gpytorch.kernels.IndexKernel(num_tasks=NUM_TASKS, rank=1).to(F64)
    features_bytes = 4 * x.shape[0] * 64 * 8  # Φ fits (rfgp.core.settings counts 4 working copies), Φ • R does not
    with rfgp.settings.memory_budget(2 * features_bytes), pytest.warns(UserWarning, match="memory_budget"):
        product = kernel(x).mul(task(i))
    assert isinstance(product, MulLinearOperator)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(product.to_dense(), kernel(x).to_dense() * task(i).to_dense())


def test_two_sketched_kernels_multiply_into_the_kronecker_of_their_features():
    x = torch.rand(12, 2, dtype=F64, generator=torch.Generator().manual_seed(4))
    left, right = SketchedRBFKernel(8, seed=0).to(F64), SketchedRBFKernel(6, seed=1).to(F64)
    product = left(x).mul(right(x))
    assert isinstance(product, FeatureRootLinearOperator) and product.root.shape[-1] == 48
    torch.testing.assert_close(product.to_dense(), left(x).to_dense() * right(x).to_dense())


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_two_nystrom_kernels_multiply_into_a_feature_root_whose_diagonal_is_the_product_of_theirs(mode):
    """Both operands carry a FITC correction c = k(x, x) − ‖Φ(x)‖²: the product keeps the face-splitting root (it
    was the dense N × N product, which also lost the corrections) with the correction c₁‖Φ₂‖² + c₂‖Φ₁‖² + c₁c₂, so
    that its diagonal is k₁(x, x)·k₂(x, x), also at points far from the landmarks."""
    g = torch.Generator().manual_seed(5)
    x = torch.rand(30, 2, dtype=F64, generator=g)
    test = torch.cat((x[:10], x[:4] + 5.0))  # landmarks' points and far points
    base_left = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(active_dims=[0])).to(F64)
    base_right = gpytorch.kernels.RBFKernel(active_dims=[1]).to(F64)
    base_left.outputscale = 1.7
    left = getattr(NystromKernel(base_left, landmarks=x[::5]), mode)()
    right = getattr(NystromKernel(base_right, landmarks=x[1::4]), mode)()
    product = left(test).mul(right(test))
    assert isinstance(product, FeatureRootLinearOperator) and product.root.shape[-1] == 6 * 8
    torch.testing.assert_close(product.to_dense(), left(test).to_dense() * right(test).to_dense())
    torch.testing.assert_close(product.to_dense().diagonal() + product.variance_correction,
                               base_left(test, diag=True) * base_right(test, diag=True), rtol=1e-10, atol=1e-12)
