"""GPyTorch's example notebooks not covered elsewhere, each run as written on small synthetic data of the notebook's
shapes with only the kernel swapped: ``rfgp.sketch(kernel, F)`` or Nyström with every relevant point a landmark.

Each recipe trains a few steps (the loss must fall), then loads the exact model's trained state and predicts: Nyström
with every input the kernel sees at prediction as a landmark gives the exact model's outputs (to the landmark jitter),
and ORF features approach them as F grows.  Notebooks (GPyTorch ``examples/``):

- 01 GP_Regression_on_Classification_Labels (GPyTorch's own ``DirichletClassificationLikelihood``, batch kernel)
- 02 Exact_GP_Posterior_Sampling_with_CIQ (``ciq_samples``)
- 04 VNNGP (``NNVariationalStrategy``), PolyaGamma_Binary_Classification (a custom likelihood, NGD),
  GP_Regression_with_Uncertain_Inputs
- 05 DGP_Multitask_Regression
- 07 Pyro_GPyTorch_Low_Level (1-D inputs, vectorised particles)
- 00 Hyperparameters and Implementing_a_custom_Kernel (Nyström of a custom kernel, set through
  ``base_kernel.<property>``)
"""

import math

import gpytorch
import pyro
import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

import rfgp

from .kernels.test_nystrom import SincKernel

F64 = torch.float64


@pytest.fixture(autouse=True)
def _float64():
    """The notebooks build their tensors in the default dtype; float64 here, so Nyström is exact to its jitter."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    yield
    torch.set_default_dtype(previous)


def exact(kernel, points):
    return kernel


def nystrom(kernel, points):
    points = torch.unique(points.reshape(-1, points.shape[-1]), dim=0)
    return rfgp.sketch(kernel, len(points), method="nystrom", x_sample=points, seed=0)


def orf(width):
    return lambda kernel, points: rfgp.sketch(kernel, width, method="orf", seed=0)


def inducing(state):
    """The exact model's trained inducing points (landmarks), if any."""
    return [state["variational_strategy.inducing_points"]] if state else []


def train(objective, optimizers, num_steps):
    """The notebooks' loop, ``num_steps`` times: zero the gradients, ``objective()``, backward, step every optimizer;
    the losses."""
    losses = []
    for _ in range(num_steps):
        for optimizer in optimizers:
            optimizer.zero_grad()
        loss = objective()
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
        losses.append(float(loss))
    return losses


# --- the notebooks' code paths, `convert` applied to the notebook's kernel; each returns (losses, outputs, state) ---

def classification_labels(convert, state):
    torch.manual_seed(2019)
    x = torch.randn(60, 2)
    y = torch.round(torch.sin(0.45 * math.pi * (x[:, 0] + x[:, 1])) + 1).long()
    test_x = torch.randn(15, 2)
    likelihood = gpytorch.likelihoods.DirichletClassificationLikelihood(y, learn_additional_noise=True, dtype=F64)
    classes = torch.Size((likelihood.num_classes,))

    class DirichletGPModel(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(x, likelihood.transformed_targets, likelihood)
            self.mean_module = gpytorch.means.ConstantMean(batch_shape=classes)
            self.covar_module = convert(ScaleKernel(RBFKernel(batch_shape=classes), batch_shape=classes),
                                        torch.cat([x, test_x]))

        def forward(self, z):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(z), self.covar_module(z))

    model = DirichletGPModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)

    def objective():
        return -mll(model(x), likelihood.transformed_targets).sum()

    losses = train(objective, (optimizer,), 5)
    if state is not None:
        model.load_state_dict(state, strict=False)
    model.eval()
    with gpytorch.settings.fast_pred_var(), torch.no_grad():
        prediction = model(test_x)
        samples = prediction.sample(torch.Size((64,))).exp()
    assert samples.shape == (64, *classes, len(test_x))
    return losses, (prediction.loc, prediction.variance), model.state_dict()


