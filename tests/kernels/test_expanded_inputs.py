"""Kernels on inputs whose batch members are copies (rfgp.core.batch_copies) compute the features once.

GPyTorch's ``likelihood(model(x))`` for a sampled likelihood evaluates K(x, x) on ``num_likelihood_samples`` copies
of x, which reach an rfgp kernel as stride-0 views (rfgp.kernels.batch_expansion; GPyTorch's own expansion repeats
x).  The features and the dense Gram are computed on one copy and returned expanded: the same values as the kernel
on x alone, the same hyperparameter gradients as evaluating every copy, and a feature map that sees n rows, not S·n.
Real copies made by the caller (``repeat``) are computed per member, with the same values.
"""

import gpytorch
import pytest
import torch
from gpytorch.lazy import LazyEvaluatedKernelTensor
from gpytorch.models import ApproximateGP
from gpytorch.variational import CholeskyVariationalDistribution, VariationalStrategy
from linear_operator.operators import DenseLinearOperator

import rfgp
from rfgp.core.batch_copies import copied_batch_dims
from rfgp.core.settings import WORKING_COPIES
from rfgp.inference.operators import ChunkedFeatureRootLinearOperator, FeatureRootLinearOperator

F64 = torch.float64
N, D, S = 12, 2, 5


def points(n=N, seed=0):
    return torch.rand(n, D, generator=torch.Generator().manual_seed(seed), dtype=F64)


def scaled_kernel(method="orf", num_features=128):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=D)).double()
    kernel.base_kernel.lengthscale = torch.tensor([[0.3, 0.5]], dtype=F64)
    kernel.outputscale = 1.7
    return rfgp.sketch(kernel, num_features, method=method, seed=0)


class RowCounter:
    """Counts the rows (batch members × points) a feature map is asked to featurise."""

    def __init__(self, feature_map):
        self.rows = 0
        self.forward = feature_map.forward
        feature_map.forward = self

    def __call__(self, x):
        self.rows += x.shape[:-1].numel()
        return self.forward(x)


def test_copies_give_the_kernel_on_one_copy_expanded_and_featurise_it_once():
    x = points()
    kernel = scaled_kernel()
    counter = RowCounter(kernel.base_kernel.feature_map)
    single = kernel(x).to_dense()
    rows_single = counter.rows
    counter.rows = 0
    batch = x.expand(S, 1, N, D)
    covariance = kernel(batch).evaluate_kernel()
    dense = covariance.to_dense()
    assert counter.rows == rows_single  # n rows and a probe row: before, S times as many
    assert torch.equal(dense, single.expand(S, 1, N, N))
    assert isinstance(covariance, FeatureRootLinearOperator)  # still the feature root, stride-0 batch
    assert covariance.scaled_features()[0].stride(0) == 0
    assert torch.equal(kernel(batch, diag=True), kernel(x, diag=True).expand(S, 1, N))
    assert torch.equal(kernel(batch, batch[:, :, :4]).to_dense(), kernel(x, x[:4]).to_dense().expand(S, 1, N, 4))


def test_real_copies_made_by_the_caller_are_computed_per_member_with_the_same_values():
    """A repeated input holds real copies, which only their values would reveal: every member is featurised (no host
    synchronisation to compare them), and the covariance is the kernel's on each member."""
    x = points()
    kernel = scaled_kernel()
    counter = RowCounter(kernel.base_kernel.feature_map)
    single = kernel(x).to_dense()
    rows_single = counter.rows
    counter.rows = 0
    dense = kernel(x.repeat(S, 1, 1, 1)).to_dense()
    assert counter.rows == S * rows_single
    torch.testing.assert_close(dense, single.expand(S, 1, N, N), rtol=1e-13, atol=1e-13)


