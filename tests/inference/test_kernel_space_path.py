"""The kernel-space (N × N) path gives the feature-space path's MLL, gradients and posterior, and is chosen by flop count."""

import gpytorch
import pytest
import torch
from gpytorch.likelihoods import FixedNoiseGaussianLikelihood, GaussianLikelihood

import rfgp
from rfgp.inference import kernel_space, operators
from rfgp.inference.kernel_space import prefers_kernel_space
from rfgp.kernels import SketchedRBFKernel
from rfgp.likelihoods import DirichletClassificationLikelihood
from rfgp.models import ExactGPModel

F64 = torch.float64
TIGHT = {"rtol": 1e-9, "atol": 1e-11}


def _data(n=40, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=F64)
    return x, torch.sin(4 * x).sum(-1) + 0.1 * torch.randn(n, generator=g, dtype=F64)


@pytest.fixture
def feature_space_only(monkeypatch):
    """Force the F × F capacitance path on every operator (the reference)."""

    def force():
        monkeypatch.setattr(operators.FeatureRootAddedDiagLinearOperator, "uses_kernel_space",
                            lambda self, statistics_batch=None: False)

    return force


def _mll_and_gradients(model, x, y):
    model.train()
    model.zero_grad()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    loss = mll(model(x), y).sum()
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _posterior(model, x_test):
    model.eval()
    with torch.no_grad():
        posterior = model(x_test)
        return posterior.mean, posterior.covariance_matrix, model.prediction_strategy.uses_kernel_space


def _compare(build, x, y, x_test, feature_space_only):
    fast = build()
    value, grads = _mll_and_gradients(fast, x, y)
    mean, covar, used = _posterior(fast, x_test)
    assert used, "the kernel-space path was not selected"
    feature_space_only()
    reference = build()
    ref_value, ref_grads = _mll_and_gradients(reference, x, y)
    ref_mean, ref_covar, ref_used = _posterior(reference, x_test)
    assert not ref_used
    torch.testing.assert_close(value, ref_value, **TIGHT)
    assert grads.keys() == ref_grads.keys() and len(grads) >= 3
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **TIGHT, msg=name)
    torch.testing.assert_close(mean, ref_mean, **TIGHT)
    torch.testing.assert_close(covar, ref_covar, **TIGHT)
    return covar


def test_regression_matches_feature_space(feature_space_only):
    x, y = _data()

    def build():
        kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, seed=0, ard_num_dims=2))
        model = ExactGPModel(x, y, GaussianLikelihood(), kernel).to(F64)
        kernel.outputscale, kernel.base_kernel.lengthscale, model.likelihood.noise = 1.7, 0.3, 0.05
        return model

    _compare(build, x, y, torch.rand(7, 2, dtype=F64), feature_space_only)


def test_heteroscedastic_noise_and_batched_kernel_match_feature_space(feature_space_only):
    x, y = _data()
    noise = torch.linspace(0.01, 0.2, x.shape[0], dtype=F64)
    targets = torch.stack([y, y.flip(0)])

    def build():
        kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, seed=1, batch_shape=torch.Size([2])),
                                              batch_shape=torch.Size([2]))
        mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([2]))
        model = ExactGPModel(x, targets, FixedNoiseGaussianLikelihood(noise, batch_shape=torch.Size([2])),
                             kernel, mean).to(F64)
        kernel.outputscale = torch.tensor([0.7, 1.4])
        kernel.base_kernel.lengthscale = torch.tensor([0.2, 0.5]).view(2, 1, 1)
        return model

    _compare(build, x, targets, torch.rand(5, 2, dtype=F64), feature_space_only)


def test_dirichlet_shared_features_match_feature_space(feature_space_only):
    x, _ = _data(n=30)
    labels = (x[:, 0] > 0.5).long() + (x[:, 1] > 0.5).long()

    def build():
        likelihood = DirichletClassificationLikelihood(labels, num_classes=3, dtype=F64, learn_additional_noise=True)
        kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, seed=2))
        mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([3]))
        model = ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel, mean).to(F64)
        kernel.base_kernel.lengthscale = 0.4
        return model

    targets = build().likelihood.transformed_targets
    _compare(build, x, targets, torch.rand(6, 2, dtype=F64), feature_space_only)


def test_bias_correction_is_added_identically(feature_space_only):
    x, y = _data(n=30)
    x_test = 3 * torch.rand(6, 2, dtype=F64)  # far out, where the truncation bias is large

    def build():
        kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(40, method="maclaurin", seed=0, input_dim=2))
        model = ExactGPModel(x, y, GaussianLikelihood(), kernel).to(F64)
        kernel.base_kernel.lengthscale = 0.5
        return model

    _compare(build, x, y, x_test, feature_space_only)
    model = build()
    _posterior(model, x_test)
    correction = model.covar_module.base_kernel.variance_correction(x_test / 0.5)
    assert bool((correction > 1e-3).any()), correction  # the check is not vacuous


