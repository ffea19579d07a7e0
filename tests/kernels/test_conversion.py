"""rfgp.sketch: GPyTorch kernel trees convert with identical hyperparameters, constraints and
priors; the converted tree approximates the original; unsupported kernels raise TypeError."""

import pickle

import gpytorch
import pytest
import torch
from gpytorch.constraints import GreaterThan, Interval
from gpytorch.kernels import AdditiveKernel, MaternKernel, ProductKernel, RBFKernel, ScaleKernel
from gpytorch.priors import GammaPrior, LogNormalPrior

import rfgp
from rfgp.kernels import FeatureSumKernel, SketchedMaternKernel, SketchedRBFKernel, SpectralProductKernel


def exact_rbf(**kwargs):
    kernel = RBFKernel(ard_num_dims=2, lengthscale_prior=GammaPrior(3.0, 6.0),
                       lengthscale_constraint=Interval(0.05, 5.0), **kwargs)
    kernel.lengthscale = torch.tensor([[0.4, 1.3]])
    return kernel


def exact_scaled_tree():
    rbf = ScaleKernel(exact_rbf(active_dims=[0, 1]), outputscale_prior=LogNormalPrior(0.0, 1.0),
                      outputscale_constraint=Interval(0.01, 20.0))
    rbf.outputscale = 1.9
    matern = MaternKernel(nu=0.5, active_dims=[2])
    matern.lengthscale = 0.8
    return rbf, matern


def assert_same_hyperparameters(exact, sketched, name):
    raw = f"raw_{name}"
    assert torch.equal(getattr(sketched, raw).data, getattr(exact, raw).data)
    assert torch.equal(getattr(sketched, name), getattr(exact, name))
    c1, c2 = getattr(exact, f"{raw}_constraint"), getattr(sketched, f"{raw}_constraint")
    assert type(c1) is type(c2) and torch.equal(c1.lower_bound, c2.lower_bound)
    assert torch.equal(c1.upper_bound, c2.upper_bound)


@pytest.mark.parametrize("method", [None, "rff", "orf", "sorf"])
def test_rbf_converts_with_same_hyperparameters(method):
    exact = exact_rbf()
    sketched = rfgp.sketch(exact, num_features=64, method=method, seed=3)
    assert isinstance(sketched, SketchedRBFKernel)
    assert sketched.method == (method or "rff") and sketched.num_features == 64
    assert sketched.ard_num_dims == 2 and sketched.feature_map.seed == 3
    assert_same_hyperparameters(exact, sketched, "lengthscale")
    priors = {n: type(p) for n, _, p, *_ in sketched.named_priors()}
    assert priors == {n: type(p) for n, _, p, *_ in exact.named_priors()} == {"lengthscale_prior": GammaPrior}
    prior = sketched.lengthscale_prior
    assert torch.equal(prior.concentration, torch.tensor(3.0)) and torch.equal(prior.rate, torch.tensor(6.0))
    # The prior's log-probability term matches (same closure over the same parameter).
    x = torch.randn(5, 2)
    for (_, m1, p1, c1, _), (_, m2, p2, c2, _) in zip(exact.named_priors(), sketched.named_priors()):
        torch.testing.assert_close(p1.log_prob(c1(m1)), p2.log_prob(c2(m2)))
    assert sketched(x).shape == (5, 5)