def test_gradients_through_copies_equal_those_of_every_copy_evaluated():
    """The hyperparameter gradient of Σ_s ⟨K(x_s, x_s), W_s⟩ sums over the copies; a stride-0 input's base tensor gets
    the sum of the members' input gradients."""
    x = points()
    weights = torch.randn(S, 1, N, N, generator=torch.Generator().manual_seed(1), dtype=F64)
    kernel = scaled_kernel()
    base = x.clone().requires_grad_(True)
    value = (kernel(base.expand(S, 1, N, D)).to_dense() * weights).sum()
    grads = torch.autograd.grad(value, [base, *kernel.parameters()])
    base_ref = x.clone().requires_grad_(True)
    reference = sum((kernel(base_ref).to_dense() * weights[s, 0]).sum() for s in range(S))
    expected = torch.autograd.grad(reference, [base_ref, *kernel.parameters()])
    for grad, want in zip(grads, expected):
        torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-12)


def test_inputs_that_need_their_own_gradients_are_evaluated_per_member():
    """The members of a leaf that requires grad, expanded with stride 0, each keep their own gradient: no copies are
    taken out."""
    x = points()
    kernel = scaled_kernel()
    counter = RowCounter(kernel.base_kernel.feature_map)
    leaf = x.expand(S, N, D).requires_grad_(True)
    weights = torch.randn(S, N, N, generator=torch.Generator().manual_seed(2), dtype=F64)
    (kernel(leaf).to_dense() * weights).sum().backward()
    assert counter.rows == S * (N + 1)
    for s in range(S):
        member = x.clone().requires_grad_(True)
        (kernel(member).to_dense() * weights[s]).sum().backward()
        torch.testing.assert_close(leaf.grad[s], member.grad, rtol=1e-12, atol=1e-12)


def test_which_dimensions_hold_copies():
    x = points().unsqueeze(0)  # (1, n, d)
    assert copied_batch_dims(x.expand(S, N, D), torch.Size([])) == (-3,)
    assert copied_batch_dims(x.expand(S, N, D), torch.Size([S])) == ()  # one lengthscale per member: not copies
    assert copied_batch_dims(x.repeat(S, 1, 1), torch.Size([])) == ()  # real copies: not compared by value
    assert copied_batch_dims(x.expand(S, N, D).requires_grad_(True), torch.Size([])) == ()  # a leaf's own .grad
    assert copied_batch_dims(x.clone().requires_grad_(True).expand(S, N, D), torch.Size([])) == (-3,)
    both = x.unsqueeze(0).expand(3, S, N, D)
    assert copied_batch_dims(both, torch.Size([])) == (-4, -3)
    assert copied_batch_dims(both, torch.Size([3, 1])) == (-3,)  # the kernel batch differs along -4
    mixed = x.unsqueeze(0).repeat(1, S, 1, 1).expand(3, S, N, D)  # copies along -4 only
    assert copied_batch_dims(mixed, torch.Size([])) == (-4,)


def test_expanding_a_feature_root_keeps_its_variance_correction():
    """linear_operator rebuilt an expanded root operator from the root alone: the correction was dropped."""
    root, correction = torch.rand(N, 4, dtype=F64), torch.rand(N, dtype=F64)
    expanded = FeatureRootLinearOperator(root, correction).expand(S, N, N)
    assert isinstance(expanded, FeatureRootLinearOperator)
    assert torch.equal(expanded.variance_correction, correction.expand(S, N))
    assert torch.equal(expanded.to_dense(), (root @ root.T).expand(S, N, N))


