"""A model refuses at construction a kernel whose declared input width contradicts train_x's columns.

Before, ``MultiOutputGPModel``/``ExactGPModel`` constructed without complaint and the error came at the first
``fit_mll`` or prediction, or never: ``ScaleKernel(RBFKernel(ard_num_dims=3))`` on one input column broadcast the
column over three lengthscales and trained a different model silently.  The check reads declared attributes only
(``ard_num_dims``, an rfgp kernel's ``input_dim``, ``active_dims``): a map that draws or fits at its first call is
not evaluated, and a kernel that declares nothing is left to that call.
"""

import gpytorch
import pytest
import torch
from gpytorch.kernels import MultitaskKernel, RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood, MultitaskGaussianLikelihood

import rfgp
from rfgp.features import RandomFourierFeatures
from rfgp.kernels import (
    CurlFreeRBFKernel,
    FeatureSumKernel,
    MultiOutputFeatureSumKernel,
    RandomFeatureKernel,
    SketchedCurlFreeKernel,
    SketchedDecomposableKernel,
    SketchedDivFreeKernel,
    SketchedRBFKernel,
)
from rfgp.models import ExactGPModel, MultiOutputGPModel

F64 = torch.float64


def _x(d, n=20):
    return torch.rand(n, d, generator=torch.Generator().manual_seed(d), dtype=F64)


def _multi(x, p, kernel):
    y = torch.sin(x.sum(-1, keepdim=True) + torch.arange(p, dtype=x.dtype))
    return MultiOutputGPModel(x, y, MultitaskGaussianLikelihood(num_tasks=p, rank=0), kernel)


def _single(x, kernel):
    return ExactGPModel(x, torch.sin(x.sum(-1)), GaussianLikelihood(), kernel)


MULTI_OUTPUT_CONTRADICTIONS = {
    "curl_free": (lambda: SketchedCurlFreeKernel(64, 3, seed=0), 3, "SketchedCurlFreeKernel(input_dim=3)"),
    "div_free_scaled": (lambda: ScaleKernel(SketchedDivFreeKernel(64, 3, seed=0)), 3,
                        "SketchedDivFreeKernel(input_dim=3)"),
    "exact_curl_free": (lambda: CurlFreeRBFKernel(3), 3, "CurlFreeRBFKernel(input_dim=3)"),
    "decomposable_ard": (lambda: SketchedDecomposableKernel(SketchedRBFKernel(64, ard_num_dims=3, seed=0), num_tasks=2),
                         2, "SketchedRBFKernel(ard_num_dims=3)"),
    "decomposable_input_dim": (lambda: SketchedDecomposableKernel(
        RandomFeatureKernel(RandomFourierFeatures(64, input_dim=3, seed=0)), num_tasks=2), 2,
        "RandomFeatureKernel(input_dim=3)"),
    "sketched_multitask": (lambda: rfgp.sketch(MultitaskKernel(RBFKernel(ard_num_dims=3), num_tasks=2), 64, seed=0), 2,
                           "SketchedRBFKernel(ard_num_dims=3)"),
    "helmholtz": (lambda: MultiOutputFeatureSumKernel(ScaleKernel(SketchedCurlFreeKernel(64, 3, seed=0)),
                                                      ScaleKernel(SketchedDivFreeKernel(64, 3, seed=1))), 3,
                  "SketchedCurlFreeKernel(input_dim=3)"),
}


@pytest.mark.parametrize("case", list(MULTI_OUTPUT_CONTRADICTIONS))
def test_multi_output_model_refuses_a_kernel_built_for_other_input_columns(case):
    """Before: constructed; the first evaluation raised ("x1 has 2 input dimensions ... built for input_dim=3")."""
    make_kernel, outputs, declared = MULTI_OUTPUT_CONTRADICTIONS[case]
    with pytest.raises(ValueError) as info:
        _multi(_x(2), outputs, make_kernel())
    message = str(info.value)
    for part in (declared, "sees 2 columns", "train_x, shape (20, 2)"):
        assert part in message, message


