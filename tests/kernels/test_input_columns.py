"""rfgp.sketch follows the input columns every node of a kernel tree sees (rfgp.kernels.input_columns): nested
active_dims compose, each leaf gets its own columns of x_sample and its width, converted trees agree with the
exact GPyTorch tree on full-width inputs, and contradictions raise at conversion with the columns named."""

import re

import pytest
import torch
from gpytorch.kernels import (
    AdditiveKernel,
    LinearKernel,
    MaternKernel,
    MultitaskKernel,
    ProductKernel,
    RBFKernel,
    ScaleKernel,
)

import rfgp
from rfgp.kernels.input_columns import check_tree, check_x_sample

F64 = torch.float64
X = torch.rand(60, 5, generator=torch.Generator().manual_seed(0), dtype=F64) * torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0],
                                                                                                dtype=F64)


def relative_error(sketched, exact, x) -> float:
    with torch.no_grad():
        target = exact(x).to_dense()
        return float((sketched(x).to_dense() - target).norm() / target.norm())


def nested_tree(rbf=None):
    """ScaleKernel(sum, active_dims=[3, 1, 4]): the RBF sees columns [3, 4], the linear part column 1."""
    rbf = RBFKernel(active_dims=[0, 2]) if rbf is None else rbf
    tree = ScaleKernel(AdditiveKernel(ScaleKernel(rbf), LinearKernel(active_dims=[1])), active_dims=[3, 1, 4])
    tree.base_kernel.kernels[0].base_kernel.lengthscale = 1.5
    return tree.double()


# ----------------------------------------------------------------------------------- columns of every node
def test_nested_active_dims_compose_and_scale_and_multitask_children_see_their_parents_columns():
    tree = nested_tree()
    columns = check_tree(tree, x_sample=X)
    sum_columns = columns.child_columns(tree, columns.root, tree.base_kernel)
    scaled = tree.base_kernel.kernels[0]
    rbf_columns = columns.child_columns(scaled, columns.child_columns(tree.base_kernel, sum_columns, scaled),
                                        scaled.base_kernel)
    linear_columns = columns.child_columns(tree.base_kernel, sum_columns, tree.base_kernel.kernels[1])
    assert (columns.root, sum_columns, rbf_columns, linear_columns) == ((3, 1, 4), (3, 1, 4), (3, 4), (1,))
    assert columns.width(rbf_columns) == 2 and torch.equal(columns.sample(rbf_columns), X[:, [3, 4]])
    multitask = MultitaskKernel(RBFKernel(), num_tasks=2, active_dims=[2, 0])
    columns = check_tree(multitask)
    assert columns.child_columns(multitask, columns.root, multitask.data_covar_module) == (2, 0)
    assert columns.width(None) is None and columns.sample(None) is None  # no x_sample, no ard_num_dims: d unknown


def test_x_sample_is_validated_once_and_batched_points_are_flattened_to_rows():
    batched = X.reshape(3, 20, 5)
    assert torch.equal(check_x_sample(batched), X)
    for bad, given in [([1.0, 2.0], "a list"), (torch.arange(6).reshape(3, 2), "a torch.int64 tensor of shape (3, 2)"),
                       (X[0], "a torch.float64 tensor of shape (5,)")]:
        with pytest.raises(ValueError, match=rf"x_sample must be a floating tensor of input points, shape \(n, d\) or "
                                             rf"batched \(\.\.\., n, d\); got {re.escape(given)}"):
            rfgp.sketch(RBFKernel(), 16, x_sample=bad)
    with pytest.raises(ValueError, match=r"x_sample must hold at least one point .* got shape \(0, 5\)"):
        rfgp.sketch(RBFKernel(), 16, x_sample=X[:0])
    broken = X.clone()
    broken[7, 2] = float("nan")
    broken[9, 0] = float("inf")
    with pytest.raises(ValueError, match=r"x_sample contains NaN or Inf entries \(2 of them, the first at row 7, "
                                         r"column 2"):
        rfgp.sketch(RBFKernel(), 16, method="nystrom", x_sample=broken)