def test_constraint_with_an_initial_value_keeps_the_copied_value():
    """GPyTorch re-initialises a parameter when a constraint with ``initial_value`` is registered (BoTorch's
    lengthscale constraints have one): a fitted lengthscale must survive the conversion."""
    constraint = GreaterThan(2.5e-2, transform=None, initial_value=0.29)
    exact = ScaleKernel(RBFKernel(ard_num_dims=2, lengthscale_constraint=constraint))
    exact.base_kernel.lengthscale = torch.tensor([[6.3, 1.1]])
    sketched = rfgp.sketch(exact, num_features=32, seed=0)
    copied = sketched.base_kernel.raw_lengthscale_constraint
    assert type(copied) is GreaterThan and copied is not constraint and not copied.enforced
    assert torch.equal(copied.lower_bound, constraint.lower_bound) and copied.initial_value == constraint.initial_value
    assert torch.equal(sketched.base_kernel.lengthscale, exact.base_kernel.lengthscale)


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_matern_converts_with_nu_batch_and_active_dims(nu):
    exact = MaternKernel(nu=nu, batch_shape=torch.Size([2]), active_dims=[1, 3])
    exact.lengthscale = torch.tensor([0.3, 2.0]).view(2, 1, 1)
    sketched = rfgp.sketch(exact, num_features=32, method="orf", seed=0)
    assert isinstance(sketched, SketchedMaternKernel) and sketched.nu == nu
    assert sketched.batch_shape == torch.Size([2]) and torch.equal(sketched.active_dims, exact.active_dims)
    assert_same_hyperparameters(exact, sketched, "lengthscale")
    assert sketched(torch.randn(6, 4)).shape == (2, 6, 6)


def test_tree_converts_structure_hyperparameters_and_seeds():
    rbf, matern = exact_scaled_tree()
    exact = ScaleKernel(AdditiveKernel(rbf, ProductKernel(matern, RBFKernel(active_dims=[0]))))
    exact.outputscale = 0.7
    sketched = rfgp.sketch(exact, num_features=32, method="orf", seed=10)
    assert isinstance(sketched, ScaleKernel) and isinstance(sketched.base_kernel, FeatureSumKernel)
    s_rbf, s_product = sketched.base_kernel.kernels
    assert isinstance(s_rbf, ScaleKernel) and isinstance(s_rbf.base_kernel, SketchedRBFKernel)
    assert isinstance(s_product, SpectralProductKernel) and s_product.seed == 13
    assert_same_hyperparameters(exact, sketched, "outputscale")
    assert_same_hyperparameters(rbf, s_rbf, "outputscale")
    assert isinstance(s_rbf.outputscale_prior, LogNormalPrior)
    assert_same_hyperparameters(rbf.base_kernel, s_rbf.base_kernel, "lengthscale")
    assert_same_hyperparameters(matern, s_product.kernels[0], "lengthscale")
    # Leaves get seeds 10, 11, 12 (independent factors of a product).
    seeds = [m.seed for m in sketched.modules() if isinstance(m, rfgp.features.FeatureMap)]
    assert seeds == [10, 11, 12]
    # The whole model's hyperparameter values are unchanged.
    exact_values = {n: p for n, p in exact.named_hyperparameters()}
    for name, value in sketched.named_hyperparameters():
        assert torch.equal(value.data, exact_values[name].data), name
    assert len(exact_values) == len(dict(sketched.named_hyperparameters()))


def test_operator_sugar_trees_convert():
    a, b = RBFKernel(active_dims=[0]), MaternKernel(nu=1.5, active_dims=[1])
    assert isinstance(rfgp.sketch(a + b, num_features=8, seed=0), FeatureSumKernel)
    assert isinstance(rfgp.sketch(a * b, num_features=8, seed=0), SpectralProductKernel)


@pytest.mark.parametrize("method", ["rff", "orf"])
def test_sketched_tree_approximates_exact_tree(method, device):
    torch.manual_seed(0)
    rbf, matern = exact_scaled_tree()
    exact = AdditiveKernel(rbf, matern).double().to(device)
    x = torch.randn(30, 3, dtype=torch.float64, device=device)
    target = exact(x).to_dense().detach()
    errors = []
    for num_features in (32, 2048):
        sketched = rfgp.sketch(exact, num_features=num_features, method=method, seed=1).double().to(device)
        errors.append(((sketched(x).to_dense().detach() - target).norm() / target.norm()).item())
    assert errors[1] < errors[0] / 3 and errors[1] < 0.1, errors


class _Unsupported(gpytorch.kernels.Kernel):
    def forward(self, x1, x2, **params):
        return x1 @ x2.mT