def test_the_input_width_is_named_before_the_outputs_it_implies():
    """A curl-free kernel in 3 dimensions on 2 columns with 2 outputs: the columns are the contradiction (its 3
    outputs follow from them); before, the error named train_y's outputs only."""
    with pytest.raises(ValueError, match=r"SketchedCurlFreeKernel\(input_dim=3\) sees 2 columns"):
        _multi(_x(2), 2, SketchedCurlFreeKernel(64, 3, seed=0))


SINGLE_OUTPUT_CONTRADICTIONS = {
    "sketched_ard": (lambda: ScaleKernel(SketchedRBFKernel(64, ard_num_dims=3, seed=0)), 2,
                     "SketchedRBFKernel(ard_num_dims=3) sees 2 columns"),
    "exact_ard": (lambda: RBFKernel(ard_num_dims=3), 2, "RBFKernel(ard_num_dims=3) sees 2 columns"),
    "input_dim": (lambda: RandomFeatureKernel(RandomFourierFeatures(64, input_dim=3, seed=0)), 2,
                  "RandomFeatureKernel(input_dim=3) sees 2 columns"),
    "ard_after_active_dims": (lambda: SketchedRBFKernel(64, ard_num_dims=3, active_dims=[0, 2], seed=0), 3,
                              "SketchedRBFKernel(ard_num_dims=3, active_dims=[0, 2]) sees 2 columns"),
    "active_dims_outside": (lambda: SketchedRBFKernel(64, active_dims=[0, 5], seed=0), 3, "active_dims=[0, 5]"),
    "sum_part": (lambda: FeatureSumKernel(SketchedRBFKernel(64, seed=0),
                                          ScaleKernel(SketchedRBFKernel(64, ard_num_dims=3, seed=1))), 2,
                 "SketchedRBFKernel(ard_num_dims=3) sees 2 columns"),
}


@pytest.mark.parametrize("case", list(SINGLE_OUTPUT_CONTRADICTIONS))
def test_exact_gp_model_refuses_a_kernel_built_for_other_input_columns(case):
    """Before: constructed; the first evaluation raised (GPyTorch's "INDICES element is out of DATA bounds" for
    active_dims outside train_x)."""
    make_kernel, d, message = SINGLE_OUTPUT_CONTRADICTIONS[case]
    with pytest.raises(ValueError, match="train_x, shape") as info:
        _single(_x(d), make_kernel())
    assert message in str(info.value)


def test_an_exact_kernel_whose_lengthscales_would_broadcast_over_one_column_is_refused():
    """Before: ScaleKernel(RBFKernel(ard_num_dims=3)) on one column trained silently (x/ℓ broadcast to 3 columns:
    GPyTorch checks ard_num_dims only on a kernel it calls, not on ScaleKernel's base)."""
    kernel = ScaleKernel(RBFKernel(ard_num_dims=3))
    assert kernel.to(F64)(_x(1)).to_dense().shape == (20, 20)  # what the model evaluated
    with pytest.raises(ValueError, match=r"RBFKernel\(ard_num_dims=3\) sees 1 columns"):
        _single(_x(1), kernel)


@pytest.mark.parametrize("make_kernel, d", [
    (lambda: SketchedRBFKernel(64, ard_num_dims=2, active_dims=[0, 2], seed=0), 3),
    (lambda: ScaleKernel(RBFKernel(ard_num_dims=2, active_dims=[2, 1])), 3),
    (lambda: FeatureSumKernel(SketchedRBFKernel(64, active_dims=[0], seed=0),
                              SketchedRBFKernel(64, ard_num_dims=2, active_dims=[1, 2], seed=1)), 3),
])
def test_kernels_on_selected_columns_are_accepted_and_predict(make_kernel, d):
    model = _single(_x(d), make_kernel()).to(F64)
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(_x(d, n=4)).mean).all()


