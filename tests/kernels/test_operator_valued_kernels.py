"""Exact and ORFF operator-valued kernels: closed forms, layout, convergence, unbiasedness, PSD, state."""

import math

import gpytorch
import pytest
import torch

import rfgp
from rfgp.features.operator_valued import OperatorValuedFourierFeatures, divergence_free_factor
from rfgp.kernels import (
    CurlFreeRBFKernel,
    DecomposableKernel,
    DivFreeRBFKernel,
    MultiOutputFeatureSumKernel,
    SketchedCurlFreeKernel,
    SketchedDecomposableKernel,
    SketchedDivFreeKernel,
    SketchedRBFKernel,
)

F64 = torch.float64
EXACT = {"curl": CurlFreeRBFKernel, "div": DivFreeRBFKernel}
SKETCHED = {"curl": SketchedCurlFreeKernel, "div": SketchedDivFreeKernel}


def _k0(delta, lengthscale):
    return torch.exp(-0.5 * ((delta / lengthscale) ** 2).sum())


@pytest.mark.parametrize("d", [2, 3, 4])
def test_exact_kernels_are_hessians_of_the_rbf(d):
    """K_curl = −∇∇ᵀk₀ and K_div = (∇∇ᵀ − ΔI)k₀ at random pairs, ARD lengthscales (autograd Hessian)."""
    torch.manual_seed(d)
    lengthscale = torch.rand(d, dtype=F64) + 0.5
    curl = CurlFreeRBFKernel(d, ard_num_dims=d).to(F64)
    div = DivFreeRBFKernel(d, ard_num_dims=d).to(F64)
    for kernel in (curl, div):
        kernel.initialize(lengthscale=lengthscale)
        lengthscale = kernel.lengthscale.detach()[0]
    x, y = torch.randn(1, d, dtype=F64), torch.randn(1, d, dtype=F64)
    hessian = torch.autograd.functional.hessian(lambda t: _k0(t, lengthscale), (x - y)[0])
    laplacian = torch.trace(hessian)
    torch.testing.assert_close(curl(x, y).to_dense(), -hessian, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(div(x, y).to_dense(), hessian - laplacian * torch.eye(d, dtype=F64), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("d", [2, 3])
def test_closed_form_identities(d):
    torch.manual_seed(0)
    curl, div = CurlFreeRBFKernel(d).to(F64), DivFreeRBFKernel(d).to(F64)
    for kernel in (curl, div):
        kernel.lengthscale = 0.7
    ell2 = curl.lengthscale.item() ** 2
    x = torch.randn(5, d, dtype=F64)
    eye = torch.eye(d, dtype=F64)
    torch.testing.assert_close(curl(x[:1]).to_dense(), eye / ell2)
    torch.testing.assert_close(div(x[:1]).to_dense(), (d - 1) * eye / ell2)
    # Helmholtz: K_curl + K_div = −Δk₀ I = (d − ‖δ‖²/ℓ²)/ℓ² k₀ I, block by block.
    delta = x[:1] - x[1:2]
    k0 = torch.exp(-0.5 * delta.pow(2).sum() / ell2)
    total = curl(x[:1], x[1:2]).to_dense() + div(x[:1], x[1:2]).to_dense()
    torch.testing.assert_close(total, (d - delta.pow(2).sum() / ell2) / ell2 * k0 * eye)
    if d == 2:  # K_div = R K_curl Rᵀ
        rotation = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=F64)
        block = curl(x[:1], x[1:2]).to_dense()
        torch.testing.assert_close(div(x[:1], x[1:2]).to_dense(), rotation @ block @ rotation.T)


def test_interleaving_matches_gpytorch_multitask_convention():
    """Entry [i·p + s, j·p + t] = K(xᵢ, yⱼ)[s, t], exactly as MultitaskKernel/IndexKernel."""
    torch.manual_seed(0)
    base = gpytorch.kernels.RBFKernel().to(F64)
    decomposable = DecomposableKernel(base, num_outputs=3, rank=2).to(F64)
    decomposable.task_covar_module.covar_factor.data.normal_()
    reference = gpytorch.kernels.MultitaskKernel(base, num_tasks=3, rank=2).to(F64)
    reference.task_covar_module.load_state_dict(decomposable.task_covar_module.state_dict())
    x, y = torch.randn(4, 2, dtype=F64), torch.randn(5, 2, dtype=F64)
    torch.testing.assert_close(decomposable(x, y).to_dense(), reference(x, y).to_dense())
    # Curl-free: block (i, j) of the matrix is the p × p kernel at (xᵢ, yⱼ).
    curl = CurlFreeRBFKernel(2).to(F64)
    full = curl(x, y).to_dense()
    for i, j in [(0, 0), (1, 3), (3, 4)]:
        torch.testing.assert_close(full[2 * i : 2 * i + 2, 2 * j : 2 * j + 2], curl(x[i : i + 1], y[j : j + 1]).to_dense())
    # and the sketched root uses the same order
    sketched = SketchedCurlFreeKernel(64, 2, seed=0).to(F64)
    root = sketched(x).evaluate_kernel().root.to_dense()
    phi = sketched.feature_map(x / sketched.lengthscale, sketched.lengthscale)
    torch.testing.assert_close(root[2 * 1 + 1], phi[1, 1])


@pytest.mark.parametrize("family", ["curl", "div"])
def test_diag_mode_matches_full_matrix(family):
    torch.manual_seed(1)
    x = torch.randn(6, 3, dtype=F64)
    for kernel in (EXACT[family](3, ard_num_dims=3), SKETCHED[family](128, 3, seed=2)):
        kernel = gpytorch.kernels.ScaleKernel(kernel).to(F64)
        kernel.outputscale = 1.7
        torch.testing.assert_close(kernel(x, diag=True), kernel(x).to_dense().diagonal())


def test_divergence_free_factor_squares_to_the_fourier_factor():
    """B Bᵀ = ‖ω‖²I − ωωᵀ and ωᵀB = 0 (the corrected factor; the supplement's is indefinite)."""
    torch.manual_seed(0)
    for d in (2, 3, 5):
        w = torch.randn(50, d, dtype=F64) * 2.0
        factor = divergence_free_factor(w)
        target = w.pow(2).sum(-1)[:, None, None] * torch.eye(d, dtype=F64) - w[:, :, None] * w[:, None, :]
        torch.testing.assert_close(factor @ factor.mT, target, atol=1e-12, rtol=1e-12)
        assert (w.unsqueeze(-2) @ factor).abs().max() < 1e-12
        # The supplement's literal I − ωωᵀ has negative eigenvalues for ‖ω‖ > 1: not a square.
        literal = torch.eye(d, dtype=F64) - w[:, :, None] * w[:, None, :]
        assert (torch.linalg.eigvalsh(literal).min(-1).values < 0).any()
    zero = divergence_free_factor(torch.zeros(1, 3, dtype=F64))
    assert torch.equal(zero, torch.zeros_like(zero))


def _pair(family, d, num_features, method, seed, lengthscale=0.8):
    exact = EXACT[family](d).to(F64)
    exact.lengthscale = lengthscale
    sketched = rfgp.sketch(exact, num_features, method=method, seed=seed).to(F64)
    return exact, sketched


def _decomposable_pair(num_features, method, seed):
    exact = DecomposableKernel(gpytorch.kernels.RBFKernel(), num_outputs=3, rank=1).to(F64)
    exact.task_covar_module.covar_factor.data = torch.tensor([[1.0], [0.5], [-0.7]], dtype=F64)
    exact.base_kernel.lengthscale = 0.8
    return exact, rfgp.sketch(exact, num_features, method=method, seed=seed).to(F64)


# The decomposable kernel inherits its scalar sketch; the core's SORF is biased in d = 3
# (paper 002 Lemma 5), so it is checked with the unbiased samplers only.
@pytest.mark.parametrize(
    "family, method",
    [(f, m) for f in ("curl", "div") for m in ("rff", "orf", "sorf")] + [("decomposable", "rff"), ("decomposable", "orf")],
)
def test_gram_error_decays_like_one_over_sqrt_features(family, method):
    """Relative Frobenius error of the (n·p) × (n·p) Gram: log-log slope in [−0.65, −0.35]."""
    torch.manual_seed(0)
    d = 3
    x = torch.randn(8, d, dtype=F64) * 0.6
    sizes = [64, 256, 1024, 4096]
    errors = []
    for size in sizes:
        trial = []
        for seed in range(6):
            if family == "decomposable":
                exact, sketched = _decomposable_pair(size // 4, method, seed)  # root width = size
            else:
                exact, sketched = _pair(family, d, size, method, seed)
            with torch.no_grad():
                target = exact(x).to_dense()
                trial.append(((sketched(x).to_dense() - target).norm() / target.norm()).item())
        errors.append(sum(trial) / len(trial))
    slope = torch.linalg.lstsq(
        torch.stack([torch.log(torch.tensor(sizes, dtype=F64)), torch.ones(4, dtype=F64)], -1),
        torch.log(torch.tensor(errors, dtype=F64)).unsqueeze(-1),
    ).solution[0].item()
    assert -0.65 <= slope <= -0.35, (errors, slope)
    assert errors[-1] < 0.1


@pytest.mark.parametrize("family", ["curl", "div"])
def test_sketched_kernel_is_unbiased(family):
    """Mean over 300 seeds of K̂(x, y) matches K(x, y) within 4 standard errors, entry by entry."""
    torch.manual_seed(3)
    d = 3
    x = torch.randn(2, d, dtype=F64) * 0.5
    draws = []
    for seed in range(300):
        exact, sketched = _pair(family, d, 16, "rff", seed)
        with torch.no_grad():
            draws.append(sketched(x[:1], x[1:]).to_dense())
    draws = torch.stack(draws)
    with torch.no_grad():
        target = exact(x[:1], x[1:]).to_dense()
    stderr = draws.std(0) / math.sqrt(draws.shape[0])
    assert ((draws.mean(0) - target).abs() <= 4 * stderr + 1e-12).all()


@pytest.mark.parametrize("family", ["curl", "div"])
def test_sketched_gram_is_psd_and_low_rank(family, dtype):
    torch.manual_seed(0)
    kernel = SKETCHED[family](64 if family == "curl" else 128, 3, seed=0).to(dtype)
    x = torch.randn(40, 3, dtype=dtype)
    covar = kernel(x).evaluate_kernel()
    assert isinstance(covar, rfgp.FeatureRootLinearOperator)
    assert covar.root.shape == (120, kernel.num_features)
    eig = torch.linalg.eigvalsh(covar.to_dense().double())
    assert eig.min() > -1e-4 * eig.max()
    exact = EXACT[family](3).to(dtype)
    assert torch.linalg.eigvalsh(exact(x[:15]).to_dense().double()).min() > -1e-6


def test_sketched_kernels_follow_dtype():
    x32 = torch.randn(5, 2)
    for kernel in (SketchedCurlFreeKernel(32, 2, seed=0), SketchedDivFreeKernel(32, 2, seed=0, method="sorf")):
        assert kernel(x32).to_dense().dtype == torch.float32
        assert kernel.double()(x32.double()).to_dense().dtype == torch.float64


def test_state_dict_round_trip_is_bit_exact():
    torch.manual_seed(0)
    x = torch.randn(7, 3, dtype=F64)
    makers = [
        lambda seed: SketchedCurlFreeKernel(64, 3, method="orf", seed=seed),
        lambda seed: SketchedDivFreeKernel(64, 3, method="sorf", seed=seed),
        lambda seed: SketchedDecomposableKernel(SketchedRBFKernel(32, seed=seed), num_tasks=2, rank=1),
    ]
    for make in makers:
        source = make(1).to(F64)
        for name, param in source.named_parameters():
            param.data.add_(0.3 * torch.randn_like(param))
        expected = source(x).to_dense()
        target = make(99).to(F64)
        assert not torch.equal(target(x).to_dense(), expected)
        target.load_state_dict(source.state_dict())
        assert torch.equal(target(x).to_dense(), expected)


def test_converters_copy_hyperparameters():
    exact = gpytorch.kernels.ScaleKernel(CurlFreeRBFKernel(2, ard_num_dims=2)).to(F64)
    exact.initialize(outputscale=2.5)
    exact.base_kernel.initialize(lengthscale=torch.tensor([0.4, 0.9]))
    sketched = rfgp.sketch(exact, 256, method="orf", seed=0).to(F64)
    assert isinstance(sketched.base_kernel, SketchedCurlFreeKernel) and sketched.base_kernel.method == "orf"
    torch.testing.assert_close(sketched.base_kernel.lengthscale, exact.base_kernel.lengthscale)
    torch.testing.assert_close(sketched.outputscale, exact.outputscale)
    div = rfgp.sketch(DivFreeRBFKernel(3), 128, seed=0)
    assert isinstance(div, SketchedDivFreeKernel)
    _, decomposable = _decomposable_pair(64, "rff", 0)
    assert isinstance(decomposable, SketchedDecomposableKernel)
    assert decomposable.num_features == 64 * 4
    # The generic gpytorch MultitaskKernel converts too.
    multitask = gpytorch.kernels.MultitaskKernel(gpytorch.kernels.RBFKernel(), num_tasks=2, rank=1)
    assert isinstance(rfgp.sketch(multitask, 64, seed=0), SketchedDecomposableKernel)


def _trained_multitask():
    """An exact MultitaskKernel with non-default hyperparameters (as after training)."""
    exact = gpytorch.kernels.MultitaskKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2), num_tasks=3, rank=1).to(F64)
    exact.data_covar_module.lengthscale = torch.tensor([0.6, 1.3], dtype=F64)
    exact.task_covar_module.covar_factor.data = torch.tensor([[1.0], [0.5], [-0.7]], dtype=F64)
    exact.task_covar_module.var = torch.tensor([0.3, 0.8, 1.5], dtype=F64)
    return exact


