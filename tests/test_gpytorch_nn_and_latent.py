"""GPyTorch's neural-network and latent-variable tutorial patterns with rfgp kernels, against the exact kernel.

Deep kernel learning (an MLP d → 2, ``ScaleToBounds(-1, 1)``, ``ScaleKernel(RBF)``; GPyTorch's tutorial puts a
``GridInterpolationKernel`` on top, which ``rfgp.sketch`` refuses, so the user drops it), SV-DKL (the network under a
batch of variational GPs with inducing points in the network's output space and a ``SoftmaxLikelihood``), Bayesian
GPLVMs (variational, MAP and point latent variables: the latent X reach the kernel as its inputs) and GPyTorch's
distributional-input kernels.  Random-feature errors shrink like 1/√F: a 16× wider map has 4× smaller errors on
average, so the tests ask for the RMS error over seeds at 16F to be below half of that at F; a Nyström kernel with
every point as a landmark agrees with the exact model to its jitter.
"""

import gpytorch
import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel

import rfgp
from rfgp.models.kernel_inputs import covar_module_inputs

F64 = torch.float64
N, D_IN = 40, 3


def regression_data(seed=0, n=N, d=D_IN):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen, dtype=F64)
    y = torch.sin(3 * x.sum(-1)) + 0.1 * torch.randn(n, generator=gen, dtype=F64)
    return x, y


def exact_kernel(lengthscale=None):
    kernel = ScaleKernel(RBFKernel(ard_num_dims=2)).double()
    if lengthscale is not None:
        kernel.base_kernel.lengthscale = lengthscale
    return kernel


class DKLModel(gpytorch.models.ExactGP):
    """GPyTorch's DKL tutorial model without the grid: z = ScaleToBounds(MLP(x)), a GP on z."""

    def __init__(self, x, y, kernel, hidden=16, out=2, extra=()):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        gen = torch.random.fork_rng()
        with gen:
            torch.manual_seed(1)
            self.feature_extractor = torch.nn.Sequential(torch.nn.Linear(x.shape[-1], hidden), *extra,
                                                         torch.nn.ReLU(), torch.nn.Linear(hidden, out))
        self.scale_to_bounds = gpytorch.utils.grid.ScaleToBounds(-1.0, 1.0)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel
        self.double()

    def forward(self, x):
        z = self.scale_to_bounds(self.feature_extractor(x))
        return gpytorch.distributions.MultivariateNormal(self.mean_module(z), self.covar_module(z))


def mll_and_weight_gradient(model, x, y):
    model.train()
    model.zero_grad()
    value = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)(model(x), y)
    value.backward()
    return value.detach(), model.feature_extractor[0].weight.grad.clone()


def network_outputs(model, x):
    """z = the kernel's inputs at the current weights (ScaleToBounds in training mode: bounds from x)."""
    return covar_module_inputs(model, x)


# ---------------------------------------------------------------- deep kernel learning (exact GP)
def test_dkl_nystrom_with_all_points_is_the_exact_model_and_its_nn_gradient():
    """Landmarks are points of the kernel's input space, the network's outputs z: with every training z as a landmark
    the marginal likelihood and its gradient w.r.t. the network weights are the exact model's."""
    x, y = regression_data()
    exact = DKLModel(x, y, exact_kernel())
    z = network_outputs(exact, x)
    nystrom = DKLModel(x, y, rfgp.sketch(exact_kernel(), N, method="nystrom", x_sample=z))
    value, grad = mll_and_weight_gradient(nystrom, x, y)
    value_exact, grad_exact = mll_and_weight_gradient(exact, x, y)
    assert abs(value - value_exact) < 1e-7
    torch.testing.assert_close(grad, grad_exact, rtol=1e-5, atol=1e-7)