def ciq_sampling(convert, state):
    torch.manual_seed(0)
    train_x = torch.linspace(0, 1, 80)
    train_y = torch.sin(train_x * (2 * math.pi)) + torch.randn(train_x.size()) * 0.2
    test_x = torch.linspace(0, 1, 100)

    class ExactGPModel(gpytorch.models.ExactGP):
        def __init__(self, likelihood):
            super().__init__(train_x, train_y, likelihood)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = convert(ScaleKernel(RBFKernel()), torch.cat([train_x, test_x]).unsqueeze(-1))

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = ExactGPModel(likelihood)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)

    def objective():
        return -mll(model(train_x), train_y)

    losses = train(objective, (optimizer,), 5)
    if state is not None:
        model.load_state_dict(state, strict=False)
    model.eval()
    test_x.requires_grad_(True)
    with torch.no_grad():
        predictive = likelihood(model(test_x))
        with gpytorch.settings.ciq_samples(True), gpytorch.settings.num_contour_quadrature(10), \
                gpytorch.settings.minres_tolerance(1e-4):
            samples = predictive.rsample(torch.Size([4000]))
    # the draws have the predictive moments (5 standard errors at every point)
    z_mean = (samples.mean(0) - predictive.mean) / (predictive.variance / len(samples)).sqrt()
    z_variance = (samples.var(0) - predictive.variance) / (predictive.variance * math.sqrt(2 / len(samples)))
    assert z_mean.abs().max() < 5 and z_variance.abs().max() < 5, (z_mean.abs().max(), z_variance.abs().max())
    return losses, (predictive.mean, predictive.variance), model.state_dict()


def vnngp(convert, state):
    from gpytorch.variational.nearest_neighbor_variational_strategy import NNVariationalStrategy

    torch.manual_seed(0)
    x = torch.rand(60, 3) * 2 - 1
    y = torch.sin(3 * x[:, 0]) + x[:, 1] ** 2 + 0.1 * torch.randn(60)
    train_x, train_y, test_x = x[:48].contiguous(), y[:48].contiguous(), x[48:].contiguous()

    class GPModel(gpytorch.models.ApproximateGP):
        def __init__(self, likelihood, k=8, training_batch_size=16):
            distribution = gpytorch.variational.MeanFieldVariationalDistribution(len(train_x))
            strategy = NNVariationalStrategy(self, train_x, distribution, k=k, training_batch_size=training_batch_size)
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = convert(MaternKernel(nu=2.5, ard_num_dims=3), torch.cat([train_x, test_x]))
            self.likelihood = likelihood

        def forward(self, z):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(z), self.covar_module(z))

        def __call__(self, z, prior=False, **kwargs):
            if z is not None and z.dim() == 1:
                z = z.unsqueeze(-1)
            return self.variational_strategy(x=z, prior=False, **kwargs)

    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    with pytest.warns(ImportWarning):  # no faiss: GPyTorch falls back to scikit-learn, as in the notebook
        model = GPModel(likelihood)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=len(train_y))
    num_batches = model.variational_strategy._total_training_batches
    batches = iter([None] * 2 * num_batches + [(train_x[:24], train_y[:24]), (train_x[24:], train_y[24:])])
    torch.manual_seed(1)

    def objective():
        batch = next(batches)
        if batch is None:  # the notebook's first loop: the strategy chooses the minibatch
            output = model(None)
            targets = train_y[..., model.variational_strategy.current_training_indices]
        else:  # its second loop: minibatches from a DataLoader
            output, targets = model(batch[0]), batch[1]
        return -mll(output, targets)

    losses = train(objective, (optimizer,), 2 * num_batches + 2)
    if state is not None:
        model.load_state_dict(state, strict=False)
    model.eval()
    with torch.no_grad():
        prediction = model(test_x)
    return losses[::3], (prediction.mean, prediction.variance), model.state_dict()


class PGLikelihood(gpytorch.likelihoods._OneDimensionalLikelihood):
    """The notebook's Pólya-Gamma likelihood: the closed-form expected log likelihood of Eq. (10) of Wenzel et al."""

    def expected_log_prob(self, target, input, *args, **kwargs):
        mean, variance = input.mean, input.variance
        second_moment = variance + mean.pow(2)
        target = target.to(mean.dtype).mul(2.0).sub(1.0)
        c = second_moment.detach().sqrt()
        half_omega = 0.25 * torch.tanh(0.5 * c) / c
        return (0.5 * target * mean - half_omega * second_moment).sum(dim=-1)

    def forward(self, function_samples):
        return torch.distributions.Bernoulli(logits=function_samples)

    def marginal(self, function_dist):
        probs = self.quadrature(lambda samples: self.forward(samples).probs, function_dist)
        return torch.distributions.Bernoulli(probs=probs)


