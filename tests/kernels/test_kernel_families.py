"""One class per approximation family: the short ``method=`` spelling, old checkpoints, wrong-family options.

``data/legacy_family_states.pt`` holds state dicts and features Φ(x) (float64, lengthscale 1.7 set before .double())
saved by the classes of commit 86a07fd, before the families were split, built as

* ``rbf_orf``: ``SketchedRBFKernel(16, method="orf", input_dim=2, seed=0)``
* ``rbf_maclaurin``: ``SketchedRBFKernel(16, method="maclaurin", input_dim=2, seed=0, max_order=4, sample_size=5)``
* ``rbf_maclaurin_complex``: ``SketchedRBFKernel(16, method="maclaurin", input_dim=2, seed=2, weights="complex",
  complex_posterior=True)``
* ``rbf_gaussian_sketch``: ``SketchedRBFKernel(16, method="gaussian_sketch", order=4, center=[0.5, 0.5],
  input_dim=2, seed=0, mode="tree")``
* ``rbf_gaussian_sketch_hd``: ``SketchedRBFKernel(32, method="gaussian_sketch_hd", radius=0.5, alpha=1e-2,
  min_lengthscale=1.0, input_dim=2, seed=1)``
* ``rbf_grad``: ``SketchedRBFKernelGrad(16, method="sorf", input_dim=2, seed=0)``
* ``exp_maclaurin`` / ``exp_random_maclaurin``: ``SketchedExponentialKernel(16, method=..., input_dim=2, seed=0,
  max_order=3)`` (``sample_size=5`` for the optimized one)

each featurized once on ``x`` (so the Maclaurin allocations are fitted) before saving.
"""

import copy
import pathlib
import pickle
import warnings

import gpytorch
import pytest
import torch

import rfgp
from rfgp.kernels import (
    GaussianSketchRBFKernel,
    MaclaurinRBFKernel,
    RandomMaclaurinExponentialKernel,
    SketchedExponentialKernel,
    SketchedRBFKernel,
    SketchedRBFKernelGrad,
)

LEGACY = torch.load(pathlib.Path(__file__).parent / "data" / "legacy_family_states.pt")
X = LEGACY["x"]

# (legacy entry, the new family class, its constructor with other seeds: the load must overwrite the draws)
NEW_SPELLINGS = {
    "rbf_orf": lambda: SketchedRBFKernel(16, method="orf", input_dim=2, seed=7),
    "rbf_maclaurin": lambda: MaclaurinRBFKernel(16, input_dim=2, seed=5, max_order=4, sample_size=5),
    "rbf_maclaurin_complex": lambda: MaclaurinRBFKernel(16, input_dim=2, seed=3, weights="complex",
                                                        complex_posterior=True),
    "rbf_gaussian_sketch": lambda: GaussianSketchRBFKernel(16, order=4, center=[0.5, 0.5], input_dim=2, seed=3,
                                                           mode="tree"),
    "rbf_gaussian_sketch_hd": lambda: GaussianSketchRBFKernel(32, method="gaussian_sketch_hd", radius=0.5,
                                                              alpha=1e-2, min_lengthscale=1.0, input_dim=2, seed=4),
    "rbf_grad": lambda: SketchedRBFKernelGrad(16, method="sorf", input_dim=2, seed=1),
    "exp_maclaurin": lambda: SketchedExponentialKernel(16, input_dim=2, seed=6, max_order=3, sample_size=5),
    "exp_random_maclaurin": lambda: SketchedExponentialKernel(16, method="random_maclaurin", input_dim=2, seed=6,
                                                              max_order=3),
}


def _features(kernel):
    with torch.no_grad():
        return kernel.featurize(X)


@pytest.mark.parametrize("name", sorted(NEW_SPELLINGS))
def test_state_saved_before_the_split_loads_bit_for_bit(name):
    kernel = NEW_SPELLINGS[name]().double()
    kernel.load_state_dict(LEGACY[name]["state"])  # strict
    assert torch.equal(kernel.raw_lengthscale.detach(), LEGACY[name]["state"]["raw_lengthscale"])
    # the state is bit for bit; features recomputed from it agree to the last bits only, which depend on the CPU's
    # BLAS kernels (AVX2 vs AVX-512 summation order: ≤ 1 ulp here; another draw would differ by O(0.1))
    torch.testing.assert_close(_features(kernel), LEGACY[name]["features"], rtol=1e-14, atol=1e-15)