def test_multitask_state_dict_loads_into_its_sketch():
    """A trained MultitaskKernel's state loads into a freshly sketched one (user code: build the sketched model,
    copy the exact model's hyperparameters): every key is taken, every hyperparameter arrives, and the sketched
    covariance then converges to the exact one."""
    exact = _trained_multitask()
    x = torch.rand(8, 2, dtype=F64) * 2
    target = exact(x).to_dense().detach()
    errors = {}
    for size in (32, 2048):
        trial = []
        for seed in range(3):
            untrained = gpytorch.kernels.MultitaskKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2), num_tasks=3)
            sketched = rfgp.sketch(untrained.to(F64), size, seed=seed).to(F64)
            result = sketched.load_state_dict(exact.state_dict(), strict=False)
            assert result.unexpected_keys == []
            # only what the exact kernel has not got: rfgp's configuration and the random draws
            assert all(key.split(".")[-1].startswith("config_") or ".feature_map." in key
                       for key in result.missing_keys), result.missing_keys
            parameters = dict(sketched.named_parameters())
            for name, value in exact.named_parameters():
                assert torch.equal(parameters[name], value), name
            torch.testing.assert_close(sketched.data_covar_module.lengthscale, exact.data_covar_module.lengthscale)
            torch.testing.assert_close(sketched.output_covariance, exact.task_covar_module.covar_matrix.to_dense())
            with torch.no_grad():
                trial.append(rfgp.metrics.relative_frobenius_error(sketched(x).to_dense(), target).item())
        errors[size] = sum(trial) / len(trial)
    assert errors[2048] < 0.05 and errors[2048] < 0.4 * errors[32], errors