def test_dkl_nystrom_landmarks_stay_put_as_the_network_trains_and_set_num_features_reselects_them():
    """Landmarks are fixed points of z-space (buffers): after a training step moves the network, the Nyström model is
    the kernel of those landmarks, no longer the exact one; ``rfgp.set_num_features(model, N)`` re-chooses them among
    the current network outputs of the training inputs (before, it chose among the raw 3-column x and failed), and
    the posterior (mean and FITC-corrected variance) is the exact model's again."""
    x, y = regression_data()
    exact = DKLModel(x, y, exact_kernel(0.1))  # short: 40 landmarks in the plane do not span the kernel everywhere
    nystrom = DKLModel(x, y, rfgp.sketch(exact_kernel(0.1), N, method="nystrom", x_sample=network_outputs(exact, x)))
    for model in (exact, nystrom):
        value, _ = mll_and_weight_gradient(model, x, y)
        torch.optim.SGD(model.parameters(), lr=0.5).step()
    moved = abs(mll_and_weight_gradient(nystrom, x, y)[0] - mll_and_weight_gradient(exact, x, y)[0])
    assert moved > 1e-4
    rfgp.set_num_features(nystrom, N)
    value, grad = mll_and_weight_gradient(nystrom, x, y)
    value_exact, grad_exact = mll_and_weight_gradient(exact, x, y)
    assert abs(value - value_exact) < 1e-7
    torch.testing.assert_close(grad, grad_exact, rtol=1e-5, atol=1e-7)
    x_test = torch.rand(7, D_IN, generator=torch.Generator().manual_seed(5), dtype=F64)
    exact.eval()
    nystrom.eval()
    with torch.no_grad():
        p, q = nystrom(x_test), exact(x_test)
    torch.testing.assert_close(p.mean, q.mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(p.variance, q.variance, rtol=1e-5, atol=1e-6)


def test_dkl_nystrom_landmarks_of_the_raw_inputs_are_refused():
    """Landmarks chosen among the raw x (3 columns) for a kernel on the network's 2 outputs: a ValueError saying where
    landmarks live (before, GPyTorch's 'x1_ and x2_ must have the same number of dimensions!')."""
    x, y = regression_data()
    model = DKLModel(x, y, rfgp.sketch(ScaleKernel(RBFKernel()).double(), 16, method="nystrom", x_sample=x))
    with pytest.raises(ValueError, match="landmarks have 3.*network outputs"):
        mll_and_weight_gradient(model, x, y)


def test_dkl_random_features_approach_the_exact_mll_and_nn_gradient():
    x, y = regression_data()
    value_exact, grad_exact = mll_and_weight_gradient(DKLModel(x, y, exact_kernel()), x, y)

    def rms_errors(width):
        errors = []
        for seed in range(6):
            model = DKLModel(x, y, rfgp.sketch(exact_kernel(), width, seed=seed))
            value, grad = mll_and_weight_gradient(model, x, y)
            errors.append(torch.stack([(value - value_exact).abs(), (grad - grad_exact).norm() / grad_exact.norm()]))
        return torch.stack(errors).pow(2).mean(0).sqrt()

    narrow, wide = rms_errors(256), rms_errors(4096)
    assert (wide < narrow / 2).all(), (narrow, wide)
    assert wide[0] < 0.005 and wide[1] < 0.15  # measured 0.0010 and 0.080


def test_dkl_nn_weight_gradient_matches_central_differences():
    x, y = regression_data()
    model = DKLModel(x, y, rfgp.sketch(exact_kernel(), 128, seed=0))
    _, grad = mll_and_weight_gradient(model, x, y)
    weight = model.feature_extractor[0].weight
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    step = 1e-6
    for i, j in [(0, 0), (3, 1), (7, 2), (15, 0)]:
        values = []
        for sign in (1, -1):
            with torch.no_grad():
                weight[i, j] += sign * step
                values.append(mll(model(x), y))
                weight[i, j] -= sign * step
        assert abs((values[0] - values[1]) / (2 * step) - grad[i, j]) < 1e-6 * (1 + abs(grad[i, j]))


def test_fit_mll_trains_a_deep_kernel_model():
    """rfgp.fit_mll trains the network weights with the hyperparameters (before: its data-scale check read the raw
    3-column x as the kernel's inputs and failed with a shape error)."""
    x, y = regression_data()
    model = DKLModel(x, y, rfgp.sketch(exact_kernel(), 256, seed=0))
    weights = model.feature_extractor[0].weight.detach().clone()
    history = rfgp.fit_mll(model, num_iterations=30)
    assert history.losses[-1] < history.losses[0] - 0.1
    assert not torch.equal(model.feature_extractor[0].weight, weights)


def test_fit_mll_and_set_num_features_fit_a_maclaurin_allocation_to_the_network_outputs():
    """The optimized Maclaurin map's allocation (fitted to its inputs) is checked and refitted by fit_mll, and refitted
    by set_num_features, on the network's outputs (before: on the raw 3-column x, a shape error)."""
    x, y = regression_data()
    model = DKLModel(x, y, rfgp.sketch(exact_kernel(), 128, method="maclaurin", seed=0))
    history = rfgp.fit_mll(model, num_iterations=3)
    assert history.losses[-1] < history.losses[0] - 0.05
    rfgp.set_num_features(model, 256)
    feature_map = model.covar_module.base_kernel.feature_map
    widths = list(feature_map.widths)
    assert 128 < model.covar_module.base_kernel.num_features <= 256
    rfgp.kernels.refit_allocation(model.covar_module, network_outputs(model, x))  # the same allocation again
    assert list(feature_map.widths) == widths


def test_fit_mll_checks_the_data_scale_of_the_network_outputs():
    """The data-scale check (DataScaleWarning) looks at the kernel's inputs: raw x in thousands fed through a network
    and ScaleToBounds reach the kernel within [-1, 1], so there is nothing to warn about (before, the check read the
    raw x — of the kernel's width here — and warned that they lie ~1000 lengthscales apart)."""
    x, y = regression_data(d=2)
    model = DKLModel(1000 * x, y, rfgp.sketch(exact_kernel(), 256, seed=0))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.DataScaleWarning)
        rfgp.fit_mll(model, num_iterations=2)
    plain = DKLModel(1000 * x, y, rfgp.sketch(exact_kernel(), 256, seed=0))
    plain.forward = lambda x: gpytorch.distributions.MultivariateNormal(plain.mean_module(x), plain.covar_module(x))
    with pytest.warns(rfgp.DataScaleWarning, match="lengthscales apart"):
        rfgp.fit_mll(plain, num_iterations=1)


