"""rfgp.sketch on the GPyTorch kernel zoo: new families, exact-type dispatch, method mappings, option checks."""

import gpytorch
import pytest
import torch
from gpytorch.constraints import GreaterThan, Interval
from gpytorch.kernels import (
    AdditiveKernel,
    ArcKernel,
    ConstantKernel,
    CosineKernel,
    LinearKernel,
    MaternKernel,
    NewtonGirardAdditiveKernel,
    PeriodicKernel,
    PolynomialKernel,
    RBFKernel,
    RQKernel,
    ScaleKernel,
    SpectralDeltaKernel,
    SpectralMixtureKernel,
)
from gpytorch.priors import GammaPrior, NormalPrior

import rfgp
from rfgp.kernels import (
    SketchedArcKernel,
    SketchedNewtonGirardAdditiveKernel,
    SketchedPolynomialKernel,
    SketchedRBFKernel,
)
from rfgp.kernels.exact_features import ConstantFeatureKernel, CosineFeatureKernel, LinearFeatureKernel
from rfgp.kernels.periodic import SketchedPeriodicKernel
from rfgp.kernels.rational_quadratic import SketchedRQKernel
from rfgp.kernels.spectral_delta import SpectralDeltaFeatureKernel
from rfgp.kernels.spectral_mixture import SketchedSpectralMixtureKernel
from rfgp.models import ExactGPModel
from tests._conversion_checks import assert_copied_constraint

F64 = torch.float64
BATCH = torch.Size([2])
X = torch.rand(30, 3, generator=torch.Generator().manual_seed(0), dtype=F64) * 2


def periodic():
    kernel = PeriodicKernel(ard_num_dims=2, batch_shape=BATCH, active_dims=(0, 2), lengthscale_prior=GammaPrior(2.0, 2.0),
                            period_length_prior=NormalPrior(1.0, 0.5),
                            period_length_constraint=GreaterThan(0.1)).double()
    kernel.lengthscale = torch.tensor([[[0.8, 1.2]], [[1.0, 0.7]]])
    kernel.period_length = torch.tensor([[[1.1, 0.6]], [[0.9, 1.4]]])
    return kernel


def rq():
    kernel = RQKernel(ard_num_dims=3, batch_shape=BATCH, alpha_constraint=Interval(0.05, 20.0)).double()
    kernel.register_prior("alpha_prior", GammaPrior(3.0, 2.0), lambda m: m.alpha, lambda m, v: m._set_alpha(v))
    kernel.lengthscale = torch.tensor([[[0.8, 1.2, 0.5]], [[1.0, 0.7, 2.0]]])
    kernel.alpha = torch.tensor([[0.7], [3.0]])
    return kernel


def spectral_mixture():
    kernel = SpectralMixtureKernel(num_mixtures=2, ard_num_dims=3, batch_shape=BATCH).double()
    kernel.mixture_weights = torch.tensor([[0.3, 0.7], [1.0, 0.5]])
    kernel.mixture_means = torch.rand(2, 2, 1, 3, generator=torch.Generator().manual_seed(1))
    kernel.mixture_scales = 0.3 + torch.rand(2, 2, 1, 3, generator=torch.Generator().manual_seed(2))
    return kernel


def linear():
    kernel = LinearKernel(ard_num_dims=3, batch_shape=BATCH, variance_prior=GammaPrior(1.0, 1.0)).double()
    kernel.variance = torch.tensor([[[0.5, 1.0, 2.0]], [[1.0, 0.1, 0.3]]])
    return kernel


def constant():
    kernel = ConstantKernel(batch_shape=BATCH, constant_prior=GammaPrior(1.0, 1.0)).double()
    kernel.constant = torch.tensor([0.4, 1.3], dtype=F64)
    return kernel


def cosine():
    kernel = CosineKernel(batch_shape=BATCH, active_dims=(1,), period_length_prior=GammaPrior(2.0, 1.0)).double()
    kernel.period_length = torch.tensor([[[0.8]], [[1.7]]])
    return kernel


def spectral_delta():
    kernel = SpectralDeltaKernel(num_dims=3, num_deltas=6, ard_num_dims=3, batch_shape=BATCH,
                                 lengthscale_prior=GammaPrior(2.0, 2.0), Z_constraint=Interval(0.0, 2.0)).double()
    kernel.Z = torch.rand(2, 6, 3, generator=torch.Generator().manual_seed(3), dtype=F64) + 0.1
    return kernel


