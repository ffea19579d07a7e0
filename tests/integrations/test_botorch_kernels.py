"""BoTorch's own kernels for rfgp.sketch: PositiveIndexKernel (MultiTaskGP's task kernel) as exact features."""

import pytest
import torch

botorch = pytest.importorskip("botorch")
pytest.importorskip("botorch.models.kernels.positive_index")  # BoTorch versions without it have nothing to convert

from botorch.models import MultiTaskGP  # noqa: E402
from botorch.models.kernels.positive_index import PositiveIndexKernel  # noqa: E402
from botorch.models.utils.priors import BetaPrior  # noqa: E402

import rfgp  # noqa: E402
from rfgp.integrations.botorch_kernels import PositiveIndexFeatureKernel  # noqa: E402

F64 = torch.float64
TASKS = torch.tensor([[0.0], [1.0], [2.0], [2.0], [0.0]], dtype=F64)


def positive_index(unit_scale=True, target=1):
    kernel = PositiveIndexKernel(num_tasks=3, rank=2, target_task_index=target, unit_scale_for_target=unit_scale,
                                 task_prior=BetaPrior(2.0, 3.0))  # on the task correlations, as in MultiTaskGP
    kernel = kernel.to(F64)
    generator = torch.Generator().manual_seed(0)
    kernel.covar_factor = torch.rand(3, 2, generator=generator, dtype=F64) + 0.1
    kernel.var = torch.rand(3, generator=generator, dtype=F64) + 0.05
    return kernel


@pytest.mark.parametrize("unit_scale", [True, False])
def test_converted_task_kernel_is_exact_with_the_same_gradients(unit_scale):
    exact = positive_index(unit_scale)
    converted = rfgp.sketch(exact, 1)
    assert isinstance(converted, PositiveIndexFeatureKernel) and converted.num_features == 2 + 3
    covariances = [kernel(TASKS).to_dense() for kernel in (exact, converted)]
    torch.testing.assert_close(covariances[1], covariances[0], rtol=1e-12, atol=1e-12)
    if unit_scale:
        assert torch.allclose(covariances[1][1, 1], torch.ones((), dtype=F64))  # task 1 is the target
    priors = [list(kernel.named_priors()) for kernel in (exact, converted)]
    assert [p[0] for p in priors[0]] == [p[0] for p in priors[1]] == ["IndexKernelPrior"]
    (_, module, prior, closure, _), (_, converted_module, _, converted_closure, _) = priors[0][0], priors[1][0]
    torch.testing.assert_close(prior.log_prob(converted_closure(converted_module)), prior.log_prob(closure(module)))
    grads = [torch.autograd.grad(c.sum(), [k.raw_covar_factor, k.raw_var])
             for c, k in zip(covariances, (exact, converted))]
    for g, e in zip(grads[1], grads[0]):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


def test_float32_task_kernel_matches_botorch():
    exact = positive_index().float()
    converted = rfgp.sketch(exact, 1)
    assert converted.raw_covar_factor.dtype == torch.float32
    tasks = TASKS.float()
    torch.testing.assert_close(converted(tasks).to_dense(), exact(tasks).to_dense(), rtol=1e-6, atol=1e-6)


def test_state_carries_the_target_task_and_refuses_another():
    converted = rfgp.sketch(positive_index(target=2), 1)
    state = converted.state_dict()
    assert int(state["config_target_task_index"]) == 2 and bool(state["config_unit_scale_for_target"])
    same = PositiveIndexFeatureKernel(num_tasks=3, rank=2, target_task_index=2, task_prior=BetaPrior(2.0, 3.0))
    same = same.to(F64)
    same.load_state_dict(state)
    torch.testing.assert_close(same(TASKS).to_dense(), converted(TASKS).to_dense(), rtol=0, atol=0)
    other = PositiveIndexFeatureKernel(num_tasks=3, rank=2, target_task_index=0, task_prior=BetaPrior(2.0, 3.0))
    other = other.to(F64)
    with pytest.raises(ValueError, match="target_task_index"):
        other.load_state_dict(state)


def test_unknown_keyword_is_refused_and_positive_index_arguments_are_accepted():
    with pytest.raises(TypeError, match="PositiveIndexFeatureKernel got unexpected keyword argument.*'target_task'"):
        PositiveIndexFeatureKernel(num_tasks=3, rank=2, target_task=1)
    tasks = PositiveIndexFeatureKernel(3, 2, target_task_index=1, unit_scale_for_target=False, active_dims=(1,))
    assert tasks.target_task_index == 1 and not tasks.unit_scale_for_target and tasks.active_dims.tolist() == [1]


def test_multitask_gp_converts_and_predicts_like_botorch():
    generator = torch.Generator().manual_seed(1)
    x = torch.rand(80, 2, generator=generator, dtype=F64)
    task = torch.randint(0, 2, (80, 1), generator=generator).to(F64)
    y = torch.sin(4 * x).sum(-1, keepdim=True) + 0.3 * task + 0.05 * torch.randn(80, 1, generator=generator, dtype=F64)
    model = MultiTaskGP(torch.cat([x, task], -1), y, task_feature=-1)
    assert isinstance(model.covar_module.kernels[1], PositiveIndexKernel)  # BoTorch's default task kernel
    model.covar_module.kernels[1].covar_factor = torch.tensor([[0.9], [0.4]], dtype=F64)
    train_x, test_x = model.train_inputs[0], torch.rand(10, 2, generator=generator, dtype=F64)
    with torch.no_grad():
        exact_covariance, exact_mean = model.covar_module(train_x).to_dense(), model.posterior(test_x).mean
        # a product keeps its width F: the RBF factor gets F / 3 features next to the 3 exact task features
        model.covar_module = rfgp.sketch(model.covar_module, 12288, seed=0, x_sample=train_x)
        model.prediction_strategy = None
        covariance, mean = model.covar_module(train_x).to_dense(), model.posterior(test_x).mean
    # Monte-Carlo error of 4 096 random Fourier features: ≈ 0.016 per entry, 0.04 at most over these 3 240 pairs
    assert (covariance - exact_covariance).abs().max() < 0.08, (covariance - exact_covariance).abs().max()
    assert mean.shape == exact_mean.shape == (10, 2) and (mean - exact_mean).abs().max() < 0.3
