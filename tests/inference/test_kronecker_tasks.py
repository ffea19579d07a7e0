"""The sketched multitask covariance φφᵀ ⊗ A with its Kronecker factors (rfgp.inference.kronecker_tasks), against
dense matrices."""

import pytest
import torch
from gpytorch.likelihoods import MultitaskGaussianLikelihood
from linear_operator.operators import DiagLinearOperator

import rfgp
from rfgp.inference.kronecker_tasks import (
    DataFeatureRootLinearOperator,
    KroneckerFeatureRootLinearOperator,
    ZeroPaddedColumnsLinearOperator,
    point_task_noise,
)
from rfgp.inference.operators import FeatureRootLinearOperator
from rfgp.kernels import SketchedDecomposableKernel, SketchedRBFKernel
from tests._cost import LargestTensor

F64 = torch.float64


def _kernel(num_features, num_tasks=3, rank=2, seed=0):
    kernel = SketchedDecomposableKernel(SketchedRBFKernel(num_features, seed=seed), num_tasks=num_tasks,
                                        rank=rank).double()
    with torch.no_grad():
        task = kernel.task_covar_module
        task.covar_factor.copy_(torch.randn(num_tasks, rank, generator=torch.Generator().manual_seed(seed + 1)))
        task.var = torch.linspace(0.2, 0.6, num_tasks, dtype=F64)
    return kernel