def test_selection_rule_by_flop_count():
    assert prefers_kernel_space(1000, 2048) and prefers_kernel_space(512, 512)
    assert not prefers_kernel_space(1000, 512)
    # N²F + N³/3 = 2.56e8 > NF² + F³/3 = 2.02e8 for one GP ...
    assert not prefers_kernel_space(600, 512)
    # ... but with 10 heteroscedastic batch members sharing Φ, the feature path forms 10 Grams
    assert prefers_kernel_space(600, 512, feature_batch=1, solve_batch=10, statistics_batch=10)


def test_copies_of_one_feature_matrix_count_once(feature_space_only):
    """T = 8 targets of one unbatched kernel under per-point noise: GPyTorch expands Φ to the targets' batch (stride
    0), and the N × N path forms its Gram once, the F × F path 8 statistics.  N = 60 > F = 50: N²F + 8·N³/3 = 7.6·10⁵
    against 8·NF² + 8·F³/3 = 1.5·10⁶ flops, so the kernel space is chosen — with the same MLL, gradients and posterior.
    Before: Φ counted per copy (8·N²F), the F × F path (8 copies of Φ at N = 600, F = 512: twice the flops)."""
    x, y = _data(n=60)
    targets = torch.stack([y * (1 + 0.1 * t) for t in range(8)])
    noise = torch.linspace(0.01, 0.2, 8 * 60, dtype=F64).reshape(8, 60)
    batch = torch.Size([8])

    def build():
        mean = gpytorch.means.ConstantMean(batch_shape=batch)
        model = ExactGPModel(x, targets, FixedNoiseGaussianLikelihood(noise, batch_shape=batch),
                             gpytorch.kernels.ScaleKernel(SketchedRBFKernel(50, seed=0)), mean).to(F64)
        model.covar_module.base_kernel.lengthscale = 0.3
        return model

    model = build()
    covar = model.likelihood(model(x)).lazy_covariance_matrix.evaluate_kernel()
    features = covar._linear_op.scaled_features()[0]
    assert features.shape[:-2] == batch and features.stride(0) == 0  # the copies this test is about
    assert prefers_kernel_space(60, 50, feature_batch=1, solve_batch=8, statistics_batch=8)
    assert not prefers_kernel_space(60, 50, feature_batch=8, solve_batch=8, statistics_batch=8)
    assert covar.uses_kernel_space()
    _compare(build, x, targets, torch.rand(5, 2, dtype=F64), feature_space_only)


@pytest.mark.parametrize("per_copy_noise", [False, True], ids=["shared_noise", "noise_per_copy"])
def test_the_posterior_factor_forms_one_gram_for_copies_of_one_feature_matrix(per_copy_noise, monkeypatch):
    """kernel_cholesky (posterior caches, leave-one-out, BoTorch's pathwise update) forms the Gram of a Φ expanded to
    8 copies once, and factorises once where the noise is shared too: the same factors, of the batch's shape.
    Before: 8 Grams and 8 factorisations (0.28 s against 0.04 s at N = 600, F = 512, one thread)."""
    g = torch.Generator().manual_seed(0)
    phi = torch.randn(30, 20, generator=g, dtype=F64) / 20**0.5
    noise = torch.rand(8, 30, generator=g, dtype=F64) + 0.05 if per_copy_noise else torch.full((30,), 0.1, dtype=F64)
    seen = []
    gram = kernel_space.kernel_gram
    monkeypatch.setattr(kernel_space, "kernel_gram", lambda features: seen.append(features.shape) or gram(features))
    chol = kernel_space.kernel_cholesky(phi.expand(8, 30, 20), noise)
    assert seen == [torch.Size([1, 30, 20])] and chol.shape == (8, 30, 30)
    torch.testing.assert_close(chol, torch.linalg.cholesky(phi @ phi.T + torch.diag_embed(noise)).expand(8, 30, 30))


@pytest.mark.parametrize("n, expected", [(40, True), (200, False)])
def test_operator_selects_the_path_automatically(n, expected, monkeypatch):
    x, y = _data(n=n)
    calls = []
    original = operators.kernel_space_inv_quad_logdet
    monkeypatch.setattr(operators, "kernel_space_inv_quad_logdet", lambda *a: calls.append(1) or original(*a))
    model = ExactGPModel(x, y, GaussianLikelihood(),
                         gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, seed=0))).to(F64)
    _mll_and_gradients(model, x, y)
    assert bool(calls) == expected