def test_fit_mll_checks_the_data_scale_of_botorch_inputs_after_their_input_transform():
    """BoTorch applies input transforms in forward (in training mode its train_inputs are the raw X): the data-scale
    check looks at the normalised inputs the kernel sees (before: X in the thousands, normalised to [0, 1] by
    Normalize, drew a DataScaleWarning saying they lie 695 lengthscales apart)."""
    pytest.importorskip("botorch")
    import warnings

    from botorch.models import SingleTaskGP
    from botorch.models.transforms import Normalize, Standardize

    x, _ = regression_data(n=50, d=2)
    y = torch.sin(5 * x[:, :1])
    kernel = rfgp.sketch(ScaleKernel(RBFKernel(ard_num_dims=2)), 256, seed=0)
    model = SingleTaskGP(1000 * x, y, covar_module=kernel, input_transform=Normalize(d=2),
                         outcome_transform=Standardize(m=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.DataScaleWarning)
        rfgp.fit_mll(model, num_iterations=2)


def test_covar_module_inputs_leave_no_trace():
    """Capturing the kernel's inputs runs the network once: batch-norm statistics, ScaleToBounds' bounds and the
    global random state (dropout) are as before, and the result is what training feeds the kernel."""
    x, y = regression_data()
    model = DKLModel(x, y, rfgp.sketch(exact_kernel(), 64, seed=0),
                     extra=(torch.nn.BatchNorm1d(16), torch.nn.Dropout(0.2)))
    before = {name: buffer.clone() for name, buffer in model.named_buffers()}
    state = torch.random.get_rng_state()
    z = covar_module_inputs(model, x)
    assert torch.equal(torch.random.get_rng_state(), state)
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, before[name]), name
    assert z.shape == (N, 2) and not z.requires_grad
    model.eval()  # no dropout, running statistics: deterministic network
    with torch.no_grad():
        expected = model.scale_to_bounds(model.feature_extractor(x))
    torch.testing.assert_close(covar_module_inputs(model, x), expected)
    plain = rfgp.models.ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(),
                                     rfgp.sketch(ScaleKernel(RBFKernel()), 64, seed=0))
    assert covar_module_inputs(plain, x) is x


def test_covar_module_inputs_under_inference_mode_leave_no_inference_buffers():
    """The buffers' copies, restored after the captured forward, were made under ``torch.inference_mode()`` when
    ``rfgp.set_num_features`` was called there: every buffer of the model (constraint bounds, batch-norm statistics)
    became an inference tensor, which a later in-place update refuses outside inference mode."""
    x, y = regression_data()
    model = DKLModel(x, y, rfgp.sketch(exact_kernel(), 64, seed=0), extra=(torch.nn.BatchNorm1d(16),))
    model.eval()
    with torch.inference_mode():
        rfgp.set_num_features(model, 128)
    assert not [name for name, buffer in model.named_buffers() if buffer.is_inference()]
    for buffer in model.buffers():
        buffer.add_(0)  # "Inplace update to inference tensor outside InferenceMode" before


def adam_steps(model, x, y, steps):
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    for _ in range(steps):
        model.train()
        optimizer.zero_grad()
        (-mll(model(x), y)).backward()
        optimizer.step()