def test_rank_zero_multitask_kernels_convert_as_independent_outputs():
    """MultitaskKernel(..., rank=0) is GPyTorch's A = diag(v) (no covar_factor columns): its sketch has the root
    φ(x) ⊗ diag(√v) of width F·p, also inside an LCMKernel, and DecomposableKernel takes rank=0 as MultitaskKernel."""
    exact = gpytorch.kernels.MultitaskKernel(gpytorch.kernels.RBFKernel(), num_tasks=3, rank=0).to(F64)
    exact.task_covar_module.var = torch.tensor([0.5, 1.0, 2.0], dtype=F64)
    lcm = gpytorch.kernels.LCMKernel([gpytorch.kernels.RBFKernel(), gpytorch.kernels.MaternKernel()], num_tasks=3,
                                     rank=[0, 1]).to(F64)
    x = torch.rand(10, 2, dtype=F64, generator=torch.Generator().manual_seed(2)) * 2
    decomposable = DecomposableKernel(gpytorch.kernels.RBFKernel(), num_outputs=3, rank=0).to(F64)
    # widths F_s·(rank + p): the LCM's parts share F = 4096 and have ranks 0 and 1
    for kernel, width in ((exact, 4096 * 3), (lcm, 2048 * 3 + 2048 * 4), (decomposable, 4096 * 3)):
        sketched = rfgp.sketch(kernel, 4096, seed=0)
        assert sketched.num_features == width
        with torch.no_grad():
            target = kernel(x).to_dense()
            assert rfgp.metrics.relative_frobenius_error(sketched(x).to_dense(), target).item() < 0.05
    assert torch.equal(rfgp.sketch(exact, 64).output_covariance, torch.diag(exact.task_covar_module.var))