def polya_gamma(convert, state):
    torch.manual_seed(0)
    x = torch.linspace(-1.0, 1.0, 60)
    y = torch.distributions.Bernoulli(probs=torch.sin(x * math.pi).add(1.0).div(2.0)).sample()
    x = x.unsqueeze(-1)
    train_x, train_y, test_x, test_y = x[:48], y[:48], x[48:], y[48:]
    points = torch.linspace(-2.0, 2.0, 12).unsqueeze(-1)

    class GPModel(gpytorch.models.ApproximateGP):
        def __init__(self):
            distribution = gpytorch.variational.NaturalVariationalDistribution(len(points))
            strategy = gpytorch.variational.VariationalStrategy(self, points, distribution,
                                                                learn_inducing_locations=True)
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = convert(ScaleKernel(RBFKernel()), torch.cat([x, points, *inducing(state)]))

        def forward(self, z):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(z), self.covar_module(z))

    model = GPModel()
    model.covar_module.base_kernel.initialize(lengthscale=torch.tensor(0.2))
    likelihood = PGLikelihood()
    ngd = gpytorch.optim.NGD(model.variational_parameters(), num_data=len(train_y), lr=0.1)
    adam = torch.optim.Adam([{"params": model.hyperparameters()}, {"params": likelihood.parameters()}], lr=0.01)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=len(train_y))

    def objective():
        return -mll(model(train_x), train_y)

    losses = train(objective, (ngd, adam), 5)
    if state is not None:
        model.load_state_dict(state, strict=False)
    model.eval()
    with torch.no_grad():
        nll = -likelihood.log_marginal(test_y, model(test_x))
        probs = likelihood(model(test_x)).probs
    return losses, (nll, probs), model.state_dict()


def uncertain_inputs(convert, state):
    torch.manual_seed(0)
    mean_x, stdv_x = torch.linspace(0, 1, 20), torch.linspace(0.03, 0.01, 20)
    train_y = torch.sin(mean_x * (2 * math.pi)) + torch.randn(20) * 0.2
    points, test_x = torch.randn(10, 1), torch.linspace(0, 1, 21)

    class GPModel(gpytorch.models.ApproximateGP):
        def __init__(self):
            distribution = gpytorch.variational.CholeskyVariationalDistribution(len(points))
            strategy = gpytorch.variational.VariationalStrategy(self, points, distribution,
                                                                learn_inducing_locations=True)
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = convert(ScaleKernel(RBFKernel()),
                                        torch.cat([points, test_x.unsqueeze(-1), *inducing(state)]))

        def forward(self, z):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(z), self.covar_module(z))

    model, likelihood = GPModel(), gpytorch.likelihoods.GaussianLikelihood()
    model.likelihood = likelihood  # one state for both
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=20)

    def objective():
        sample = torch.distributions.Normal(mean_x, stdv_x).rsample()  # a new draw of the inputs per step
        return -mll(model(sample), train_y)

    losses = train(objective, (optimizer,), 8)
    if state is not None:
        model.load_state_dict(state, strict=False)
    model.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        prediction = likelihood(model(test_x))
        lower, upper = prediction.confidence_region()
    return losses, (prediction.mean, prediction.variance, upper), model.state_dict()


def pyro_low_level(convert, state):
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    train_x = torch.linspace(0, 1, 30)  # 1-D inputs, as in the notebook
    train_y = torch.distributions.Exponential((torch.sin(2 * math.pi * train_x) + 1).reciprocal()).sample()
    test_x, points = torch.linspace(0, 1, 15), torch.linspace(0, 1, 8)  # the inducing points among the test points

    class PVGPRegressionModel(gpytorch.models.ApproximateGP):
        def __init__(self, name_prefix="mixture_gp"):
            self.name_prefix = name_prefix
            distribution = gpytorch.variational.CholeskyVariationalDistribution(num_inducing_points=len(points))
            super().__init__(gpytorch.variational.VariationalStrategy(self, points, distribution))
            self.mean_module = gpytorch.means.ConstantMean()
            # landmarks: the points prediction evaluates the kernel at (with the training inputs: ill-conditioned)
            landmarks = torch.cat([test_x, points, *(z.flatten() for z in inducing(state))]).unsqueeze(-1)
            self.covar_module = convert(ScaleKernel(RBFKernel()), landmarks)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

        def guide(self, x, y):
            function_dist = self.pyro_guide(x)
            with pyro.plate(self.name_prefix + ".data_plate", dim=-1):
                pyro.sample(self.name_prefix + ".f(x)", function_dist)

        def model(self, x, y):
            pyro.module(self.name_prefix + ".gp", self)
            function_dist = self.pyro_model(x)
            with pyro.plate(self.name_prefix + ".data_plate", dim=-1):
                function_samples = pyro.sample(self.name_prefix + ".f(x)", function_dist)
                rate = function_samples.exp().reciprocal()
                return pyro.sample(self.name_prefix + ".y", pyro.distributions.Exponential(rate), obs=y)

    model = PVGPRegressionModel()
    pyro.clear_param_store()
    pyro.set_rng_seed(1)
    elbo = pyro.infer.Trace_ELBO(num_particles=16, vectorize_particles=True, retain_graph=True)
    svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.1}), elbo)
    model.train()
    losses = [float(svi.step(train_x, train_y)) for _ in range(6)]
    if state is not None:
        model.load_state_dict(state, strict=False)
    model.eval()
    with torch.no_grad():
        output = model(test_x)
        assert output(torch.Size([100])).shape == (100, len(test_x))
    return losses, (output.mean, output.variance), model.state_dict()


