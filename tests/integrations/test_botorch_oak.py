"""BoTorch's OrthogonalAdditiveKernel in rfgp.sketch: orthogonalised base features against BoTorch's kernel (Monte
Carlo over seeds), gradients, BoTorch's state and priors, inputs outside [0, 1]^d, and a SingleTaskGP + qLogEI loop."""

import pytest
import torch

botorch = pytest.importorskip("botorch")

from botorch.acquisition.logei import qLogExpectedImprovement  # noqa: E402
from botorch.fit import fit_gpytorch_mll  # noqa: E402
from botorch.models import SingleTaskGP  # noqa: E402
from botorch.models.additive_gp import OrthogonalAdditiveGP  # noqa: E402
from botorch.models.kernels.orthogonal_additive_kernel import OrthogonalAdditiveKernel  # noqa: E402
from botorch.optim import optimize_acqf  # noqa: E402
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel  # noqa: E402
from gpytorch.mlls import ExactMarginalLogLikelihood  # noqa: E402
from gpytorch.priors import GammaPrior  # noqa: E402

import rfgp  # noqa: E402
from rfgp.integrations.botorch_oak import SketchedOrthogonalAdditiveKernel  # noqa: E402
from tests._conversion_checks import assert_copied_constraint  # noqa: E402

F64 = torch.float64
X = torch.rand(10, 3, generator=torch.Generator().manual_seed(0), dtype=F64)


def oak(second_order=True, base_kernel=None, **kwargs):
    kernel = OrthogonalAdditiveKernel(dim=3, base_kernel=base_kernel, second_order=second_order, dtype=F64, **kwargs)
    kernel.base_kernel.lengthscale = torch.tensor([0.2, 0.5, 1.0], dtype=F64).view(3, 1, 1)
    kernel.offset = 0.3
    kernel.coeffs_1 = torch.tensor([1.0, 0.5, 2.0], dtype=F64)
    if second_order:
        kernel.coeffs_2 = torch.tensor([[0.0, 0.7, 0.2], [0.0, 0.0, 1.5], [0.0, 0.0, 0.0]], dtype=F64)
    return kernel


def parameters(kernel):
    """The hyperparameters (the column copies' tied lengthscales are ``base_kernel``'s, listed once)."""
    names = ("raw_offset", "raw_coeffs_1", "raw_coeffs_2", "base_kernel.raw_lengthscale")
    return [parameter for name, parameter in kernel.named_parameters() if name in names]


def draws_and_gradients(exact, num_features, seeds, weights):
    """K̂ and ∂⟨weights, K̂⟩/∂θ per seed."""
    grams, grads = [], []
    for seed in seeds:
        converted = rfgp.sketch(exact, num_features, seed=1000 * seed)
        gram = converted(X).to_dense()
        grads.append(torch.cat([g.flatten() for g in torch.autograd.grad((gram * weights).sum(),
                                                                         parameters(converted))]))
        grams.append(gram.detach())
    return torch.stack(grams), torch.stack(grads)


@pytest.mark.parametrize("second_order, base", [(True, None), (False, "matern")])
def test_mean_of_the_features_and_their_gradients_is_botorchs_kernel(second_order, base):
    """At G = 16 features per component the projection's O(1/G) bias stays below 4 SE of 200 draws."""
    base_kernel = MaternKernel(nu=2.5, batch_shape=torch.Size([3])) if base == "matern" else None
    exact = oak(second_order, base_kernel)
    components = 6 if second_order else 3
    weights = torch.randn(10, 10, generator=torch.Generator().manual_seed(1), dtype=F64)
    grams, grads = draws_and_gradients(exact, 1 + 16 * components, range(200), weights)
    truth = exact(X).to_dense()
    truth_grad = torch.cat([g.flatten() for g in torch.autograd.grad((truth * weights).sum(), parameters(exact))])
    for draws, target in ((grams, truth.detach()), (grads, truth_grad)):
        error, standard_error = (draws.mean(0) - target).abs(), draws.std(0) / draws.shape[0] ** 0.5
        assert (error <= 4 * standard_error + 1e-12).all(), (error / standard_error).max()  # the offset's is exact
    assert (truth.detach() < 0).any()  # orthogonalised components do go negative: not just a positive kernel