def test_unsupported_kernels_raise_type_error_naming_them():
    with pytest.raises(TypeError, match="no random-feature version of _Unsupported.*supported kernels: "
                                        ".*MaternKernel.*RBFKernel"):
        rfgp.sketch(_Unsupported(), num_features=8)
    with pytest.raises(TypeError, match="_Unsupported"):
        rfgp.sketch(ScaleKernel(AdditiveKernel(RBFKernel(), _Unsupported())), num_features=8)


class _SquaredScale(ScaleKernel):
    def forward(self, x1, x2, **params):
        return super().forward(x1, x2, **params).to_dense() ** 2


class _UnitScale(ScaleKernel):  # constructor defaults only, the covariance of a ScaleKernel
    def __init__(self, base_kernel):
        super().__init__(base_kernel, outputscale_constraint=Interval(0.5, 2.0))


def test_a_composite_subclass_converts_as_its_parent_only_if_it_computes_as_it():
    with pytest.raises(TypeError, match="_SquaredScale; it is a subclass of ScaleKernel.*not converted as its parent"):
        rfgp.sketch(AdditiveKernel(RBFKernel(), _SquaredScale(MaternKernel())), num_features=64, seed=0)
    sketched = rfgp.sketch(_UnitScale(RBFKernel()), num_features=64, seed=0)
    assert type(sketched) is ScaleKernel and float(sketched.raw_outputscale_constraint.lower_bound) == 0.5


class _SquaredOutputscale(ScaleKernel):  # ScaleKernel.forward, reading an outputscale that is another function of raw
    @property
    def outputscale(self):
        return self.raw_outputscale_constraint.transform(self.raw_outputscale) ** 2

    @outputscale.setter
    def outputscale(self, value):
        self._set_outputscale(value)


def test_a_composite_subclass_overriding_what_its_forward_reads_is_not_converted_as_its_parent():
    """Only forward, __call__ and num_outputs_per_input were compared with the parent's: a ScaleKernel whose
    outputscale property squares the constrained value converted to a plain ScaleKernel with the same raw value, a
    covariance 1.31 where the exact one is 1.72, silently."""
    exact = _SquaredOutputscale(RBFKernel())
    exact.initialize(raw_outputscale=torch.tensor(1.0))
    with pytest.raises(TypeError, match="_SquaredOutputscale; it is a subclass of ScaleKernel.*not converted as its"):
        rfgp.sketch(exact, num_features=64, seed=0)


def test_a_prior_that_cannot_carry_over_is_refused_naming_it():
    """A prior registered on a kernel instance is carried with its closure; one that reads the kernel's covariance
    (not a hyperparameter) would take another value on the sketch, changing the MAP objective: refused by name."""
    points = torch.zeros(1, 1), torch.ones(1, 1)
    exact = ScaleKernel(RBFKernel())
    exact.base_kernel.register_prior("correlation_prior", gpytorch.priors.NormalPrior(0.6, 0.1),
                                     lambda m: m(*points).to_dense())
    with pytest.raises(TypeError, match="would change the model's priors.*base_kernel.correlation_prior "
                                        r"\(log-density .* differs\)"):
        rfgp.sketch(exact, num_features=64, seed=0)


class _MultitaskGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, covar_module):
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2)
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(), num_tasks=2)
        self.covar_module = covar_module

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))