def test_dkl_eval_predictions_after_training_steps_and_state_dict_round_trip():
    """Each model.eval() after a training step predicts with the new network (GPyTorch drops the prediction strategy
    in train()): equal to a fresh model loaded from the state_dict, bit for bit, at every step; after training the
    posterior is close to the exact model's at the same weights and hyperparameters."""
    x, y = regression_data()
    x_test = torch.rand(9, D_IN, generator=torch.Generator().manual_seed(3), dtype=F64)
    model = DKLModel(x, y, rfgp.sketch(exact_kernel(), 4096, seed=0))
    previous = None
    for _ in range(3):
        adam_steps(model, x, y, 2)
        model.eval()
        with torch.no_grad():
            p = model(x_test)
        fresh = DKLModel(x, y, rfgp.sketch(exact_kernel(), 4096, seed=7))
        fresh.load_state_dict(model.state_dict())
        fresh.eval()
        with torch.no_grad():
            q = fresh(x_test)
        assert torch.equal(p.mean, q.mean) and torch.equal(p.variance, q.variance)
        assert previous is None or not torch.equal(previous, p.mean)
        previous = p.mean
    exact = DKLModel(x, y, exact_kernel())
    exact.load_state_dict(model.state_dict(), strict=False)  # rfgp's draws are the only extra keys
    exact.eval()
    with torch.no_grad():
        e = exact(x_test)
    assert (p.mean - e.mean).abs().max() < 0.05
    assert (p.variance - e.variance).abs().max() < 0.05


def test_dkl_weights_changed_in_eval_mode_keep_the_cache_as_gpytorch_does():
    """Changing network weights in place in eval mode keeps the training caches of the old weights, in GPyTorch's
    exact model as in rfgp's (GPyTorch rebuilds them after model.train()): the same stale behaviour, not an rfgp one;
    after train()/eval() both follow the new weights."""
    x, y = regression_data()
    x_test = torch.rand(5, D_IN, generator=torch.Generator().manual_seed(3), dtype=F64)
    for kernel in (exact_kernel(), rfgp.sketch(exact_kernel(), 512, seed=0)):
        model = DKLModel(x, y, kernel)
        model.eval()
        with torch.no_grad():
            model(x_test)
            model.feature_extractor[2].weight.mul_(1.5)
            stale = model(x_test).mean
        model.train()
        model.eval()
        with torch.no_grad():
            rebuilt = model(x_test).mean
        fresh = DKLModel(x, y, kernel)
        fresh.load_state_dict(model.state_dict())
        fresh.eval()
        with torch.no_grad():
            expected = fresh(x_test).mean
        assert (stale - rebuilt).abs().max() > 1e-3
        assert torch.equal(rebuilt, expected)


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_fit_mll_with_a_parameter_the_loss_does_not_reach(optimizer):
    """A network head the forward does not use has no gradient; fit_mll treats it as 0 and leaves it as it is (before:
    AttributeError on its None gradient at the first accepted point)."""
    x, y = regression_data()
    model = DKLModel(x, y, rfgp.sketch(exact_kernel(), 128, seed=0))
    model.unused_head = torch.nn.Linear(2, 1).double()
    head = model.unused_head.weight.detach().clone()
    history = rfgp.fit_mll(model, optimizer=optimizer, num_iterations=5)
    assert history.losses[-1] < history.losses[0]
    assert torch.equal(model.unused_head.weight, head)