def test_chunked_and_distributed_operators_stay_in_feature_space():
    x, y = _data()
    model = ExactGPModel(x, y, GaussianLikelihood(), gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, seed=0)))
    model = model.to(F64)
    with rfgp.settings.chunk_size(16):
        value, _ = _mll_and_gradients(model, x, y)
        _, _, used = _posterior(model, x[:3])
    assert not used
    plain, _ = _mll_and_gradients(model, x, y)
    torch.testing.assert_close(value, plain, **TIGHT)


def test_kernel_cholesky_matches_dense():
    g = torch.Generator().manual_seed(0)
    features = torch.randn(2, 30, 50, generator=g, dtype=F64)
    noise = torch.rand(30, generator=g, dtype=F64) + 0.1
    chol = kernel_space.kernel_cholesky(features, noise, torch.tensor([1.0, 2.0], dtype=F64))
    dense = torch.stack([features[0] @ features[0].T, 2 * features[1] @ features[1].T]) + torch.diag(noise)
    torch.testing.assert_close(chol @ chol.mT, dense, **TIGHT)


def _dense_inv_quad_logdet(features, noise, rhs, scale):
    covar = scale[..., None, None] * (features @ features.mT) + torch.diag_embed(noise)
    inv_quad = None if rhs is None else (rhs * torch.linalg.solve(covar, rhs.expand(*covar.shape[:-1], -1))).sum(-2)
    return inv_quad, torch.logdet(covar)


@pytest.mark.parametrize("width", [None, 1, 3])
@pytest.mark.parametrize("logdet", [True, False])
@pytest.mark.parametrize("shapes", [((), (), ()), ((), (3,), (3,)), ((2,), (2,), ()), ((3,), (3,), (1,))],
                         ids=["plain", "shared-features", "batched", "scale-broadcast"])
def test_inv_quad_logdet_and_gradients_match_dense(width, logdet, shapes):
    """Values and first derivatives (the lean backward) equal autograd through dense K = sΦΦᵀ + D."""
    if width is None and not logdet:
        pytest.skip("nothing asked")
    (feature_batch, noise_batch, scale_batch), g = shapes, torch.Generator().manual_seed(1)
    features = torch.randn(*feature_batch, 7, 11, generator=g, dtype=F64, requires_grad=True)
    noise = (torch.rand(*noise_batch, 7, generator=g, dtype=F64) + 0.2).requires_grad_()
    rhs = None if width is None else torch.randn(7, width, generator=g, dtype=F64, requires_grad=True)
    scale = (torch.rand(scale_batch, generator=g, dtype=F64) + 0.5).requires_grad_()
    inputs = [t for t in (features, noise, rhs, scale) if t is not None]
    inv_quad, logdet_term = kernel_space.kernel_space_inv_quad_logdet(features, noise, rhs, logdet, scale)
    dense_quad, dense_logdet = _dense_inv_quad_logdet(features, noise, rhs, scale)
    outputs, expected = [], []
    if width is not None:
        torch.testing.assert_close(inv_quad, dense_quad, **TIGHT)
        outputs.append(inv_quad.sum())
        expected.append(dense_quad.sum())
    if logdet:
        torch.testing.assert_close(logdet_term, dense_logdet, **TIGHT)
        outputs.append(0.7 * logdet_term.sum())
        expected.append(0.7 * dense_logdet.sum())
    grads = torch.autograd.grad(sum(outputs), inputs)
    dense = torch.autograd.grad(sum(expected), inputs)
    for got, want in zip(grads, dense):
        torch.testing.assert_close(got, want, **TIGHT)


def test_mll_solves_without_copying_the_factor(monkeypatch):
    """α = K⁻¹r runs as two triangular solves on the factor (linalg.cholesky_solve), not through torch.cholesky_solve,
    which copies the N × N factor to column-major and, on CPU, runs LAPACK's threaded potrs (7 ms against 0.3 ms at
    N = 1000 on two threads)."""
    def refuse(*args, **kwargs):
        raise AssertionError("torch.cholesky_solve called")

    monkeypatch.setattr(torch, "cholesky_solve", refuse)
    g = torch.Generator().manual_seed(3)
    features = torch.randn(8, 12, generator=g, dtype=F64, requires_grad=True)
    noise, rhs = torch.rand(8, generator=g, dtype=F64) + 0.2, torch.randn(8, 1, generator=g, dtype=F64)
    inv_quad, logdet_term = kernel_space.kernel_space_inv_quad_logdet(features, noise, rhs, True, 1.5)
    (inv_quad.sum() + logdet_term.sum()).backward()
    dense_quad, dense_logdet = _dense_inv_quad_logdet(features, noise, rhs, torch.tensor(1.5, dtype=F64))
    torch.testing.assert_close(inv_quad, dense_quad, **TIGHT)
    torch.testing.assert_close(logdet_term, dense_logdet, **TIGHT)


