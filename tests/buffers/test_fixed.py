import pytest
import torch

import buffers
from buffers import FORGET_ONE, HIDDEN_RADIX


def test_radices_are_the_papers():
    assert buffers.HIDDEN_RADIX == 23 and buffers.FORGET_RADIX == 10 and FORGET_ONE == 1024


def test_to_fixed_round_trip_and_rounding():
    x = torch.tensor([0.0, 1.0, -1.0, 0.5, -255.9999, 2.0 ** -23, 3 * 2.0 ** -24], dtype=torch.float64)
    h = buffers.to_fixed(x)
    assert h.dtype == torch.int32
    assert h.tolist()[:6] == [0, 1 << 23, -(1 << 23), 1 << 22, round(-255.9999 * 2 ** 23), 1]
    assert torch.equal(buffers.to_float(h, dtype=torch.float64), h.double() / 2 ** 23)


@pytest.mark.parametrize("value", [256.0, -256.0 - 2 ** -22, float("nan"), 1e9])
def test_to_fixed_out_of_range_raises(value):
    with pytest.raises(buffers.FixedPointOverflowError):
        buffers.to_fixed(torch.tensor([0.0, value], dtype=torch.float64))


def test_largest_legal_values_convert():
    top = (2 ** 31 - 1) / 2 ** HIDDEN_RADIX
    assert buffers.to_fixed(torch.tensor([top, -256.0], dtype=torch.float64)).tolist() == [2 ** 31 - 1, -(2 ** 31)]


def test_guard_defers_overflow_until_check():
    guard = buffers.OverflowGuard()
    h = buffers.to_fixed(torch.tensor([300.0]), guard=guard)  # clamped meanwhile, no exception yet
    assert h.item() == 2 ** 31 - 1
    with pytest.raises(buffers.FixedPointOverflowError, match="to_fixed"):
        guard.check()


def test_checked_add_detects_wraparound():
    big = torch.tensor([2 ** 31 - 10], dtype=torch.int32)
    assert buffers.checked_add(big, torch.tensor([9], dtype=torch.int32)).item() == 2 ** 31 - 1
    with pytest.raises(buffers.FixedPointOverflowError):
        buffers.checked_add(big, torch.tensor([10], dtype=torch.int32))
    with pytest.raises(buffers.FixedPointOverflowError):
        buffers.checked_add(-big - 1, torch.tensor([-10], dtype=torch.int32))


@pytest.mark.parametrize("bits,m,zmin",
                         [(1, 0.5, 512), (2, 0.75, 256), (3, 0.875, 128), (5, 0.96875, 32), (None, 1.0, 1)])
def test_max_forgetting_map(bits, m, zmin):
    limit = buffers.ForgetLimit(bits)
    assert limit.bits == bits and limit.slope == m and limit.min_numerator == zmin
    sig = torch.tensor([0.0, 0.3, 1.0])
    z = buffers.restrict_forget(sig, limit)
    assert torch.allclose(z, m * sig + (1 - m))
    zq = buffers.quantize_forget(z, limit)
    assert zq.dtype == torch.int64 and zq.min() >= zmin and zq.max() == FORGET_ONE
    assert zq[0].item() == zmin  # fully closed gate forgets exactly k bits (never all of h without a limit)


def test_forget_limit_is_one_value_of_the_legal_set():
    assert buffers.MAX_FORGET_CHOICES == (1, 2, 3, 5, None)
    assert [buffers.ForgetLimit(b).bits for b in buffers.MAX_FORGET_CHOICES] == list(buffers.MAX_FORGET_CHOICES)
    assert buffers.ForgetLimit() == buffers.NO_FORGET_LIMIT == buffers.ForgetLimit(None)
    assert buffers.ForgetLimit(3) == buffers.ForgetLimit(3) != buffers.ForgetLimit(2)
    with pytest.raises(AttributeError):
        buffers.ForgetLimit(3).bits = 2  # frozen: its derived numbers cannot go stale


@pytest.mark.parametrize("bits", [0, 4, 10, 11, 2.5, 3.0, "3", True])
def test_illegal_forget_limits_are_refused(bits):
    with pytest.raises(ValueError, match="max forgotten bits must be one of 1, 2, 3, 5, None"):
        buffers.ForgetLimit(bits)


def test_restrict_forget_gradient_is_m():
    a = torch.tensor([0.3], requires_grad=True)
    buffers.restrict_forget(torch.sigmoid(a), buffers.ForgetLimit(3)).sum().backward()
    s = torch.sigmoid(torch.tensor(0.3))
    assert torch.allclose(a.grad, 0.875 * s * (1 - s))


def test_straight_through_value_and_gradient():
    x = torch.tensor([0.3, -1.2], requires_grad=True)
    surrogate = 2 * x
    exact = torch.tensor([7.123456789, 8.0])
    y = buffers.straight_through(exact, surrogate)
    assert torch.equal(y.detach(), exact)
    y.sum().backward()
    assert torch.equal(x.grad, torch.tensor([2.0, 2.0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_to_float_is_the_conversion_then_the_exact_scaling(dtype):
    h = torch.tensor([-(2 ** 31), -(2 ** 24) - 1, -3, 0, 5, 2 ** 24 + 1, 2 ** 31 - 1], dtype=torch.int32)
    assert torch.equal(buffers.to_float(h, dtype=dtype), h.to(dtype) * 2.0 ** -23)
    assert buffers.to_float(h, dtype=dtype).dtype == dtype
