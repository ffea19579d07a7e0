import pytest
import scipy.special
import torch

from rfgp.features.bessel import recurrence_start, scaled_bessel_i


@pytest.mark.parametrize("num_orders", [1, 2, 40])
def test_scaled_bessel_matches_scipy_ive(num_orders):
    z = torch.tensor([1e-4, 0.05, 0.7, 3.0, 12.0, 35.0], dtype=torch.float64)
    values = scaled_bessel_i(z, num_orders)
    orders = torch.arange(num_orders, dtype=torch.float64)
    reference = torch.from_numpy(scipy.special.ive(orders.numpy()[None, :], z.numpy()[:, None]))
    assert values.shape == (6, num_orders)
    mask = reference > 1e-280
    assert torch.allclose(values[mask], reference[mask], rtol=1e-11, atol=0)


def test_large_arguments_need_a_later_start():
    z = torch.tensor([400.0], dtype=torch.float64)
    values = scaled_bessel_i(z, 10, start=recurrence_start(10, 400.0))
    reference = torch.from_numpy(scipy.special.ive(torch.arange(10, dtype=torch.float64).numpy(), 400.0))
    assert torch.allclose(values[0], reference, rtol=1e-11, atol=0)


def test_derivative_is_the_bessel_recurrence_and_twice_differentiable():
    # d/dz [I_k(z)e^{−z}] = (I_{k−1} + I_{k+1})/2·e^{−z} − I_k e^{−z}
    z = torch.tensor([0.3, 2.0, 9.0], dtype=torch.float64, requires_grad=True)
    values = scaled_bessel_i(z, 6)
    grads = torch.stack([torch.autograd.grad(values[:, k].sum(), z, retain_graph=True)[0] for k in range(6)], -1)
    zn, k = z.detach().numpy()[:, None], torch.arange(6).numpy()[None, :]
    expected = (scipy.special.ive(abs(k - 1), zn) + scipy.special.ive(k + 1, zn)) / 2 - scipy.special.ive(k, zn)
    assert torch.allclose(grads, torch.from_numpy(expected), rtol=1e-9, atol=1e-14)
    assert torch.autograd.gradgradcheck(lambda t: scaled_bessel_i(t, 3, start=12), (z[:2].detach().requires_grad_(),))


def test_bad_arguments_named():
    z = torch.ones(2, dtype=torch.float64)
    with pytest.raises(ValueError, match="num_orders"):
        scaled_bessel_i(z, 0)
    with pytest.raises(ValueError, match="start"):
        scaled_bessel_i(z, 10, start=3)