@pytest.mark.parametrize("d", [2, 3])
def test_dkl_fantasy_posterior_with_propagated_gradients_is_the_model_with_the_points_appended(d):
    """get_fantasy_model under detach_test_caches(False) (BoTorch's propagate_grads, qKG): the rank-updated strategy
    rebuilds the training caches with their graph from the kernel's inputs at the training points, the network's
    outputs (before: from model.train_inputs, the raw x — a shape error for 3 columns, and for 2 a silently wrong
    network-weight gradient; before the deferred graph also a posterior mean off by up to 0.58).  Reference: the same
    model with the points appended to its training data."""
    x, y = regression_data(d=d)
    x_test = torch.rand(5, d, dtype=F64, generator=torch.Generator().manual_seed(1))
    x_new = torch.rand(3, d, dtype=F64, generator=torch.Generator().manual_seed(2))
    y_new = torch.tensor([0.3, -0.2, 0.1], dtype=F64)
    model = DKLModel(x, y, rfgp.sketch(exact_kernel(), 16, seed=0))  # N + q = 43 > F: the rank update
    mll_and_weight_gradient(model, x, y)  # ScaleToBounds' bounds of the training step
    model.zero_grad()
    model.eval()
    with torch.no_grad():
        model(x_test)
    reference = DKLModel(x, y, rfgp.sketch(exact_kernel(), 16, seed=0))
    reference.load_state_dict(model.state_dict())
    results = []
    for appended in (False, True):
        new = x_new.clone().requires_grad_(True)
        with gpytorch.settings.detach_test_caches(False):
            if appended:
                reference.set_train_data(torch.cat([x, new]), torch.cat([y, y_new]), strict=False)
                reference.eval()
                mean = reference(x_test).mean
            else:
                fantasy = model.get_fantasy_model(new, y_new)
                assert type(fantasy.prediction_strategy).__name__ == "RankUpdatedFantasyStrategy"
                mean = fantasy(x_test).mean
        mean.sum().backward()
        results.append((mean.detach(), new.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-8, atol=1e-9)
    assert results[1][1].abs().max() > 1e-2
    # the network weights: the parent's caches reach them through the kernel's inputs, the new rows through the
    # fantasy model's copy; together the reference's gradient
    weight_grads = [m.feature_extractor[0].weight.grad for m in (model, fantasy, reference)]
    combined = sum(g for g in weight_grads[:2] if g is not None)
    torch.testing.assert_close(combined, weight_grads[2], rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("d", [2, 3])
def test_posterior_paths_of_a_deep_kernel_model_are_refused(d):
    """Weight-space paths evaluate covar_module on x itself; a DKL model's kernel sees the network's outputs, so paths
    would skip the network (before: paths were drawn, and evaluating them failed with a shape error for 3 input
    columns, and for 2 gave, silently, draws of another function)."""
    x, y = regression_data(d=d)
    model = DKLModel(x, y, rfgp.sketch(exact_kernel(), 64, seed=0))
    model.eval()
    with pytest.raises(ValueError, match="DKLModel.forward passes its inputs to covar_module transformed"):
        rfgp.sampling.posterior_paths(model, 4)


# ---------------------------------------------------------------- SV-DKL (classification)
NUM_LATENT, NUM_CLASSES = 2, 3


class SVDKLGPLayer(gpytorch.models.ApproximateGP):
    """GPyTorch's SV-DKL GP layer with a plain VariationalStrategy (inducing points in the network's output space,
    one set per latent GP) instead of the grid: a batch of NUM_LATENT GPs under
    IndependentMultitaskVariationalStrategy."""

    def __init__(self, kernel, num_inducing=8):
        batch = torch.Size([NUM_LATENT])
        gen = torch.Generator().manual_seed(2)
        inducing = torch.rand(NUM_LATENT, num_inducing, 2, generator=gen, dtype=F64) * 2 - 1
        distribution = gpytorch.variational.CholeskyVariationalDistribution(num_inducing, batch_shape=batch)
        strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(
            gpytorch.variational.VariationalStrategy(self, inducing, distribution, learn_inducing_locations=True),
            num_tasks=NUM_LATENT)
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
        self.covar_module = kernel
        distribution.variational_mean.data = 0.5 * torch.randn(NUM_LATENT, num_inducing, generator=gen, dtype=F64)
        strategy.base_variational_strategy.variational_params_initialized.fill_(1)  # no random re-initialisation

    def forward(self, z):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(z), self.covar_module(z))


class SVDKL(gpytorch.Module):
    def __init__(self, kernel):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(1)
            self.feature_extractor = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(),
                                                         torch.nn.Linear(16, 2)).double()
        self.scale_to_bounds = gpytorch.utils.grid.ScaleToBounds(-1.0, 1.0)
        self.gp_layer = SVDKLGPLayer(kernel)
        self.double()

    def forward(self, x):
        return self.gp_layer(self.scale_to_bounds(self.feature_extractor(x)))


def batch_kernel():
    batch = torch.Size([NUM_LATENT])
    kernel = ScaleKernel(RBFKernel(batch_shape=batch), batch_shape=batch).double()
    kernel.base_kernel.lengthscale = torch.tensor([0.3, 0.4], dtype=F64).reshape(NUM_LATENT, 1, 1)
    return kernel


def classification_data(n=60):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=gen, dtype=F64)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()


def svdkl_elbo_and_weight_gradient(kernel):
    x, labels = classification_data()
    model = SVDKL(kernel)
    likelihood = gpytorch.likelihoods.SoftmaxLikelihood(num_features=NUM_LATENT, num_classes=NUM_CLASSES).double()
    likelihood.mixing_weights.data = torch.randn(NUM_CLASSES, NUM_LATENT, generator=torch.Generator().manual_seed(3),
                                                 dtype=F64)
    elbo = gpytorch.mlls.VariationalELBO(likelihood, model.gp_layer, num_data=x.shape[0])
    with torch.random.fork_rng(), gpytorch.settings.num_likelihood_samples(32):
        torch.manual_seed(5)  # the same standard normals in every model
        value = elbo(model(x), labels)
    value.backward()
    return value.detach(), model.feature_extractor[0].weight.grad.clone(), model, likelihood


