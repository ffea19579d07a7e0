"""Two-sketch kernel PCA (paper 003 Appendix A, Thm A.2) against the exact eigendecomposition of K.

Guarantee (with constant probability): Tr(K) − Tr(VᵀKV) ≤ (1 + ε) Σ_{i>k} λᵢ(K) + α.  Checked
over repeated independent trials: the mean ratio to the optimum stays within 1 + ε (4 SE), the
bound holds in most trials, and the one-sketch shortcut (top-k of M alone) measurably fails it.
"""

import math

import pytest
import torch

from rfgp.applications.distances import (
    exact_kernel_pca_eigenvalues,
    gaussian_kernel,
    projection_residual,
    two_sketch_kernel_pca,
)
from rfgp.features import GaussianSketch
from rfgp.features.gaussian_sketch import truncation_order

K_COMPONENTS = 5


def _problem(n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=torch.float64) * 2 - 1  # lengthscale 1: box radius L = 1/√2
    kernel = gaussian_kernel(1.0)
    eigenvalues = torch.linalg.eigvalsh(kernel(x, x)).flip(0)
    best = eigenvalues[K_COMPONENTS:].sum()  # ‖B_X − [B_X]_k‖²_F
    alpha = 1e-3 * best.item()
    # Thm A.2: the truncation must hold for every row of I − VVᵀ, i.e. ξ = 4n²
    order = truncation_order(1 / math.sqrt(2), alpha, d, xi=4 * n**2)
    return x, kernel, eigenvalues, best, alpha, order


def test_explicit_sketches_give_the_truncated_kernels_top_eigenvectors():
    """s^d ≤ m: G(X) = A_s exactly, so V spans the top-k eigenvectors of K_s (deterministic)."""
    x, kernel, eigenvalues, best, alpha, order = _problem(300, 2)
    g = GaussianSketch(256, order=order, input_dim=2, seed=0).double()
    h = GaussianSketch(512, order=order, input_dim=2, seed=1).double()
    assert g.explicit and h.explicit
    out = two_sketch_kernel_pca(g, h, x, K_COMPONENTS)
    assert torch.allclose(out.basis.T @ out.basis, torch.eye(K_COMPONENTS, dtype=torch.float64), atol=1e-12)
    residual = projection_residual(kernel, x, out.basis)
    assert best - 1e-9 <= residual <= best + alpha  # Ky Fan lower bound; Thm A.2 with ε = 0
    truncated = g.truncated_kernel(x, x)
    top = torch.linalg.eigvalsh(truncated).flip(0)[:K_COMPONENTS]
    assert torch.allclose(out.singular_values.square(), top, rtol=1e-9)
    assert (eigenvalues[:K_COMPONENTS] - top).abs().max() <= alpha  # K − K_s is PSD with trace error ≤ α


def test_tree_sketches_meet_relative_error_bound_over_trials():
    x, kernel, _, best, alpha, order = _problem(400, 3)
    assert order**3 > 512  # the sketches are random (tree), not the explicit features
    epsilon, trials = 0.1, 12
    ratios, shortcut = [], []
    for trial in range(trials):
        g = GaussianSketch(32, order=order, input_dim=3, mode="tree", seed=2 * trial).double()
        h = GaussianSketch(512, order=order, input_dim=3, mode="tree", seed=2 * trial + 1).double()
        out = two_sketch_kernel_pca(g, h, x, K_COMPONENTS)
        ratios.append(((projection_residual(kernel, x, out.basis) - alpha) / best).item())
        one_sketch = torch.linalg.svd(g(x), full_matrices=False)[0][:, :K_COMPONENTS]
        shortcut.append(((projection_residual(kernel, x, one_sketch) - alpha) / best).item())
    ratios, shortcut = torch.tensor(ratios), torch.tensor(shortcut)
    se = ratios.std() / math.sqrt(trials)
    assert (ratios >= 1 - alpha / best - 1e-9).all()  # no basis beats the optimum
    assert ratios.mean() - 4 * se <= 1 + epsilon  # mean within the (1 + ε) bound
    assert (ratios <= 1 + epsilon).float().mean() >= 2 / 3  # "with constant probability"
    # the second (wide) sketch is what makes it work: top-k of M alone misses the bound
    shortcut_se = shortcut.std() / math.sqrt(trials)
    assert shortcut.mean() - 4 * shortcut_se > 1 + epsilon
    assert ratios.mean() < shortcut.mean()


def test_arguments_validated():
    x = torch.rand(20, 2, dtype=torch.float64)
    g = GaussianSketch(8, order=2, input_dim=2, seed=0).double()  # rank ≤ s^d = 4
    with pytest.raises(ValueError, match="num_components must be ≤ rank of the range sketch"):
        two_sketch_kernel_pca(g, g, x, 5)
    with pytest.raises(ValueError, match="basis must be"):
        projection_residual(gaussian_kernel(), x, torch.zeros(19, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"x must have shape \(n, d\) with n ≥ 1 and d ≥ 1"):
        two_sketch_kernel_pca(g, g, x[0], 1)
    # the reference helper: exact eigenvalues agree with projection_residual's optimum
    values = exact_kernel_pca_eigenvalues(gaussian_kernel(), x, 20, center=False)
    eigvecs = torch.linalg.eigh(gaussian_kernel()(x, x))[1].flip(-1)[:, :3]
    assert torch.allclose(projection_residual(gaussian_kernel(), x, eigvecs, chunk_size=7), values[3:].sum(), atol=1e-10)