def oak_with_priors():
    kernel = oak(offset_prior=GammaPrior(2.0, 4.0), coeffs_1_prior=GammaPrior(1.5, 2.0),
                 coeffs_2_prior=GammaPrior(1.0, 3.0))
    kernel.base_kernel.register_prior("lengthscale_prior", GammaPrior(3.0, 6.0), lambda m: m.lengthscale)
    return kernel


def test_converted_kernel_keeps_botorchs_parameters_priors_and_state():
    exact = oak_with_priors()
    converted = rfgp.sketch(exact, 1 + 6 * 32, seed=0)
    assert isinstance(converted, SketchedOrthogonalAdditiveKernel) and converted.num_features == 1 + 6 * 32
    for name in ("offset", "coeffs_1", "coeffs_2"):
        assert torch.equal(getattr(converted, name), getattr(exact, name)), name
    assert torch.equal(converted.base_kernel.lengthscale, exact.base_kernel.lengthscale)
    assert_copied_constraint(converted.coeff_constraint, exact.coeff_constraint)
    priors = {name: prior.log_prob(closure(module)).sum() for name, module, prior, closure, _ in exact.named_priors()}
    converted_priors = {name: prior.log_prob(closure(module)).sum()
                        for name, module, prior, closure, _ in converted.named_priors()}
    assert priors.keys() == converted_priors.keys() and len(priors) == 4  # the tied column copies count once
    for name in priors:
        torch.testing.assert_close(converted_priors[name], priors[name])
    # BoTorch's trained state loads into the conversion; the conversion's state reproduces it bit for bit
    trained = oak_with_priors()
    trained.coeffs_1 = torch.tensor([0.1, 0.2, 0.3], dtype=F64)
    trained.base_kernel.lengthscale = torch.tensor([0.3, 0.3, 0.9], dtype=F64).view(3, 1, 1)
    missing, unexpected = converted.load_state_dict(trained.state_dict(), strict=False)
    assert not unexpected
    assert torch.equal(converted.coeffs_1, trained.coeffs_1)
    assert all(torch.equal(k.lengthscale, trained.base_kernel.lengthscale) for k in converted.column_kernels)
    gram = converted(X).to_dense()
    columns = (converted.base_kernel, *converted.column_kernels)
    frequencies = [kernel.feature_map.state_dict()["frequencies"] for kernel in columns]
    assert len(frequencies) == 3 and not torch.equal(frequencies[0], frequencies[1])  # independent per column
    again = rfgp.sketch(oak_with_priors(), 1 + 6 * 32, seed=7)
    again(X)
    again.load_state_dict(converted.state_dict())
    assert torch.equal(again(X).to_dense(), gram)


def test_large_width_matches_botorch_and_small_width_is_refused():
    exact = oak()
    truth = exact(X).to_dense().detach()
    converted = rfgp.sketch(exact, 1 + 6 * 2048, seed=0)
    assert float((converted(X).to_dense().detach() - truth).norm() / truth.norm()) < 0.06  # 0.008–0.038 over seeds
    with pytest.raises(ValueError, match="num_features=12 is too small .* dim=3 with 6 first- and second-order"):
        rfgp.sketch(exact, 12)


def test_inputs_outside_the_unit_cube_are_refused_by_name():
    converted = rfgp.sketch(oak(), 1 + 6 * 16, seed=0)
    with pytest.raises(ValueError, match=r"x1 is not in the hypercube \[0, 1\]\^3 .*Normalize"):
        converted(X * 2).to_dense()
    with pytest.raises(ValueError, match="x1 has 2 columns, but this OrthogonalAdditiveKernel has dim=3"):
        converted(X[:, :2]).to_dense()


