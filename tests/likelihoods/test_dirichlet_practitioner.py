"""The Dirichlet GP as a classification practitioner uses it: GPyTorch's recipe with rfgp's pieces."""

import gpytorch
import pytest
import torch

import rfgp
from rfgp.kernels.fourier import SketchedRBFKernel
from rfgp.likelihoods import DirichletClassificationLikelihood
from rfgp.models import ExactGPModel


def _classifier(dtype, num_points=100, num_classes=3):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(num_points, 2, generator=gen, dtype=dtype)
    labels = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    likelihood = DirichletClassificationLikelihood(labels, num_classes=num_classes, dtype=dtype,
                                                   learn_additional_noise=True)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(32, seed=0))
    mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([num_classes]))
    model = ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel, mean).to(dtype)
    model.eval()
    return model, likelihood, torch.randn(40, 2, generator=gen, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_test_points_over_the_memory_budget_predict_the_classes_as_whole(dtype):
    # More test points than fit the memory budget (rfgp.settings.chunk_size) give a chunked posterior covariance;
    # with Φ* shared by the C classes its root rows are (C, chunk, F), and its variance, samples and class
    # probabilities failed on "expand(... [3, 16, 32], size=[16, 32])" (DirichletGPClassifier.predict_proba too).
    model, likelihood, x_test = _classifier(dtype)
    with torch.no_grad():
        whole = model(x_test)
        reference = (whole.mean, whole.variance, likelihood.predict_proba(whole), likelihood(whole).variance)
        with rfgp.settings.chunk_size(16):
            chunked = model(x_test)
            assert chunked.lazy_covariance_matrix.shape == (3, 40, 40)
            result = (chunked.mean, chunked.variance, likelihood.predict_proba(chunked), likelihood(chunked).variance)
            assert chunked.sample(torch.Size([4])).shape == (4, 3, 40)
            dense = chunked.lazy_covariance_matrix.to_dense()
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for got, expected in zip(result, reference):
        torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    torch.testing.assert_close(dense, whole.covariance_matrix, rtol=tol, atol=tol)


def test_a_model_with_another_number_of_classes_than_the_likelihood_is_refused_by_name():
    # Labels 1..3 without num_classes give 4 classes (class 0 without points); a model of batch (3,) built for the
    # three classes seen failed in training and prediction on GPyTorch's "Attempting to broadcast a dimension of
    # length 3 at -1!" instead of naming num_classes.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, 2, generator=gen)
    labels = (x[:, 0] > 0).long() + (x[:, 1] > 0).long() + 1
    likelihood = DirichletClassificationLikelihood(labels, learn_additional_noise=True)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(32, seed=0))
    model = ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel,
                         gpytorch.means.ConstantMean(batch_shape=torch.Size([3])))
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with pytest.raises(ValueError, match=r"batch shape \(3,\).*num_classes=4.*labels span 1\.\.3"):
        mll(model(x), likelihood.transformed_targets)
    model.eval()
    with torch.no_grad(), pytest.raises(ValueError, match=r"batch shape \(3,\).*num_classes=4"):
        model(x[:2])
    # one latent GP broadcast to all classes, and the C classes' own, are accepted
    for batch in (torch.Size([1]), torch.Size([4])):
        assert likelihood(gpytorch.distributions.MultivariateNormal(
            torch.zeros(*batch, 60), torch.eye(60).expand(*batch, 60, 60))).batch_shape == (4,)


def test_monte_carlo_class_probabilities_keep_to_the_memory_budget(monkeypatch):
    # predict_proba's Monte Carlo held chunk_size (256) samples of every point at once, whatever
    # rfgp.settings.memory_budget said: 80 000 points of 20 classes (6 MB of means) took 3.2 GB.  The points now go
    # in blocks that fit the budget, with the same draws: the same probabilities to rounding.
    gen = torch.Generator().manual_seed(0)
    mean = 3 * torch.randn(3000, 4, generator=gen, dtype=torch.float64)
    variance = torch.rand(3000, 4, generator=gen, dtype=torch.float64)
    posterior = gpytorch.distributions.MultivariateNormal(mean.T.contiguous(), torch.diag_embed(variance.T))
    likelihood = DirichletClassificationLikelihood(torch.tensor([0, 1, 2, 3]))
    reference = likelihood.predict_proba(posterior)
    largest = []
    softmax = rfgp.likelihoods.softmax.softmax_last
    monkeypatch.setattr(rfgp.likelihoods.softmax, "softmax_last", lambda x: largest.append(x.numel()) or softmax(x))
    budget = 2**20
    with rfgp.settings.memory_budget(budget):
        blocked = likelihood.predict_proba(posterior)
    assert 0 < max(largest) * 8 <= budget
    torch.testing.assert_close(blocked, reference, rtol=1e-12, atol=1e-12)


def test_gpytorchs_batch_shape_argument_is_taken_as_one_noise_per_class():
    """GPyTorch's DirichletClassificationLikelihood takes batch_shape (and ignores it); rfgp's drop-in raised
    "FixedNoiseGaussianLikelihood.__init__() got multiple values for keyword argument 'batch_shape'"."""
    labels = torch.tensor([0, 1, 2, 1, 0, 2])
    expected = DirichletClassificationLikelihood(labels).noise
    for shape in (torch.Size([3]), [3]):
        torch.testing.assert_close(DirichletClassificationLikelihood(labels, batch_shape=shape).noise, expected,
                                   rtol=0, atol=0)
    for shape in (torch.Size([2]), torch.Size(), None, 3):
        with pytest.raises(ValueError, match=r"batch_shape must be \(num_classes,\) = \(3,\) .* got"):
            DirichletClassificationLikelihood(labels, batch_shape=shape)


def test_gpytorchs_positional_alpha_epsilon_is_named():
    """``DirichletClassificationLikelihood(y, 0.1)`` (GPyTorch's order: targets, alpha_epsilon) said only
    "num_classes must be a positive integer, got 0.1"; the message now says which argument 0.1 was meant for."""
    y = torch.tensor([0, 1, 2, 1])
    with pytest.raises(TypeError, match=r"GPyTorch's DirichletClassificationLikelihood takes alpha_epsilon; pass "
                                        r"alpha_epsilon=0.1 by keyword"):
        DirichletClassificationLikelihood(y, 0.1)
    assert DirichletClassificationLikelihood(y, 3).num_classes == 3
