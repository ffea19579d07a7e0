"""NystromKernel: exactness at the landmarks, accuracy in M, FITC-style variance, gradients, every rfgp model."""

import copy
import io
import pickle
import re
import warnings

import gpytorch
import pytest
import torch
from gpytorch.kernels import MaternKernel, PeriodicKernel, PolynomialKernel, RBFKernel, ScaleKernel
from gpytorch.utils.warnings import NumericalWarning
from linear_operator.utils.errors import NotPSDError

import rfgp
from rfgp.kernels import NystromKernel
from rfgp.models.regression import ExactGPModel

DTYPE = torch.float64


def data(n=120, d=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen, dtype=DTYPE) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.5 * x[:, 1] ** 2 + 0.1 * torch.randn(n, generator=gen, dtype=DTYPE)
    return x, y


def exact_kernel(d=2):
    kernel = ScaleKernel(RBFKernel(ard_num_dims=d)).to(DTYPE)
    kernel.base_kernel.lengthscale = torch.tensor([0.7, 1.3], dtype=DTYPE)[:d]
    kernel.outputscale = 1.5
    return kernel


def relative_error(kernel, approx, x):
    exact = kernel(x).to_dense().detach()
    with torch.no_grad():
        return float((approx(x).to_dense() - exact).norm() / exact.norm())


def test_gram_is_exact_at_the_landmarks():
    x, _ = data()
    kernel = exact_kernel()
    nystrom = NystromKernel(kernel, x[:30], jitter=1e-12)
    torch.testing.assert_close(nystrom(x[:30]).to_dense(), kernel(x[:30]).to_dense(), rtol=0, atol=1e-9)
    assert nystrom.num_features == 30 and nystrom(x).evaluate_kernel().root.shape == (120, 30)


def test_error_decreases_in_m_and_beats_random_features():
    x, _ = data(300)
    kernel = exact_kernel()
    errors = [relative_error(kernel, rfgp.sketch(kernel, m, method="nystrom", x_sample=x, seed=0), x)
              for m in (10, 20, 40, 80)]  # the same seed gives nested uniform landmarks
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    rff = [relative_error(kernel, rfgp.sketch(kernel, 80, method="rff", seed=s), x) for s in range(3)]
    assert errors[-1] < 0.1 * min(rff), (errors, rff)


def test_variance_correction_is_the_fitc_residual():
    x, _ = data()
    kernel = exact_kernel()
    nystrom = NystromKernel(kernel, x[:20]).eval()
    test = torch.cat((x[20:40], x[:5] + 10.0))  # far points: Φ ≈ 0, the correction restores k(x, x)
    operator = nystrom(test).evaluate_kernel()
    features = operator.root.to_dense()
    prior = kernel(test, diag=True)
    correction = operator.variance_correction
    assert bool((correction >= 0).all())
    torch.testing.assert_close(correction, prior - features.pow(2).sum(-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(correction[-5:], prior[-5:], rtol=1e-10, atol=0)
    # train mode carries it too (leave-one-out predictions of the training covariance read it)
    torch.testing.assert_close(nystrom.train()(test).evaluate_kernel().variance_correction, correction,
                               rtol=0, atol=0)


@pytest.mark.parametrize("learn_landmarks", [False, True])
def test_first_and_second_derivatives_match_finite_differences(learn_landmarks):
    x, _ = data(8)
    base = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=2)).to(DTYPE)
    nystrom = NystromKernel(base, x[:4] + 0.1, learn_landmarks=learn_landmarks)
    names = ["base_kernel.raw_outputscale", "base_kernel.base_kernel.raw_lengthscale"]
    names += ["landmarks"] if learn_landmarks else []
    params = dict(nystrom.named_parameters())
    assert sorted(params) == sorted(names)

    def gram(*values):
        state = {name: value for name, value in zip(names, values)}
        return torch.func.functional_call(nystrom, state, (x,)).to_dense()

    inputs = tuple(params[name].detach().clone().requires_grad_(True) for name in names)
    assert torch.autograd.gradcheck(gram, inputs)
    assert torch.autograd.gradgradcheck(gram, inputs)


def test_batch_shapes_of_the_base_kernel():
    x, _ = data(40)
    base = RBFKernel(batch_shape=torch.Size([3])).to(DTYPE)
    base.lengthscale = torch.tensor([0.3, 0.8, 2.0], dtype=DTYPE).view(3, 1, 1)
    features = NystromKernel(base, x[:10]).featurize(x)
    assert features.shape == (3, 40, 10)
    for b in range(3):
        single = RBFKernel().to(DTYPE)
        single.lengthscale = base.lengthscale[b]
        torch.testing.assert_close(features[b], NystromKernel(single, x[:10]).featurize(x))


def test_batched_kernel_whose_diagonal_ignores_diag_on_unbatched_inputs():
    """A batched IndexKernel returns its whole (S, n, n) matrix for ``diag=True`` on unbatched (n, d) inputs (GPyTorch
    1.15.2 takes the diagonal only when the output has the inputs' dimension), so a product with it could not be
    multiplied with its factor's (S, n) diagonal; BoTorch's SaasFullyBayesianMultiTaskGP has this kernel after
    fitting.  Nyström evaluates diagonals at inputs expanded to the kernel's batch shape: exact at the landmarks."""
    from gpytorch.kernels import IndexKernel

    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(12, 2, generator=gen, dtype=DTYPE), (torch.arange(12) % 3).to(DTYPE)[:, None]], -1)
    data_kernel = ScaleKernel(RBFKernel(ard_num_dims=2, batch_shape=torch.Size([2]), active_dims=[0, 1]),
                              batch_shape=torch.Size([2]))
    task_kernel = IndexKernel(num_tasks=3, rank=2, batch_shape=torch.Size([2]), active_dims=[2])
    kernel = (data_kernel * task_kernel).to(DTYPE)
    with torch.no_grad():
        task_kernel.covar_factor.copy_(torch.randn(2, 3, 2, generator=gen, dtype=DTYPE))
        data_kernel.base_kernel.lengthscale = torch.tensor([[[0.3, 0.6]], [[0.8, 0.4]]], dtype=DTYPE)
    nystrom = rfgp.sketch(kernel, 12, method="nystrom", x_sample=x)
    with torch.no_grad():
        # the default jitter on K(Z, Z), 1e-8 of its mean diagonal: seen 2e-8
        torch.testing.assert_close(nystrom(x).to_dense(), kernel(x).to_dense(), rtol=0, atol=1e-7)
        moments = nystrom.diag_moments(x)
    torch.testing.assert_close(moments[0], kernel(x).to_dense().diagonal(dim1=-2, dim2=-1).detach())


def fitted(kernel, x, y, noise=0.05):
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DTYPE)
    likelihood.noise = noise
    model = ExactGPModel(x, y, likelihood, kernel, gpytorch.means.ZeroMean()).to(DTYPE)
    return model.eval(), likelihood.eval()


def posterior(kernel, x, y, test):
    model, _ = fitted(kernel, x, y)
    with torch.no_grad():
        out = model(test)
        return out.mean, out.variance


def test_regression_posterior_is_dtc_mean_with_fitc_variance():
    x, y = data()
    test, _ = data(30, seed=1)
    kernel = exact_kernel()
    z, noise = x[:25], 0.05
    mean, variance = posterior(NystromKernel(kernel, z, jitter=1e-12), x, y, test)
    with torch.no_grad():
        kzz, kxz, ktz = (kernel(a, z).to_dense() for a in (z, x, test))
        sigma = noise * kzz + kxz.mT @ kxz
        torch.testing.assert_close(mean, ktz @ torch.linalg.solve(sigma, kxz.mT @ y), rtol=1e-7, atol=1e-8)
        dtc = noise * (ktz @ torch.linalg.solve(sigma, ktz.mT)).diagonal()
        fitc = kernel(test, diag=True) - (ktz @ torch.linalg.solve(kzz, ktz.mT)).diagonal()
        torch.testing.assert_close(variance, dtc + fitc, rtol=1e-6, atol=1e-8)