def test_each_leaf_gets_its_own_columns_of_x_sample_batched_or_not():
    """The Gaussian sketch's centre is the bounding-box centre of the columns its leaf sees (here [3, 4])."""
    for x_sample in (X, X.reshape(2, 30, 5)):
        sketched = rfgp.sketch(nested_tree(), 512, method="gaussian_sketch", x_sample=x_sample, alpha=1e-2, seed=0)
        leaf = sketched.base_kernel.kernels[0].base_kernel
        seen = X[:, [3, 4]]
        torch.testing.assert_close(leaf.input_center, (seen.min(0).values + seen.max(0).values) / 2)
        assert sketched.base_kernel.kernels[1].num_features == 1  # the linear part's width: its one column


# ------------------------------------------------------------------------ converted trees agree with exact ones
def test_nested_sum_agrees_with_the_exact_tree_on_full_width_inputs():
    tree = nested_tree()
    assert relative_error(rfgp.sketch(tree, 8192, seed=0, x_sample=X), tree, X[:12]) < 0.05
    assert relative_error(rfgp.sketch(tree, 8192, method="gaussian_sketch", x_sample=X, alpha=1e-3, seed=0).double(),
                          tree, X[:12]) < 0.05
    # exact features only (linear leaves): equal to rounding
    linear = ScaleKernel(AdditiveKernel(LinearKernel(active_dims=[0, 2]), LinearKernel(active_dims=[1])),
                         active_dims=[3, 1, 4]).double()
    assert relative_error(rfgp.sketch(linear, 8, x_sample=X), linear, X) < 1e-12


def test_products_with_nested_active_dims_agree_with_the_exact_tree():
    spectral = ScaleKernel(ProductKernel(RBFKernel(active_dims=[0]), MaternKernel(nu=2.5, active_dims=[1, 2])),
                           active_dims=[4, 0, 2]).double()
    assert relative_error(rfgp.sketch(spectral, 8192, seed=0), spectral, X[:12]) < 0.05
    kronecker = ProductKernel(LinearKernel(active_dims=[1]), ScaleKernel(RBFKernel(active_dims=[0, 3]))).double()
    sketched = rfgp.sketch(kronecker, 8192, seed=0)
    assert relative_error(sketched, kronecker, X[:12]) < 0.05
    exact_only = ProductKernel(LinearKernel(active_dims=[1, 2]), LinearKernel(active_dims=[4])).double()
    assert relative_error(rfgp.sketch(exact_only, 64), exact_only, X) < 1e-12


def test_multitask_kernel_columns_agree_with_the_exact_kernel():
    """The MultitaskKernel's own active_dims select the columns (they were dropped before)."""
    exact = MultitaskKernel(ScaleKernel(RBFKernel()), num_tasks=2, rank=1, active_dims=[1, 3]).double()
    assert relative_error(rfgp.sketch(exact, 8192, seed=0), exact, X[:8]) < 0.05
    landmarks = rfgp.sketch(exact, 12, method="nystrom", x_sample=X[:12], seed=0)  # landmarks = the points: exact
    assert relative_error(landmarks, exact, X[:12]) < 1e-6


def test_active_dims_gpytorch_ignores_warn_and_are_ignored_by_the_converted_kernel_too():
    """MultitaskKernel runs its data kernel's forward: the data kernel's own active_dims have no effect."""
    exact = MultitaskKernel(RBFKernel(active_dims=[0]), num_tasks=2).double()
    exact.data_covar_module.lengthscale = 3.0
    message = r"RBFKernel.active_dims=\[0\] have no effect inside MultitaskKernel .* sees its parent's columns"
    with pytest.warns(UserWarning, match=message):
        sketched = rfgp.sketch(exact, 8192, seed=0)
    assert relative_error(sketched, exact, X[:8]) < 0.05
    with pytest.warns(UserWarning, match=message):
        landmarks = rfgp.sketch(exact, 12, method="nystrom", x_sample=X[:12], seed=0)
    assert relative_error(landmarks, exact, X[:12]) < 1e-6
    scaled = ScaleKernel(RBFKernel(active_dims=[0])).double()  # base's active_dims changed after wrapping
    scaled.base_kernel.active_dims = torch.tensor([2])
    with pytest.warns(UserWarning, match=r"RBFKernel.active_dims=\[2\] have no effect inside ScaleKernel"):
        sketched = rfgp.sketch(scaled, 8192, seed=0)
    assert relative_error(sketched, scaled, X[:8]) < 0.05


