"""Training targets are checked along their point axis against the inputs ``(*b, N, d)``: vectors ``(*b, N)``,
multi-output ``(*b, N, T)`` (rfgp.core.validation.check_training_data, check_targets)."""

import pytest
import torch

from rfgp.core.validation import check_targets, check_training_data


def _x(*shape):
    return torch.zeros(*shape, dtype=torch.float64)


@pytest.mark.parametrize("x_shape, y_shape, target_axis", [
    ((10, 2), (10,), -1),
    ((3, 10, 2), (3, 10), -1),        # a batch of b = 3 GPs, one target vector each
    ((3, 10, 2), (10,), -1),          # one target vector for every batch member
    ((2, 3, 10, 2), (3, 10), -1),     # batch dimensions broadcast from the left
    ((10, 2), (10, 4), -2),           # T = 4 outputs per point
    ((3, 10, 2), (3, 10, 4), -2),
    ((3, 10, 2), (10, 4), -2),
])
def test_targets_of_valid_shapes_pass(x_shape, y_shape, target_axis):
    check_training_data(_x(*x_shape), _x(*y_shape), target_axis=target_axis)


@pytest.mark.parametrize("x_shape, y_shape, target_axis, match", [
    ((3, 10, 2), (3, 11), -1, r"one target per row of train_x \(10 along axis -1\), got shape \(3, 11\)"),
    ((3, 10, 2), (10, 3), -1, r"one target per row of train_x \(10 along axis -1\), got shape \(10, 3\)"),
    ((10, 2), (4, 10), -2, r"one target per row of train_x \(10 along axis -2\), got shape \(4, 10\)"),
    ((3, 10, 2), (3, 4, 10), -2, r"one target per row of train_x \(10 along axis -2\), got shape \(3, 4, 10\)"),
    ((3, 10, 2), (10,), -2, r"one target per row of train_x \(10 along axis -2\), got shape \(10,\)"),
    # batch shapes that do not broadcast: GPyTorch's mean − y failed with "The size of tensor a (3) must match ..."
    ((3, 10, 2), (2, 10), -1, r"train_y's batch shape \(2,\) does not broadcast with train_x's \(3,\)"),
    ((3, 10, 2), (2, 10, 4), -2, r"train_y's batch shape \(2,\) does not broadcast with train_x's \(3,\)"),
])
def test_targets_of_mismatched_shapes_are_refused_by_name(x_shape, y_shape, target_axis, match):
    with pytest.raises(ValueError, match=match):
        check_training_data(_x(*x_shape), _x(*y_shape), target_axis=target_axis)


def test_batched_target_vectors_are_checked_for_points_along_their_last_axis():
    # a (b, N) batch of target vectors read its batch axis as the points: (3, 0) passed as non-empty and
    # (0, 10), no data point missing, was refused as "empty (0 data points)"
    with pytest.raises(ValueError, match=r"the training targets y is empty \(0 data points\)"):
        check_targets(_x(3, 0), "the training targets y")
    check_targets(_x(0, 10), "the training targets y")
    check_targets(_x(3, 10), "the training targets y")
    # interleaved multi-output vectors (b, N·T), read as (b, N, T)
    with pytest.raises(ValueError, match=r"is empty \(0 data points\)"):
        check_targets(_x(3, 0), "the training targets y", num_tasks=2)
    check_targets(_x(3, 8), "the training targets y", num_tasks=2)
    with pytest.raises(ValueError, match=r"indexed \(…, point, task\), contains NaN .* the first at index \(1, 2, 1\)"):
        check_targets(torch.zeros(3, 8, dtype=torch.float64).index_put_((torch.tensor(1), torch.tensor(5)),
                                                                       torch.tensor(torch.nan, dtype=torch.float64)),
                      "the training targets y", num_tasks=2)


def test_right_hand_side_matrices_are_checked_for_points_along_their_second_last_axis():
    # linear_operator's inv_quad_rhs: (N,) or (*b, N, k)
    with pytest.raises(ValueError, match=r"is empty \(0 data points\)"):
        check_targets(_x(3, 0, 1), point_axis=-2)
    check_targets(_x(10, 0), point_axis=-2)  # k = 0 right-hand sides of N = 10 points