def test_svdkl_elbo_and_network_gradient_approach_the_exact_kernel():
    value_exact, grad_exact, _, _ = svdkl_elbo_and_weight_gradient(batch_kernel())

    def rms_errors(width):
        errors = []
        for seed in range(4):
            value, grad, _, _ = svdkl_elbo_and_weight_gradient(rfgp.sketch(batch_kernel(), width, seed=seed))
            errors.append(torch.stack([(value - value_exact).abs(), (grad - grad_exact).norm() / grad_exact.norm()]))
        return torch.stack(errors).pow(2).mean(0).sqrt()

    narrow, wide = rms_errors(128), rms_errors(2048)
    assert (wide < narrow / 2).all(), (narrow, wide)
    assert wide[0] < 0.01 and wide[1] < 0.4, wide  # measured 0.0033 and 0.18 (F = 32 768: 0.0005, 0.052)


def test_svdkl_predictions_and_state_dict_round_trip():
    x, _ = classification_data()
    _, _, model, likelihood = svdkl_elbo_and_weight_gradient(rfgp.sketch(batch_kernel(), 8192, seed=0))
    _, _, exact, _ = svdkl_elbo_and_weight_gradient(batch_kernel())
    fresh = SVDKL(rfgp.sketch(batch_kernel(), 8192, seed=9))
    fresh.load_state_dict(model.state_dict())
    outputs = []
    for m in (model, fresh, exact):
        m.eval()
        with torch.no_grad():
            outputs.append(m(x[:8]))
    assert torch.equal(outputs[0].mean, outputs[1].mean) and torch.equal(outputs[0].variance, outputs[1].variance)
    assert (outputs[0].mean - outputs[2].mean).abs().max() < 0.06  # F = 2048: 0.044, F = 32 768: 0.008
    assert (outputs[0].variance - outputs[2].variance).abs().max() < 0.06


# ---------------------------------------------------------------- Bayesian GPLVM
GPLVM_N, GPLVM_D, GPLVM_Q, GPLVM_M = 30, 4, 2, 10


def gplvm_data():
    gen = torch.Generator().manual_seed(0)
    t = torch.rand(GPLVM_N, 1, generator=gen, dtype=F64) * 4
    loadings = torch.randn(2, GPLVM_D, generator=gen, dtype=F64)
    signal = torch.cat([torch.sin(t), torch.cos(t)], -1) @ loadings
    return signal + 0.05 * torch.randn(GPLVM_N, GPLVM_D, generator=gen, dtype=F64)


class GPLVM(gpytorch.models.gplvm.BayesianGPLVM):
    """GPyTorch's Bayesian GPLVM tutorial model: D independent output GPs (batch), latent X of width Q."""

    def __init__(self, kernel, latent):
        from gpytorch.models.gplvm import MAPLatentVariable, PointLatentVariable, VariationalLatentVariable
        from gpytorch.priors import NormalPrior

        gen = torch.Generator().manual_seed(1)
        x_init = torch.nn.Parameter(torch.randn(GPLVM_N, GPLVM_Q, generator=gen, dtype=F64))
        prior = NormalPrior(torch.zeros(GPLVM_N, GPLVM_Q, dtype=F64), torch.ones(GPLVM_N, GPLVM_Q, dtype=F64))
        if latent == "variational":
            with torch.random.fork_rng():  # its log-σ are drawn from the global generator
                torch.manual_seed(1)
                x = VariationalLatentVariable(GPLVM_N, GPLVM_D, GPLVM_Q, x_init, prior).double()
        elif latent == "map":
            x = MAPLatentVariable(GPLVM_N, GPLVM_Q, x_init, prior)
        else:
            x = PointLatentVariable(GPLVM_N, GPLVM_Q, x_init)
        inducing = torch.randn(GPLVM_D, GPLVM_M, GPLVM_Q, generator=gen, dtype=F64)
        batch = torch.Size([GPLVM_D])
        distribution = gpytorch.variational.CholeskyVariationalDistribution(GPLVM_M, batch_shape=batch)
        strategy = gpytorch.variational.VariationalStrategy(self, inducing, distribution, learn_inducing_locations=True)
        super().__init__(x, strategy)
        self.mean_module = gpytorch.means.ZeroMean(batch_shape=batch)
        self.covar_module = kernel
        distribution.variational_mean.data = 0.5 * torch.randn(GPLVM_D, GPLVM_M, generator=gen, dtype=F64)
        strategy.variational_params_initialized.fill_(1)  # GPyTorch would re-draw it at the first call
        self.likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch)
        self.double()

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    def latent_parameter(self):
        return self.X.q_mu if hasattr(self.X, "q_mu") else self.X.X