def dgp_multitask(convert, state):
    from gpytorch.models.deep_gps import DeepGP, DeepGPLayer

    torch.manual_seed(0)
    x = torch.linspace(0, 1, 30)
    angle = x * (2 * math.pi)
    train_y = torch.stack([torch.sin(angle), torch.cos(angle), torch.sin(angle) + 2 * torch.cos(angle),
                           -torch.cos(angle)], -1) + 0.2 * torch.randn(30, 4)
    train_x, test_x = x.unsqueeze(-1), torch.linspace(0, 1, 11).unsqueeze(-1)

    class DGPHiddenLayer(DeepGPLayer):
        def __init__(self, input_dims, output_dims, num_inducing=8, linear_mean=True):
            batch_shape = torch.Size([output_dims])
            points = torch.randn(output_dims, num_inducing, input_dims,
                                 generator=torch.Generator().manual_seed(input_dims))
            distribution = gpytorch.variational.CholeskyVariationalDistribution(num_inducing, batch_shape=batch_shape)
            strategy = gpytorch.variational.VariationalStrategy(self, points, distribution,
                                                                learn_inducing_locations=True)
            super().__init__(strategy, input_dims, output_dims)
            self.mean_module = gpytorch.means.ConstantMean() if linear_mean else gpytorch.means.LinearMean(input_dims)
            self.covar_module = convert(ScaleKernel(MaternKernel(nu=2.5, batch_shape=batch_shape,
                                                                 ard_num_dims=input_dims),
                                                    batch_shape=batch_shape, ard_num_dims=None), None)

        def forward(self, z):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(z), self.covar_module(z))

    class MultitaskDeepGP(DeepGP):
        def __init__(self):
            hidden_layer, last_layer = DGPHiddenLayer(1, 3), DGPHiddenLayer(3, 4, linear_mean=False)
            super().__init__()
            self.hidden_layer, self.last_layer = hidden_layer, last_layer
            self.likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=4)

        def forward(self, inputs):
            return self.last_layer(self.hidden_layer(inputs))

    model = MultitaskDeepGP()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    mll = gpytorch.mlls.DeepApproximateMLL(gpytorch.mlls.VariationalELBO(model.likelihood, model, num_data=30))
    seeds = iter(range(100, 200))

    def objective():
        torch.manual_seed(next(seeds))  # the same layer samples in every model
        return -mll(model(train_x), train_y)

    with gpytorch.settings.num_likelihood_samples(4):
        losses = train(objective, (optimizer,), 5)
    if state is not None:
        model.load_state_dict(state, strict=False)
    model.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var(), gpytorch.settings.num_likelihood_samples(4):
        torch.manual_seed(7)
        prediction = model.likelihood(model(test_x)).to_data_independent_dist()
    return losses, (prediction.mean.mean(0), prediction.variance.mean(0)), model.state_dict()


def custom_kernel_and_hyperparameters(convert, state):
    """The custom-kernel notebook's ``SincKernel`` in a ScaleKernel, with the Hyperparameters notebook's priors,
    constraints, ``initialize`` paths and ``base_kernel.<property>`` writes (only Nyström converts a custom kernel)."""
    torch.manual_seed(0)
    train_x = torch.linspace(0, 1, 40)
    train_y = torch.sin(train_x * (2 * math.pi)) + torch.randn(40) * 0.2
    test_x = torch.linspace(0, 1, 21)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-2))
    likelihood.noise_covar.register_prior("noise_std_prior", gpytorch.priors.NormalPrior(0, 1),
                                          lambda module: module.noise.sqrt())

    class SincGPModel(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(train_x, train_y, likelihood)
            self.mean_module = gpytorch.means.ConstantMean()
            prior = gpytorch.priors.GammaPrior(2.0, 0.15)
            self.covar_module = convert(ScaleKernel(SincKernel(), outputscale_prior=prior),
                                        torch.cat([train_x, test_x]).unsqueeze(-1))
            self.covar_module.outputscale = prior.mean
            self.covar_module.base_kernel.length = 0.1

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    model = SincGPModel()
    model.initialize(**{"likelihood.noise_covar.noise": torch.tensor(0.5),
                        "covar_module.outputscale": torch.tensor(2.0)})
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)

    def objective():
        return -mll(model(train_x), train_y)

    losses = train(objective, (optimizer,), 5)
    if state is not None:
        model.load_state_dict(state, strict=False)
    model.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        prediction = likelihood(model(test_x))
    return losses, (prediction.mean, prediction.variance), model.state_dict()


