"""FeatureMap base: seeds, lazy initialisation, state_dict round-trips, dtype/device moves, bad input."""

import io

import pytest
import torch

from rfgp.features import FeatureMap, MaternSpectralDensity, RandomFourierFeatures, RationalQuadraticSpectralDensity

SAMPLERS = ["iid", "orthogonal", "structured"]


def make(sampler="iid", **kwargs):
    kwargs.setdefault("seed", 0)
    return RandomFourierFeatures(16, sampler=sampler, **kwargs)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_same_seed_same_draws_other_seed_differs(sampler, device):
    x = torch.randn(5, 3, device=device)
    a, b, c = make(sampler, input_dim=3, seed=1), make(sampler, input_dim=3, seed=1), make(sampler, input_dim=3, seed=2)
    assert torch.equal(a.to(device)(x), b.to(device)(x))
    assert not torch.equal(a(x), c.to(device)(x))


def test_generator_and_global_seed_are_reproducible():
    a = make(input_dim=3, seed=None, generator=torch.Generator().manual_seed(5))
    b = make(input_dim=3, seed=None, generator=torch.Generator().manual_seed(5))
    assert a.seed == b.seed and torch.equal(a.frequencies, b.frequencies)
    torch.manual_seed(11)
    c = make(input_dim=3, seed=None)
    torch.manual_seed(11)
    d = make(input_dim=3, seed=None)
    assert torch.equal(c.frequencies, d.frequencies)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA generator needs a GPU")
def test_seed_from_a_cuda_generator_is_drawn_on_its_device():
    """torch.randint refused a CUDA generator on the CPU ("Expected a 'cpu' device type for generator"): the seed is
    drawn on the generator's device, reproducibly."""
    a = make(input_dim=3, seed=None, generator=torch.Generator("cuda").manual_seed(5))
    b = make(input_dim=3, seed=None, generator=torch.Generator("cuda").manual_seed(5))
    assert a.seed == b.seed and torch.equal(a.frequencies, b.frequencies)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_lazy_initialisation_equals_eager(sampler, device):
    lazy, eager = make(sampler, seed=3), make(sampler, seed=3, input_dim=4)
    assert not lazy.is_initialized and lazy.input_dim is None
    x = torch.randn(6, 4, device=device)
    out = lazy.to(device)(x)
    assert lazy.is_initialized and lazy.input_dim == 4
    assert torch.equal(out, eager.to(device)(x))
    # The input dimension is now fixed.
    with pytest.raises(ValueError, match="input_dim=4"):
        lazy(torch.randn(6, 5, device=device))


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_resample_changes_draws_and_is_reproducible(sampler):
    fm = make(sampler, input_dim=3)
    x = torch.randn(4, 3)
    before = fm(x)
    fm.resample(torch.Generator().manual_seed(0))
    after = fm(x)
    assert not torch.equal(before, after)
    other = make(sampler, input_dim=3, seed=123).resample(torch.Generator().manual_seed(0))
    assert torch.equal(other(x), after)



@pytest.mark.parametrize("redraw", ["resample", "load_into_lazy"])
def test_draws_made_under_inference_mode_stay_usable_by_training(redraw):
    # resample() in an evaluation loop, or a state loaded into a map never called, under torch.inference_mode():
    # the new draws were inference tensors, and the next training step raised "Inference tensors cannot be saved
    # for backward" (the first-call draws were already made outside inference mode).
    saved = make(input_dim=3, seed=2).state_dict()
    fm = make(input_dim=3, seed=1) if redraw == "resample" else make(seed=1)
    with torch.inference_mode():
        if redraw == "resample":
            fm.resample(torch.Generator().manual_seed(0))
        else:
            fm.load_state_dict(saved)
    assert not any(buffer.is_inference() for buffer in fm.buffers())
    x = torch.randn(5, 3, requires_grad=True)
    fm(x).pow(2).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("source_lazy", [False, True])
def test_state_dict_round_trip_bit_for_bit(sampler, source_lazy, device):
    density = MaternSpectralDensity(1.5)
    source = RandomFourierFeatures(16, input_dim=None if source_lazy else 3, spectral_density=density,
                                   sampler=sampler, seed=7).to(device)
    x = torch.randn(5, 3, device=device)
    expected = source(x)
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    for target_dim in (None, 3):  # a fresh map with another seed, lazy or eager
        target = RandomFourierFeatures(16, input_dim=target_dim, spectral_density=density, sampler=sampler,
                                       seed=99).to(device)
        target.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
        assert target.seed == source.seed and target.input_dim == 3
        assert torch.equal(target(x), expected)