def gplvm_kernel():
    """Lengthscales at which K(Z, Z) of the 10 inducing points is well conditioned (smallest eigenvalue ≥ 0.005):
    the whitened strategy multiplies kernel errors by chol(K_ZZ)⁻¹."""
    kernel = ScaleKernel(RBFKernel(ard_num_dims=GPLVM_Q)).double()
    kernel.base_kernel.lengthscale = torch.tensor([0.5, 0.6], dtype=F64)
    return kernel


def gplvm_loss(model, y):
    """The tutorial's loss: −ELBO summed over the D outputs, at one draw of the latent X (same seed in every model)."""
    elbo = gpytorch.mlls.VariationalELBO(model.likelihood, model, num_data=GPLVM_N)
    with torch.random.fork_rng():
        torch.manual_seed(5)
        sample = model.sample_latent_variable()
    return -elbo(model(sample), y.T).sum()


def gplvm_loss_and_latent_gradient(kernel, latent):
    y = gplvm_data()
    model = GPLVM(kernel, latent)
    model.train()
    loss = gplvm_loss(model, y)
    loss.backward()
    return loss.detach(), model.latent_parameter().grad.clone()


@pytest.mark.parametrize("latent", ["variational", "map", "point"])
def test_gplvm_elbo_and_latent_gradient_approach_the_exact_kernel(latent):
    """The latent X reach the kernel as its inputs: the ELBO and its gradient w.r.t. X (the kernel's part: the point
    latent variable has no prior term) approach the exact kernel's as F grows."""
    loss_exact, grad_exact = gplvm_loss_and_latent_gradient(gplvm_kernel(), latent)

    def rms_errors(width):
        errors = []
        for seed in range(6):
            loss, grad = gplvm_loss_and_latent_gradient(rfgp.sketch(gplvm_kernel(), width, seed=seed), latent)
            errors.append(torch.stack([(loss - loss_exact).abs() / loss_exact.abs(),
                                       (grad - grad_exact).norm() / grad_exact.norm()]))
        return torch.stack(errors).pow(2).mean(0).sqrt()

    narrow, wide = rms_errors(256), rms_errors(4096)
    assert (wide < narrow / 2).all(), (narrow, wide)
    assert wide[0] < 4e-3 and wide[1] < 0.15, wide  # measured ≤ 1.7e-3 and ≤ 0.086


def test_gplvm_latent_gradient_matches_central_differences():
    y = gplvm_data()
    model = GPLVM(rfgp.sketch(gplvm_kernel(), 64, seed=0), "point")
    model.train()
    gplvm_loss(model, y).backward()
    latent = model.latent_parameter()
    grad = latent.grad.clone()
    step = 1e-6
    for i, j in [(0, 0), (7, 1), (19, 0), (29, 1)]:
        values = []
        for sign in (1, -1):
            with torch.no_grad():
                latent[i, j] += sign * step
                values.append(gplvm_loss(model, y))
                latent[i, j] -= sign * step
        assert abs((values[0] - values[1]) / (2 * step) - grad[i, j]) < 1e-6 * (1 + abs(grad[i, j]))


def test_gplvm_training_steps_follow_the_exact_kernel():
    """Ten Adam steps of the tutorial's loop (variational latent X, inducing points, hyperparameters): the loss falls
    as the exact model's does.  (Adam's steps are ≈ lr·sign(gradient) for the many latent coordinates whose gradient
    is near 0, so individual latent means are no fair comparison.)"""
    y = gplvm_data()
    losses = []
    for kernel in (gplvm_kernel(), rfgp.sketch(gplvm_kernel(), 4096, seed=0)):
        model = GPLVM(kernel, "variational")
        model.train()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
        trace = []
        for _ in range(10):
            optimizer.zero_grad()
            loss = gplvm_loss(model, y)
            loss.backward()
            optimizer.step()
            trace.append(loss.detach())
        losses.append(torch.stack(trace))
    assert losses[1][-1] < losses[1][0]
    torch.testing.assert_close(losses[1], losses[0], rtol=5e-3, atol=0)  # RMS relative error at F = 4096: 1.6e-3