@pytest.mark.parametrize("method", [None, "nystrom"])
def test_the_converted_tree_is_in_the_exact_trees_mode(method):
    """The converted modules were new, hence in train mode, whatever the exact tree's: a model converted after
    ``model.eval()`` (as BoTorch's fit leaves it) predicted with its kernel in train mode, where a multitask Nyström
    kernel leaves out its variance correction — a posterior variance of 1e-10 far from the data, where it is the
    prior's (2.48 after model.train(); model.eval())."""
    x = torch.linspace(0, 1, 30, dtype=torch.float64).unsqueeze(-1)
    y = torch.cat([torch.sin(6 * x), torch.cos(6 * x)], -1)
    far = torch.tensor([[2.0], [3.0]], dtype=torch.float64)
    exact = gpytorch.kernels.MultitaskKernel(RBFKernel(), num_tasks=2, rank=1).double()
    exact.data_covar_module.lengthscale = 0.05
    options = {} if method is None else {"method": method, "x_sample": x}
    for mode in (True, False):
        sketched = rfgp.sketch(exact.train(mode), num_features=6, seed=0, **options)
        assert {module.training for module in sketched.modules()} == {mode}
    model = _MultitaskGP(x, y, exact).eval()
    model.covar_module = rfgp.sketch(model.covar_module, num_features=6, seed=0, **options)
    with torch.no_grad():
        variance = model(far).variance
        model.train()
        model.eval()
        assert torch.equal(variance, model(far).variance)
    if method == "nystrom":  # far from every landmark: the prior variance A_ii
        assert torch.allclose(variance, exact.task_covar_module.covar_matrix.to_dense().diagonal().expand(2, 2))


def test_a_parameter_that_several_kernels_share_stays_one_parameter():
    """``matern.raw_lengthscale = rbf.raw_lengthscale`` (one lengthscale in GPyTorch's ``named_parameters``, trained
    as one) converted to two lengthscale parameters, which training fitted apart: another model."""
    rbf, matern = RBFKernel(active_dims=[0]), MaternKernel(nu=2.5, active_dims=[1])
    matern.raw_lengthscale = rbf.raw_lengthscale
    rbf.lengthscale = 0.7
    scaled = ScaleKernel(RBFKernel())
    exact = ScaleKernel(rbf) + ScaleKernel(matern) + scaled * gpytorch.kernels.PeriodicKernel()
    exact.kernels[1].raw_outputscale = scaled.raw_outputscale
    sketched = rfgp.sketch(exact, num_features=64, seed=0)
    assert [n for n, _ in sketched.named_parameters()] == [n for n, _ in exact.named_parameters()]
    s_rbf, s_matern = sketched.kernels[0].base_kernel, sketched.kernels[1].base_kernel
    assert s_rbf.raw_lengthscale is s_matern.raw_lengthscale
    assert torch.equal(s_rbf.lengthscale, rbf.lengthscale)
    s_scaled = next(m for m in sketched.kernels[2].modules() if isinstance(m, ScaleKernel))
    assert sketched.kernels[1].raw_outputscale is s_scaled.raw_outputscale


def test_a_module_used_twice_whose_parameter_another_kernel_shares_stays_one_parameter():
    """Both kinds of tie at once: ``rbf`` in a sum and in a product, and its lengthscale held by a Matérn too: the
    exact tree has one lengthscale, and so do its three converted holders."""
    rbf, matern = RBFKernel(), MaternKernel(nu=2.5)
    matern.raw_lengthscale = rbf.raw_lengthscale
    exact = rbf + rbf * matern
    sketched = rfgp.sketch(exact, num_features=64, seed=0)
    holders = [m for m in sketched.modules() if hasattr(m, "raw_lengthscale")]
    assert len(holders) == 3 and all(m.raw_lengthscale is holders[0].raw_lengthscale for m in holders)
    assert [n for n, _ in sketched.named_parameters()] == [n for n, _ in exact.named_parameters()]


def _trees_with_active_dims():
    rbf, matern = exact_scaled_tree()
    index = gpytorch.kernels.IndexKernel(num_tasks=2, rank=1, active_dims=[2])
    multitask = gpytorch.kernels.MultitaskKernel(RBFKernel(), num_tasks=2, active_dims=[0, 1])
    structure = gpytorch.kernels.AdditiveStructureKernel(RBFKernel(active_dims=[0, 2]), 2, active_dims=[0, 1, 2])
    return [rbf + matern, ProductKernel(ScaleKernel(RBFKernel(active_dims=[0, 1])), index), multitask, structure]