OLD_AND_NEW = [
    (lambda: SketchedRBFKernel(32, method="maclaurin", input_dim=2, seed=0, weights="real", max_order=5),
     lambda: MaclaurinRBFKernel(32, input_dim=2, seed=0, weights="real", max_order=5)),
    (lambda: SketchedRBFKernel(32, method="maclaurin", ard_num_dims=2, seed=1),
     lambda: MaclaurinRBFKernel(32, ard_num_dims=2, seed=1)),
    (lambda: SketchedRBFKernel(32, method="gaussian_sketch", radius=1.0, alpha=1e-3, min_lengthscale=0.6,
                               input_dim=2, seed=0),
     lambda: GaussianSketchRBFKernel(32, radius=1.0, alpha=1e-3, min_lengthscale=0.6, input_dim=2, seed=0)),
    (lambda: SketchedRBFKernel(64, method="gaussian_sketch_hd", order=5, center=[0.5, 0.5], input_dim=2, seed=2),
     lambda: GaussianSketchRBFKernel(64, method="gaussian_sketch_hd", order=5, center=[0.5, 0.5], input_dim=2,
                                     seed=2)),
    (lambda: SketchedExponentialKernel(32, method="random_maclaurin", input_dim=2, seed=0, max_order=4),
     lambda: RandomMaclaurinExponentialKernel(32, input_dim=2, seed=0, max_order=4)),
]


@pytest.mark.parametrize("old, new", OLD_AND_NEW)
def test_method_spelling_builds_the_family_class_with_the_same_features(old, new):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a, b = old().double(), new().double()
    assert type(a) is type(b) and isinstance(a, (SketchedRBFKernel, SketchedExponentialKernel))
    assert a.method == b.method
    assert torch.equal(_features(a), _features(b))
    assert torch.equal(a(X).to_dense(), b(X).to_dense())


