import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from buffers import FORGET_ONE, WORD_LIMIT, div_exact, mul_exact

int32s = st.integers(-(2 ** 31), 2 ** 31 - 1)
words = st.integers(0, WORD_LIMIT - 1)
numerators = st.integers(1, FORGET_ONE)


@settings(max_examples=500, deadline=None)
@given(h=int32s, b=words, z=numerators)
def test_mul_then_div_is_identity(h, b, z):
    ht, bt, zt = (torch.tensor([v], dtype=torch.int64) for v in (h, b, z))
    h2, b2 = mul_exact(ht, bt, zt)
    assert -(2 ** 31) <= h2.item() < 2 ** 31 and b2.item() >= 0
    h3, b3 = div_exact(h2, b2, zt)
    assert (h3.item(), b3.item()) == (h, b)


@given(h=int32s, b=words, z=numerators)
def test_product_is_the_rounded_real_product(h, b, z):
    h2, _ = mul_exact(*(torch.tensor([v], dtype=torch.int64) for v in (h, b, z)))
    # h' = ⌊h/2^R⌋·z* + s with s in [0, z*) from the buffer: within z* units of the real product
    assert abs(h2.item() - h * z / FORGET_ONE) < z


def test_buffer_grows_by_the_forgotten_bits():
    b = torch.zeros(1, dtype=torch.int64)
    h = torch.tensor([123456789], dtype=torch.int64)
    z = torch.tensor([256])  # forgets exactly 2 bits per call
    for _ in range(20):
        h, b = mul_exact(h, b, z)
    assert 2 ** 38 <= b.item() < 2 ** 41