def _lcm():
    lcm = gpytorch.kernels.LCMKernel([gpytorch.kernels.RBFKernel(ard_num_dims=2), gpytorch.kernels.MaternKernel()],
                                     num_tasks=3, rank=[1, 2]).to(F64)
    with torch.no_grad():
        lcm.covar_module_list[0].data_covar_module.lengthscale = torch.tensor([[0.6, 1.4]], dtype=F64)
        lcm.covar_module_list[1].data_covar_module.lengthscale = 0.9
        for part in lcm.covar_module_list:
            part.task_covar_module.covar_factor.normal_(generator=torch.Generator().manual_seed(3))
    return lcm


@pytest.mark.parametrize("method", ["rff", "nystrom"])
def test_lcm_kernel_converts_to_a_sum_of_decomposable_sketches_with_its_names(method):
    exact = _lcm()
    x = torch.rand(10, 2, dtype=F64, generator=torch.Generator().manual_seed(1)) * 2
    target = exact(x).to_dense().detach()
    options = {"x_sample": x} if method == "nystrom" else {}
    widths = (16, 4096) if method == "rff" else (4, 10)
    errors = []
    for width in widths:
        sketched = rfgp.sketch(exact, width, method=method, seed=0, **options)
        assert isinstance(sketched, rfgp.kernels.SketchedLCMKernel) and sketched.num_tasks == 3
        assert [part.rank for part in sketched.covar_module_list] == [1, 2]
        with torch.no_grad():
            errors.append(rfgp.metrics.relative_frobenius_error(sketched(x).to_dense(), target).item())
    assert errors[1] < errors[0] / 4 and errors[1] < (0.05 if method == "rff" else 1e-6), errors
    fresh = rfgp.sketch(gpytorch.kernels.LCMKernel([gpytorch.kernels.RBFKernel(ard_num_dims=2),
                                                    gpytorch.kernels.MaternKernel()], num_tasks=3, rank=[1, 2]),
                        64, seed=1).to(F64)
    result = fresh.load_state_dict(exact.state_dict(), strict=False)
    assert result.unexpected_keys == []
    parameters = dict(fresh.named_parameters())
    for name, value in exact.named_parameters():
        assert torch.equal(parameters[name], value), name