def arc():
    kernel = ArcKernel(gpytorch.kernels.MaternKernel(nu=1.5, batch_shape=BATCH), ard_num_dims=2, batch_shape=BATCH,
                       active_dims=(0, 2), angle_prior=GammaPrior(2.0, 4.0),
                       lengthscale_prior=GammaPrior(2.0, 2.0)).double()
    kernel.angle = torch.tensor([[[0.3, 0.6]], [[0.8, 0.2]]])
    kernel.radius = torch.tensor([[[0.7, 1.6]], [[1.2, 0.4]]])
    return kernel


def newton_girard():
    kernel = NewtonGirardAdditiveKernel(RBFKernel(ard_num_dims=2, lengthscale_prior=GammaPrior(2.0, 2.0)), num_dims=2,
                                        batch_shape=BATCH, active_dims=(0, 2)).double()
    kernel.base_kernel.lengthscale = torch.tensor([[0.6, 1.3]])
    kernel.outputscale = torch.tensor([[0.7, 0.2], [0.4, 0.9]])
    return kernel


CASES = {
    "periodic": (periodic, SketchedPeriodicKernel, ("lengthscale", "period_length")),
    "rq": (rq, SketchedRQKernel, ("lengthscale", "alpha")),
    "spectral_mixture": (spectral_mixture, SketchedSpectralMixtureKernel,
                         ("mixture_weights", "mixture_means", "mixture_scales")),
    "linear": (linear, LinearFeatureKernel, ("variance",)),
    "constant": (constant, ConstantFeatureKernel, ("constant",)),
    "cosine": (cosine, CosineFeatureKernel, ("period_length",)),
    "spectral_delta": (spectral_delta, SpectralDeltaFeatureKernel, ("lengthscale", "Z")),
    "arc": (arc, SketchedArcKernel, ("lengthscale", "angle", "radius")),
    "newton_girard": (newton_girard, SketchedNewtonGirardAdditiveKernel, ("outputscale",)),
}


@pytest.mark.parametrize("family", CASES)
def test_conversion_carries_hyperparameters_constraints_priors_batch_and_active_dims(family):
    make, sketched_type, names = CASES[family]
    exact = make()
    sketched = rfgp.sketch(exact, num_features=64, seed=0)
    assert type(sketched) is sketched_type
    assert sketched.batch_shape == exact.batch_shape
    assert (sketched.active_dims is None) == (exact.active_dims is None)
    if exact.active_dims is not None:
        assert torch.equal(sketched.active_dims, exact.active_dims)
    for name in names:
        assert torch.equal(getattr(sketched, name), getattr(exact, name)), name
        assert_copied_constraint(getattr(sketched, f"raw_{name}_constraint"), getattr(exact, f"raw_{name}_constraint"))
    assert {n for n, *_ in exact.named_priors()} == {n for n, *_ in sketched.named_priors()}
    again = rfgp.sketch(make(), num_features=64, seed=5)
    sketched(X).to_dense(), again(X).to_dense()  # draws are made at the first call
    again.load_state_dict(sketched.state_dict())
    assert torch.equal(again(X).to_dense(), sketched(X).to_dense())


@pytest.mark.parametrize("family", ["periodic", "rq", "spectral_mixture", "arc", "newton_girard"])
def test_converted_random_kernels_approximate_the_exact_gram(family):
    exact = CASES[family][0]()
    target = exact(X).to_dense().detach()
    errors = [float((rfgp.sketch(exact, f, seed=1)(X).to_dense().detach() - target).norm() / target.norm())
              for f in (64, 4096)]
    assert errors[1] < errors[0] / 4 and errors[1] < 0.1, errors


@pytest.mark.parametrize("family", ["linear", "constant", "cosine", "spectral_delta"])
def test_exact_families_convert_exactly_with_their_own_width(family):
    exact = CASES[family][0]()
    sketched = rfgp.sketch(exact, num_features=512)
    assert torch.allclose(sketched(X).to_dense(), exact(X).to_dense(), atol=1e-13)
    assert sketched.num_features == {"linear": 3, "constant": 1, "cosine": 2, "spectral_delta": 12}[family]


def test_every_converted_leaf_exposes_num_features():
    for family, (make, *_) in CASES.items():
        assert isinstance(rfgp.sketch(make(), num_features=64).num_features, int), family


