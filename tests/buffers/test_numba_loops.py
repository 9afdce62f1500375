"""The compiled loops' own arithmetic; their agreement with the other backends is in test_buffer.py."""

from hypothesis import given, settings
from hypothesis import strategies as st

from buffers import FORGET_ONE, WORD_LIMIT
from buffers.backends import numba_loops

# Dividends as the loops see them: int32 states (pop) and live words below WORD_LIMIT (push).
_DIVIDENDS = st.one_of(st.integers(-(1 << 31), (1 << 31) - 1), st.integers(0, WORD_LIMIT - 1),
                       st.sampled_from([0, -1, 1, WORD_LIMIT - 1, WORD_LIMIT - 2, -(1 << 31), (1 << 31) - 1]))
_NUMERATORS = st.one_of(st.integers(1, FORGET_ONE), st.sampled_from([1, 2, 3, 127, 128, 1023, FORGET_ONE]))


@settings(max_examples=2000, deadline=None)
@given(_DIVIDENDS, _NUMERATORS)
def test_divmod_is_floor_division(a, z):
    assert numba_loops._divmod(a, z) == divmod(a, z)