def test_posterior_approaches_the_exact_gp_as_m_grows():
    x, y = data(80)
    test, _ = data(25, seed=1)
    kernel = exact_kernel()
    exact_mean, exact_var = posterior(copy.deepcopy(kernel), x, y, test)
    gaps = []
    for m in (10, 20, 40, 80):
        mean, var = posterior(rfgp.sketch(kernel, m, method="nystrom", x_sample=x, seed=0, jitter=1e-12), x, y, test)
        gaps.append(float((mean - exact_mean).abs().max() + (var - exact_var).abs().max()))
    assert gaps[-1] < 1e-6 and gaps[0] > 100 * gaps[-1], gaps  # M = N: the exact posterior up to the jitter
    assert all(a >= b for a, b in zip(gaps, gaps[1:])), gaps


def test_training_moves_hyperparameters_and_learnable_landmarks_with_kmeanspp():
    x, y = data()
    kernel = rfgp.sketch(exact_kernel(), 15, method="nystrom", x_sample=x, landmarks="kmeans++", seed=0,
                         learn_landmarks=True)
    start = kernel.base_kernel.landmarks.detach().clone()
    model, likelihood = fitted(kernel, x, y)
    model.train(), likelihood.train()
    losses = rfgp.fit_mll(model, 30, lr=0.05, progress=False)
    assert losses[-1] < losses[0]
    assert not torch.equal(kernel.base_kernel.landmarks.detach(), start)


def test_state_dict_round_trip_is_bit_exact():
    x, y = data()
    kernel = rfgp.sketch(exact_kernel(), 20, method="nystrom", x_sample=x, landmarks="rls", seed=0)
    model, _ = fitted(kernel, x, y)
    assert all(torch.is_tensor(v) for v in model.state_dict().values())
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    other = rfgp.sketch(exact_kernel(), 20, method="nystrom", x_sample=x, landmarks="uniform", seed=5)
    other_model, _ = fitted(other, x, y, noise=0.3)
    buffer.seek(0)
    other_model.load_state_dict(torch.load(buffer))
    test, _ = data(10, seed=2)
    with torch.no_grad():
        a, b = model(test), other_model.eval()(test)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)


@pytest.mark.parametrize("landmarks", ["uniform", "kmeans++", "rls"])
def test_repeated_rows_give_distinct_landmarks_or_an_error(landmarks):
    """A sample of 32 points each repeated 4× (mtcars-like): M ≤ 32 distinct landmarks, seeded and the same for a
    float32 kernel and sample as for their float64 copies; M = 48 raises naming num_landmarks instead of spending 16
    of the width on copies; the landmarks survive a state_dict round trip bit for bit."""
    x, y = data(32)
    order = torch.randperm(128, generator=torch.Generator().manual_seed(0))
    x, y = x.repeat(4, 1)[order], y.repeat(4)[order]
    k32 = exact_kernel().float()
    sketch = rfgp.sketch(k32, 32, method="nystrom", x_sample=x.float(), landmarks=landmarks, seed=3).base_kernel
    assert sketch.landmarks.dtype == torch.float32 and sketch.landmarks.unique(dim=0).shape[0] == 32
    assert torch.equal(sketch.landmarks, rfgp.sketch(k32, 32, method="nystrom", x_sample=x.float(),
                                                     landmarks=landmarks, seed=3).base_kernel.landmarks)
    wide = rfgp.sketch(k32.double(), 32, method="nystrom", x_sample=x, landmarks=landmarks, seed=3).base_kernel
    assert torch.equal(sketch.landmarks, wide.landmarks.float())
    with pytest.raises(ValueError, match=r"only 32 distinct rows, fewer than num_landmarks=48 \(num_features"):
        rfgp.sketch(k32, 48, method="nystrom", x_sample=x.float(), landmarks=landmarks, seed=3)
    model, _ = fitted(rfgp.sketch(exact_kernel(), 24, method="nystrom", x_sample=x, landmarks=landmarks, seed=3), x, y)
    other, _ = fitted(rfgp.sketch(exact_kernel(), 24, method="nystrom", x_sample=x, landmarks=landmarks, seed=4), x, y)
    other.load_state_dict(model.state_dict())
    assert torch.equal(other.covar_module.base_kernel.landmarks, model.covar_module.base_kernel.landmarks)
    with pytest.raises(ValueError, match=r"only 32 distinct rows, fewer than num_landmarks=40"):
        rfgp.set_num_features(model, 40)


def test_sketch_converts_the_whole_tree_into_a_copy():
    x, _ = data()
    tree = (ScaleKernel(RBFKernel(lengthscale_prior=gpytorch.priors.GammaPrior(2.0, 3.0)))
            + ScaleKernel(PeriodicKernel(active_dims=[1]))).to(DTYPE)  # landmarks hold every input column
    converted = rfgp.sketch(tree, 80, method="nystrom", x_sample=x, seed=0)
    assert isinstance(converted, NystromKernel) and converted.num_features == 80
    assert converted.base_kernel is not tree
    assert [name for name, *_ in converted.named_priors()] == ["base_kernel.kernels.0.base_kernel.lengthscale_prior"]
    assert relative_error(tree, converted, x) < 0.05
    before = [p.detach().clone() for p in tree.parameters()]
    with torch.no_grad():
        for p in converted.parameters():
            p.add_(0.5)
    assert all(torch.equal(a, b) for a, b in zip(before, tree.parameters()))


def test_jitter_grows_with_one_warning_and_failure_raises():
    x, _ = data()
    duplicated = torch.cat((x[:10], x[:10] + 1e-9))  # distinct rows (repeated ones are refused), numerically equal
    nystrom = NystromKernel(exact_kernel(), duplicated, jitter=1e-20)  # near-duplicates need more than 1e-20
    with pytest.warns(NumericalWarning, match="needed relative jitter"):
        first = nystrom(x).to_dense()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        second = nystrom(x).to_dense()  # warned once per kernel
        third = nystrom(x).to_dense()
    assert bool(torch.isfinite(first).all())
    assert torch.equal(second, third)  # the same jitter, reused: bit for bit
    # with and without autograd GPyTorch evaluates K(Z, Z) by two formulas whose rounding (u·k̄ ≈ 2·10⁻¹⁶) the
    # inverse of K(Z, Z) + εI amplifies up to 1/ε at the grown relative jitter 10⁻¹⁵: 2.7·10⁻⁶ measured; a jitter
    # 10× or 100× the grown one changes K̂ by 2.7·10⁻⁴ and 3.0·10⁻⁴ at these near-duplicate landmarks
    torch.testing.assert_close(first.detach(), second, rtol=0, atol=3e-5)

    class NotPositive(RBFKernel):
        def forward(self, x1, x2, **params):
            return -super().forward(x1, x2, **params)

    with pytest.raises(NotPSDError, match="NotPositive at 10 landmarks"):
        NystromKernel(NotPositive(), x[:10]).featurize(x)


