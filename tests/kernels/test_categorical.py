"""SketchedCategoricalKernel: shapes, diagonal, batches, lengthscale gradient, state_dict, refusals."""

import math

import gpytorch
import pytest
import torch

import rfgp
from rfgp.features.categorical import categorical_kernel
from rfgp.kernels import SketchedCategoricalKernel

F64 = torch.float64
X = torch.tensor([[0.0, 1.0], [0.0, 2.0], [1.0, 2.0], [0.5, 1.0], [-0.0, 1.0]], dtype=F64)


def kernel(num_features=256, seed=0, **kwargs):
    kwargs.setdefault("ard_num_dims", 2)
    module = SketchedCategoricalKernel(num_features, seed=seed, **kwargs).double()
    module.lengthscale = torch.tensor([0.7, 2.0], dtype=F64).expand_as(module.lengthscale)
    return module


def test_shapes_diag_and_low_rank():
    module = kernel()
    covariance = module(X)
    dense = covariance.to_dense()
    assert dense.shape == (5, 5) and covariance.shape == (5, 5)
    phi = module.featurize(X)
    assert phi.shape == (5, 256)
    torch.testing.assert_close(dense, phi @ phi.T)
    torch.testing.assert_close(module(X, diag=True), dense.diagonal())
    torch.testing.assert_close(dense[0], dense[4], rtol=0, atol=0)  # −0.0 and 0.0 are one category
    cross = module(X[:2], X).to_dense()
    torch.testing.assert_close(cross, dense[:2])
    assert module.diag_moments(X) is None and module.num_features == 256 and module.input_dim == 2


def test_it_targets_botorchs_formula():
    """exp(−(1/d) Σ 1[xᵢ ≠ yᵢ]/ℓᵢ) = Πᵢ(cᵢ + (1 − cᵢ)1[xᵢ = yᵢ]), cᵢ = exp(−1/(d ℓᵢ)); wide map within 5 SE."""
    module = kernel(num_features=2**16)
    lengthscale = module.lengthscale.detach().squeeze(-2)
    mismatches = (X.unsqueeze(-2) != X.unsqueeze(-3)).to(F64)
    target = torch.exp(-(mismatches / lengthscale).mean(-1))
    torch.testing.assert_close(categorical_kernel(X, X, torch.exp(-1 / (2 * lengthscale))), target)
    estimate = module(X).to_dense().detach()
    assert (estimate - target).abs().max() < 5 * math.sqrt(2.0 / 2**16)  # Var ≤ (Πm − k²)/F ≤ 2/F for d = 2


def test_batch_shape_gives_one_lengthscale_per_batch():
    module = kernel(batch_shape=torch.Size([3]))
    module.lengthscale = torch.tensor([[[0.3, 1.0]], [[1.0, 1.0]], [[5.0, 0.2]]], dtype=F64)
    batched = module(X).to_dense()
    assert batched.shape == (3, 5, 5)
    single = kernel()
    single.lengthscale = module.lengthscale[2]
    torch.testing.assert_close(batched[2], single(X).to_dense(), rtol=1e-12, atol=1e-12)
    batched_x = module(X.expand(3, 5, 2)).to_dense()
    torch.testing.assert_close(batched_x, batched)


def test_shared_lengthscale_and_active_dims():
    module = SketchedCategoricalKernel(64, seed=1, active_dims=[1]).double()
    wide = torch.cat([torch.rand(5, 1, dtype=F64), X[:, 1:]], -1)
    assert module(wide).to_dense().shape == (5, 5)
    assert module.input_dim == 1
    shared = SketchedCategoricalKernel(256, seed=2).double()
    shared.lengthscale = torch.tensor(1.3, dtype=F64)
    ard = kernel(seed=2)
    ard.lengthscale = torch.tensor([[1.3, 1.3]], dtype=F64)
    torch.testing.assert_close(shared(X).to_dense(), ard(X).to_dense(), rtol=0, atol=0)