@pytest.mark.parametrize("subclass", [gpytorch.kernels.RBFKernelGrad, gpytorch.kernels.RBFKernelGradGrad,
                                      gpytorch.kernels.Matern52KernelGrad, gpytorch.kernels.PolynomialKernelGrad])
def test_unregistered_subclasses_are_never_converted_as_their_parent(subclass):
    kernel = subclass(power=2) if subclass is gpytorch.kernels.PolynomialKernelGrad else subclass()
    if type(kernel) in rfgp.kernels.conversion._CONVERTERS:
        pytest.skip(f"{subclass.__name__} has its own converter")
    with pytest.raises(TypeError, match=f"no random-feature version of {subclass.__name__}; it is a subclass of"):
        rfgp.sketch(ScaleKernel(kernel), num_features=16)


def test_gpytorch_rff_kernel_converts_like_the_rbf_kernel_it_approximates():
    exact = gpytorch.kernels.RFFKernel(num_samples=8, ard_num_dims=3, lengthscale_prior=GammaPrior(3.0, 6.0)).double()
    exact.lengthscale = torch.tensor([[0.7, 1.3, 2.0]])
    sketched = rfgp.sketch(exact, num_features=4096, method="orf", seed=0)
    assert isinstance(sketched, SketchedRBFKernel) and sketched.num_features == 4096
    assert torch.equal(sketched.lengthscale, exact.lengthscale)
    assert {n for n, *_ in sketched.named_priors()} == {"lengthscale_prior"}
    rbf = RBFKernel(ard_num_dims=3).double()
    rbf.lengthscale = exact.lengthscale
    target = rbf(X).to_dense().detach()
    assert float((sketched(X).to_dense().detach() - target).norm() / target.norm()) < 0.05


KEOPS_TWINS = {
    "rbf": (lambda **kw: gpytorch.kernels.keops.RBFKernel(**kw), lambda **kw: RBFKernel(**kw)),
    "matern": (lambda **kw: gpytorch.kernels.keops.MaternKernel(nu=1.5, **kw),
               lambda **kw: gpytorch.kernels.MaternKernel(nu=1.5, **kw)),
    "periodic": (lambda **kw: gpytorch.kernels.keops.PeriodicKernel(**kw), lambda **kw: PeriodicKernel(**kw)),
}


@pytest.mark.parametrize("family", KEOPS_TWINS)
def test_keops_kernels_convert_as_their_namesakes(family):
    keops_kernel, plain_kernel = (ScaleKernel(make(ard_num_dims=3, lengthscale_prior=GammaPrior(3.0, 6.0))).double()
                                  for make in KEOPS_TWINS[family])
    plain_kernel.base_kernel.lengthscale = keops_kernel.base_kernel.lengthscale = torch.tensor([[0.7, 1.3, 2.0]])
    sketched = rfgp.sketch(keops_kernel, num_features=4096, seed=0)
    twin = rfgp.sketch(plain_kernel, num_features=4096, seed=0)
    assert type(sketched.base_kernel) is type(twin.base_kernel)
    assert {n for n, *_ in sketched.named_priors()} == {n for n, *_ in twin.named_priors()}
    assert torch.equal(sketched(X).to_dense(), twin(X).to_dense())
    target = keops_kernel(X).to_dense().detach()  # ScaleKernel calls the KeOps kernel's forward: no KeOps warning
    assert float((sketched(X).to_dense().detach() - target).norm() / target.norm()) < 0.1


def test_method_mapping_by_name_applies_to_keops_twins():
    tree = ScaleKernel(gpytorch.kernels.keops.RBFKernel()) + ScaleKernel(RBFKernel())
    sketched = rfgp.sketch(tree, 64, method={"RBFKernel": "orf"})
    assert [part.base_kernel.method for part in sketched.kernels] == ["orf", "orf"]


@pytest.mark.parametrize("kernel, reason", [
    (lambda: gpytorch.kernels.GridInterpolationKernel(RBFKernel(), grid_size=10, num_dims=1), "SKI / KISS-GP"),
    (lambda: gpytorch.kernels.InducingPointKernel(RBFKernel(), torch.rand(4, 1), gpytorch.likelihoods.GaussianLikelihood()),
     "SGPR's inducing-point approximation"),
    (lambda: gpytorch.kernels.MultiDeviceKernel(RBFKernel(), device_ids=[], output_device=torch.device("cpu")),
     "across GPUs"),
    (lambda: gpytorch.kernels.GridKernel(RBFKernel(), grid=torch.linspace(0, 1, 5).unsqueeze(-1)),
     r"Kronecker structure .* rfgp.sketch\(kernel.base_kernel, num_features\)"),  # GPyTorch's Grid_GP_Regression
])
def test_approximation_wrappers_are_refused_with_what_to_sketch_instead(kernel, reason):
    with pytest.raises(TypeError, match=f"does not convert .*{reason}"):
        rfgp.sketch(ScaleKernel(kernel()), num_features=16)