# ------------------------------------------------------------------------------------- widths of linear leaves
def test_linear_width_comes_from_x_sample_then_from_a_leaf_on_the_same_columns_else_the_first_call():
    assert rfgp.sketch(ScaleKernel(RBFKernel()) + LinearKernel(), 64, seed=0, x_sample=X).kernels[1].num_features == 5
    inferred = rfgp.sketch(ScaleKernel(RBFKernel(ard_num_dims=5)) + LinearKernel(), 64, seed=0)
    assert [k.num_features for k in (inferred.kernels[0].base_kernel, inferred.kernels[1])] == [58, 5]
    assert rfgp.sketch(ProductKernel(LinearKernel(), RBFKernel(ard_num_dims=5)), 64, seed=0).num_features == 60
    lazy = rfgp.sketch(ScaleKernel(RBFKernel()) + LinearKernel(), 64, seed=0).double()
    lazy(X).to_dense()  # d unknown at conversion: set at the first call, the sum F + d wide
    assert lazy.num_features == 64 + 5
    with pytest.raises(ValueError, match="width of LinearFeatureKernel .* is unknown at conversion"):
        rfgp.sketch(ProductKernel(LinearKernel(), RBFKernel()), 64)  # a product must keep F
    with pytest.raises(ValueError, match=r"input_dim=4 was passed, but LinearKernel sees 5 columns \(all columns of "
                                         r"x_sample \(60 rows × 5 columns\)\)"):
        rfgp.sketch(LinearKernel(), 64, x_sample=X, input_dim=4)


# ----------------------------------------------------------------------------------------------- contradictions
@pytest.mark.parametrize("tree, x_sample, message", [
    (LinearKernel(active_dims=[0, 5]), X,
     (r"LinearKernel has active_dims=\[0, 5\], but it is given 5 columns \(all columns of x_sample \(60 rows × 5 "
     r"columns\)\); active_dims must be in 0\.\.4")),
    (ScaleKernel(AdditiveKernel(RBFKernel(active_dims=[0]), LinearKernel(active_dims=[3])), active_dims=[4, 2, 0]),
     None, (r"LinearKernel inside AdditiveKernel has active_dims=\[3\], but it is given 3 columns \(columns \[4, 2, 0\] "
     r"of the input\); active_dims must be in 0\.\.2")),
    (RBFKernel(active_dims=[-1]), None, (r"RBFKernel has active_dims=\[-1\], but it is given all columns .*"
                                        r"non-negative column indices")),
    (RBFKernel(ard_num_dims=2) + LinearKernel(active_dims=[2]), None,
     (r"LinearKernel inside AdditiveKernel has active_dims=\[2\], but it is given 2 columns \(all columns of the input "
     r"\(d = 2, the ard_num_dims of RBFKernel\)\)")),
    (RBFKernel(ard_num_dims=3, active_dims=[0, 1]), None,
     (r"RBFKernel\(ard_num_dims=3, active_dims=\[0, 1\]\) sees 2 columns \(columns \[0, 1\] of the input\); its "
     r"ard_num_dims must be 2")),
    (AdditiveKernel(ScaleKernel(RBFKernel(ard_num_dims=2)), LinearKernel()), X,
     (r"RBFKernel\(ard_num_dims=2\) sees 5 columns \(all columns of x_sample \(60 rows × 5 columns\)\); its "
     r"ard_num_dims must be 5")),
    (MultitaskKernel(ScaleKernel(RBFKernel(ard_num_dims=3)), num_tasks=2, active_dims=[0, 1]), None,
     r"RBFKernel\(ard_num_dims=3\) sees 2 columns \(columns \[0, 1\] of the input\)"),
    (ScaleKernel(RBFKernel(ard_num_dims=2)) + MaternKernel(ard_num_dims=3), None,
     (r"leaves that see the same input columns \(all of them\) have different ard_num_dims: RBFKernel\(ard_num_dims=2\), "
     r"MaternKernel\(ard_num_dims=3\)")),
])
@pytest.mark.parametrize("method", [None, "nystrom"])
def test_contradictions_raise_at_conversion_naming_the_kernel_and_its_columns(tree, x_sample, message, method):
    with pytest.raises(ValueError, match=message):
        rfgp.sketch(tree, 16, method=method, x_sample=x_sample)  # Nyström: before its "x_sample is required"
