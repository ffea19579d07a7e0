"""rfgp.sketch(..., method="gaussian_sketch" | "gaussian_sketch_hd"): the data radius and α choose the
truncation order (paper 003 Lemmas 2.9/2.11); hyperparameters carry over; |K − K_s| ≤ α/4 entrywise."""

import math

import pytest
import torch
from gpytorch.constraints import Interval
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.priors import GammaPrior

import rfgp
from rfgp.features.gaussian_sketch import truncation_order
from rfgp.kernels import SketchedRBFKernel

METHODS = ["gaussian_sketch", "gaussian_sketch_hd"]


def _points(n, seed, low=2.0, high=3.5):
    g = torch.Generator().manual_seed(seed)
    return low + (high - low) * torch.rand(n, 2, generator=g, dtype=torch.float64)  # off-centre box


def _exact(batch_shape=torch.Size()):
    rbf = RBFKernel(ard_num_dims=2, batch_shape=batch_shape, lengthscale_prior=GammaPrior(3.0, 6.0),
                    lengthscale_constraint=Interval(0.05, 5.0))
    rbf.lengthscale = torch.tensor([0.45, 0.8])  # below GPyTorch's initial ln 2 in one dimension
    scaled = ScaleKernel(rbf, batch_shape=batch_shape)
    scaled.outputscale = 1.7
    return scaled.double()


@pytest.mark.parametrize("method", METHODS)
def test_converted_kernel_within_alpha_of_exact_on_data_within_radius(method):
    # HD sketches its blocks of degree j once d^j > m_j: a narrower box keeps s (and 2^s) small
    width = 1.5 if method == "gaussian_sketch" else 0.6
    exact, train = _exact(), _points(50, 0, 2.0, 2.0 + width)
    alpha = 1e-6
    # F large enough for explicit Taylor features (s^d ≤ F; HD: every block d^j ≤ m_j) → only truncation error
    sketched = rfgp.sketch(exact, 4096, method=method, seed=0, x_sample=train, alpha=alpha).double()
    base = sketched.base_kernel
    assert isinstance(sketched, ScaleKernel) and isinstance(base, SketchedRBFKernel) and base.method == method
    # hyperparameters, constraint and prior carried over exactly
    assert torch.equal(sketched.raw_outputscale, exact.raw_outputscale)
    assert torch.equal(base.raw_lengthscale, exact.base_kernel.raw_lengthscale)
    constraint = exact.base_kernel.raw_lengthscale_constraint
    assert torch.equal(base.raw_lengthscale_constraint.lower_bound, constraint.lower_bound)
    assert isinstance(base.lengthscale_prior, GammaPrior)
    # centre = bounding-box centre of x_sample; order from the radius in the smallest lengthscale's units
    low, high = train.min(0).values, train.max(0).values
    assert torch.allclose(base.input_center.double(), (low + high) / 2)
    offsets = (train - (low + high) / 2) / 0.45
    radius = offsets.abs().max() if method == "gaussian_sketch" else offsets.norm(dim=-1).max()
    dim = 2 if method == "gaussian_sketch" else None
    assert base.feature_map.order == truncation_order(float(radius) / math.sqrt(2), alpha, dim)
    # Every point within the radius (new points inside the sample's box for GS; the ball for HD):
    # w = e_i − e_j style bounds give |K − K_s|_ij ≤ α/ξ = α/4 for (Σ|w|)² ≤ ξ = 4.
    if method == "gaussian_sketch":
        assert base.feature_map.explicit
        test = _points(40, 1, 2.05, 2.0 + width - 0.05)
    else:
        assert all(explicit for *_, explicit in base.feature_map.block_widths())
        test = (low + high) / 2 + (_points(40, 1, -0.5, 0.5) * float(radius) * 0.45 / math.sqrt(2))  # ‖·‖₂ ≤ radius
    with torch.no_grad():
        error = (sketched(train, test).to_dense() - exact(train, test).to_dense()).abs().max()
        diag_error = (sketched(train).to_dense() - exact(train).to_dense()).abs().max()
    assert error <= 1.7 * alpha / 4 and diag_error <= 1.7 * alpha / 4
    assert error > 0  # a truncated expansion, not the exact kernel