@pytest.mark.parametrize("old, new", OLD_AND_NEW)
def test_family_state_round_trip_and_copies(old, new):
    a = old().double()
    a.lengthscale = 0.8
    _features(a)  # fits a Maclaurin allocation
    b = new().double()
    b.load_state_dict(a.state_dict())
    assert torch.equal(_features(a), _features(b))
    for clone in (copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert type(clone) is type(a)
        assert torch.equal(_features(clone), _features(a))


def test_states_of_different_families_do_not_load_into_each_other():
    fourier = SketchedRBFKernel(16, input_dim=2, seed=0)
    maclaurin = MaclaurinRBFKernel(16, input_dim=2, seed=0)
    taylor = GaussianSketchRBFKernel(16, order=3, input_dim=2, seed=0)
    with pytest.raises(ValueError, match="method is 'rff' in the state dict but 'maclaurin'"):
        maclaurin.load_state_dict(fourier.state_dict())
    with pytest.raises(ValueError, match="type is 'MaclaurinRBFKernel' in the state dict but 'GaussianSketchRBFKernel'"):
        taylor.load_state_dict(maclaurin.state_dict())
    with pytest.raises(ValueError, match="type is 'SketchedRBFKernel' in the state dict but 'SketchedRBFKernelGrad'"):
        SketchedRBFKernelGrad(16, input_dim=2, seed=0).load_state_dict(fourier.state_dict())


@pytest.mark.parametrize("build, message", [
    (lambda: SketchedRBFKernel(16, method="rff", max_order=3),
     r"max_order=3 is an option of MaclaurinRBFKernel \(method='maclaurin'\), not of SketchedRBFKernel \(method='rff'\)"),
    (lambda: SketchedRBFKernel(16, method="orf", radius=1.0),
     r"radius=1.0 is an option of GaussianSketchRBFKernel \(method='gaussian_sketch'/'gaussian_sketch_hd'\)"),
    (lambda: SketchedRBFKernel(16, method="maclaurin", order=4),
     r"order=4 is an option of GaussianSketchRBFKernel .*not of MaclaurinRBFKernel \(method='maclaurin'\)"),
    (lambda: GaussianSketchRBFKernel(16, order=4, weights="ctr"),
     r"weights='ctr' is an option of MaclaurinRBFKernel"),
    (lambda: SketchedRBFKernel(16, method="gaussian_sketch", order=4, complex_posterior=True),
     r"complex_posterior=True is an option of MaclaurinRBFKernel"),
    (lambda: MaclaurinRBFKernel(16, method="rff"), r"method must be one of 'maclaurin'; got 'rff'"),
    (lambda: SketchedExponentialKernel(16, method="random_maclaurin", sample_size=50),
     (r"sample_size=50 is an option of SketchedExponentialKernel \(method='maclaurin'\), not of "
      r"RandomMaclaurinExponentialKernel \(method='random_maclaurin'\)")),
    (lambda: SketchedExponentialKernel(16, method="rff"), r"method must be one of 'maclaurin', 'random_maclaurin'"),
    # an unhashable method raised Python's "unhashable type: 'list'", which names neither the argument nor the choices
    (lambda: SketchedRBFKernel(16, method=["rff"]), r"method must be one of 'rff', .*got \['rff'\]"),
    (lambda: GaussianSketchRBFKernel(16, method="maclaurin"),
     r"method must be one of 'gaussian_sketch', 'gaussian_sketch_hd'; got 'maclaurin'"),
])
def test_options_of_another_family_raise_naming_the_family(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_a_subclass_of_a_root_refuses_another_family_s_method_by_name():
    """A user's subclass of SketchedRBFKernel builds itself, so only its own family's methods (it raised a raw
    KeyError for method="maclaurin")."""

    class MyRBFKernel(SketchedRBFKernel):
        pass

    assert type(MyRBFKernel(16, method="orf", seed=0)) is MyRBFKernel
    with pytest.raises(ValueError, match="method must be one of 'rff', 'orf', 'sorf'; got 'maclaurin'"):
        MyRBFKernel(16, method="maclaurin")


def test_unknown_keyword_arguments_raise_instead_of_being_dropped_by_gpytorch():
    for build in (lambda: SketchedRBFKernel(16, lenghtscale_prior=None, bogus=1),
                  lambda: MaclaurinRBFKernel(16, bogus=1),
                  lambda: GaussianSketchRBFKernel(16, order=3, bogus=1),
                  lambda: SketchedExponentialKernel(16, bogus=1)):
        with pytest.raises(TypeError, match="unexpected keyword argument.*'bogus'.*ard_num_dims"):
            build()


def test_unused_options_of_other_families_given_as_none_or_false_are_accepted():
    """As before the split: ``order=None`` or ``complex_posterior=False`` mean "not used" in every family."""
    kernel = SketchedRBFKernel(16, method="rff", order=None, center=None, complex_posterior=False, seed=0)
    assert type(kernel) is SketchedRBFKernel


def test_sketch_converts_to_the_family_classes():
    exact = gpytorch.kernels.RBFKernel(ard_num_dims=2)
    maclaurin = rfgp.sketch(exact, 32, method="maclaurin", seed=0, max_order=4)
    taylor = rfgp.sketch(exact, 32, method="gaussian_sketch", seed=0, order=3)
    assert type(maclaurin) is MaclaurinRBFKernel and maclaurin.feature_map.max_order == 4
    assert type(taylor) is GaussianSketchRBFKernel and taylor.feature_map.order == 3
    with pytest.raises(ValueError, match="max_order=4 is an option of MaclaurinRBFKernel"):
        rfgp.sketch(exact, 32, method="orf", max_order=4)


def test_derivative_kernel_keeps_its_own_class():
    kernel = SketchedRBFKernelGrad(16, method="orf", input_dim=2, seed=0)
    assert type(kernel) is SketchedRBFKernelGrad and kernel.method == "orf"
    with pytest.raises(ValueError, match="method"):
        SketchedRBFKernelGrad(16, method="maclaurin")


def test_polynomial_method_options_go_to_their_method_only():
    from rfgp.kernels import SketchedPolynomialKernel

    kernel = SketchedPolynomialKernel(3, 21, method="maclaurin", weights="real", sample_size=7, input_dim=2, seed=0)
    assert kernel.feature_map.sample_size == 7
    with pytest.raises(ValueError, match=r"sample_size=7 is an option of SketchedPolynomialKernel\(method='maclaurin'\), "
                                         r"not of method='sketch'"):
        SketchedPolynomialKernel(3, 21, sample_size=7)
    with pytest.raises(TypeError, match="unexpected keyword argument.*'max_order'"):
        SketchedPolynomialKernel(3, 21, method="maclaurin", max_order=3)  # fixed to the power
    # srht_blocks is validated for every projection (it was dropped for non-SRHT ones)
    with pytest.raises(ValueError, match="srht_blocks"):
        SketchedPolynomialKernel(3, 16, projection="gaussian", srht_blocks="bogus")


def test_spectral_kernels_refuse_unknown_keyword_arguments():
    from rfgp.kernels import SketchedPeriodicKernel, SketchedRQKernel

    for build in (lambda: SketchedPeriodicKernel(16, max_order=3), lambda: SketchedRQKernel(16, max_order=3)):
        with pytest.raises(TypeError, match="unexpected keyword argument.*'max_order'"):
            build()


def test_min_lengthscale_without_radius_raises_instead_of_being_ignored():
    with pytest.raises(ValueError, match="min_lengthscale=0.5 only applies with radius="):
        GaussianSketchRBFKernel(32, order=4, min_lengthscale=0.5)


def test_maclaurin_width_mismatch_on_load_reports_the_num_features_passed():
    """An even num_features leaves a column unused (width 63 for 64); the load error names the argument, 64 vs 32."""
    x = torch.randn(10, 3, dtype=torch.float64)
    saved = gpytorch.kernels.ScaleKernel(rfgp.kernels.MaclaurinRBFKernel(64, seed=0)).double()
    saved(x, x).to_dense()
    target = gpytorch.kernels.ScaleKernel(rfgp.kernels.MaclaurinRBFKernel(32, seed=0)).double()
    with pytest.raises(ValueError, match=r"base_kernel\.feature_map\.num_features is 64 in the state dict but 32 in"):
        target.load_state_dict(saved.state_dict())
    # the same width built from the odd argument loads (and adopts the saved argument)
    same = gpytorch.kernels.ScaleKernel(rfgp.kernels.MaclaurinRBFKernel(63, seed=1)).double()
    same.load_state_dict(saved.state_dict())
    assert same.base_kernel.feature_map.requested_num_features == 64
    torch.testing.assert_close(same(x, x).to_dense(), saved(x, x).to_dense(), rtol=0, atol=0)
