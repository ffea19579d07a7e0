"""Statistics of Φ = K·L⁻ᵀ with the shortened backward: equal to autograd through the solve, wired into Nyström models."""

import gpytorch
import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from linear_operator.operators import DiagLinearOperator

import rfgp
from rfgp.inference import triangular_statistics as module
from rfgp.inference.linalg import feature_statistics
from rfgp.inference.operators import FeatureRootAddedDiagLinearOperator, FeatureRootLinearOperator
from rfgp.inference.triangular_statistics import TriangularFeatures, triangular_features, triangular_statistics
from rfgp.kernels import NystromKernel
from rfgp.likelihoods import DirichletClassificationLikelihood
from rfgp.models.regression import ExactGPModel

DTYPE = torch.float64


def factors(n=40, m=9, t=2, batch=(), chol_batch=(), per_point=True, seed=0):
    """(K, L, w, R) of an RBF Nyström map with close landmarks (an ill-conditioned L), all requiring gradients."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(*batch, n, 2, generator=gen, dtype=DTYPE)
    z = torch.rand(*chol_batch, m, 2, generator=gen, dtype=DTYPE)
    gram = torch.exp(-torch.cdist(z, z) ** 2) + 1e-6 * torch.eye(m, dtype=DTYPE)
    cross = torch.exp(-torch.cdist(x, z.expand(*batch, m, 2) if batch else z) ** 2)
    chol = torch.linalg.cholesky(gram)
    weights = torch.rand(*batch, n if per_point else 1, generator=gen, dtype=DTYPE) + 0.5
    rhs = torch.randn(*batch, n, t, generator=gen, dtype=DTYPE)
    return tuple(v.requires_grad_() for v in (cross, chol, weights, rhs))


def fused(cross, chol, weights, rhs):
    return triangular_statistics(triangular_features(cross, chol), cross, chol, weights, rhs)


def autograd(cross, chol, weights, rhs):
    return feature_statistics(triangular_features(cross, chol), weights, rhs)


@pytest.mark.parametrize("weights", ["per_point", "per_point_fixed", "uniform"])
@pytest.mark.parametrize("shapes", [((), ()), ((3,), ()), ((3,), (3,))])
def test_values_and_gradients_equal_autograd_through_the_solve(weights, shapes):
    batch, chol_batch = shapes
    inputs = factors(batch=batch, chol_batch=chol_batch, per_point=weights != "uniform")
    if weights == "per_point_fixed":  # no w̄: K̄ by the one product instead of the solve of Φ̄
        inputs[2].requires_grad_(False)
    gen = torch.Generator().manual_seed(1)
    out = fused(*inputs)
    reference = autograd(*inputs)
    cotangents = [torch.randn(o.shape, generator=gen, dtype=DTYPE) for o in reference]
    for value, expected in zip(out, reference):
        torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12)
    wanted = [t for t in inputs if t.requires_grad]
    grads = torch.autograd.grad(out, wanted, cotangents)
    expected_grads = torch.autograd.grad(reference, wanted, cotangents)
    for g, e in zip(grads, expected_grads):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


def test_gradient_of_the_factor_is_lower_triangular_and_not_zero():
    cross, chol, weights, rhs = factors()
    gram, projection = fused(cross, chol, weights, rhs)
    (grad,) = torch.autograd.grad(gram.sum() + projection.sum(), chol)
    assert grad.abs().max() > 1e-3
    assert torch.equal(grad, grad.tril())


@pytest.mark.parametrize("per_point", [True, False])
def test_gradcheck_and_gradgradcheck(per_point):
    inputs = factors(n=7, m=4, t=2, batch=(2,), per_point=per_point)
    assert torch.autograd.gradcheck(fused, inputs)
    assert torch.autograd.gradgradcheck(fused, inputs)


def test_only_requested_gradients_and_empty_rhs():
    cross, chol, weights, rhs = factors()
    weights.requires_grad_(False)
    empty = rhs.new_zeros(rhs.shape[0], 0)
    gram, _ = fused(cross, chol, weights, empty)
    grads = torch.autograd.grad(gram.pow(2).sum(), (cross, chol))
    expected = torch.autograd.grad(autograd(cross, chol, weights, empty)[0].pow(2).sum(), (cross, chol))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- models


def float32_gradient_error(path, monkeypatch, n=3000, m=384):
    """Largest relative error of float32 hyperparameter gradients against float64, for close landmarks."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(n, 2, generator=gen)
    y = torch.sin(6 * x).sum(-1) + 0.1 * torch.randn(n, generator=gen)
    grads = {}
    for dtype in (torch.float64, torch.float32):
        xd, yd = x.to(dtype), y.to(dtype)
        kernel = rfgp.sketch(ScaleKernel(RBFKernel(ard_num_dims=2)), m, method="nystrom", x_sample=xd, seed=0)
        model = ExactGPModel(xd, yd, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(dtype)
        with monkeypatch.context() as patch:
            if path == "autograd" or dtype == torch.float64:
                patch.setattr(NystromKernel, "feature_root", NystromKernel.featurize)
            _, values = mll_and_grads(model, xd, yd)
        grads[dtype] = torch.cat([g.reshape(-1).double() for g in values])
    return float(((grads[torch.float32] - grads[torch.float64]).abs() / grads[torch.float64].abs()).max())


def test_float32_gradients_are_as_accurate_as_autograd(monkeypatch, fused_calls):
    """Float32 K̄ is solved per row (Φ̄L⁻¹) and the M × M product 2SG + H̄Hᵀ of L̄ formed in float64: M × M factors
    rounded to float32, shared by all N rows, triple the gradient error here."""
    autograd_error = float32_gradient_error("autograd", monkeypatch)
    assert not fused_calls
    fused_error = float32_gradient_error("triangular", monkeypatch)
    assert fused_calls
    assert fused_error <= 2 * autograd_error, (fused_error, autograd_error)


def data(n=60, d=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen, dtype=DTYPE) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.5 * x[:, 1] ** 2 + 0.1 * torch.randn(n, generator=gen, dtype=DTYPE)
    return x, y


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the calls of the shortened backward's Function (a test that needs it fails if it is not reached)."""
    calls = []
    apply = module._TriangularStatistics.apply

    def counting(*args):
        calls.append((args[0].shape, args[3].shape))  # (Φ, weights)
        return apply(*args)

    monkeypatch.setattr(module._TriangularStatistics, "apply", counting)
    return calls


def unfused(monkeypatch):
    """Nyström training covariances with the dense root Φ: autograd through the triangular solve."""
    monkeypatch.setattr(NystromKernel, "feature_root", NystromKernel.featurize)


def mll_and_grads(model, x, y, create_graph=False):
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    params = [p for p in model.parameters() if p.requires_grad]
    value = mll(model(x), y).sum()
    grads = torch.autograd.grad(value, params, create_graph=create_graph)
    return value, grads


def assert_unfused_path_agrees(monkeypatch, model, x, y, value, grads):
    """The MLL and its gradients of ``model`` through the unfused path equal ``value`` and ``grads``."""
    unfused(monkeypatch)
    expected_value, expected_grads = mll_and_grads(model, x, y)
    torch.testing.assert_close(value, expected_value, rtol=1e-12, atol=1e-12)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-10)