def test_tree_sketch_conversion_is_unbiased_for_truncated_kernel():
    """mode="tree" (s^d > F): the mean over seeds of K̂ matches K_s within 4 SE (paper 003 Lemma 2.5)."""
    exact, train = _exact(), _points(12, 0)
    estimates = torch.stack([
        rfgp.sketch(exact, 64, method="gaussian_sketch", seed=s, x_sample=train, alpha=1e-3, mode="tree")
        .double()(train[:6], train[6:]).to_dense().detach()
        for s in range(150)
    ])
    truth = exact(train[:6], train[6:]).to_dense().detach()
    se = estimates.std(0) / math.sqrt(len(estimates))
    assert ((estimates.mean(0) - truth).abs() <= 4 * se + 1e-3 / 4).all()


@pytest.mark.parametrize("method", METHODS)
def test_missing_radius_or_alpha_raises_value_error_naming_it(method):
    exact, train = _exact(), _points(10, 0)
    with pytest.raises(ValueError, match=r"missing: radius and alpha.*x_sample="):
        rfgp.sketch(exact, 256, method=method)
    with pytest.raises(ValueError, match=r"missing: radius \(got radius=None"):
        rfgp.sketch(exact, 256, method=method, alpha=1e-4)
    with pytest.raises(ValueError, match=r"missing: alpha \(got radius=.*, x_sample=a tensor of shape \(10, "):
        rfgp.sketch(exact, 256, method=method, x_sample=train)  # the message said x_sample=None
    with pytest.raises(ValueError, match="not both"):
        rfgp.sketch(exact, 256, method=method, x_sample=train, radius=1.0, alpha=1e-4)
    with pytest.raises(ValueError, match="x_sample must be"):
        rfgp.sketch(exact, 256, method=method, x_sample=[1.0, 2.0], alpha=1e-4)
    # an explicit order needs neither; radius + alpha without a sample works (centre at the origin)
    assert rfgp.sketch(exact, 256, method=method, order=5).base_kernel.feature_map.order == 5
    assert rfgp.sketch(exact, 256, method=method, radius=1.0, alpha=1e-4).base_kernel.input_center is None


def test_lengthscale_below_the_converted_one_is_refused_and_active_dims_apply():
    exact = RBFKernel(active_dims=[1, 2]).double()
    exact.lengthscale = 0.3
    x = torch.cat((100 * torch.ones(20, 1), _points(20, 0, 2.0, 2.5)), dim=-1)  # column 0 is not active
    sketched = rfgp.sketch(exact, 1024, method="gaussian_sketch_hd", x_sample=x, alpha=1e-4, seed=0).double()
    assert sketched.min_lengthscale == pytest.approx(0.3) and sketched.input_center.shape == (2,)
    assert torch.allclose(sketched(x).to_dense().detach(), exact(x).to_dense().detach(), atol=0.05)
    sketched.lengthscale = 0.25
    with pytest.raises(ValueError, match="min_lengthscale"):
        sketched(x).to_dense()


@pytest.mark.parametrize("method", METHODS)
def test_state_dict_round_trip_bit_for_bit(method):
    exact, train = _exact(), _points(30, 0)
    options = {"method": method, "x_sample": train, "alpha": 1e-4, "mode": "tree"} if method == "gaussian_sketch" \
        else {"method": method, "x_sample": train, "alpha": 1e-4}
    a = rfgp.sketch(exact, 64, seed=0, **options).double()
    a.outputscale = 2.3
    out = a(train).to_dense().detach()
    b = rfgp.sketch(exact, 64, seed=7, **options).double()
    assert not torch.equal(b(train).to_dense().detach(), out)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b(train).to_dense().detach(), out)



def test_batched_x_sample_gives_the_centre_and_radius_of_all_its_rows():
    """taylor_sketch_options with x_sample of shape (b, n, d): the bounding box of all b·n rows (it had been one
    centre per batch member, a centre of b·d entries)."""
    from rfgp.kernels.conversion import taylor_sketch_options

    x = torch.rand(2, 20, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 4
    exact = RBFKernel(ard_num_dims=3).double()
    batched = taylor_sketch_options(exact, "gaussian_sketch_hd", x_sample=x, alpha=1e-2)
    flat = taylor_sketch_options(exact, "gaussian_sketch_hd", x_sample=x.reshape(40, 3), alpha=1e-2)
    assert batched == flat and len(flat["center"]) == 3