@pytest.mark.parametrize("index", range(4))
def test_the_converted_tree_shares_no_tensor_with_the_exact_one(index):
    """The converters passed the exact kernels' ``active_dims`` buffers to the rfgp constructors, which kept them:
    loading a state dict into the converted tree (``load_state_dict`` copies into buffers in place) changed the
    columns the exact kernel selects."""
    exact = _trees_with_active_dims()[index]
    sketched = rfgp.sketch(exact, num_features=16, seed=0)
    exact_tensors = {id(t) for t in (*exact.parameters(), *exact.buffers())}
    assert not exact_tensors & {id(t) for t in (*sketched.parameters(), *sketched.buffers())}
    before = {name: value.clone() for name, value in exact.state_dict().items()}
    state = sketched.state_dict()
    for name, value in state.items():
        if name.endswith("active_dims"):
            state[name] = value.flip(-1)
    sketched.load_state_dict(state)
    for name, value in exact.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("scaled", [False, True])
def test_a_prior_on_a_function_of_a_hyperparameter_under_its_name_is_refused(scaled):
    """A ``lengthscale_prior`` on ℓ² (an ``outputscale_prior`` on √s) was re-registered on ℓ (s) by the conversion;
    the check of the priors' values passed where the two agree (ℓ = 1), so the MAP objective changed silently.  The
    same prior under another name carries over with its closure."""
    exact = ScaleKernel(RBFKernel())
    kernel, name = (exact, "outputscale") if scaled else (exact.base_kernel, "lengthscale")
    setattr(kernel, name, 1.0)
    kernel.register_prior(f"{name}_prior", GammaPrior(2.0, 1.0), lambda m: getattr(m, name) ** 2)
    raw = getattr(kernel, f"raw_{name}").detach().clone()
    with pytest.raises(TypeError, match=r"would change the model's priors.*not kept \(at every raw hyperparameter "
                                        rf"\+ 0.5\): .*{name}_prior \(log-density"):
        rfgp.sketch(exact, num_features=16, seed=0)
    assert torch.equal(getattr(kernel, f"raw_{name}"), raw)
    renamed = ScaleKernel(RBFKernel())
    kernel = renamed if scaled else renamed.base_kernel
    setattr(kernel, name, 1.0)
    kernel.register_prior(f"{name}_squared_prior", GammaPrior(2.0, 1.0), lambda m: getattr(m, name) ** 2)
    sketched = rfgp.sketch(renamed, num_features=16, seed=0)
    for tree in (renamed, sketched):
        setattr(tree if scaled else tree.base_kernel, name, 0.5)
    terms = [[p.log_prob(c(m)).detach() for _, m, p, c, _ in tree.named_priors()] for tree in (renamed, sketched)]
    assert len(terms[0]) == 1 and torch.equal(terms[0][0], terms[1][0])


def test_a_prior_whose_closure_reads_the_exact_kernel_is_refused():
    """A prior registered on an instance is carried with its closure; one that ignores the module it is given and
    reads the exact kernel (``lambda m: rbf.lengthscale``) agreed at conversion, then stayed at the exact kernel's
    value however the converted lengthscale was trained."""
    rbf = RBFKernel()
    rbf.register_prior("shrinkage_prior", GammaPrior(2.0, 2.0), lambda m: rbf.lengthscale)
    with pytest.raises(TypeError, match=r"not kept \(at every raw hyperparameter \+ 0.5\): shrinkage_prior"):
        rfgp.sketch(rbf, num_features=16, seed=0)


def test_a_model_instead_of_a_kernel_is_refused_naming_its_covar_module():
    x, y = torch.rand(5, 2), torch.rand(5)
    model = rfgp.models.ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), ScaleKernel(RBFKernel()))
    with pytest.raises(TypeError, match=r"kernel must be a gpytorch.kernels.Kernel.*got ExactGPModel.*"
                                        r"model.covar_module = rfgp.sketch\(model.covar_module"):
        rfgp.sketch(model, num_features=64)
    for thing in (None, torch.rand(3, 3), "RBFKernel"):
        with pytest.raises(TypeError, match=f"kernel must be .*got {type(thing).__name__}$"):
            rfgp.sketch(thing, num_features=64)