RECIPES = {  # name: (recipe, ORF widths (narrow, wide), or None: a custom kernel converts by Nyström only)
    "classification_labels": (classification_labels, (64, 4096)),  # logits (log-Dirichlet targets) within ±4
    "ciq_sampling": (ciq_sampling, (64, 4096)),
    "vnngp": (vnngp, (64, 4096)),
    "polya_gamma": (polya_gamma, (64, 4096)),
    "uncertain_inputs": (uncertain_inputs, (64, 4096)),
    "pyro_low_level": (pyro_low_level, (64, 4096)),
    "dgp_multitask": (dgp_multitask, (64, 2048)),
    "custom_kernel_and_hyperparameters": (custom_kernel_and_hyperparameters, None),
}


def largest_error(outputs, reference):
    return max(float((a - b).abs().max()) for a, b in zip(outputs, reference))


@pytest.mark.parametrize("name", list(RECIPES))
def test_notebook_recipe_trains_and_predicts_as_the_exact_model(name):
    recipe, widths = RECIPES[name]
    losses, reference, state = recipe(exact, None)
    assert losses[-1] < losses[0], losses
    if name != "dgp_multitask":  # Nyström landmarks are known inputs: a deep GP's last layer sees random samples
        sketched_losses, outputs, _ = recipe(nystrom, state)
        assert sketched_losses[-1] < sketched_losses[0], sketched_losses
        assert largest_error(outputs, reference) < 1e-4, largest_error(outputs, reference)
    if widths is not None:
        errors = []
        for width in widths:
            sketched_losses, outputs, _ = recipe(orf(width), state)
            assert sketched_losses[-1] < sketched_losses[0], sketched_losses
            errors.append(largest_error(outputs, reference))
        assert errors[1] < errors[0] / 2 and errors[1] < (0.2 if name == "classification_labels" else 0.05), errors


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("convert", [orf(256), nystrom], ids=["orf", "nystrom"])
def test_torchscript_variational_notebook_traces_saves_and_loads(convert, tmp_path):
    """08 TorchScript_Variational_Models: an SVGP wrapped to return (mean, variance), traced under ``trace_mode``
    after one evaluation, saved and loaded, predicts as the model at other test points."""
    torch.manual_seed(0)
    train_x, train_y, test_x = torch.randn(100, 4), torch.randn(100), torch.randn(48, 4)
    points = torch.randn(12, 4)

    class GPModel(gpytorch.models.ApproximateGP):
        def __init__(self):
            distribution = gpytorch.variational.CholeskyVariationalDistribution(len(points))
            super().__init__(gpytorch.variational.VariationalStrategy(self, points, distribution,
                                                                      learn_inducing_locations=True))
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = convert(ScaleKernel(RBFKernel(ard_num_dims=4)), torch.cat([points, test_x]))

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    class MeanVarModelWrapper(torch.nn.Module):
        def __init__(self, gp):
            super().__init__()
            self.gp = gp

        def forward(self, x):
            output = self.gp(x)
            return output.mean, output.variance

    model, likelihood = GPModel(), gpytorch.likelihoods.GaussianLikelihood()
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=len(train_y))
    optimizer = torch.optim.Adam([*model.parameters(), *likelihood.parameters()], lr=0.05)
    for _ in range(3):
        optimizer.zero_grad()
        (-mll(model(train_x), train_y)).backward()
        optimizer.step()
    model.eval()
    wrapped = MeanVarModelWrapper(model)
    with torch.no_grad(), gpytorch.settings.trace_mode():
        wrapped(test_x[:16])  # computes the caches
        traced = torch.jit.trace(wrapped, test_x[:16])
    traced.save(str(tmp_path / "traced.pt"))
    loaded = torch.jit.load(str(tmp_path / "traced.pt"))
    with torch.no_grad():
        for actual, expected in zip(loaded(test_x[16:]), wrapped(test_x[16:])):
            torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)