def test_chunked_kernel_on_copies_chunks_one_copy():
    """At a memory budget that the S copies exceed but one copy fits, the kernel no longer chunks (before: the
    budget counted every copy and split the rows); a forced chunk size keeps a chunked operator, expanded."""
    x = points()
    kernel = scaled_kernel(num_features=256)
    batch = x.expand(S, 1, N, D)
    single = kernel(x).to_dense()
    budget = 2 * WORKING_COPIES * N * 256 * 8  # bytes: one copy's Φ fits twice, S copies' not
    with rfgp.settings.memory_budget(budget):
        covariance = kernel(batch).evaluate_kernel()
        assert isinstance(covariance, FeatureRootLinearOperator)
        assert torch.equal(covariance.to_dense(), single.expand(S, 1, N, N))
    with rfgp.settings.chunk_size(5):
        covariance = kernel(batch).evaluate_kernel()
        assert isinstance(covariance, ChunkedFeatureRootLinearOperator)
        torch.testing.assert_close(covariance.to_dense(), single.expand(S, 1, N, N), rtol=1e-13, atol=1e-13)


class SVGP(ApproximateGP):
    def __init__(self, covar_module, inducing_points):
        q_u = CholeskyVariationalDistribution(inducing_points.shape[-2]).double()
        super().__init__(VariationalStrategy(self, inducing_points, q_u, learn_inducing_locations=True))
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = covar_module

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def test_sampled_likelihood_featurises_the_test_points_once_whatever_the_number_of_samples():
    """``likelihood(model(x))`` of a Beta likelihood in eval mode: GPyTorch expands x for each of the S samples; the
    rows featurised no longer grow with S, and the samples are those of the dense predictive covariance."""
    x, z = points(20, seed=3), points(6, seed=4)
    model = SVGP(scaled_kernel(), z).double().eval()
    likelihood = gpytorch.likelihoods.BetaLikelihood().double().eval()
    with torch.no_grad(), gpytorch.settings.num_likelihood_samples(1):
        likelihood(model(x))  # eval mode caches K(Z, Z)'s factor, the kernel its probe rows' shapes, at the first call
    counter = RowCounter(model.covar_module.base_kernel.feature_map)
    rows = {}
    for samples in (1, 16):
        counter.rows = 0
        with torch.no_grad(), gpytorch.settings.num_likelihood_samples(samples):
            latent = model(x)
            torch.manual_seed(0)
            predictive = likelihood(latent)
            rows[samples] = counter.rows
            covariance = DenseLinearOperator(latent.covariance_matrix)
            dense = gpytorch.distributions.MultivariateNormal(latent.mean, covariance)
            torch.manual_seed(0)
            reference = likelihood(dense)
        torch.testing.assert_close(predictive.mean, reference.mean, rtol=1e-12, atol=1e-12)
    assert rows[16] == rows[1]


def test_sampled_likelihood_hands_the_kernel_stride_0_copies():
    """pyro.plate expands the predictive distribution; its lazily evaluated rfgp covariance (inside the SVGP's sum)
    expands x by ``Tensor.expand`` (before: ``repeat``, S contiguous copies), so the feature kernel sees stride 0."""
    x, z = points(20, seed=3), points(6, seed=4)
    model = SVGP(scaled_kernel(), z).double().eval()
    likelihood = gpytorch.likelihoods.BetaLikelihood().double().eval()
    base = model.covar_module.base_kernel
    seen = []

    def forward(x1, x2, **kwargs):
        seen.append((x1.shape, x1.stride(), x2.stride()))
        return type(base).forward(base, x1, x2, **kwargs)

    base.forward = forward
    with torch.no_grad(), gpytorch.settings.num_likelihood_samples(16):
        likelihood(model(x))
    copies = [(shape, strides1, strides2) for shape, strides1, strides2 in seen if shape[:-2] == (16, 1)]
    assert copies and all(strides1[0] == 0 and strides2[0] == 0 for _, strides1, strides2 in copies)