def test_float32_landmark_factor_is_computed_in_float64():
    """300 close landmarks: a float32 Cholesky needs jitter growth; the float64 factor rounded to float32 does not,
    and the float32 features match the float64 ones to float32 accuracy (with the same first jitter)."""
    g = torch.Generator().manual_seed(0)
    landmarks = torch.rand(300, 1, generator=g, dtype=torch.float64)
    x = torch.rand(50, 1, generator=g, dtype=torch.float64)
    kernel = RBFKernel().double()
    kernel.lengthscale = 0.5
    gram = kernel(landmarks.float(), landmarks.float()).to_dense().detach().float()
    eye = torch.eye(300)
    assert int(torch.linalg.cholesky_ex(gram + 1e-6 * gram.diagonal().mean() * eye).info) != 0  # float32 would grow
    reference = NystromKernel(kernel, landmarks, jitter=1e-6)
    single = copy.deepcopy(reference).float()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no jitter growth, no warning
        features = single.featurize(x.float())
    assert features.dtype == torch.float32 and single.landmark_cholesky().dtype == torch.float32
    expected = reference.featurize(x)
    gram_error = (features.double() @ features.double().mT - expected @ expected.mT).abs().max()
    assert gram_error < 1e-3, gram_error


def test_bad_arguments():
    x, _ = data()
    with pytest.raises(ValueError, match="x_sample="):
        rfgp.sketch(exact_kernel(), 10, method="nystrom")
    with pytest.raises(ValueError, match="num_landmarks=500 exceeds"):
        rfgp.sketch(exact_kernel(), 500, method="nystrom", x_sample=x)
    with pytest.raises(ValueError, match="landmarks contains NaN"):
        NystromKernel(exact_kernel(), torch.full((3, 2), float("nan")))
    with pytest.raises(ValueError, match="landmarks must have shape"):
        NystromKernel(exact_kernel(), x[0])
    with pytest.raises(TypeError, match="base_kernel must be a gpytorch Kernel"):
        NystromKernel("rbf", x[:3])
    with pytest.raises(TypeError, match="outputs per input"):
        NystromKernel(gpytorch.kernels.MultitaskKernel(RBFKernel(), num_tasks=2), x[:3])
    with pytest.raises(ValueError, match="jitter"):
        NystromKernel(exact_kernel(), x[:3], jitter=-1.0)


@pytest.mark.parametrize("learn_landmarks", [False, True])
def test_hand_given_landmarks_with_repeated_rows_or_no_rows_or_columns_are_refused(learn_landmarks):
    """Repeated landmarks made K(Z, Z) singular: the default jitter absorbed them without a warning and the map had rank
    5 at width 10; a (5, 0) tensor was accepted until the first evaluation blamed the inputs' columns."""
    x, _ = data()
    with pytest.raises(ValueError, match=r"landmarks has 5 repeated rows \(5 distinct of 10\).*torch.unique"):
        NystromKernel(exact_kernel(), torch.cat([x[:5], x[:5]]), learn_landmarks=learn_landmarks)
    for shape in [(5, 0), (0, 2)]:
        with pytest.raises(ValueError, match=rf"landmarks must have shape \(n, d\) with n ≥ 1 and d ≥ 1.*{shape}"):
            NystromKernel(exact_kernel(), torch.zeros(shape, dtype=DTYPE), learn_landmarks=learn_landmarks)
    with pytest.raises(ValueError, match="inputs with 2 columns, but its landmarks have 3"):
        NystromKernel(RBFKernel().to(DTYPE), torch.rand(5, 3, dtype=DTYPE))(x).to_dense()
    assert NystromKernel(exact_kernel(), x[:10], learn_landmarks=learn_landmarks).num_features == 10


@pytest.mark.parametrize("learn_landmarks", [False, True])
def test_non_finite_hyperparameters_are_named_not_blamed_on_the_landmarks(learn_landmarks):
    """A NaN lengthscale (or learned landmark) made K(Z, Z) NaN: the jitter grew to 10⁻¹ in vain and a NotPSDError
    blamed duplicated landmarks; now the NanError that optimisers step back from, naming the hyperparameter."""
    x, _ = data(40)
    kernel = rfgp.sketch(exact_kernel(), 8, method="nystrom", x_sample=x, seed=0, learn_landmarks=learn_landmarks)
    nystrom = kernel.base_kernel
    with torch.no_grad():
        if learn_landmarks:
            nystrom.landmarks[0, 0] = float("nan")
        else:
            nystrom.base_kernel.raw_lengthscale[..., 0] = float("nan")
    name = "landmarks" if learn_landmarks else "lengthscale"
    with pytest.raises(gpytorch.utils.errors.NanError, match=f"{name} = "):
        nystrom.landmark_cholesky()
    with pytest.raises(gpytorch.utils.errors.NanError, match=f"{name} = "):
        kernel(x).to_dense()

def test_sgpr_inducing_point_kernel_is_refused_naming_its_nystrom_kernel():
    """Before, method="nystrom" built Nyström features of GPyTorch's InducingPointKernel: in train mode they raised
    GPyTorch's "x1 should equal x2 in training mode", in eval mode they approximated SGPR's rank-5 covariance."""
    x, _ = data(30)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    sgpr = gpytorch.kernels.InducingPointKernel(exact_kernel(), x[:5].clone(), likelihood)
    for tree in (sgpr, ScaleKernel(sgpr) + RBFKernel()):
        with pytest.raises(TypeError, match=r"InducingPointKernel \(SGPR\).*NystromKernel\(ipk.base_kernel"):
            rfgp.sketch(tree, 10, method="nystrom", x_sample=x, seed=0)
    with pytest.raises(TypeError, match=r"base_kernel holds GPyTorch's InducingPointKernel"):
        NystromKernel(sgpr, x[:5])
    with pytest.raises(TypeError, match=r"NystromKernel\(kernel.base_kernel, kernel.inducing_points"):
        rfgp.sketch(sgpr, 16)
    kernel = NystromKernel(sgpr.base_kernel, sgpr.inducing_points.detach(), learn_landmarks=True)
    torch.testing.assert_close(kernel(x[:5]).to_dense(), sgpr.base_kernel(x[:5]).to_dense(), atol=1e-6, rtol=0)

def test_selection_arguments_that_would_go_unused_are_refused():
    """Before, a generator beside a seed was ignored (the seed alone chose the landmarks), and ``regularization`` or
    ``pilot_size`` with uniform or k-means++ selection raised Python's "unexpected keyword argument" of a helper."""
    x, _ = data()
    with pytest.raises(ValueError, match="seed or generator, not both"):
        rfgp.sketch(exact_kernel(), 10, method="nystrom", x_sample=x, seed=0, generator=torch.Generator())
    for method, option in (("uniform", {"regularization": 0.1}), ("kmeans++", {"pilot_size": 5})):
        with pytest.raises(TypeError, match=f"landmarks='rls'.*{re.escape(repr(method))} takes none"):
            rfgp.sketch(exact_kernel(), 10, method="nystrom", x_sample=x, landmarks=method, **option)
    with pytest.raises(TypeError, match="learn_landmarks must be True or False, got 'no'"):  # was taken as True
        rfgp.sketch(exact_kernel(), 10, method="nystrom", x_sample=x, seed=0, learn_landmarks="no")
    drawn = rfgp.sketch(exact_kernel(), 10, method="nystrom", x_sample=x, generator=torch.Generator().manual_seed(3))
    again = rfgp.sketch(exact_kernel(), 10, method="nystrom", x_sample=x, generator=torch.Generator().manual_seed(3))
    assert torch.equal(drawn.base_kernel.landmarks, again.base_kernel.landmarks)


def test_selection_settings_of_a_hand_built_kernel_are_checked_when_it_is_built():
    """``NystromKernel(..., selection_seed="a", regularization=-1)`` was accepted and failed only at
    ``set_num_features``, when the landmarks are re-selected with them (a seed of 2**70 in torch's "Overflow")."""
    x, _ = data()
    landmarks = x[:5]
    for options, error, name in (({"selection_seed": "a"}, TypeError, "selection_seed"),
                                 ({"selection_seed": 2**70}, ValueError, "selection_seed"),
                                 ({"regularization": -1.0}, ValueError, "regularization"),
                                 ({"pilot_size": 0}, ValueError, "pilot_size")):
        with pytest.raises(error, match=name):
            NystromKernel(exact_kernel(), landmarks, **options)