def dirichlet_nystrom_model(x):
    """A batched Dirichlet classifier over Nyström features with learned landmarks and its transformed targets:
    per-class hyperparameters (one Φ per class) and per-point (label) noise."""
    labels = (x[:, 0] > 0).long() + (x[:, 1] > 1).long()
    likelihood = DirichletClassificationLikelihood(labels, num_classes=3, learn_additional_noise=True, dtype=DTYPE)
    batch = torch.Size([3])
    kernel = ScaleKernel(NystromKernel(RBFKernel(batch_shape=batch), x[:10] + 0.05, learn_landmarks=True),
                         batch_shape=batch)
    model = ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel,
                         gpytorch.means.ConstantMean(batch_shape=batch)).to(DTYPE)
    with torch.no_grad():
        kernel.base_kernel.base_kernel.lengthscale = torch.tensor([0.5, 1.0, 1.5], dtype=DTYPE).view(3, 1, 1)
    return model, likelihood.transformed_targets


def nystrom_model(x, y, form, likelihood=None, learn_landmarks=True):
    landmarks = x[:8] + 0.05
    if form == "scale":  # the outputscale outside: a constant-scaled TriangularFeatures root
        kernel = ScaleKernel(NystromKernel(RBFKernel(ard_num_dims=x.shape[-1]), landmarks,
                                           learn_landmarks=learn_landmarks))
    else:  # rfgp.sketch's form: the outputscale inside K and K(Z, Z)
        kernel = NystromKernel(ScaleKernel(RBFKernel(ard_num_dims=x.shape[-1])), landmarks,
                               learn_landmarks=learn_landmarks)
    likelihood = likelihood if likelihood is not None else gpytorch.likelihoods.GaussianLikelihood()
    model = ExactGPModel(x, y, likelihood, kernel).to(DTYPE)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "landmarks" not in name:
                param.add_(0.1 * torch.arange(param.numel(), dtype=DTYPE).view(param.shape).cos())
    return model