# ---------------------------------------------------------------- distributional inputs
def symmetrized_kl_rows(n=30):
    gen = torch.Generator().manual_seed(0)
    return torch.cat([torch.randn(n, 2, generator=gen, dtype=F64),
                      0.5 * torch.randn(n, 2, generator=gen, dtype=F64) - 1], -1)  # (means, log variances)


def squared_mean_distance(x1, x2):
    return (x1[..., :, None, :2] - x2[..., None, :, :2]).pow(2).sum(-1)


DISTRIBUTIONAL = {
    "symmetrized_kl": lambda: gpytorch.kernels.GaussianSymmetrizedKLKernel().double(),
    "distance_function": lambda: gpytorch.kernels.DistributionalInputKernel(squared_mean_distance).double(),
}


@pytest.mark.parametrize("name", DISTRIBUTIONAL)
def test_distributional_input_kernels_are_refused_with_the_reason_and_convert_by_nystrom(name):
    """rfgp.sketch refuses GaussianSymmetrizedKLKernel and DistributionalInputKernel by name and says why (no spectral
    measure of their inputs); the Nyström route it names is the exact kernel with every point as a landmark, in the
    Gram matrix and in an ExactGP's marginal likelihood and its gradient w.r.t. the input means."""
    kernel = ScaleKernel(DISTRIBUTIONAL[name]()).double()
    what = {"symmetrized_kl": "GaussianSymmetrizedKLKernel: its inputs are Gaussian distributions",
            "distance_function": "DistributionalInputKernel: it is exp"}[name]
    with pytest.raises(TypeError, match=f"does not convert {what}.*method='nystrom'"):
        rfgp.sketch(kernel, 64)
    x = symmetrized_kl_rows()
    y = torch.sin(2 * x[:, 0]) + x[:, 1]
    nystrom = rfgp.sketch(kernel, x.shape[0], method="nystrom", x_sample=x)
    torch.testing.assert_close(nystrom(x).to_dense(), kernel(x).to_dense(), rtol=0, atol=1e-6)
    results = []
    for k in (kernel, nystrom):
        inputs = x.clone().requires_grad_(True)
        model = rfgp.models.ExactGPModel(inputs, y, gpytorch.likelihoods.GaussianLikelihood(), k).double()
        model.train()
        value = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)(model(inputs), y)
        value.backward()
        results.append((value.detach(), inputs.grad))
    assert abs(results[0][0] - results[1][0]) < 1e-6
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- GPyTorch's "Simple Batch Mode" regression
def test_simple_batch_mode_independent_regressions_approach_the_exact_kernel():
    """GPyTorch's batch-mode tutorial: B = 3 independent GPs on their own inputs (B, n, 1), a batch kernel and
    likelihood, loss = −mll.sum(); the summed marginal likelihood, its lengthscale gradients (one per member) and the
    batch of predictions approach the exact ones as F grows."""
    batch = torch.Size([3])
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(3, 25, 1, generator=gen, dtype=F64)
    y = torch.stack([torch.sin(6 * x[0, :, 0]), torch.cos(4 * x[1, :, 0]), x[2, :, 0] ** 2])
    y = y + 0.05 * torch.randn(y.shape, generator=gen, dtype=F64)
    x_test = torch.rand(3, 7, 1, generator=gen, dtype=F64)

    def kernel():
        k = ScaleKernel(RBFKernel(batch_shape=batch), batch_shape=batch).double()
        k.base_kernel.lengthscale = torch.tensor([0.1, 0.2, 0.4], dtype=F64).reshape(3, 1, 1)
        return k

    def run(k):
        model = gpytorch.models.ExactGP(x, y, gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch))
        model.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
        model.covar_module = k
        model.forward = lambda z: gpytorch.distributions.MultivariateNormal(model.mean_module(z), model.covar_module(z))
        model.double().train()
        value = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)(model(x), y).sum()
        value.backward()
        grad = k.base_kernel.raw_lengthscale.grad.flatten().clone()
        model.eval()
        with torch.no_grad():
            mean = model(x_test).mean
        return torch.cat([value.detach().reshape(1), grad, mean.flatten()])

    exact = run(kernel())

    def rms_errors(width):  # of the summed MLL, the three lengthscale gradients, the 21 predictive means
        squared = torch.stack([run(rfgp.sketch(kernel(), width, seed=s)) - exact for s in range(4)]).pow(2)
        return torch.stack([squared[:, 0].mean(), squared[:, 1:4].mean(), squared[:, 4:].mean()]).sqrt()

    narrow, wide = rms_errors(256), rms_errors(4096)
    assert (wide < narrow / 2).all(), (narrow, wide)
    assert (wide < 0.02).all(), wide