# ----- inside every rfgp model ------------------------------------------------------------------


def test_chunked_evaluation_matches_unchunked():
    x, y = data(90)
    kernel = rfgp.sketch(exact_kernel(), 12, method="nystrom", x_sample=x, seed=0, learn_landmarks=True)
    model, likelihood = fitted(kernel, x, y)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    test, _ = data(20, seed=3)
    results = []
    for size in (None, 16):
        model.train(), likelihood.train()
        model.zero_grad()
        with rfgp.settings.chunk_size(size):
            loss = -mll(model(x), y)
            loss.backward()
            model.eval(), likelihood.eval()
            model.prediction_strategy = None
            with torch.no_grad():
                out = model(test)
        grads = [p.grad.clone() for p in model.parameters()]
        results.append((loss.detach(), grads, out.mean, out.variance))
    (l0, g0, m0, v0), (l1, g1, m1, v1) = results
    torch.testing.assert_close(l1, l0)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(m1, m0)
    torch.testing.assert_close(v1, v0)


def test_chunked_diag_moments_match_and_differentiate():
    x, _ = data(50)
    nystrom = NystromKernel(exact_kernel(), x[:10] + 0.05, learn_landmarks=True)
    results = []
    for size in (None, 7):
        nystrom.zero_grad()
        with rfgp.settings.chunk_size(size):
            target, norms = nystrom.diag_moments(x)
        norms.sum().backward()
        results.append((target.detach(), norms.detach(), nystrom.landmarks.grad.clone()))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)


def test_streaming_equals_batch_posterior_and_guards_hyperparameters():
    x, y = data()
    test, _ = data(15, seed=4)
    kernel = rfgp.sketch(exact_kernel(), 20, method="nystrom", x_sample=x, seed=0)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DTYPE)
    likelihood.noise = 0.05
    stream = rfgp.StreamingFeatureGP(kernel, likelihood).to(DTYPE)
    for xb, yb in zip(x.split(50), y.split(50)):
        stream.update(xb, yb)
    mean, variance = posterior(copy.deepcopy(kernel), x, y, test)
    with torch.no_grad():
        out = stream(test)
    torch.testing.assert_close(out.mean, mean)
    torch.testing.assert_close(out.variance, variance)
    with torch.no_grad():
        kernel.base_kernel.landmarks.add_(0.1)
    with pytest.raises(RuntimeError, match="landmarks changed"):
        stream.update(x[:5], y[:5])


def test_multi_output_over_a_nystrom_data_kernel():
    x, _ = data(60)
    y = torch.stack((torch.sin(2 * x[:, 0]), torch.cos(x[:, 1]) + torch.sin(2 * x[:, 0])), -1)
    exact = gpytorch.kernels.MultitaskKernel(exact_kernel(), num_tasks=2, rank=1).to(DTYPE)
    sketched = rfgp.sketch(exact, 60, method="nystrom", x_sample=x, seed=0, jitter=1e-12)
    assert isinstance(sketched.base_kernel.base_kernel, NystromKernel)  # ScaleKernel(NystromKernel(RBF))
    test, _ = data(10, seed=5)
    means = []
    for kernel in (exact, sketched):
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=0).to(DTYPE)
        likelihood.noise = 0.05
        model = rfgp.MultiOutputGPModel(x, y, likelihood, kernel).to(DTYPE).eval()
        with torch.no_grad():
            means.append(model(test).mean)
    torch.testing.assert_close(means[1], means[0], rtol=1e-5, atol=1e-6)  # M = N landmarks: the exact GP


@pytest.mark.parametrize("chunk_size", [None, 3])
@pytest.mark.parametrize("kind", ["multitask", "lcm"])
def test_multi_output_nystrom_variance_is_the_exact_gps_away_from_the_landmarks(kind, chunk_size):
    """The multi-output root φ(x) ⊗ Bᵀ carries the data kernel's FITC term (k(x, x) − ‖φ(x)‖²)·A_ii: before, a
    multitask or LCM model over Nyström data kernels had none, and its variance away from the landmarks fell to
    10⁻¹⁰ instead of the prior A_ii·k(x, x) (and differed from the exact GP's with every point a landmark)."""
    x, _ = data(40)
    y = torch.stack((torch.sin(2 * x[:, 0]), torch.cos(x[:, 1]) + torch.sin(2 * x[:, 0])), -1)
    torch.manual_seed(0)  # IndexKernel's random covar_factor
    if kind == "multitask":
        exact = gpytorch.kernels.MultitaskKernel(exact_kernel(), num_tasks=2, rank=1).to(DTYPE)
    else:
        exact = gpytorch.kernels.LCMKernel([exact_kernel(), MaternKernel(nu=1.5)], num_tasks=2, rank=1).to(DTYPE)
    sketched = rfgp.sketch(exact, 40, method="nystrom", x_sample=x, seed=0, jitter=1e-12)
    test = torch.cat((data(6, seed=5)[0], torch.tensor([[6.0, -6.0], [-9.0, 7.0]], dtype=DTYPE)))  # 2 far away
    results = []
    for kernel in (exact, sketched):
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=0).to(DTYPE)
        likelihood.noise = 0.05
        model = rfgp.MultiOutputGPModel(x, y, likelihood, kernel).to(DTYPE).eval()
        with torch.no_grad(), rfgp.settings.chunk_size(chunk_size if kernel is sketched else None):
            posterior = model(test)  # chunked: the test covariance evaluated 3 points at a time
            results.append((posterior.mean, posterior.variance))
    (mean, variance), (nystrom_mean, nystrom_variance) = results
    torch.testing.assert_close(nystrom_mean, mean, rtol=1e-5, atol=1e-6)  # M = N landmarks: the exact GP
    torch.testing.assert_close(nystrom_variance, variance, rtol=1e-5, atol=1e-6)
    assert bool((variance[-2:] > 0.1).all())  # the prior, far from the data


@pytest.mark.parametrize("kind", ["multitask", "lcm"])
def test_a_scaled_multi_output_nystrom_kernel_keeps_its_variance_correction_chunked(kind):
    """``ScaleKernel`` around a sketched multitask / LCM kernel of Nyström data kernels, its covariances evaluated 3
    points at a time: c times the FITC term (k(x, x) − ‖φ(x)‖²)·A_ii stays on the diagonal, so the chunked posterior
    is the unchunked one.  Before, scaling a chunked multi-output root dropped the term: the variance far from the
    10 landmarks was 10⁻¹⁰ instead of about c·A_ii·k(x, x)."""
    x, _ = data(40)
    y = torch.stack((torch.sin(2 * x[:, 0]), torch.cos(x[:, 1])), -1)
    torch.manual_seed(0)  # IndexKernel's random covar_factor
    if kind == "multitask":
        exact = gpytorch.kernels.MultitaskKernel(exact_kernel(), num_tasks=2, rank=1).to(DTYPE)
    else:
        exact = gpytorch.kernels.LCMKernel([exact_kernel(), MaternKernel(nu=1.5)], num_tasks=2, rank=1).to(DTYPE)
    kernel = ScaleKernel(rfgp.sketch(exact, 10, method="nystrom", x_sample=x[:10], seed=0)).to(DTYPE)
    kernel.outputscale = 3.0
    test = torch.cat((data(6, seed=5)[0], torch.tensor([[6.0, -6.0], [-9.0, 7.0]], dtype=DTYPE)))  # 2 far away
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=0).to(DTYPE)
    likelihood.noise = 0.05
    model = rfgp.MultiOutputGPModel(x, y, likelihood, kernel).to(DTYPE).eval()
    results = []
    for chunk_size in (None, 3):
        model.train().eval()
        with torch.no_grad(), rfgp.settings.chunk_size(chunk_size):
            posterior = model(test)
            results.append((posterior.mean, posterior.variance))
    torch.testing.assert_close(results[1], results[0], rtol=1e-10, atol=1e-12)
    assert bool((results[1][1][-2:] > 1.0).all())  # c·A_ii·k(x, x), far from the data