@pytest.mark.parametrize("form", ["scale", "inside"])
def test_model_mll_and_all_gradients_equal_the_unfused_path(form, fused_calls, monkeypatch):
    x, y = data()
    model = nystrom_model(x, y, form)
    value, grads = mll_and_grads(model, x, y)
    assert fused_calls, "the Nyström MLL did not take the triangular statistics"
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("landmarks" in n for n in names) and any("outputscale" in n for n in names)
    unfused(monkeypatch)
    count = len(fused_calls)
    expected_value, expected_grads = mll_and_grads(model, x, y)
    assert len(fused_calls) == count
    torch.testing.assert_close(value, expected_value, rtol=1e-12, atol=1e-12)
    for name, g, e in zip(names, grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-10, msg=name)


def test_scaled_root_keeps_the_factors():
    x, _ = data()
    kernel = ScaleKernel(NystromKernel(RBFKernel(), x[:8])).to(DTYPE)
    operator = kernel(x).evaluate_kernel()
    assert isinstance(operator, FeatureRootLinearOperator)
    root, constant = operator.scaled_root()
    assert isinstance(root, TriangularFeatures) and constant is not None
    dense = kernel.base_kernel.featurize(x) * kernel.outputscale.sqrt()
    torch.testing.assert_close(operator.to_dense(), dense @ dense.mT)
    torch.testing.assert_close(operator.diagonal(), dense.pow(2).sum(-1))
    rows = torch.tensor([3, 0, 7])
    torch.testing.assert_close(operator[..., rows, :][..., :, rows].to_dense(), (dense @ dense.mT)[rows][:, rows])
    probe = torch.randn(x.shape[0], 2, dtype=DTYPE)
    torch.testing.assert_close(operator @ probe, dense @ (dense.mT @ probe))
    with_noise = operator + DiagLinearOperator(torch.full((x.shape[0],), 0.1, dtype=DTYPE))
    assert isinstance(with_noise, FeatureRootAddedDiagLinearOperator)
    assert isinstance(with_noise._linear_op.scaled_root()[0], TriangularFeatures)


def test_heteroscedastic_fixed_noise_takes_per_point_weights(fused_calls, monkeypatch):
    x, y = data()
    noise = 0.02 + 0.1 * torch.rand(x.shape[0], generator=torch.Generator().manual_seed(3), dtype=DTYPE)
    likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise)
    model = nystrom_model(x, y, "scale", likelihood)
    value, grads = mll_and_grads(model, x, y)
    assert fused_calls and fused_calls[-1][1] == (x.shape[0],)  # per-point weights
    assert_unfused_path_agrees(monkeypatch, model, x, y, value, grads)


def test_batched_dirichlet_model_equals_the_unfused_path(fused_calls, monkeypatch):
    x, _ = data(n=80)
    model, targets = dirichlet_nystrom_model(x)
    value, grads = mll_and_grads(model, x, targets)
    assert fused_calls and fused_calls[-1][1] == (3, x.shape[0])  # one Φ and per-point weights per class
    assert_unfused_path_agrees(monkeypatch, model, x, targets, value, grads)


def test_batched_regression_model_equals_the_unfused_path(fused_calls, monkeypatch):
    x, y = data()
    targets = torch.stack((y, y.flip(0)))
    batch = torch.Size([2])
    kernel = NystromKernel(ScaleKernel(RBFKernel(batch_shape=batch), batch_shape=batch), x[:8] + 0.05)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch)
    model = ExactGPModel(x, targets, likelihood, kernel, gpytorch.means.ZeroMean(batch_shape=batch)).to(DTYPE)
    with torch.no_grad():
        kernel.base_kernel.base_kernel.lengthscale = torch.tensor([0.6, 1.2], dtype=DTYPE).view(2, 1, 1)
    value, grads = mll_and_grads(model, x, targets)
    assert fused_calls
    assert_unfused_path_agrees(monkeypatch, model, x, targets, value, grads)