@pytest.mark.parametrize("make_kernel, outputs", [
    (lambda: SketchedCurlFreeKernel(64, 3, ard_num_dims=3, active_dims=[2, 0, 1], seed=0), 3),
    (lambda: SketchedDecomposableKernel(SketchedRBFKernel(64, ard_num_dims=2, active_dims=[0, 3], seed=0), num_tasks=2),
     2),
])
def test_multi_output_kernels_on_selected_columns_are_accepted_and_predict(make_kernel, outputs):
    model = _multi(_x(4), outputs, make_kernel()).to(F64)
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(_x(4, n=3)).mean).all()


def test_maps_drawn_at_their_first_call_are_not_evaluated_at_construction():
    """Nothing is drawn or fitted on a probe point: the undeclared width is left to the first call."""
    single = ScaleKernel(SketchedRBFKernel(64, seed=0))
    multi = SketchedDecomposableKernel(SketchedRBFKernel(64, seed=1), num_tasks=2)
    _single(_x(3), single)
    _multi(_x(3), 2, multi)
    assert not single.base_kernel.feature_map.is_initialized
    assert not multi.data_covar_module.feature_map.is_initialized


def test_a_subclass_whose_forward_transforms_the_inputs_is_left_to_the_first_call():
    """Deep kernel learning: the kernel sees g(x), of another width than train_x, so train_x is not checked."""

    class TwoFeatures(ExactGPModel):
        def __init__(self, x, y, likelihood, kernel):
            super().__init__(x, y, likelihood, kernel)
            self.net = torch.nn.Linear(x.shape[-1], 2)

        def forward(self, x):
            return super().forward(self.net(x))

    model = TwoFeatures(_x(3), torch.sin(_x(3).sum(-1)), GaussianLikelihood(),
                        ScaleKernel(SketchedRBFKernel(64, ard_num_dims=2, seed=0))).to(F64)
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(_x(3, n=4)).mean).all()


@pytest.mark.parametrize("kernel_dtype", [torch.float32, torch.float64])
def test_a_kernel_in_another_dtype_is_accepted_and_converted_with_the_model(kernel_dtype):
    """float32 kernel parameters with float64 data are not refused: building with a fresh (float32) kernel and then
    calling model.double() (or .to(device)) is GPyTorch's usual pattern; the conversion aligns them."""
    model = _multi(_x(2), 2, SketchedCurlFreeKernel(64, 2, seed=0).to(kernel_dtype)).double()
    model.eval()
    with torch.no_grad():
        assert model(_x(2, n=3)).mean.dtype == F64


def test_a_multitask_mean_for_another_number_of_outputs_is_refused():
    """Before: constructed; the first marginal likelihood raised GPyTorch's "mean shape torch.Size([20, 3]) is
    incompatible with covariance shape torch.Size([40, 40])"."""
    x = _x(2)
    mean = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(), num_tasks=3)
    with pytest.raises(ValueError, match=r"mean_module has num_tasks=3 but the kernel has 2 outputs"):
        MultiOutputGPModel(x, torch.sin(x), MultitaskGaussianLikelihood(num_tasks=2, rank=0),
                           SketchedCurlFreeKernel(64, 2, seed=0), mean)


def test_new_training_inputs_of_another_width_are_refused_by_set_train_data():
    """set_train_data(strict=False) took 3 columns for a kernel with ard_num_dims=2; the next call raised."""
    model = _single(_x(2), ScaleKernel(SketchedRBFKernel(64, ard_num_dims=2, seed=0))).to(F64)
    with pytest.raises(ValueError, match=r"ard_num_dims=2\) sees 3 columns \(all columns of train_x, shape \(20, 3\)"):
        model.set_train_data(_x(3), torch.sin(_x(3).sum(-1)), strict=False)
    model.set_train_data(_x(2, n=7), torch.zeros(7, dtype=F64), strict=False)
    assert model.train_inputs[0].shape == (7, 2)