def test_bad_method_and_num_features_named():
    with pytest.raises(ValueError, match="method must be one of"):
        rfgp.sketch(RBFKernel(), num_features=8, method="magic")
    with pytest.raises(ValueError, match="num_features"):
        rfgp.sketch(RBFKernel(), num_features=-4)


def test_register_converter_extends_sketch():
    class MyKernel(RBFKernel):
        pass

    class Other(gpytorch.kernels.Kernel):
        def forward(self, x1, x2, **params):
            return x1 @ x2.mT

    called = []

    @rfgp.register_converter(Other)
    def convert_other(kernel, num_features, method, seed, **options):
        called.append((num_features, method, seed, options))
        return SketchedRBFKernel(num_features, seed=seed)

    try:
        with pytest.raises(TypeError, match="MyKernel.*subclass of RBFKernel"):  # never as its parent
            rfgp.sketch(MyKernel(), num_features=8, seed=0)
        assert isinstance(rfgp.sketch(Other(), num_features=8, method="orf", seed=4), SketchedRBFKernel)
        assert called == [(8, "orf", 4, {})]
    finally:
        from rfgp.kernels import conversion

        conversion._CONVERTERS.pop(Other)


@pytest.mark.parametrize("exact", [
    gpytorch.kernels.PeriodicKernel(lengthscale_prior=GammaPrior(2.0, 2.0), period_length_prior=GammaPrior(2.0, 2.0)),
    gpytorch.kernels.CosineKernel(period_length_prior=GammaPrior(2.0, 2.0)),
    gpytorch.kernels.LinearKernel(variance_prior=GammaPrior(2.0, 2.0)),
    gpytorch.kernels.ConstantKernel(constant_prior=GammaPrior(2.0, 2.0)),
    ScaleKernel(gpytorch.kernels.PolynomialKernel(power=2, offset_prior=GammaPrior(2.0, 2.0)),
                outputscale_prior=GammaPrior(2.0, 2.0)),
], ids=["periodic", "cosine", "linear", "constant", "scale-polynomial"])
def test_carried_priors_sample_set_and_pickle(exact):
    """GPyTorch's prior API on the converted kernel: ``sample_from_prior`` and Pyro's ``pyro_sample_from_prior``
    set the hyperparameter through its setting closure, which GPyTorch's kernels write as a call of their private
    setter (``PeriodicKernel._set_period_length``): copied as they were, they raised AttributeError on the rfgp
    kernel; the rfgp kernel pickles (its closures are no lambdas)."""
    sketched = rfgp.sketch(exact, 8, seed=0)
    names = sorted(name for name, *_ in exact.named_priors())
    assert sorted(name for name, *_ in sketched.named_priors()) == names
    torch.manual_seed(0)
    for name, module, prior, closure, _ in sketched.named_priors():
        before = closure(module).detach().clone()
        module.sample_from_prior(name.rsplit(".", 1)[-1])
        assert not torch.equal(closure(module), before)
        assert torch.isfinite(prior.log_prob(closure(module))).all()
    sampled = sketched.pyro_sample_from_prior()
    assert sorted(name for name, *_ in sampled.named_priors()) == names
    clone = pickle.loads(pickle.dumps(sketched))
    for (_, module, _, closure, _), (_, copied, _, copied_closure, _) in zip(sketched.named_priors(),
                                                                          clone.named_priors()):
        torch.testing.assert_close(copied_closure(copied), closure(module), rtol=0, atol=0)