def test_lengthscale_gradient_matches_finite_differences():
    module = kernel(num_features=128, seed=3)
    weights = torch.randn(5, 5, dtype=F64, generator=torch.Generator().manual_seed(0))

    def loss():
        return (module(X).to_dense() * weights).sum()

    (grad,) = torch.autograd.grad(loss(), module.raw_lengthscale)
    raw = module.raw_lengthscale.detach().clone()
    step = 1e-6
    for i in range(2):
        values = []
        for sign in (1, -1):
            shifted = raw.clone()
            shifted[..., i] += sign * step
            with torch.no_grad():
                module.raw_lengthscale.copy_(shifted)
                values.append(loss())
        module.raw_lengthscale.data.copy_(raw)
        torch.testing.assert_close(grad[..., i].squeeze(), (values[0] - values[1]) / (2 * step), rtol=1e-6, atol=1e-9)
    assert grad.abs().min() > 0


def test_state_dict_round_trip_is_bit_for_bit():
    module = SketchedCategoricalKernel(64, seed=4, ard_num_dims=2).double()
    module.lengthscale = torch.tensor([[0.4, 3.0]], dtype=F64)
    before = module(X).to_dense()
    state = module.state_dict()
    assert int(state["feature_map.config_seed"]) == 4 and state["feature_map.hash_offset"].dtype == torch.int64
    loaded = SketchedCategoricalKernel(64, seed=5, ard_num_dims=2).double()
    loaded.load_state_dict(state)
    torch.testing.assert_close(loaded(X).to_dense(), before, rtol=0, atol=0)
    with pytest.raises(ValueError, match="num_features"):
        SketchedCategoricalKernel(32, ard_num_dims=2).double().load_state_dict(state)


def test_resample_changes_the_draws_only():
    module = kernel(seed=6)
    before = module(X).to_dense()
    module.resample(torch.Generator().manual_seed(1))
    after = module(X).to_dense()
    assert not torch.equal(before, after)
    torch.testing.assert_close(after.diagonal(), torch.ones(5, dtype=F64), rtol=0, atol=0.5)


def test_refusals():
    module = kernel()
    with pytest.raises(NotImplementedError, match="last_dim_is_batch"):
        module(X, last_dim_is_batch=True).to_dense()
    with pytest.raises(ValueError, match="input_dim=2"):
        SketchedCategoricalKernel(8, input_dim=2).double()(torch.zeros(3, 3, dtype=F64)).to_dense()
    with pytest.raises(ValueError, match="NaN"):
        module(torch.tensor([[float("nan"), 0.0]], dtype=F64)).to_dense()
    with pytest.raises(TypeError, match="float16"):
        module(X.half()).to_dense()
    with pytest.raises(ValueError, match="ard_num_dims=2 does not match input_dim=3"):
        SketchedCategoricalKernel(8, ard_num_dims=2, input_dim=3)
    with pytest.raises(TypeError, match="unexpected|accept"):
        SketchedCategoricalKernel(8, nu=2.5)


def test_in_an_exact_gp_with_a_scale_kernel():
    class Model(gpytorch.models.ExactGP):
        def __init__(self, x, y, likelihood):
            super().__init__(x, y, likelihood)
            self.mean = gpytorch.means.ConstantMean()
            self.covar = gpytorch.kernels.ScaleKernel(SketchedCategoricalKernel(128, seed=7, ard_num_dims=2))

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean(x), self.covar(x))

    y = torch.tensor([0.1, 0.5, 0.9, 0.2, 0.1], dtype=F64)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    model = Model(X, y, likelihood).double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    loss = -mll(model(X), y)
    loss.backward()
    assert torch.isfinite(loss) and model.covar.base_kernel.raw_lengthscale.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        prediction = likelihood(model(X[:3]))
    assert torch.isfinite(prediction.mean).all() and (prediction.variance > 0).all()


def test_set_num_features_redraws_at_the_new_width():
    module = kernel(num_features=64, seed=8)
    module(X)
    rfgp.set_num_features(module, 128)
    assert module.num_features == 128 and module.feature_map.hash_lo.shape == (2, 128)
    assert module.featurize(X).shape == (5, 128)