def test_dirichlet_classifier_with_a_nystrom_kernel():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(150, 2, generator=gen, dtype=DTYPE)
    labels = (x[:, 0] + 0.3 * torch.randn(150, generator=gen, dtype=DTYPE) > 0).long() + (x[:, 1] > 1).long()
    kernel = rfgp.sketch(ScaleKernel(RBFKernel()).to(DTYPE), 30, method="nystrom", x_sample=x[:100], landmarks="kmeans++",
                         seed=0)
    clf = rfgp.models.DirichletGPClassifier(kernel, num_iterations=10, standardize=False, dtype=DTYPE,
                                            probability_method="mean_field", progress=False)
    clf.fit(x[:100], labels[:100])
    proba = clf.predict_proba(x[100:])
    assert proba.shape == (50, 3)
    torch.testing.assert_close(proba.sum(-1), torch.ones(50, dtype=DTYPE))
    assert float((clf.predict(x[100:]) == labels[100:].numpy()).mean()) > 0.8
    assert isinstance(clf.model_.covar_module.base_kernel, NystromKernel)


def test_float32_features_far_from_the_landmarks_have_no_subnormal_numbers():
    """K(x, Z) of points far from every landmark underflows below float32's smallest normal number; the solve and the
    Gram matrix on subnormal numbers ran 7x slower per marginal likelihood and gradient (standardised one-hot
    diamonds, N = 1200, M = 512: 0.83 s against 0.12 s). Negligible entries of K, L and Φ are zero instead."""
    tiny = torch.finfo(torch.float32).tiny
    kernel = ScaleKernel(RBFKernel()).double()
    kernel.base_kernel.lengthscale = 0.1
    landmarks = torch.linspace(0, 3, 40, dtype=DTYPE)[:, None]
    x = torch.cat([torch.linspace(0, 3, 30, dtype=DTYPE), torch.linspace(4.25, 4.45, 30, dtype=DTYPE)])[:, None]
    single = NystromKernel(kernel, landmarks).float()
    with torch.no_grad():
        cross = single.base_kernel(x.float(), landmarks.float()).to_dense()
        assert int(((cross != 0) & (cross.abs() < tiny)).sum()) > 0  # the trigger is there
        features = single.featurize(x.float())
        expected = NystromKernel(kernel, landmarks, jitter=1e-6).featurize(x)
    assert features.dtype == torch.float32
    assert int(((features != 0) & (features.abs() < tiny)).sum()) == 0
    torch.testing.assert_close(features.double() @ features.double().mT, expected @ expected.mT, atol=1e-4, rtol=0)



def whole_tree_nystrom(exact, converted):
    """The conversion of before the ScaleKernel was factored out: one NystromKernel over the whole exact tree, at the
    converted kernel's landmarks."""
    return NystromKernel(copy.deepcopy(exact), converted.base_kernel.landmarks)


@pytest.mark.parametrize("leaf", [lambda: RBFKernel(ard_num_dims=3), lambda: MaternKernel(nu=1.5, ard_num_dims=3)],
                         ids=["rbf_ard", "matern"])