def test_a_polynomial_lengthscale_added_by_the_option_starts_at_the_exact_covariance():
    """``rfgp.sketch(PolynomialKernel(2), F, lengthscale=True)`` added a lengthscale at GPyTorch's initial softplus(0)
    = 0.69, so the converted kernel was ((x/0.69)ᵀ(y/0.69) + c)², another covariance, from the conversion on."""
    exact = gpytorch.kernels.PolynomialKernel(power=2).double()
    exact.offset = 0.7
    x = torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    plain = rfgp.sketch(exact, num_features=64, seed=0)
    scaled = rfgp.sketch(exact, num_features=64, seed=0, lengthscale=True)
    assert torch.equal(scaled.lengthscale.detach(), torch.ones(1, 1, dtype=torch.float64))
    assert torch.allclose(scaled(x).to_dense(), plain(x).to_dense(), rtol=1e-12, atol=1e-12)


def test_a_degree_zero_polynomial_kernel_is_refused_naming_the_kernel_and_the_constant_kernel():
    """PolynomialKernel(power=0) is the constant 1: the refusal names the kernel and ConstantKernel (before: the
    feature map's bare 'power must be a positive integer, got 0', naming neither)."""
    with pytest.raises(ValueError, match=r"PolynomialKernel\(power=0\) is the constant kernel.*ConstantKernel"):
        rfgp.sketch(gpytorch.kernels.PolynomialKernel(power=0), 64)


def _exact_trees_with_constraints_and_priors():
    rbf, matern = exact_scaled_tree()
    periodic = gpytorch.kernels.PeriodicKernel(period_length_prior=GammaPrior(2.0, 2.0),
                                               period_length_constraint=Interval(0.1, 4.0))
    shared = exact_rbf()
    index = gpytorch.kernels.IndexKernel(num_tasks=3, rank=1, prior=gpytorch.priors.LKJCovariancePrior(
        3, 1.0, gpytorch.priors.SmoothedBoxPrior(0.1, 2.0)))
    rq = gpytorch.kernels.RQKernel(alpha_constraint=Interval(0.1, 9.0))
    rq.register_prior("alpha_prior", GammaPrior(2.0, 1.0), lambda module: module.alpha)
    return [rbf + matern, periodic * exact_rbf(), shared + shared * periodic, index, rq]


@pytest.mark.parametrize("index", range(5))
def test_the_converted_tree_owns_its_constraints_and_priors(index):
    """The converted tree holds copies of the exact tree's constraint and prior modules, not the modules themselves:
    moving the converted kernel to another dtype, or loading a state dict into it, leaves the exact kernel as it was
    (before, ``sketched.double()`` cast the exact kernel's constraint bounds and prior parameters, and loading a
    state dict with other bounds changed the exact kernel's constraints)."""
    exact = _exact_trees_with_constraints_and_priors()[index]
    sketched = rfgp.sketch(exact, num_features=64, seed=0)
    exact_state = {name: value.clone() for name, value in exact.state_dict().items()}
    assert not {id(m) for m in exact.modules()} & {id(m) for m in sketched.modules()}
    for (name, c1), (other, c2) in zip(exact.named_constraints(), sketched.named_constraints()):
        assert type(c1) is type(c2) and torch.equal(c1.lower_bound, c2.lower_bound), (name, other)
        assert torch.equal(c1.upper_bound, c2.upper_bound) and c1.initial_value == c2.initial_value
    x = torch.rand(4, 3 if index == 0 else 2)
    expected = [p.log_prob(c(m)).detach() for _, m, p, c, _ in exact.named_priors()]
    assert len(expected) == len(list(sketched.named_priors())) > 0
    with torch.no_grad():
        for (_, m, p, c, _), value in zip(sketched.named_priors(), expected):
            assert torch.equal(p.log_prob(c(m)), value)
    state = sketched.state_dict()
    sketched.double()
    with torch.no_grad():
        for name, value in state.items():
            if "_constraint." in name or "_prior." in name:
                value.add_(0.5)
    sketched.load_state_dict(state)
    assert exact.state_dict().keys() == exact_state.keys()
    for name, value in exact.state_dict().items():
        assert value.dtype == exact_state[name].dtype and torch.equal(value, exact_state[name]), name
    if index != 3:
        assert exact(x).to_dense().dtype == torch.float32