def test_sampled_likelihood_values_and_gradients_equal_those_of_real_copies():
    """Student-t samples of an SVGP at inputs that require grad: the stride-0 copies give the samples and the gradients
    (inputs and every parameter) of GPyTorch's own repeat, which featurises each copy."""
    def sample_and_gradients():
        x = points(20, seed=3).requires_grad_(True)
        model = SVGP(scaled_kernel(), points(6, seed=4)).double().eval()
        likelihood = gpytorch.likelihoods.StudentTLikelihood().double().eval()
        with gpytorch.settings.num_likelihood_samples(8):
            torch.manual_seed(0)
            value = likelihood(model(x)).rsample().sum()
        return value, torch.autograd.grad(value, [x, *model.parameters()], allow_unused=True)

    value, gradients = sample_and_gradients()
    routed = LazyEvaluatedKernelTensor._expand_batch
    LazyEvaluatedKernelTensor._expand_batch = routed.generic_expand_batch
    try:
        reference, expected = sample_and_gradients()
    finally:
        LazyEvaluatedKernelTensor._expand_batch = routed
    torch.testing.assert_close(value, reference, rtol=1e-12, atol=1e-12)
    for gradient, want in zip(gradients, expected):
        if want is not None:
            torch.testing.assert_close(gradient, want, rtol=1e-10, atol=1e-10)


def test_expanding_a_lazy_rfgp_covariance_expands_its_inputs_and_keeps_the_rest():
    """Batch (3,) kernel on x (n, d) expanded to (S, 3): x becomes an (S, 1, n, d) view (what ``repeat`` made, as a
    copy); same class, kernel and values.  An exact kernel keeps linear_operator's repeat."""
    x = points()
    kernel = rfgp.sketch(gpytorch.kernels.RBFKernel(batch_shape=torch.Size([3])), 64, seed=0).double()
    kernel.lengthscale = torch.tensor([[[0.3]], [[0.5]], [[0.8]]], dtype=F64)
    lazy = kernel(x, x[:5])
    expanded = lazy.expand(S, 3, N, 5)
    assert type(expanded) is type(lazy) and expanded.kernel is kernel
    assert expanded.x1.shape == (S, 1, N, D) and expanded.x1.stride(0) == 0 and expanded.x1.data_ptr() == x.data_ptr()
    assert expanded.x2.shape == (S, 1, 5, D) and expanded.x2.stride(0) == 0
    assert torch.equal(expanded.to_dense(), lazy.to_dense().expand(S, 3, N, 5))
    symmetric = kernel(x).expand(S, 3, N, N)
    assert symmetric.x2 is symmetric.x1
    exact = gpytorch.kernels.RBFKernel()(x).expand(S, N, N)
    assert exact.x1.stride(0) != 0  # GPyTorch's own repeat, untouched


FAMILIES = {
    # name: kernel factory; each covariance keeps its operator class and its variance correction on copies
    "maclaurin (bias-corrected)": lambda: rfgp.kernels.MaclaurinRBFKernel(128, seed=0, ard_num_dims=D),
    "nystrom": lambda: rfgp.sketch(gpytorch.kernels.RBFKernel(), 8, method="nystrom", x_sample=points(30, 5), seed=0),
    "curl-free (2 outputs per point)": lambda: rfgp.kernels.SketchedCurlFreeKernel(64, input_dim=D, seed=0),
    "complex posterior": lambda: rfgp.kernels.SketchedPolynomialKernel(2, 64, weights="complex", seed=0,
                                                                       complex_posterior=True),
}


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_on_copies_is_its_covariance_on_one_copy_expanded(name):
    kernel = FAMILIES[name]().double()
    x = points().unsqueeze(0)  # one copy (a batch of 1: Nyström's batched triangular solve rounds otherwise)
    single = kernel(x).evaluate_kernel()
    covariance = kernel(x.expand(S, -1, -1)).evaluate_kernel()
    assert type(covariance) is type(single)
    assert torch.equal(covariance.to_dense(), single.to_dense().expand(S, -1, -1))
    if single.variance_correction is not None:
        assert torch.equal(covariance.variance_correction, single.variance_correction.expand(S, -1))
    torch.testing.assert_close(covariance.to_dense(), kernel(x[0]).to_dense().expand(S, -1, -1), rtol=1e-14,
                               atol=1e-14)
