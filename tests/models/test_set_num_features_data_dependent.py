"""set_num_features on data-dependent maps: Nyström landmarks re-chosen by rule and seed; Maclaurin budgets."""

import copy

import gpytorch
import pytest
import torch

import rfgp
from rfgp.kernels import NystromKernel
from rfgp.models import ExactGPModel


def data(n=400, d=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen, dtype=torch.float64) * 4
    y = torch.sin(2 * x).sum(-1) + 0.05 * torch.randn(n, generator=gen, dtype=torch.float64)
    return x, y


def rbf(lengthscale=0.7):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    kernel.base_kernel.lengthscale = lengthscale
    return kernel.double()


def model(kernel, x, y):
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = 0.01
    return ExactGPModel(x, y, likelihood, kernel).double()


@pytest.mark.parametrize("rule, options", [("uniform", {}), ("kmeans++", {}), ("rls", {}),
                                           ("rls", {"regularization": 0.05})])
def test_resized_landmarks_repeat_the_rule_and_keep_the_hyperparameters(rule, options):
    """Also where the rule's regularization λ is on the scale of the whole kernel s·k: ScaleKernel(NystromKernel(k))
    re-scores with the outputscale around it, as the first choice did."""
    x, y = data()
    gp = model(rfgp.sketch(rbf(), 16, method="nystrom", x_sample=x, landmarks=rule, seed=5, **options), x, y)
    before = {name: value.clone() for name, value in gp.named_parameters()}
    rfgp.set_num_features(gp, 64)
    kernel = gp.covar_module.base_kernel
    assert kernel.num_features == 64 and kernel.landmarks.shape == (64, 2)
    fresh = rfgp.sketch(rbf(), 64, method="nystrom", x_sample=x, landmarks=rule, seed=5, **options).base_kernel
    assert torch.equal(kernel.landmarks, fresh.landmarks)  # same rule, same seed, same data
    for name, value in gp.named_parameters():
        assert torch.equal(value, before[name]), name
    rows = (kernel.landmarks.unsqueeze(1) == x.unsqueeze(0)).all(-1).any(-1)
    assert rows.all()  # landmarks are data points


def test_prediction_approaches_the_exact_gp_as_landmarks_grow():
    x, y = data()
    test_x = data(50, seed=1)[0]
    exact = model(rbf(), x, y).eval()
    with torch.no_grad():
        target = exact(test_x).mean
    gp = model(rfgp.sketch(rbf(), 8, method="nystrom", x_sample=x, seed=0), x, y)
    errors = []
    for width in (8, 32, 128):
        rfgp.set_num_features(gp, width)
        gp.eval()
        with torch.no_grad():
            errors.append((gp(test_x).mean - target).abs().max().item())
    assert errors[2] < errors[1] < errors[0] and errors[2] < 1e-2


def test_uniform_selection_at_a_larger_width_extends_the_smaller_one():
    x, _ = data()
    small = rfgp.sketch(rbf(), 16, method="nystrom", x_sample=x, seed=2)
    large = rfgp.sketch(rbf(), 16, method="nystrom", x_sample=x, seed=2)
    rfgp.set_num_features(large, 48, x_sample=x)
    assert torch.equal(large.base_kernel.landmarks[:16], small.base_kernel.landmarks)


def test_state_round_trip_at_the_new_width_into_a_kernel_built_at_the_old_one():
    x, y = data()
    gp = model(rfgp.sketch(rbf(), 16, method="nystrom", x_sample=x, landmarks="kmeans++", seed=1), x, y)
    rfgp.set_num_features(gp, 40)
    state = gp.state_dict()
    other = model(rfgp.sketch(rbf(), 16, method="nystrom", x_sample=x, seed=9), x, y)
    other.load_state_dict(state)
    assert torch.equal(other.covar_module.base_kernel.landmarks, gp.covar_module.base_kernel.landmarks)
    assert other.covar_module.base_kernel.landmark_method == "kmeans++"
    assert other.covar_module.base_kernel.selection_seed == 1
    gp.eval(), other.eval()
    with torch.no_grad():
        assert torch.equal(gp(x[:7]).mean, other(x[:7]).mean)


def test_states_without_the_selection_fields_still_load():
    """Checkpoints saved before the selection rule was stored (no config_num_features etc.) load strictly."""
    x, _ = data()
    kernel = rfgp.sketch(rbf(), 16, method="nystrom", x_sample=x, seed=1)
    state = {key: value for key, value in kernel.state_dict().items()
             if not key.endswith(("num_features", "landmark_method", "selection_seed", "regularization",
                                  "pilot_size"))}
    fresh = rfgp.sketch(rbf(), 16, method="nystrom", x_sample=x, seed=4)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.base_kernel.landmarks, kernel.base_kernel.landmarks)