def test_double_backward_matches_dense():
    g = torch.Generator().manual_seed(2)
    features = torch.randn(6, 9, generator=g, dtype=F64, requires_grad=True)
    noise = (torch.rand(6, generator=g, dtype=F64) + 0.3).requires_grad_()
    rhs = torch.randn(6, 1, generator=g, dtype=F64)
    scale = torch.tensor(1.3, dtype=F64, requires_grad=True)
    direction = torch.randn(6, 9, generator=g, dtype=F64)
    results = []
    for compute in (lambda: kernel_space.kernel_space_inv_quad_logdet(features, noise, rhs, True, scale),
                    lambda: _dense_inv_quad_logdet(features, noise, rhs, scale)):
        inv_quad, logdet_term = compute()
        (grad_features,) = torch.autograd.grad((inv_quad + logdet_term).sum(), features, create_graph=True)
        results.append(torch.autograd.grad((grad_features * direction).sum(), (features, noise, scale)))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, **TIGHT)


def test_multi_output_mll_matches_feature_space(feature_space_only, monkeypatch):
    from gpytorch.likelihoods import MultitaskGaussianLikelihood

    from rfgp.kernels import SketchedCurlFreeKernel

    x, y = _data(n=20)
    field = torch.stack([y, y.flip(0)], -1)

    def build():
        kernel = gpytorch.kernels.ScaleKernel(SketchedCurlFreeKernel(128, 2, seed=0))
        likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=0)
        model = rfgp.MultiOutputGPModel(x, field, likelihood, kernel).to(F64)
        kernel.base_kernel.lengthscale = 0.4
        return model

    calls = []
    original = operators.kernel_space_inv_quad_logdet
    monkeypatch.setattr(operators, "kernel_space_inv_quad_logdet", lambda *a: calls.append(1) or original(*a))
    value, grads = _mll_and_gradients(build(), x, field)
    assert calls  # N·p = 40 ≤ F = 128
    feature_space_only()
    ref_value, ref_grads = _mll_and_gradients(build(), x, field)
    torch.testing.assert_close(value, ref_value, **TIGHT)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **TIGHT, msg=name)


class _TargetBatchGP(gpytorch.models.ExactGP):
    """T targets over one unbatched kernel: a constant mean per target, one kernel (``rfgp.models.GPRegressor``'s
    multi-target model, GPyTorch's batch-mean recipe)."""

    def __init__(self, x, y, kernel):
        super().__init__(x, y, GaussianLikelihood())
        self.mean = gpytorch.means.ConstantMean(batch_shape=y.shape[:-1])
        self.covar = kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean(x), self.covar(x))


@pytest.mark.parametrize("num_data", [48, 600])  # kernel space (N ≤ F), feature space (N > F)
def test_targets_of_one_kernel_share_its_gram(num_data):
    """A batch of T targets over one unbatched kernel is T independent GPs with one kernel and one noise: its
    marginal likelihood and gradients are the sums of the T single-target models', and ΦΦᵀ (kernel space) or ΦᵀΦ
    (feature space) is formed once, not once per target (the likelihood's noise expands Φ to the targets' batch)."""
    from torch.utils.flop_counter import FlopCounterMode

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(num_data, 2, generator=gen, dtype=torch.float64)
    y = torch.sin(3 * x).sum(-1) + 0.3 * torch.randn(4, num_data, generator=gen, dtype=torch.float64)

    constants = torch.linspace(-0.5, 0.5, 4, dtype=torch.float64)

    def loss_and_grads(targets, constant):
        kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(256, ard_num_dims=2, seed=0))
        model = _TargetBatchGP(x, targets, kernel).double()
        with torch.no_grad():
            model.mean.constant.copy_(constant.view_as(model.mean.constant))
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        with FlopCounterMode(display=False) as counter:
            loss = -mll(model(x), targets).sum() * num_data
            loss.backward()
        grads = {name: p.grad for name, p in model.named_parameters() if name != "mean.raw_constant"}
        return loss.detach(), grads, counter.get_total_flops()

    loss, grads, flops = loss_and_grads(y, constants)
    singles = [loss_and_grads(y[t], constants[t]) for t in range(4)]
    torch.testing.assert_close(loss, sum(s[0] for s in singles), rtol=1e-10, atol=1e-9)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, sum(s[1][name] for s in singles), rtol=1e-8, atol=1e-9)
    assert flops < 0.6 * sum(s[2] for s in singles)