def test_sketched_decomposable_kernel_has_multitask_kernel_names():
    exact = _trained_multitask()
    sketched = rfgp.sketch(exact, 64, seed=0)
    assert isinstance(sketched.data_covar_module, SketchedRBFKernel)
    assert sketched.num_tasks == sketched.num_outputs == 3 and sketched.rank == 1
    assert sketched.base_kernel is sketched.data_covar_module  # the former name, an alias, not a second submodule
    assert [name for name, _ in sketched.named_children()] == ["data_covar_module", "task_covar_module"]
    keys = set(sketched.state_dict())
    assert {key.split(".")[0] for key in keys} == {"data_covar_module", "task_covar_module", "config_type",
                                                    "config_num_outputs", "config_rank"}
    assert {k for k in exact.state_dict() if "constraint" not in k} <= keys
    with pytest.raises(AttributeError):
        sketched.num_outputs = 2
    with pytest.raises(AttributeError, match="data_covar_module"):
        sketched.base_kernel = SketchedRBFKernel(16)
    # GPyTorch's constructor signature, positional and by keyword
    prior = gpytorch.priors.LKJCovariancePrior(2, 1.0, gpytorch.priors.SmoothedBoxPrior(0.1, 2.0))
    built = SketchedDecomposableKernel(data_covar_module=SketchedRBFKernel(16), num_tasks=2, rank=2,
                                       task_covar_prior=prior)
    assert built.num_tasks == 2 and built.task_covar_module.covar_factor.shape == (2, 2)
    assert [entry[2] for entry in built.named_priors()] == [prior]
    assert SketchedDecomposableKernel(SketchedRBFKernel(16), 4).num_tasks == 4