def test_refusals_name_the_reason():
    x, y = data()
    by_hand = NystromKernel(rbf(), x[:10])
    with pytest.raises(TypeError, match="given by hand"):
        rfgp.set_num_features(model(by_hand, x, y), 20)
    learned = rfgp.sketch(rbf(), 10, method="nystrom", x_sample=x, seed=0, learn_landmarks=True)
    with pytest.raises(ValueError, match="learn_landmarks=True, trained or not.*build the kernel at the new width"):
        rfgp.set_num_features(model(learned, x, y), 20)
    bare = rfgp.sketch(rbf(), 10, method="nystrom", x_sample=x, seed=0)
    with pytest.raises(ValueError, match="x_sample"):
        rfgp.set_num_features(bare, 20)
    with pytest.raises(ValueError):
        rfgp.set_num_features(bare, 500, x_sample=x)  # more landmarks than data points
    with pytest.raises(TypeError, match="pilot_sise"):
        rfgp.sketch(rbf(), 10, method="nystrom", x_sample=x, landmarks="rls", pilot_sise=50)


def test_a_tree_with_nystrom_and_random_features_keeps_its_proportions():
    x, y = data()
    nystrom = rfgp.sketch(rbf(), 32, method="nystrom", x_sample=x, seed=0)
    fourier = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(64, seed=0)).double()
    gp = model(nystrom + fourier, x, y)
    rfgp.set_num_features(gp, 192)
    assert nystrom.base_kernel.num_features == 64 and fourier.base_kernel.num_features == 128


@pytest.mark.parametrize("width", [64, 65])
def test_maclaurin_widths_are_budgets_as_in_the_constructor(width):
    """A CtR Maclaurin map with a constant column has odd real widths 1 + 2·D: a budget of 64 gives 63 columns
    (the unusable one dropped), in set_num_features as in __init__."""
    x, y = data()
    gp = model(gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(32, method="maclaurin", seed=0)).double(),
               x, y)
    rfgp.set_num_features(gp, width)
    fresh = rfgp.kernels.SketchedRBFKernel(width, method="maclaurin", seed=0)
    expected = {64: 63, 65: 65}[width]
    assert gp.covar_module.base_kernel.num_features == fresh.num_features == expected


@pytest.mark.parametrize("method", ["maclaurin", "random_maclaurin"])
def test_a_resized_maclaurin_map_saves_the_state_of_one_built_at_the_new_width(method):
    """The saved requested width follows the resize: the state of a model trained at 32 and resized to 128 loads
    into a model built at 128 as that model's own, and a model built at the old width refuses it naming 128
    (it said "32 in the state dict but 32 in this module")."""
    x, y = data()

    def build(width):
        kernel = rfgp.kernels.SketchedExponentialKernel(width, method=method, seed=0)
        return model(gpytorch.kernels.ScaleKernel(kernel).double(), x, y)

    gp = rfgp.set_num_features(build(32), 128)
    state, fresh = gp.state_dict(), build(128).state_dict()
    assert state.keys() == fresh.keys() and all(torch.equal(state[k], fresh[k]) for k in state)
    with pytest.raises(ValueError, match="is 128 in the state dict but 32 in this module"):
        build(32).load_state_dict(state)


def test_complex_polynomial_sketch_widths_stay_even_as_in_the_constructor():
    kernel = rfgp.kernels.SketchedPolynomialKernel(3, 12, weights="ctr", seed=0)
    with pytest.raises(ValueError, match="multiple of 2"):
        rfgp.set_num_features(kernel, 13)
    with pytest.raises(ValueError, match="even"):
        rfgp.kernels.SketchedPolynomialKernel(3, 13, weights="ctr", seed=0)


@pytest.mark.parametrize("tree", [
    lambda: gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(active_dims=[0, 2])),
    lambda: gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(active_dims=[0, 2]))
    + gpytorch.kernels.LinearKernel(active_dims=[1]),
], ids=["scaled", "sum"])
def test_maclaurin_refits_on_the_columns_its_kernel_sees(tree):
    """A ScaleKernel selects its (copied) active_dims and runs its base's forward: the base's own are not applied
    again, so the refit sees columns [0, 2] once (selecting them twice raised an index error)."""
    x, y = data(d=3)
    gp = model(rfgp.sketch(tree(), 32, method="maclaurin", x_sample=x, seed=0).double(), x, y)
    gp(x).covariance_matrix  # the allocation is fitted at the first evaluation
    leaf = next(m for m in gp.modules() if isinstance(m, rfgp.kernels.MaclaurinRBFKernel))
    leaf.lengthscale = 1.5  # training moved it: the refit must see x[:, [0, 2]] / 1.5
    rfgp.set_num_features(gp, 64)
    reference = copy.deepcopy(leaf.feature_map)
    reference.fit(x[:, [0, 2]] / 1.5)
    assert leaf.feature_map.widths == reference.widths and leaf.feature_map.num_features > 32
    with torch.no_grad():
        gp.train()
        assert torch.isfinite(gp(x).covariance_matrix).all()