def test_scale_kernel_stays_on_top_with_the_exact_tree_paths_and_values(leaf):
    """ScaleKernel(k) converts to ScaleKernel(NystromKernel(k)): .outputscale and .base_kernel.lengthscale read and
    set the hyperparameters as on the exact tree, and the covariance, its FITC correction and their gradients equal
    the whole-tree Nyström map's (K and the relative jitter scale with s)."""
    x, _ = data(80, d=3)
    test, _ = data(20, d=3, seed=1)
    exact = ScaleKernel(leaf()).to(DTYPE)
    exact.outputscale, exact.base_kernel.lengthscale = 2.5, torch.tensor([0.6, 0.9, 1.4], dtype=DTYPE)
    converted = rfgp.sketch(exact, 30, method="nystrom", x_sample=x, seed=0)
    assert type(converted) is ScaleKernel and isinstance(converted.base_kernel, NystromKernel)
    torch.testing.assert_close(converted.outputscale, exact.outputscale, rtol=0, atol=0)
    torch.testing.assert_close(converted.base_kernel.lengthscale, exact.base_kernel.lengthscale, rtol=0, atol=0)
    assert not converted.base_kernel.has_lengthscale and not hasattr(converted.base_kernel, "raw_lengthscale")
    converted.outputscale, converted.base_kernel.lengthscale = 1.7, torch.tensor([0.8, 1.1, 0.5], dtype=DTYPE)
    torch.testing.assert_close(converted.base_kernel.base_kernel.lengthscale,
                               torch.tensor([[0.8, 1.1, 0.5]], dtype=DTYPE), rtol=0, atol=1e-15)
    exact.outputscale, exact.base_kernel.lengthscale = 1.7, torch.tensor([0.8, 1.1, 0.5], dtype=DTYPE)
    old = whole_tree_nystrom(exact, converted)
    for mode in ("train", "eval"):
        getattr(converted, mode)(), getattr(old, mode)()
        for a, b in ((x, x), (test, test), (test, x)):
            torch.testing.assert_close(converted(a, b).to_dense(), old(a, b).to_dense(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(converted(test, diag=True), old(test, diag=True), rtol=1e-12, atol=1e-12)
    correction = converted(test).evaluate_kernel().variance_correction  # eval mode: s·(k(x, x) − ‖Φ(x)‖²)
    torch.testing.assert_close(correction, old(test).evaluate_kernel().variance_correction, rtol=1e-12, atol=1e-14)
    weights = torch.randn(len(test), len(x), dtype=DTYPE, generator=torch.Generator().manual_seed(0))
    grads = []
    for kernel, scale, inner in ((converted, converted, converted.base_kernel.base_kernel),
                                 (old, old.base_kernel, old.base_kernel.base_kernel)):
        value = (kernel(test, x).to_dense() * weights).sum() + kernel(test).evaluate_kernel().variance_correction.sum()
        grads.append(torch.autograd.grad(value, (scale.raw_outputscale, inner.raw_lengthscale)))
    for new, before in zip(*grads):
        torch.testing.assert_close(new, before, rtol=1e-10, atol=1e-12)


class SincKernel(gpytorch.kernels.Kernel):
    """GPyTorch's "Implementing a custom kernel" example: sin(‖x − y‖/l)/(‖x − y‖/l), l = ``length`` (a property)."""

    is_stationary = True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.register_parameter("raw_length", torch.nn.Parameter(torch.zeros(*self.batch_shape, 1, 1)))
        self.register_constraint("raw_length", gpytorch.constraints.Positive())

    @property
    def length(self):
        return self.raw_length_constraint.transform(self.raw_length)

    @length.setter
    def length(self, value):
        self.initialize(raw_length=self.raw_length_constraint.inverse_transform(torch.as_tensor(value).to(self.raw_length)))

    def forward(self, x1, x2, **params):
        diff = self.covar_dist(x1.div(self.length), x2.div(self.length), **params)
        diff = diff.where(diff != 0, torch.as_tensor(1e-20, dtype=diff.dtype))
        return torch.sin(diff).div(diff)


@pytest.mark.parametrize("leaf, name, value", [
    (PeriodicKernel, "period_length", 0.4),
    (gpytorch.kernels.RQKernel, "alpha", 3.0),
    (lambda: gpytorch.kernels.PolynomialKernel(power=2), "offset", 2.0),
    (SincKernel, "length", 0.3),
], ids=["periodic", "rq", "polynomial", "custom"])
def test_hyperparameter_accessors_of_the_base_kernel_read_and_set_as_on_the_exact_tree(leaf, name, value):
    """``covar_module.base_kernel.<name> = v`` on ScaleKernel(NystromKernel(k)) sets k's hyperparameter, as on the
    exact ScaleKernel(k), directly or by GPyTorch's ``initialize``; before, it set a plain attribute of the Nyström
    kernel and left the covariance unchanged without a word (reads raised AttributeError)."""
    x, _ = data(60)
    exact = ScaleKernel(leaf()).to(DTYPE)
    converted = rfgp.sketch(exact, 60, method="nystrom", x_sample=x, seed=0)
    torch.testing.assert_close(getattr(converted.base_kernel, name), getattr(exact.base_kernel, name), rtol=0, atol=0)
    setattr(exact.base_kernel, name, value)
    setattr(converted.base_kernel, name, value)
    assert name not in vars(converted.base_kernel)
    torch.testing.assert_close(getattr(converted.base_kernel.base_kernel, name), getattr(exact.base_kernel, name))
    torch.testing.assert_close(converted(x).to_dense(), exact(x).to_dense(), rtol=1e-6, atol=1e-6)
    setattr(exact.base_kernel, name, 2 * value)
    converted.initialize(**{f"base_kernel.{name}": torch.tensor(2 * value, dtype=DTYPE)})
    torch.testing.assert_close(converted(x).to_dense(), exact(x).to_dense(), rtol=1e-6, atol=1e-6)
    assert not hasattr(converted.base_kernel, "raw_" + name)  # the parameter keeps one owner, the base kernel
    with pytest.raises(AttributeError):
        converted.base_kernel.no_such_hyperparameter


def test_lengthscale_set_on_a_trained_model_reaches_its_next_prediction():
    """GPyTorch's cache rule: model.train(); set the lengthscale; model.eval() predicts with the new one — no stale
    posterior cache and no stale landmark factor L = chol(K(Z, Z) + εI)."""
    x, y = data(60, d=3)
    test, _ = data(10, d=3, seed=1)
    exact = ScaleKernel(RBFKernel(ard_num_dims=3)).to(DTYPE)
    model, _ = fitted(rfgp.sketch(exact, 25, method="nystrom", x_sample=x, seed=0), x, y)
    with torch.no_grad():
        before = model(test).mean
    model.train()
    model.covar_module.base_kernel.lengthscale = 0.4
    model.eval()
    with torch.no_grad():
        after = model(test).mean
    # as a float64 tensor: GPyTorch's setter rounds a Python float to float32 first, rfgp's takes it in the dtype
    exact.base_kernel.lengthscale = torch.tensor(0.4, dtype=DTYPE)
    fresh, _ = fitted(whole_tree_nystrom(exact, model.covar_module), x, y)
    with torch.no_grad():
        torch.testing.assert_close(after, fresh(test).mean, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(before, after)


def test_nystrom_of_a_tree_without_a_scale_kernel_exposes_its_top_lengthscale():
    x, _ = data(50)
    converted = rfgp.sketch(RBFKernel().to(DTYPE), 20, method="nystrom", x_sample=x, seed=0)
    assert isinstance(converted, NystromKernel)
    converted.lengthscale = 0.3
    torch.testing.assert_close(converted.base_kernel.lengthscale, torch.tensor([[0.3]], dtype=DTYPE))
    with pytest.raises(ValueError, match="lengthscale"):
        converted.lengthscale = -1.0
    # the parameter has one owner, found once by code that walks the modules for lengthscales (priors, bounds)
    assert [name for name, _ in converted.named_parameters()] == ["base_kernel.raw_lengthscale"]
    assert [m for m in converted.modules() if getattr(m, "has_lengthscale", False) or hasattr(m, "raw_lengthscale")
            ] == [converted.base_kernel]
    converted.register_prior("lengthscale_prior", gpytorch.priors.GammaPrior(2.0, 4.0), "lengthscale")
    prior_value = next(closure(module) for _, module, _, closure, _ in converted.named_priors())
    torch.testing.assert_close(prior_value, converted.base_kernel.lengthscale, rtol=0, atol=0)
    summed = rfgp.sketch((RBFKernel() + PeriodicKernel()).to(DTYPE), 20, method="nystrom", x_sample=x, seed=0)
    assert summed.lengthscale is None
    with pytest.raises(RuntimeError, match="NystromKernel has no lengthscale: its base kernel AdditiveKernel"):
        summed.lengthscale = 1.0


def test_state_dicts_of_the_exact_tree_load_and_of_the_whole_tree_conversion_refuse():
    """The exact tree's state loads with no key over (active_dims of the ScaleKernel and of its base included); a state
    saved from the whole-tree NystromKernel(ScaleKernel(k)) layout raises instead of loading partly."""
    x, _ = data(60, d=3)
    exact = ScaleKernel(RBFKernel(ard_num_dims=2, active_dims=[0, 2])).to(DTYPE)
    converted = rfgp.sketch(exact, 20, method="nystrom", x_sample=x, seed=0)
    assert converted.base_kernel.landmarks.shape == (20, 2)
    on_columns = copy.deepcopy(exact)
    on_columns.active_dims = on_columns.base_kernel.active_dims = None
    torch.testing.assert_close(converted(x).to_dense(), whole_tree_nystrom(on_columns, converted)(x[:, [0, 2]])
                               .to_dense(), rtol=1e-12, atol=1e-12)
    exact.outputscale, exact.base_kernel.lengthscale = 3.0, torch.tensor([0.5, 2.0], dtype=DTYPE)
    result = converted.load_state_dict(exact.state_dict(), strict=False)
    assert result.unexpected_keys == [] and "base_kernel.landmarks" in result.missing_keys
    torch.testing.assert_close(converted.base_kernel.lengthscale, exact.base_kernel.lengthscale, rtol=0, atol=0)
    torch.testing.assert_close(converted.outputscale, exact.outputscale, rtol=0, atol=0)
    old_layout = NystromKernel(ScaleKernel(RBFKernel(ard_num_dims=2)).to(DTYPE), x[:20, [0, 2]])
    for strict in (True, False):
        with pytest.raises(ValueError, match="before it became ScaleKernel\\(NystromKernel\\(k\\)\\)"):
            converted.load_state_dict(old_layout.state_dict(), strict=strict)


def test_batched_scale_kernel_conversion_pickles_with_its_state_guard():
    """A batch of outputscales and lengthscales (one GP per output): ScaleKernel(NystromKernel(k)) equals the
    whole-tree map per batch member, and a pickled copy keeps its values and its refusal of old-layout states."""
    x, _ = data(50)
    batch = torch.Size([3])
    exact = ScaleKernel(RBFKernel(ard_num_dims=2, batch_shape=batch), batch_shape=batch).to(DTYPE)
    exact.outputscale = torch.tensor([0.5, 1.0, 2.0], dtype=DTYPE)
    exact.base_kernel.lengthscale = torch.tensor([[[0.5, 1.0]], [[0.8, 0.3]], [[1.2, 2.0]]], dtype=DTYPE)
    converted = rfgp.sketch(exact, 20, method="nystrom", x_sample=x, seed=0)
    assert converted.base_kernel.lengthscale.shape == (3, 1, 2)
    dense = converted(x).to_dense()
    assert dense.shape == (3, 50, 50)
    torch.testing.assert_close(dense, whole_tree_nystrom(exact, converted)(x).to_dense(), rtol=1e-12, atol=1e-12)
    copied = pickle.loads(pickle.dumps(converted))
    assert torch.equal(copied(x).to_dense(), dense)
    with pytest.raises(ValueError, match="cannot load state"):
        copied.load_state_dict(whole_tree_nystrom(exact, converted).state_dict(), strict=False)


def test_forward_over_reverse_hessian_of_the_posterior_variance():
    """``torch.autograd.functional.hessian(..., outer_jacobian_strategy="forward-mode")`` of a Nyström model's
    posterior variance in its test inputs: the correction's row norms (squared_row_norms, an autograd Function) had no
    forward-mode derivative ("You must implement the jvp function"), where ``pow(2).sum(-1)`` before it had one."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(30, 2, generator=g, dtype=torch.float64)
    y = torch.sin(3 * x).sum(-1)
    kernel = gpytorch.kernels.ScaleKernel(NystromKernel(gpytorch.kernels.RBFKernel(), landmarks=x[:8])).double()
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).double().eval()
    test = torch.rand(3, 2, generator=g, dtype=torch.float64)

    def variance(z):
        return model(z).variance.sum()

    forward = torch.autograd.functional.hessian(variance, test, vectorize=True, outer_jacobian_strategy="forward-mode")
    torch.testing.assert_close(forward, torch.autograd.functional.hessian(variance, test), rtol=1e-10, atol=1e-12)


def _float32_and_float64_features(x, lengthscale, num_landmarks):
    kernel = rfgp.sketch(RBFKernel(), num_features=num_landmarks, method="nystrom", x_sample=x, seed=0)
    kernel.lengthscale = lengthscale
    reference = copy.deepcopy(kernel).double()
    reference.jitter = 1e-6  # float32's default: the same K(Z, Z) + εI, so that the features compare
    return kernel, reference


def test_float32_features_evaluate_the_cross_kernel_in_float64_where_float32_is_too_coarse():
    """Φ(x) = K(x, Z)·L⁻ᵀ amplifies K(x, Z)'s error by L⁻¹.  Evaluated in float32, distances between points far
    from the origin in lengthscales cancel (‖a‖² + ‖b‖² − 2aᵀb): 40 clusters spread over 100 lengthscales in 10
    dimensions gave features 1.3·10⁻² off float64's (ggplot2's txhousing, d = 53: 0.9 %, and a test RMSE of 0.301
    against 0.290).  The landmark factor now finds the float32 evaluation too coarse there and K(x, Z) is evaluated
    in float64 and rounded: 10⁻⁷.  Standard normal inputs keep the float32 evaluation (float64 cost 12–43 % of an
    MLL with gradient and gains nothing there)."""
    g = torch.Generator().manual_seed(0)
    centers = 100 * torch.randn(40, 10, generator=g)
    x = centers[torch.randint(0, 40, (600,), generator=g)] + 0.3 * torch.randn(600, 10, generator=g)
    kernel, reference = _float32_and_float64_features(x, 1.0, 200)
    with torch.no_grad():
        exact = reference.featurize(x.double())
        features = kernel.featurize(x)
    assert kernel._cross_in_work_precision and features.dtype == torch.float32
    assert (features.double() - exact).norm() / exact.norm() < 1e-5
    plain, _ = _float32_and_float64_features(torch.randn(600, 3, generator=g), 0.7, 200)
    with torch.no_grad():
        plain.featurize(torch.randn(5, 3, generator=g))
    assert not plain._cross_in_work_precision


def test_reselection_among_points_of_other_columns_is_refused_and_keeps_the_landmarks():
    """reselect_landmarks takes points in the landmarks' columns (after the kernel's active_dims); given the tree's
    inputs it chose landmarks of 3 columns for a kernel on 2, refused only at the next evaluation."""
    x = torch.randn(100, 3, dtype=torch.float64)
    kernel = rfgp.sketch(ScaleKernel(RBFKernel(active_dims=[0, 2])).double(), 30, method="nystrom", x_sample=x, seed=0)
    before = kernel.base_kernel.landmarks.clone()
    with pytest.raises(ValueError, match="x_sample has 3 columns but the landmarks have 2"):
        kernel.base_kernel.reselect_landmarks(40, x)
    assert torch.equal(kernel.base_kernel.landmarks, before)
    kernel.base_kernel.reselect_landmarks(40, x[:, [0, 2]])
    assert kernel.base_kernel.landmarks.shape == (40, 2)


@pytest.mark.parametrize("landmarks", ["uniform", "kmeans++", "rls"])
def test_float32_polynomial_kernel_is_factorised_in_float64(landmarks):
    """K(Z, Z) of float32 inputs is formed in float64, and so are the selectors' kernel values.  GPyTorch's
    PolynomialKernel does not promote its float32 offset to float64 inputs (``torch.addmm``): a float32 Nyström map of
    it raised "self and mat2 must have the same dtype" at every evaluation (and at "kmeans++" and "rls" selection).
    Now its features are the float64 map's (same landmarks, same jitter) to float32 rounding, the gradient still
    reaches the float32 offset, and the base kernel's parameters stay float32 (rfgp.core.module_in_dtype)."""
    x = torch.rand(60, 2, generator=torch.Generator().manual_seed(0))
    kernel = rfgp.sketch(PolynomialKernel(power=2), 6, method="nystrom", x_sample=x, seed=0, landmarks=landmarks)
    reference = copy.deepcopy(kernel).double()
    reference.jitter = 1e-6  # float32's default jitter
    features = kernel.featurize(x)
    exact = reference.featurize(x.double())
    assert features.dtype == torch.float32
    assert torch.equal(kernel.landmarks.double(), reference.landmarks)
    assert (features.double() - exact).norm() / exact.norm() < 1e-3  # K(Z, Z) of rank 6 = M: L⁻¹ amplifies rounding
    features.sum().backward()
    assert kernel.base_kernel.raw_offset.dtype == torch.float32
    assert kernel.base_kernel.raw_offset.grad is not None and bool(torch.isfinite(kernel.base_kernel.raw_offset.grad))


def test_state_of_landmarks_in_other_columns_is_refused_and_keeps_the_landmarks():
    """A state whose landmarks have another number of columns: the saved width was adopted first (Z re-created
    uninitialised at this module's d), so torch's "size mismatch" named that new shape as this module's and left
    the kernel with garbage landmarks; now a ValueError names both shapes and the landmarks stay."""
    kernel = NystromKernel(RBFKernel(), torch.randn(5, 2))
    other = NystromKernel(RBFKernel(), torch.randn(8, 3))
    before = kernel.landmarks.clone()
    with pytest.raises(ValueError, match=r"landmarks has shape \(8, 3\) in the state dict.*\(5, 2\) have 2"):
        kernel.load_state_dict(other.state_dict())
    assert torch.equal(kernel.landmarks, before)


def test_float32_cross_precision_is_that_of_the_reused_factor():
    """The precision of K(x, Z) is chosen with each landmark factor.  It was an attribute set whenever a factor was
    computed, so a factor reused from the cache (prediction) took the choice of the last factor computed, one under
    autograd at other hyperparameters that the cache does not keep: the same state's float32 covariance changed by
    4·10⁻³ with the kernel's history."""
    x = 1000 + torch.rand(300, 3, generator=torch.Generator().manual_seed(0))
    base = RBFKernel()
    base.lengthscale = 0.3  # here the float32 evaluation of K(x, Z) is too coarse, at ℓ = 0.1 it is not
    kernel = NystromKernel(base, x[:100]).eval()
    with torch.no_grad():
        first = kernel(x[100:]).to_dense()
    assert kernel._cross_in_work_precision
    base.lengthscale = 0.1
    kernel(x[100:]).to_dense().sum().backward()  # a factor under autograd, not cached
    assert not kernel._cross_in_work_precision
    base.lengthscale = 0.3
    with torch.no_grad():
        again = kernel(x[100:]).to_dense()  # the cached factor of the first call
    assert kernel._cross_in_work_precision
    assert torch.equal(again, first)


def test_float32_features_that_err_beyond_the_tolerance_warn_once_at_prediction(monkeypatch):
    """With 256 landmarks on [0, 1] at ℓ = 0.1, K(Z, Z) is near-singular and L⁻¹ amplifies the float32 rounding of
    K(x, Z), of L and of the solve: the features err by about 7·10⁻⁴.  The estimate at the landmarks matches the data
    rows' error (within a factor 3), and a prediction warns once per kernel where it exceeds the tolerance (1 % by
    default).  Training never checks, nor does a float64 kernel."""
    import rfgp.kernels.nystrom as nystrom

    g = torch.Generator().manual_seed(0)
    x = torch.rand(400, 1, generator=g)
    kernel, reference = _float32_and_float64_features(x, 0.1, 256)
    with torch.no_grad():
        exact = reference.featurize(x.double())
        error = (kernel.featurize(x).double() - exact).norm() / exact.norm()
    monkeypatch.setattr(nystrom, "FEATURE_PRECISION_TOLERANCE", float(error) / 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernel(x).to_dense()  # train mode: no check
        reference.eval()(x).to_dense()  # float64: nothing to check
    kernel.eval()
    with pytest.warns(NumericalWarning, match=r"float32 features at 256 landmarks err by") as caught:
        kernel(x[:5], x).to_dense()
    estimate = float(re.search(r"err by (\S+) \(relative\)", str(caught[0].message)).group(1))
    assert error / 3 < estimate < 3 * error, (estimate, float(error))
    kernel.lengthscale = 0.2  # a new factor: warned once per kernel already
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernel(x[:5], x).to_dense()


def _member_model(x, y, batch, landmarks):
    """An ExactGP of ``batch`` independent members with learned landmarks, all starting at ``landmarks``."""
    base = ScaleKernel(RBFKernel(batch_shape=batch), batch_shape=batch)
    kernel = NystromKernel(base, landmarks, learn_landmarks=True)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch)
    return ExactGPModel(x, y, likelihood, kernel, gpytorch.means.ConstantMean(batch_shape=batch)).to(DTYPE)


def _member_losses(model):
    model.train()
    with torch.no_grad():
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        return -mll(model(*model.train_inputs), model.train_targets)


def test_learned_landmarks_of_batch_members_are_their_own_and_train_as_if_alone():
    """Learned landmarks were one (M, d) parameter shared by the members of a batched model: BoTorch's
    fit_gpytorch_mll (which fits a multi-output SingleTaskGP's outputs independently) crashed reshaping it
    ("shape '[2, 2]' is invalid for input of size 20") and member_lbfgs refused it.  Each member now has its own Z:
    member b's loss is that of the un-batched model of member b's kernel (kernel[b]) and depends on no other member's
    parameters, member_lbfgs moves every member's Z, and a state with shared (M, d) landmarks still loads
    (each member gets that Z)."""
    x, y = data(30)
    xs = torch.stack([x, x.flip(0)])
    ys = torch.stack([y, 2 * torch.cos(x.flip(0)[:, 0])])
    start = x[:5] + 0.05
    model = _member_model(xs, ys, torch.Size([2]), start)
    assert model.covar_module.landmarks.shape == (2, 5, 2)
    shared = {**model.state_dict(), "covar_module.landmarks": start}
    rfgp.fit_mll(model, optimizer="member_lbfgs", num_iterations=30)
    z = model.covar_module.landmarks.detach()
    assert not torch.equal(z[0], start) and not torch.equal(z[1], start) and not torch.equal(z[0], z[1])
    model.covar_module.landmarks.grad = None
    loss = -gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)(model(xs), ys)
    loss[0].backward()
    assert torch.equal(model.covar_module.landmarks.grad[1], torch.zeros(5, 2, dtype=DTYPE))  # no coupling
    for b in range(2):
        likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DTYPE)
        likelihood.noise = model.likelihood.noise[b].detach()
        mean = gpytorch.means.ConstantMean().to(DTYPE)
        mean.constant = model.mean_module.constant[b].detach()
        alone = ExactGPModel(xs[b], ys[b], likelihood, model.covar_module[b], mean)
        torch.testing.assert_close(_member_losses(model)[b], _member_losses(alone), rtol=1e-10, atol=1e-12)
        assert torch.equal(model.covar_module[b].landmarks, z[b]) and model.covar_module[b].batch_shape == ()
    model.load_state_dict(shared)  # saved when the members shared Z
    assert torch.equal(model.covar_module.landmarks, start.expand(2, 5, 2))