def test_botorchs_normalizer_clamp_is_reproduced():
    """BoTorch clamps N = wᵀKw at 10⁻⁶: a base kernel of amplitude 10⁻⁷ on column 0 has N ≈ 6·10⁻⁸, so the clamp
    (not N) divides its correction there; a large coefficient makes that component dominate K."""
    batch = torch.Size([3])
    base = ScaleKernel(RBFKernel(batch_shape=batch), batch_shape=batch).double()
    base.outputscale = torch.tensor([1e-7, 1.0, 1.0], dtype=F64)
    base.base_kernel.lengthscale = 0.5
    exact = OrthogonalAdditiveKernel(dim=3, base_kernel=base, dtype=F64)
    exact.coeffs_1 = torch.tensor([1e7, 1e-3, 1e-3], dtype=F64)
    assert float(exact.normalizer()[0].detach()) == 1e-6
    truth = exact(X).to_dense().detach()
    converted = rfgp.sketch(exact, 1 + 3 * 4096, seed=0)
    gram = converted(X).to_dense()
    assert float((gram.detach() - truth).norm() / truth.norm()) < 0.02
    assert torch.isfinite(torch.autograd.grad(gram.sum(), converted.base_kernel.raw_outputscale)[0]).all()


def test_k_normalizer_and_orthogonal_base_kernels_are_botorchs_methods_of_the_features_used():
    """BoTorch's k(x1, x2) (per-column base kernel) and normalizer() (wᵀk(z, z)w, clamped) exist with BoTorch's shapes;
    they are those of column i's own features (second order: its own draws), so BoTorch's orthogonalisation formula
    applied to them is ψᵢψᵢᵀ, the first-order components of the converted K."""
    exact = oak()
    converted = rfgp.sketch(exact, 1 + 6 * 16, seed=0)
    x2 = X[:4]
    gram, cross, diag = converted.k(X, X), converted.k(X, x2), converted.k(X, X, diag=True)
    assert gram.shape == exact.k(X, X).shape == (3, 10, 10) and cross.shape == (3, 10, 4) and diag.shape == (3, 10)
    torch.testing.assert_close(diag, torch.diagonal(gram, dim1=-2, dim2=-1), rtol=1e-12, atol=0)
    nodes, weights = converted.quadrature_nodes, converted.quadrature_weights
    z = nodes.unsqueeze(-1).expand(-1, 3)
    normalizer = converted.normalizer()
    assert normalizer.shape == exact.normalizer().shape == (3, 1, 1)
    torch.testing.assert_close(normalizer.squeeze(), torch.einsum("q,dqr,r->d", weights, converted.k(z, z), weights),
                               rtol=1e-12, atol=0)
    s1, s2 = converted.k(X, z) @ weights, converted.k(x2, z) @ weights  # BoTorch's _orthogonal_base_kernels
    botorch_formula = cross - s1.unsqueeze(-1) * s2.unsqueeze(-2) / normalizer
    orthogonal = converted._orthogonal_base_kernels(X, x2)
    torch.testing.assert_close(orthogonal, botorch_formula, rtol=1e-10, atol=1e-12)
    components = converted._non_reduced_forward(X, x2).to_dense()  # offset, 3 first-order, 3 second-order
    torch.testing.assert_close(components[1:4], converted.coeffs_1[:, None, None] * orthogonal, rtol=1e-10, atol=1e-12)


def test_k_and_normalizer_approach_botorchs_as_the_width_grows():
    exact = oak()
    errors = {}
    for width in (64, 4096):
        converted = rfgp.sketch(exact, 1 + 6 * width, seed=0)
        with torch.no_grad():
            errors[width] = (float((converted.k(X, X) - exact.k(X, X)).abs().max()),
                             float(((converted.normalizer() - exact.normalizer()) / exact.normalizer()).abs().max()),
                             float((converted._orthogonal_base_kernels(X, X)
                                    - exact._orthogonal_base_kernels(X, X)).abs().max()))
    for large, small in zip(errors[4096], errors[64]):
        assert large < 0.04 and large < small / 2, errors