@pytest.mark.parametrize("num_features", [8, 64])  # data rank below and above the 20 points
def test_the_training_covariance_has_its_kronecker_factors_and_the_data_factor_its_exact_eigenpairs(num_features):
    x = torch.rand(20, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    kernel = _kernel(num_features)
    with torch.no_grad():
        covariance = kernel(x).evaluate_kernel()
        assert isinstance(covariance, KroneckerFeatureRootLinearOperator)
        data, task = covariance.linear_ops
        assert covariance.linear_ops[0] is data  # cached: BoTorch's train_full_covar keeps one eigendecomposition
        expected_data = kernel.data_covar_module(x).to_dense()
        torch.testing.assert_close(data.to_dense(), expected_data)
        torch.testing.assert_close(task.to_dense(), kernel.task_covar_module.covar_matrix.to_dense())
        torch.testing.assert_close(covariance.to_dense(), torch.kron(expected_data, task.to_dense()))
        evals, evecs = data.diagonalization()
        rank = min(20, 2 * (num_features // 2))
        # square, as BoTorch pads a partial diagonalization: the complement's eigenvalues 0, its columns zero
        assert evals.shape == (20,) and evecs.shape == (20, 20) and isinstance(evecs, ZeroPaddedColumnsLinearOperator)
        assert torch.equal(evals[rank:], torch.zeros(20 - rank, dtype=F64))
        evecs = evecs.to_dense()
        assert torch.equal(evecs[:, rank:], torch.zeros(20, 20 - rank, dtype=F64))
        torch.testing.assert_close(evecs[:, :rank].mT @ evecs[:, :rank], torch.eye(rank, dtype=F64))
        torch.testing.assert_close((evecs * evals) @ evecs.mT, expected_data)


def test_zero_padded_columns_multiply_as_the_dense_matrix_without_forming_it():
    gen = torch.Generator().manual_seed(0)
    columns, rhs = torch.randn(2, 7, 3, generator=gen, dtype=F64), torch.randn(2, 7, 4, generator=gen, dtype=F64)
    operator = ZeroPaddedColumnsLinearOperator(columns, 7)
    dense = torch.cat((columns, torch.zeros(2, 7, 4, dtype=F64)), -1)
    assert operator.shape == (2, 7, 7) and torch.equal(operator.to_dense(), dense)
    with LargestTensor() as cost:
        product, transposed = operator.matmul(rhs), operator._t_matmul(rhs)
    assert cost.numel < 2 * 7 * 7  # products touch U only
    torch.testing.assert_close(product, dense @ rhs)
    torch.testing.assert_close(transposed, dense.mT @ rhs)
    torch.testing.assert_close(operator.mT.to_dense(), dense.mT)
    torch.testing.assert_close(operator.expand(3, 2, 7, 7).matmul(rhs), (dense @ rhs).expand(3, 2, 7, 4))
    with pytest.raises(ValueError, match="num_columns must be at least the 3 columns given, got 2"):
        ZeroPaddedColumnsLinearOperator(columns, 2)


def test_diagonalization_refuses_a_root_with_a_graph():
    features = torch.randn(6, 4, dtype=F64, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires a gradient.*torch.no_grad"):
        DataFeatureRootLinearOperator(features).diagonalization()


@pytest.mark.parametrize("num_features", [8, 64])
def test_cat_rows_is_the_feature_root_of_the_joint_covariance_and_checks_the_cross_covariance(num_features):
    gen = torch.Generator().manual_seed(0)
    x, xs = torch.rand(20, 2, generator=gen, dtype=F64), torch.rand(3, 5, 2, generator=gen, dtype=F64)
    kernel = _kernel(num_features)
    with torch.no_grad():
        data = kernel(x).evaluate_kernel().linear_ops[0]
        scalar = kernel.data_covar_module
        joint = data.cat_rows(cross_mat=scalar(xs, x), new_mat=scalar(xs))
        assert isinstance(joint, FeatureRootLinearOperator) and joint.shape == (3, 25, 25)
        assert joint.root.shape[-1] <= 25  # at most as wide as tall: BoTorch draws one base sample per row
        expected = scalar(torch.cat((x.expand(3, 20, 2), xs), -2)).to_dense()
        torch.testing.assert_close(joint.root_decomposition().root.to_dense() @ joint.root.to_dense().mT, expected)
        other = SketchedRBFKernel(num_features, seed=5).double()  # another feature map: its cross is not φ*φᵀ
        with pytest.raises(ValueError, match="cross_mat is not φ\\*φᵀ"):
            data.cat_rows(cross_mat=other(xs, x), new_mat=scalar(xs))
        with pytest.raises(TypeError, match="new_mat must be an rfgp feature covariance"):
            data.cat_rows(cross_mat=scalar(xs, x), new_mat=torch.eye(5, dtype=F64))


def _noises(num_tasks):
    isotropic = MultitaskGaussianLikelihood(num_tasks, has_task_noise=False)
    diagonal = MultitaskGaussianLikelihood(num_tasks)
    correlated = MultitaskGaussianLikelihood(num_tasks, rank=1)
    with torch.no_grad():
        isotropic.noise = 0.3
        diagonal.task_noises = torch.linspace(0.01, 1.0, num_tasks)
        diagonal.noise = 0.05
        correlated.task_noise_covar_factor.copy_(torch.linspace(-0.5, 0.7, num_tasks)[:, None])
    return {"isotropic": isotropic, "task": diagonal, "correlated": correlated}


@pytest.mark.parametrize("noise", ["isotropic", "task", "correlated"])
@pytest.mark.parametrize("num_features", [8, 64])
def test_solve_through_the_eigendecompositions_is_the_dense_solve(noise, num_features):
    x = torch.rand(20, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    kernel = _kernel(num_features)
    likelihood = _noises(3)[noise].double()
    rhs = torch.randn(4, 60, 2, generator=torch.Generator().manual_seed(1), dtype=F64, requires_grad=True)
    with torch.no_grad():
        covariance = kernel(x).evaluate_kernel()
        noise_covar = likelihood._shaped_noise_covar(x.shape)
    assert point_task_noise(noise_covar, 3) is not None
    total = covariance + noise_covar
    dense = covariance.to_dense() + noise_covar.to_dense()
    solve = total.solve(rhs)
    torch.testing.assert_close(solve, torch.linalg.solve(dense, rhs), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(total.solve(rhs[0, :, 0]), torch.linalg.solve(dense, rhs[0, :, 0]))
    (grad,) = torch.autograd.grad(solve.square().sum(), rhs)  # differentiable in the right-hand side
    (expected,) = torch.autograd.grad(torch.linalg.solve(dense, rhs).square().sum(), rhs)
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-10)
    # the marginal likelihood's path is rfgp's feature algebra, unchanged
    targets = rhs[0, :, 0].detach()
    inv_quad, logdet = total.inv_quad_logdet(targets, logdet=True)
    torch.testing.assert_close(inv_quad, targets @ torch.linalg.solve(dense, targets))
    torch.testing.assert_close(logdet, torch.logdet(dense))


def test_solve_with_a_graph_in_the_kernel_or_per_point_noise_takes_rfgps_woodbury_solve():
    x = torch.rand(20, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    kernel = _kernel(8)
    covariance = kernel(x).evaluate_kernel()  # the task factor requires a gradient
    noise = torch.linspace(0.1, 0.5, 60, dtype=F64)
    total = covariance + DiagLinearOperator(noise)
    rhs = torch.randn(60, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(total.solve(rhs), torch.linalg.solve(covariance.to_dense() + torch.diag(noise), rhs))
    likelihood = _noises(3)["task"].double()
    total = covariance + likelihood._shaped_noise_covar(x.shape)
    solve = total.solve(rhs)
    (grad,) = torch.autograd.grad(solve.sum(), kernel.task_covar_module.raw_var)
    dense = kernel(x).to_dense() + likelihood._shaped_noise_covar(x.shape).to_dense()
    torch.testing.assert_close(solve, torch.linalg.solve(dense, rhs))
    (expected,) = torch.autograd.grad(torch.linalg.solve(dense, rhs).sum(), kernel.task_covar_module.raw_var)
    torch.testing.assert_close(grad, expected)


def test_other_feature_roots_name_why_they_have_no_kronecker_factors():
    x = torch.rand(5, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    covariance = rfgp.kernels.SketchedCurlFreeKernel(16, input_dim=2, seed=0).double()(x).evaluate_kernel()
    with pytest.raises(AttributeError, match="no Kronecker factors.*sketched MultitaskKernel.*materialised"):
        covariance.linear_ops
    assert not hasattr(covariance, "linear_ops")


def test_a_right_hand_side_of_the_wrong_length_is_refused():
    """A batch of vectors (b, N·p) is not a matrix with N·p rows: the eigendecomposition solve read (p, N·p) as one
    point with N·p right-hand sides (BoTorch's batched KroneckerMultiTaskGP passes one, and its mean took the wrong
    shape instead of failing)."""
    x = torch.rand(20, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    with torch.no_grad():
        total = _kernel(8)(x).evaluate_kernel() + _noises(3)["task"].double()._shaped_noise_covar(x.shape)
        with pytest.raises(RuntimeError):
            total.solve(torch.randn(3, 60, dtype=F64))


def test_the_narrowed_joint_root_keeps_finite_gradients_where_new_rows_repeat_training_rows():
    """qLogNEI appends its baseline (training points) to the candidates, whose part outside φ's row space is zero (an
    SVD of the whole root [φ; φ*] has NaN gradients there): the block root's gradients in the candidates are the
    central differences."""
    gen = torch.Generator().manual_seed(0)
    x, candidates = torch.rand(10, 2, generator=gen, dtype=F64), torch.rand(2, 2, generator=gen, dtype=F64)
    kernel = _kernel(64)
    scalar = kernel.data_covar_module
    with torch.no_grad():
        data = kernel(x).evaluate_kernel().linear_ops[0]
    base = torch.randn(15, 3, generator=gen, dtype=F64)

    def sample(points):
        new = torch.cat((x[:3], points))
        root = data.cat_rows(cross_mat=scalar(new, x), new_mat=scalar(new)).root_decomposition().root.to_dense()
        assert root.shape == (15, 15)
        return (root @ base)[10:].square().sum()

    point = candidates.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(sample(point), point)
    step = 1e-6
    shifts = torch.eye(4, dtype=F64).reshape(4, 2, 2) * step
    with torch.no_grad():
        expected = torch.stack([(sample(candidates + s) - sample(candidates - s)) / (2 * step) for s in shifts])
    torch.testing.assert_close(grad.reshape(-1), expected, rtol=1e-5, atol=1e-7)