@pytest.mark.parametrize("form", ["scale", "inside"])
def test_second_derivatives_equal_the_unfused_path(form, fused_calls, monkeypatch):
    x, y = data(n=40)
    model = nystrom_model(x, y, form, learn_landmarks=False)
    params = [p for p in model.parameters() if p.requires_grad]

    def hessian_rows():
        _, grads = mll_and_grads(model, x, y, create_graph=True)
        flat = torch.cat([g.reshape(-1) for g in grads])
        return torch.stack([torch.cat([h.reshape(-1) for h in torch.autograd.grad(flat[i], params, retain_graph=True)])
                            for i in range(flat.numel())])

    hessian = hessian_rows()
    assert fused_calls and hessian.abs().max() > 1e-3
    unfused(monkeypatch)
    torch.testing.assert_close(hessian, hessian_rows(), rtol=1e-8, atol=1e-9)


def test_posterior_equals_the_unfused_path(monkeypatch):
    x, y = data()
    test = torch.linspace(-2, 2, 7, dtype=DTYPE).unsqueeze(-1).expand(7, 2)

    def posterior():
        model = nystrom_model(x, y, "scale")
        model.eval()
        with torch.no_grad():
            out = model(test)
            return out.mean, out.variance

    mean, variance = posterior()
    unfused(monkeypatch)
    expected_mean, expected_variance = posterior()
    torch.testing.assert_close(mean, expected_mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(variance, expected_variance, rtol=1e-12, atol=1e-12)


def test_kernel_space_path_reads_the_dense_features(fused_calls):
    x, y = data(n=12)  # N ≤ M: the N × N path, no feature statistics
    kernel = rfgp.sketch(ScaleKernel(RBFKernel()).to(DTYPE), 16, method="nystrom", x_sample=torch.cat([x, x + 0.1]),
                         seed=0)
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(DTYPE)
    noise = DiagLinearOperator(model.likelihood.noise.expand(12))
    assert (kernel(x).evaluate_kernel() + noise).uses_kernel_space()
    value, _ = mll_and_grads(model, x, y)
    assert not fused_calls
    covar = kernel(x).to_dense() + model.likelihood.noise * torch.eye(12, dtype=DTYPE)
    dense = torch.distributions.MultivariateNormal(model.mean_module(x), covar).log_prob(y) / 12
    torch.testing.assert_close(value, dense, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- chunked


@pytest.fixture
def chunked_calls(monkeypatch):
    """Counts the chunked Function's calls."""
    calls = []
    apply = module._ChunkedTriangularStatistics.apply

    def counting(*args):
        calls.append(args[3].shape)  # weights
        return apply(*args)

    monkeypatch.setattr(module._ChunkedTriangularStatistics, "apply", counting)
    return calls


def chunked_mll(model, x, y, size, create_graph=False):
    with rfgp.settings.chunk_size(size):
        return mll_and_grads(model, x, y, create_graph)


@pytest.mark.parametrize("form", ["scale", "inside"])
@pytest.mark.parametrize("noise", ["uniform", "fixed", "learned"])
def test_chunked_statistics_equal_unchunked_and_chunked_autograd(form, noise, chunked_calls, monkeypatch):
    x, y = data(n=70)
    per_point = 0.02 + 0.1 * torch.rand(x.shape[0], generator=torch.Generator().manual_seed(3), dtype=DTYPE)
    likelihood = {"uniform": None,
                  "fixed": gpytorch.likelihoods.FixedNoiseGaussianLikelihood(per_point),
                  "learned": gpytorch.likelihoods.FixedNoiseGaussianLikelihood(per_point, learn_additional_noise=True)}
    model = nystrom_model(x, y, form, likelihood[noise])
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    value, grads = chunked_mll(model, x, y, 16)
    assert chunked_calls, "the chunked Nyström MLL did not take the chunked triangular statistics"
    expected = {"unchunked": mll_and_grads(model, x, y)}
    monkeypatch.setattr(NystromKernel, "featurizer", FeatureKernelFeaturizer)
    count = len(chunked_calls)
    expected["chunked autograd"] = chunked_mll(model, x, y, 16)
    assert len(chunked_calls) == count
    for path, (expected_value, expected_grads) in expected.items():
        torch.testing.assert_close(value, expected_value, rtol=1e-12, atol=1e-12, msg=path)
        for name, g, e in zip(names, grads, expected_grads):
            torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-10, msg=f"{path}: {name}")


def FeatureKernelFeaturizer(kernel, x, reuse_shape=False):
    """FeatureKernel's featurizer: Φ recomputed per chunk with autograd through the solve (the unfused chunked path)."""
    return rfgp.kernels.FeatureKernel.featurizer(kernel, x, reuse_shape)


def test_chunked_batched_dirichlet_and_second_derivatives(chunked_calls, monkeypatch):
    x, _ = data(n=50)
    model, targets = dirichlet_nystrom_model(x)
    value, grads = chunked_mll(model, x, targets, 12)
    assert chunked_calls and chunked_calls[-1] == (3, x.shape[0])
    expected_value, expected_grads = mll_and_grads(model, x, targets)
    torch.testing.assert_close(value, expected_value, rtol=1e-12, atol=1e-12)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-10)
    names, params = zip(*[(n, p) for n, p in model.named_parameters() if p.requires_grad])
    row = names.index("covar_module.base_kernel.base_kernel.raw_lengthscale")

    def hessian_row(size):  # the outputscale rows: tests/inference/test_chunked.py
        _, first = chunked_mll(model, x, targets, size, create_graph=True)
        return torch.cat([h.reshape(-1) for h in torch.autograd.grad(first[row].sum(), params, allow_unused=True,
                                                                      materialize_grads=True)])

    torch.testing.assert_close(hessian_row(12), hessian_row(None), rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("size", [None, 16])
def test_gradient_reaches_differentiable_inputs(size, fused_calls, chunked_calls, monkeypatch):
    """x computed by a differentiable map (deep kernel learning): x̄ through K̄, unchunked and chunked."""
    x, y = data(n=50)
    warp = torch.tensor([[1.0, 0.3], [-0.2, 0.8]], dtype=DTYPE, requires_grad=True)
    model = nystrom_model(x, y, "inside")
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)

    def warp_grad():
        with rfgp.settings.chunk_size(size):
            inputs = x @ warp
            model.set_train_data(inputs, y, strict=False)
            return torch.autograd.grad(mll(model(inputs), y), warp)[0]

    grad = warp_grad()
    assert (fused_calls if size is None else chunked_calls)
    monkeypatch.setattr(NystromKernel, "feature_root", NystromKernel.featurize)
    monkeypatch.setattr(NystromKernel, "featurizer", FeatureKernelFeaturizer)
    torch.testing.assert_close(grad, warp_grad(), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("per_point", [False, True], ids=["uniform", "per-point"])
def test_chunked_statistics_differentiate_the_weights_and_targets_alone(per_point):
    """Before: a chunked Nyström root whose K and L need no gradient (a frozen kernel, only the noise trained) raised
    ``TypeError: Value after * must be an iterable, not NoneType`` in the backward for uniform weights (K̄'s factors
    were skipped, K̄ still asked for).  Now w̄ and R̄ are those of autograd through the unchunked statistics."""
    cross, chol, weights, rhs = (v.detach() for v in factors(per_point=per_point))
    weights.requires_grad_(), rhs.requires_grad_()
    # the inputs are row numbers: K(x_c) is a slice of K
    featurizer = module.TriangularFeaturizer(lambda rows: cross[rows[:, 0].long()], lambda: chol, (), chol.shape[-1],
                                             torch.Size())
    inputs = torch.arange(cross.shape[0], dtype=DTYPE).unsqueeze(-1)
    gram, projection = module.chunked_triangular_statistics(featurizer, inputs, weights, rhs, 16)
    grads = torch.autograd.grad(gram.square().sum() + projection.sum(), (weights, rhs))
    gram, projection = autograd(cross, chol, weights, rhs)
    expected = torch.autograd.grad(gram.square().sum() + projection.sum(), (weights, rhs))
    for grad, want in zip(grads, expected):
        torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-10)