def test_sketched_decomposable_kernel_batches_its_task_covariance_as_multitask_kernel():
    """SketchedDecomposableKernel(..., batch_shape=b) built one task covariance A shared by the b members where
    GPyTorch's MultitaskKernel(..., batch_shape=b) gives each its own: the drop-in was silently another model, and a
    batched MultitaskKernel's state_dict did not load into it (size mismatch of covar_factor)."""
    batch = torch.Size([2])
    data = SketchedRBFKernel(32, seed=0, batch_shape=batch).to(F64)
    sketched = SketchedDecomposableKernel(data, num_tasks=3, rank=1, batch_shape=batch).to(F64)
    exact = gpytorch.kernels.MultitaskKernel(data, num_tasks=3, rank=1, batch_shape=batch).to(F64)
    assert {name: p.shape for name, p in sketched.named_parameters()} == {
        name: p.shape for name, p in exact.named_parameters()}
    with torch.no_grad():
        exact.task_covar_module.covar_factor.copy_(torch.randn(2, 3, 1, generator=torch.Generator().manual_seed(1)))
    sketched.load_state_dict(exact.state_dict(), strict=False)  # strict=False: rfgp adds its config entries
    x = torch.rand(2, 5, 2, dtype=F64)
    # GPyTorch's MultitaskKernel.forward repeats a batched task covariance over x's batch (2 → 4 members): compare
    # with its entries K(xᵢ, xⱼ)·A[s, t] at [i·p + s, j·p + t] instead
    tasks, values = exact.task_covar_module.covar_matrix.to_dense(), data(x).to_dense()
    expected = torch.stack([torch.kron(values[member], tasks[member]) for member in range(2)])
    assert not torch.allclose(tasks[0], tasks[1])
    torch.testing.assert_close(sketched(x).to_dense(), expected)


def test_sketched_decomposable_kernel_accepts_its_former_keywords():
    with pytest.warns(DeprecationWarning, match="num_tasks"):
        kernel = SketchedDecomposableKernel(base_kernel=SketchedRBFKernel(16), num_outputs=2, output_covar_prior=None)
    assert kernel.num_tasks == 2 and isinstance(kernel.data_covar_module, SketchedRBFKernel)
    with pytest.raises(TypeError, match="num_tasks"):
        SketchedDecomposableKernel(SketchedRBFKernel(16), num_tasks=2, num_outputs=2)


def test_sketched_decomposable_state_round_trip_is_bit_exact_and_reads_former_keys():
    torch.manual_seed(0)
    x = torch.randn(6, 2, dtype=F64)
    source = rfgp.sketch(_trained_multitask(), 64, seed=1).to(F64)
    expected = source(x).to_dense()
    state = source.state_dict()
    former = {key.replace("data_covar_module.", "base_kernel.", 1): value for key, value in state.items()}
    for saved in (state, former):  # a state saved by versions that named the data kernel base_kernel
        target = rfgp.sketch(_trained_multitask(), 64, seed=2).to(F64)
        assert not torch.equal(target(x).to_dense(), expected)
        target.load_state_dict(saved)
        assert torch.equal(target(x).to_dense(), expected)
        assert set(target.state_dict()) == set(state)