def test_single_task_gp_with_a_converted_oak_fits_and_optimises_qlogei():
    generator = torch.Generator().manual_seed(0)
    train_x = torch.rand(60, 3, generator=generator, dtype=F64)
    train_y = (torch.sin(6 * train_x[:, :1]) + train_x[:, 1:2] * train_x[:, 2:3]
               + 0.05 * torch.randn(60, 1, generator=generator, dtype=F64))
    exact = SingleTaskGP(train_x, train_y, covar_module=oak())
    model = SingleTaskGP(train_x, train_y, covar_module=rfgp.sketch(exact.covar_module, 1 + 6 * 256, seed=0))
    before = model.covar_module.coeffs_1.detach().clone()
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model), optimizer_kwargs={"options": {"maxiter": 20}})
    assert not torch.equal(model.covar_module.coeffs_1, before)
    test_x = torch.rand(20, 3, generator=generator, dtype=F64)
    with torch.no_grad():
        mean = model.posterior(test_x).mean
    truth = torch.sin(6 * test_x[:, :1]) + test_x[:, 1:2] * test_x[:, 2:3]
    assert float((mean - truth).abs().max()) < 0.3
    acquisition = qLogExpectedImprovement(model, best_f=train_y.max())
    bounds = torch.tensor([[0.0] * 3, [1.0] * 3], dtype=F64)
    candidate, value = optimize_acqf(acquisition, bounds, q=2, num_restarts=2, raw_samples=32,
                                     options={"maxiter": 20})
    assert candidate.shape == (2, 3) and torch.isfinite(value) and ((candidate >= 0) & (candidate <= 1)).all()


def test_set_num_features_redraws_every_component_at_the_new_share():
    exact = oak()
    train_x = X
    model = SingleTaskGP(train_x, torch.sin(3 * train_x).sum(-1, keepdim=True),
                         covar_module=rfgp.sketch(exact, 1 + 6 * 16, seed=0)).eval()
    with torch.no_grad():
        model.posterior(X[:2])
    rfgp.set_num_features(model, 1 + 6 * 2048 + 5)  # rounded down to an even share per component
    kernel = model.covar_module
    assert kernel.num_features == 1 + 6 * 2048 and kernel.pair_sketch.num_features == 2048
    assert all(k.num_features == 2048 for k in (kernel.base_kernel, *kernel.column_kernels))
    truth = exact(X).to_dense().detach()
    assert float((kernel(X).to_dense().detach() - truth).norm() / truth.norm()) < 0.06
    with torch.no_grad():
        assert torch.isfinite(model.posterior(X[:2]).mean).all()


def test_component_posteriors_of_orthogonal_additive_gp_match_botorchs():
    """OrthogonalAdditiveGP.posterior(..., infer_all_components=True): each component's posterior from its own
    columns of Φ (the slice of the weights' posterior), against BoTorch's exact component posteriors."""
    generator = torch.Generator().manual_seed(0)
    train_x = torch.rand(50, 3, generator=generator, dtype=F64)
    train_y = torch.sin(5 * train_x[:, :1]) + train_x[:, 1:2] * train_x[:, 2:]
    exact = OrthogonalAdditiveGP(train_x, train_y, covar_module=oak())
    converted = OrthogonalAdditiveGP(train_x, train_y, covar_module=rfgp.sketch(oak(), 1 + 6 * 4096, seed=0))
    for model in (exact, converted):
        model.likelihood.noise = 1e-2
        model.eval()
    test_x = torch.rand(5, 3, generator=generator, dtype=F64)
    covariances = [model.covar_module._non_reduced_forward(test_x, train_x).to_dense().detach()
                   for model in (exact, converted)]
    assert covariances[1].shape == (7, 5, 50)
    assert float((covariances[1] - covariances[0]).abs().max()) < 0.05  # G = 4096: Monte-Carlo error ≈ 0.02
    diagonals = [model.covar_module._non_reduced_forward(test_x, test_x, diag=True).detach()
                 for model in (exact, converted)]
    assert float((diagonals[1] - diagonals[0]).abs().max()) < 0.05
    with torch.no_grad():
        expected, actual = (model.posterior(test_x, infer_all_components=True) for model in (exact, converted))
    assert actual.mean.shape == expected.mean.shape == (7, 5, 1)
    assert float((actual.mean - expected.mean).abs().max()) < 0.02
    assert float((actual.variance - expected.variance).abs().max()) < 1e-3