PER_COLUMN_WRAPPERS = {
    "additive": lambda base: gpytorch.kernels.AdditiveStructureKernel(base, num_dims=3),
    "product": lambda base: gpytorch.kernels.ProductStructureKernel(base, num_dims=3),
    "ski": lambda base: gpytorch.kernels.GridInterpolationKernel(base, grid_size=8, num_dims=3),
}
PER_COLUMN_BASES = {
    "rbf": lambda: SketchedRBFKernel(64, seed=0),
    "tree": lambda: rfgp.sketch(mixed_tree(), 64, seed=0),
    "gradient": lambda: rfgp.sketch(gpytorch.kernels.RBFKernelGrad(), 64, seed=0),
}


@pytest.mark.parametrize("wrapper, base", [(w, b) for w in PER_COLUMN_WRAPPERS for b in PER_COLUMN_BASES
                                           if w != "ski" or b == "rbf"])  # GridKernel refuses non-stationary bases
def test_rfgp_kernels_inside_per_column_wrappers_are_refused_naming_them(wrapper, base):
    with pytest.raises(NotImplementedError, match="last_dim_is_batch=True, which GPyTorch's AdditiveStructureKernel, "
                                                  "ProductStructureKernel.*AdditiveKernel"):
        PER_COLUMN_WRAPPERS[wrapper](ScaleKernel(PER_COLUMN_BASES[base]()).double())(X).to_dense()


@pytest.mark.parametrize("tree", [lambda: SketchedRBFKernel(64) + RBFKernel(), lambda: rfgp.sketch(mixed_tree(), 64),
                                  lambda: rfgp.sketch(gpytorch.kernels.RBFKernelGrad(), 64)])
def test_trees_holding_rfgp_kernels_are_refused_as_already_sketched(tree):
    with pytest.raises(TypeError, match="is already an rfgp kernel; pass the exact tree.*rfgp.set_num_features"):
        rfgp.sketch(ScaleKernel(tree()), num_features=16)


def test_multitask_kernel_around_an_rfgp_kernel_is_refused_naming_the_drop_in():
    data = ScaleKernel(SketchedRBFKernel(64, seed=0)).double()
    multitask = gpytorch.kernels.MultitaskKernel(data, num_tasks=3, rank=1).double()
    multitask.task_covar_module.covar_factor.data.normal_(generator=torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match="data_covar_module holds SketchedRBFKernel, already an rfgp kernel: use "
                                        "rfgp.kernels.SketchedDecomposableKernel"):
        rfgp.sketch(multitask, num_features=64)
    drop_in = rfgp.kernels.SketchedDecomposableKernel(data, num_tasks=3, rank=1).double()
    drop_in.load_state_dict(multitask.state_dict(), strict=False)
    assert torch.allclose(drop_in(X).to_dense(), multitask(X).to_dense(), atol=1e-12)


def test_piecewise_polynomial_is_refused_with_the_reason():
    with pytest.raises(TypeError, match="does not convert PiecewisePolynomialKernel: its compactly supported"):
        rfgp.sketch(gpytorch.kernels.PiecewisePolynomialKernel(), num_features=16)


def test_piecewise_polynomial_refusal_names_the_landmark_features_that_convert_it():
    """The refusal named only keeping the kernel exact or swapping it for a Matérn, while method='nystrom' converts
    it (exactly, with every point a landmark)."""
    exact = gpytorch.kernels.PiecewisePolynomialKernel(q=2).double()
    with pytest.raises(TypeError, match="PiecewisePolynomialKernel.*method='nystrom', x_sample=X"):
        rfgp.sketch(exact, num_features=16)
    x = torch.rand(12, 2, dtype=F64, generator=torch.Generator().manual_seed(0))
    landmark = rfgp.sketch(exact, 12, method="nystrom", x_sample=x, seed=0)
    torch.testing.assert_close(landmark(x).to_dense(), exact(x).to_dense(), rtol=0, atol=1e-6)


def mixed_tree():
    return AdditiveKernel(ScaleKernel(RBFKernel()), PolynomialKernel(power=2), LinearKernel())