def test_state_dict_carries_buffers_not_just_seed():
    source = make("orthogonal", input_dim=3)
    source.frequencies.mul_(2.0)  # fitted / modified draws must survive, not be redrawn from the seed
    target = make("orthogonal", input_dim=3, seed=5)
    target.load_state_dict(source.state_dict())
    assert torch.equal(target.frequencies, source.frequencies)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_to_dtype_moves_buffers(sampler, device):
    fm = make(sampler).double().to(device)
    x = torch.randn(4, 5, dtype=torch.float64, device=device)
    phi64 = fm(x)
    for name in fm._buffer_names:
        buf = getattr(fm, name)
        assert buf.device.type == device.type
        if buf.is_floating_point():
            assert buf.dtype == torch.float64
    fm.float()
    assert all(getattr(fm, n).dtype == torch.float32 for n in fm._buffer_names if getattr(fm, n).is_floating_point())
    phi32 = fm(x.float())
    assert phi32.dtype == torch.float32
    torch.testing.assert_close(phi32.double(), phi64, rtol=1e-4, atol=1e-5)


def test_base_class_hooks_are_abstract():
    class Bare(FeatureMap):
        pass

    with pytest.raises(NotImplementedError):
        Bare(4, input_dim=2)
    lazy = Bare(4)
    with pytest.raises(NotImplementedError):
        lazy.target_diag(torch.zeros(1, 2))
    with pytest.raises(NotImplementedError):
        lazy.expected_diag(torch.zeros(1, 2))


def test_frequency_matrix_needs_draws():
    with pytest.raises(RuntimeError, match="no draws"):
        make().frequency_matrix()


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("bad", [0, -2])
def test_num_features_must_be_positive(bad):
    with pytest.raises(ValueError, match=rf"num_features.*{bad}"):
        RandomFourierFeatures(bad)


@pytest.mark.parametrize("bad", [2.0, "8", True, None])
def test_num_features_must_be_an_integer(bad):
    with pytest.raises(TypeError, match="num_features"):
        RandomFourierFeatures(bad)


@pytest.mark.parametrize("bad", [1, 7, 33])
def test_num_features_must_be_even_for_sin_cos(bad):
    with pytest.raises(ValueError, match=rf"num_features must be even.*{bad}"):
        RandomFourierFeatures(bad)


def test_input_dim_must_be_positive_int():
    with pytest.raises(ValueError, match="input_dim"):
        RandomFourierFeatures(8, input_dim=0)
    with pytest.raises(TypeError, match="input_dim"):
        RandomFourierFeatures(8, input_dim=2.5)


def test_unknown_sampler_names_choices():
    with pytest.raises(ValueError, match=r"sampler must be one of 'iid', 'orthogonal', 'structured'; got 'qmc'"):
        RandomFourierFeatures(8, sampler="qmc")


def test_bad_spectral_density_and_parameters():
    with pytest.raises(TypeError, match="spectral_density"):
        RandomFourierFeatures(8, spectral_density="rbf")
    with pytest.raises(ValueError, match="nu must be one of"):
        MaternSpectralDensity(1.0)
    with pytest.raises(ValueError, match="alpha"):
        RationalQuadraticSpectralDensity(0.0)


def test_seed_and_generator_are_exclusive_and_seed_is_int():
    with pytest.raises(ValueError, match="seed or generator"):
        RandomFourierFeatures(8, seed=1, generator=torch.Generator())
    with pytest.raises(TypeError, match="seed"):
        RandomFourierFeatures(8, seed=1.5)


def test_wrong_input_dimension(device):
    fm = make(input_dim=3).to(device)
    with pytest.raises(ValueError, match=r"x has 4 input dimensions.*input_dim=3"):
        fm(torch.randn(5, 4, device=device))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_input(value, device):
    x = torch.randn(5, 3, device=device)
    x[2, 1] = value
    with pytest.raises(ValueError, match="x contains NaN or Inf"):
        make(input_dim=3).to(device)(x)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_input_rejected(dtype, device):
    with pytest.raises(TypeError, match=rf"x must be a floating-point tensor.*{str(dtype)}"):
        make(input_dim=3).to(device)(torch.ones(5, 3, dtype=dtype, device=device))


def test_complex_and_non_tensor_input_rejected(device):
    with pytest.raises(TypeError, match="x must be a real tensor.*complex"):
        make(input_dim=3).to(device)(torch.randn(5, 3, dtype=torch.complex64, device=device))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        make(input_dim=3)([[0.0, 1.0, 2.0]])
    with pytest.raises(ValueError, match=r"shape \(\.\.\., n, d\)"):
        make(input_dim=3)(torch.randn(3))