def test_bad_input_is_rejected_with_clear_messages():
    with pytest.raises(ValueError, match="input_dim must be ≥ 2"):
        CurlFreeRBFKernel(1)
    with pytest.raises(ValueError, match="input_dim must be ≥ 2"):
        SketchedDivFreeKernel(64, 1)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., n, 3\)"):
        CurlFreeRBFKernel(3)(torch.randn(4, 2)).to_dense()
    with pytest.raises(ValueError, match="x1 has 3 input dimensions.*input_dim=2"):
        SketchedCurlFreeKernel(64, 2, seed=0)(torch.randn(4, 3)).to_dense()
    with pytest.raises(ValueError, match="multiple of 2·p' = 4"):
        SketchedDivFreeKernel(66, 3)
    with pytest.raises(ValueError, match="method must be one of"):
        SketchedCurlFreeKernel(64, 2, method="qmc")
    for make in (lambda **kw: CurlFreeRBFKernel(3, **kw), lambda **kw: DivFreeRBFKernel(3, **kw),
                 lambda **kw: SketchedCurlFreeKernel(64, 3, **kw), lambda **kw: SketchedDivFreeKernel(64, 3, **kw)):
        with pytest.raises(ValueError, match="ard_num_dims must be None or input_dim=3, got 2"):
            make(ard_num_dims=2)
        with pytest.raises(ValueError, match=r"active_dims must select input_dim=3 columns, got \[0, 1\]"):
            make(active_dims=[0, 1])
    with pytest.raises(TypeError, match="data_covar_module must be an rfgp feature kernel"):
        SketchedDecomposableKernel(gpytorch.kernels.RBFKernel(), num_tasks=2)
    with pytest.raises(ValueError, match="num_outputs"):
        DecomposableKernel(gpytorch.kernels.RBFKernel(), num_outputs=0)
    with pytest.raises(ValueError, match="family must be one of"):
        OperatorValuedFourierFeatures(64, 2, family="helmholtz")


@pytest.mark.parametrize("family", ["curl", "div"])
def test_ard_lengthscales_reach_the_sketched_factors(family):
    """With ARD, ω = ε/ℓ enters B(ω) too: the sketch converges to the exact ARD kernel, and
    the lengthscale gradient flows through both the projection and the factor."""
    torch.manual_seed(0)
    exact = EXACT[family](3, ard_num_dims=3).to(F64)
    exact.initialize(lengthscale=torch.tensor([0.5, 0.9, 1.4], dtype=F64))
    sketched = rfgp.sketch(exact, 8192 * 2, method="orf", seed=0).to(F64)
    x = torch.randn(6, 3, dtype=F64) * 0.5
    target = exact(x).to_dense().detach()
    approx = sketched(x).to_dense()
    assert ((approx - target).norm() / target.norm()).item() < 0.05
    approx.sum().backward()
    assert sketched.raw_lengthscale.grad.abs().min() > 0


def test_feature_sum_reads_the_outputs_of_components_inside_nested_scale_kernels():
    """Before: a component in ScaleKernel(ScaleKernel(...)) counted as 1 output, so a sum of two such curl- and
    div-free kernels had num_outputs 1 and its 2n × 2n covariance failed in GPyTorch ("likely a bug in GPyTorch"),
    and a mix with a single ScaleKernel was refused as having [1, 2] outputs."""
    scale = gpytorch.kernels.ScaleKernel
    curl, div = SketchedCurlFreeKernel(64, 2, seed=0), SketchedDivFreeKernel(64, 2, seed=1)
    helmholtz = MultiOutputFeatureSumKernel(scale(scale(curl)), scale(scale(div))).to(F64)
    assert helmholtz.num_outputs == 2
    x = torch.randn(5, 2, dtype=F64)
    outer, inner = helmholtz.kernels[0].outputscale, helmholtz.kernels[0].base_kernel.outputscale  # both components'
    root = torch.cat((curl.featurize(x), div.featurize(x)), -1)
    torch.testing.assert_close(helmholtz(x).to_dense(), root @ root.mT * outer * inner)
    assert MultiOutputFeatureSumKernel(scale(scale(curl)), scale(div)).num_outputs == 2