def test_method_mapping_by_class_or_name():
    sketched = rfgp.sketch(mixed_tree(), 64, method={"RBFKernel": "orf", PolynomialKernel: "sketch"}, seed=0)
    rbf, polynomial, linear_part = sketched.kernels
    assert isinstance(rbf.base_kernel, SketchedRBFKernel) and rbf.base_kernel.method == "orf"
    assert isinstance(polynomial, SketchedPolynomialKernel) and polynomial.method == "sketch"
    assert isinstance(linear_part, LinearFeatureKernel)


def test_single_method_applies_where_it_exists_and_defaults_elsewhere():
    sketched = rfgp.sketch(mixed_tree(), 64, method="orf", seed=0)
    assert sketched.kernels[0].base_kernel.method == "orf" and sketched.kernels[1].method == "sketch"


def test_bad_methods_raise_naming_them():
    with pytest.raises(ValueError, match="method must be one of .*'orf'.*got 'magic'"):
        rfgp.sketch(mixed_tree(), 64, method="magic")
    with pytest.raises(ValueError, match="method must be one of 'rff'.*got 'orf'"):
        rfgp.sketch(PeriodicKernel(), 64, method="orf")
    with pytest.raises(ValueError, match="'FancyKernel', which rfgp.sketch does not convert"):
        rfgp.sketch(mixed_tree(), 64, method={"FancyKernel": "orf"})
    with pytest.raises(ValueError, match="method for RBFKernel must be one of .*got 'sketch'"):
        rfgp.sketch(mixed_tree(), 64, method={"RBFKernel": "sketch"})
    with pytest.raises(TypeError, match="method must be None, a str or a mapping"):
        rfgp.sketch(mixed_tree(), 64, method=3)


def test_unknown_and_unused_keyword_options_raise():
    with pytest.raises(TypeError, match="unexpected keyword argument.*'methd'; accepted: num_features, method, seed, "
                                        ".*x_sample"):
        rfgp.sketch(RBFKernel(), 64, methd="sorf")
    with pytest.raises(TypeError, match="options not taken by any kernel in this tree: 'alpha' \\(taken by RBFKernel, RFFKernel\\)"):
        rfgp.sketch(PeriodicKernel(), 64, alpha=1e-2)
    rfgp.sketch(PeriodicKernel(), 64, x_sample=X)  # points of the input space: any tree may be given them


def test_non_positive_hyperparameters_refused_at_conversion():
    kernel = PeriodicKernel(period_length_constraint=Interval(-2.0, 2.0))
    kernel.period_length = -0.5
    with pytest.raises(ValueError, match="PeriodicKernel.period_length must be finite and > 0"):
        rfgp.sketch(kernel, 64)
    kernel = RQKernel(alpha_constraint=Interval(-1.0, 1.0))
    kernel.alpha = 0.0
    with pytest.raises(ValueError, match="RQKernel.alpha must be finite and > 0"):
        rfgp.sketch(kernel, 64)


def test_mauna_loa_style_sum_converts_and_approximates():
    tree = (ScaleKernel(RBFKernel()) + ScaleKernel(PeriodicKernel()) + ScaleKernel(RQKernel())).double()
    x = X[:, :1]
    target = tree(x).to_dense().detach()
    sketched = rfgp.sketch(tree, 2048, seed=0)
    assert float((sketched(x).to_dense().detach() - target).norm() / target.norm()) < 0.1




def test_converted_periodic_tree_predicts_like_the_exact_gp():
    generator = torch.Generator().manual_seed(3)
    x = torch.rand(150, 1, generator=generator, dtype=F64) * 6
    y = torch.sin(2 * torch.pi * x[:, 0] / 1.3) + 0.3 * x[:, 0] + 0.05 * torch.randn(150, generator=generator, dtype=F64)
    tree = (ScaleKernel(PeriodicKernel()) + ScaleKernel(RQKernel()) + LinearKernel()).double()
    tree.kernels[0].base_kernel.period_length = 1.3
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = 0.01
    exact = ExactGPModel(x, y, likelihood, tree).double().eval()
    sketched = ExactGPModel(x, y, likelihood, rfgp.sketch(tree, 512, seed=0)).double().eval()
    x_test = torch.linspace(0, 7, 40, dtype=F64).unsqueeze(-1)
    with torch.no_grad():
        exact_mean = exact(x_test).mean
        sketched_mean = sketched(x_test).mean
    assert float((sketched_mean - exact_mean).norm() / exact_mean.norm()) < 0.05