def test_botorch_fits_a_multi_output_model_with_learned_landmarks_independently():
    botorch = pytest.importorskip("botorch")
    x, _ = data(15)
    y = torch.stack([torch.sin(3 * x[:, 0]), torch.cos(3 * x[:, 1])], -1)
    model = botorch.models.SingleTaskGP(x, y)
    model.covar_module = rfgp.sketch(model.covar_module, 4, method="nystrom", x_sample=x, seed=0, learn_landmarks=True)
    start = model.covar_module.landmarks.detach().clone()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    botorch.fit.fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": 10}})
    landmarks = model.covar_module.landmarks.detach()
    assert landmarks.shape == (2, 4, 2) and not torch.equal(landmarks[0], landmarks[1])
    assert not torch.equal(landmarks[0], start[0]) and not torch.equal(landmarks[1], start[1])


def test_landmarks_reselected_under_inference_mode_stay_usable_by_training():
    """Landmarks chosen again inside ``torch.inference_mode()`` were inference tensors: the next training step raised
    "Inference tensors cannot be saved for backward"."""
    x = torch.randn(80, 2, generator=torch.Generator().manual_seed(0))
    y = torch.sin(x.sum(-1))
    kernel = rfgp.sketch(ScaleKernel(RBFKernel()), 12, method="nystrom", x_sample=x, seed=0)
    nystrom = kernel.base_kernel
    with torch.inference_mode():
        nystrom.reselect_landmarks(12, x.clone())
    assert not nystrom.landmarks.is_inference()
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    (-mll(model(x), y)).backward()
    assert kernel.base_kernel.base_kernel.raw_lengthscale.grad is not None


def test_raw_parameters_of_the_base_kernel_are_refused_with_their_path():
    """GPyTorch's hyperparameter tutorial reads ``covar_module.base_kernel.raw_lengthscale`` (and its constraint);
    on ScaleKernel(NystromKernel(k)) the parameter stays k's (one owner for module walkers), and the error names
    where it is instead of torch's bare "'NystromKernel' object has no attribute 'raw_lengthscale'"."""
    x, _ = data(40)
    converted = rfgp.sketch(ScaleKernel(RBFKernel()).to(DTYPE), 20, method="nystrom", x_sample=x, seed=0)
    for name in ("raw_lengthscale", "raw_lengthscale_constraint"):
        with pytest.raises(AttributeError, match=rf"NystromKernel\.base_kernel\.{name}\b"):
            getattr(converted.base_kernel, name)
    assert not hasattr(converted.base_kernel, "raw_lengthscale")
    with pytest.raises(AttributeError, match="no attribute 'no_such_attribute'$"):
        converted.base_kernel.no_such_attribute