def test_hamming_imq_converts_inside_a_tree_and_approximates_the_exact_gram():
    """One-hot sequences (3 positions over 4 tokens) next to a continuous column: Hamming IMQ + RBF."""
    generator = torch.Generator().manual_seed(4)
    tokens = torch.nn.functional.one_hot(torch.randint(0, 4, (30, 3), generator=generator), 4).flatten(-2).to(F64)
    x = torch.cat([tokens, X[:, :1]], -1)
    imq = gpytorch.kernels.HammingIMQKernel(vocab_size=4).double()  # takes no active_dims: its ScaleKernel selects
    imq.alpha, imq.beta = 0.5, 2.0
    tree = ScaleKernel(imq, active_dims=list(range(12))) + ScaleKernel(RBFKernel(active_dims=[12])).double()
    target = tree(x).to_dense().detach()
    errors = [float((rfgp.sketch(tree, f, seed=1)(x).to_dense().detach() - target).norm() / target.norm())
              for f in (64, 8192)]
    assert errors[1] < errors[0] / 4 and errors[1] < 0.1, errors
    assert type(rfgp.sketch(tree, 64).kernels[0].base_kernel).__name__ == "SketchedHammingIMQKernel"


def test_method_mapping_naming_a_kernel_the_tree_does_not_hold_raises():
    """A mapping entry that no leaf of the tree takes would silently leave every leaf at its default (as a single
    method name that no leaf has, which raises): ``{"MaternKernel": "sorf"}`` on an RBF tree kept RFF."""
    with pytest.raises(ValueError, match="names MaternKernel, which is no leaf of this tree.*RBFKernel.*nothing"):
        rfgp.sketch(ScaleKernel(RBFKernel()), 64, method={"MaternKernel": "sorf"})
    with pytest.raises(ValueError, match="names MaternKernel, which is no leaf of this tree"):
        rfgp.sketch(mixed_tree(), 64, method={"RBFKernel": "orf", MaternKernel: "sorf"})
    sketched = rfgp.sketch(ScaleKernel(MaternKernel()), 64, method={MaternKernel: "sorf"})
    assert sketched.base_kernel.method == "sorf"


@pytest.mark.parametrize("seed", ["3", 1.0, [3]])
def test_a_seed_that_is_not_an_integer_is_refused_by_name(seed):
    """Before, a string seed failed inside the seed sequence with "can only concatenate str (not "int") to str" (with
    method="nystrom" too, for an LCMKernel)."""
    with pytest.raises(TypeError, match=r"seed must be an int or None, got .* of type"):
        rfgp.sketch(RBFKernel() + MaternKernel(), 64, seed=seed)
    lcm = gpytorch.kernels.LCMKernel([RBFKernel(), MaternKernel()], num_tasks=2)
    with pytest.raises(TypeError, match=r"seed must be an int or None, got .* of type"):
        rfgp.sketch(lcm, 8, method="nystrom", x_sample=X, seed=seed)


def test_nystrom_width_list_is_refused_naming_num_features():
    """method="nystrom" makes one map of the whole tree: a list of per-part widths was refused as "num_landmarks"."""
    with pytest.raises(TypeError, match=r"^num_features must be a positive integer, got \[8, 8\]"):
        rfgp.sketch(RBFKernel() + MaternKernel(), [8, 8], method="nystrom", x_sample=X)


def test_unknown_subclass_refusal_names_the_landmark_features_that_convert_it():
    """guide/gpytorch.md: a subclass rfgp does not know is refused naming method='nystrom' (it named only
    rfgp.register_converter)."""

    class SquaredScaleKernel(ScaleKernel):
        def forward(self, x1, x2, **params):
            return super().forward(x1, x2, **params) ** 2

    exact = SquaredScaleKernel(RBFKernel()).double()
    with pytest.raises(TypeError, match="version of SquaredScaleKernel; it is a subclass of ScaleKernel.*"
                                        "register_converter.*method='nystrom', x_sample=X"):
        rfgp.sketch(exact, num_features=16)
    x = torch.rand(12, 2, dtype=F64, generator=torch.Generator().manual_seed(0))
    landmark = rfgp.sketch(exact, 12, method="nystrom", x_sample=x, seed=0)
    torch.testing.assert_close(landmark(x).to_dense(), exact(x).to_dense(), rtol=0, atol=1e-6)
