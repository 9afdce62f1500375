"""Fused CPU loops for :class:`~buffers.buffer.InformationBuffer`: one call per pushed or popped group.

The tensor implementation of a push costs about twenty small torch ops per chunk of lanes, and a
300-unit RNN folded onto 16 lanes pushes ten chunks per half-step: on a CPU the time goes into op
dispatch, not arithmetic. These loops do the same integer arithmetic (Algorithm 1, floor
semantics, see :mod:`buffers.multiply`) and the same bookkeeping (overflow slab pushes, flags) on
the buffer's own arrays, compiled by numba. Their results are bit-identical to the tensor path,
which CUDA uses and the tests compare against.

Python's (and numba's) ``//`` and ``%`` on integers are floor division and a non-negative remainder
for positive divisors, the semantics Algorithm 1 needs; ``>>`` on int64 is arithmetic.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .fixed import FORGET_ONE, FORGET_RADIX, INT32_MAX, INT32_MIN

_LOW_MASK = (1 << FORGET_RADIX) - 1

OK, BAD_NUMERATOR, OUT_OF_RANGE = 0, 1, 2

# Bits destroyed by a numerator z*, R − log2 z*, looked up: a log2 per lane would cost more than the
# arithmetic itself. numba freezes a global array into the compiled code.
_LOST_BITS = FORGET_RADIX - np.log2(np.maximum(np.arange(FORGET_ONE + 1), 1).astype(np.float64))


@njit(cache=True, nogil=True)
def _bad_numerators(z: np.ndarray, active: np.ndarray, min_numerator: int) -> bool:
    rows, width = z.shape
    for b in range(rows):
        for j in range(width):
            if active[b, j] and (z[b, j] < min_numerator or z[b, j] > FORGET_ONE):
                return True
    return False


@njit(cache=True, nogil=True)
def push_group(h: np.ndarray, z: np.ndarray, active: np.ndarray, curr: np.ndarray, stack: np.ndarray,
               top: np.ndarray, flags: np.ndarray, first_flag: int, word_limit: int, min_numerator: int,
               out: np.ndarray) -> tuple[int, float]:
    """Push the columns of ``h`` [B, W] chunk by chunk onto the lanes ``curr`` [B, L], writing
    h·z/2^R into ``out``. Returns (status, bits destroyed over active lanes)."""
    if _bad_numerators(z, active, min_numerator):
        return BAD_NUMERATOR, 0.0
    rows, width = h.shape
    lanes = curr.shape[1]
    lost = 0.0
    for c in range((width + lanes - 1) // lanes):
        start = c * lanes
        chunk = min(lanes, width - start)
        # All lanes grow together when any active lane's live word could overflow (see buffer.py).
        overflow = False
        for b in range(rows):
            for k in range(chunk):
                if active[b, start + k] and curr[b, k] >= word_limit:
                    overflow = True
        if overflow:
            stack[top[0]] = curr
            curr[:] = 0
            top[0] += 1
        flags[first_flag + c] = overflow
        for b in range(rows):
            for k in range(chunk):
                j = start + k
                hv = np.int64(h[b, j])
                if active[b, j]:
                    zj = np.int64(z[b, j])
                    b1 = curr[b, k] * FORGET_ONE + (hv & _LOW_MASK)
                    out[b, j] = (hv >> FORGET_RADIX) * zj + b1 % zj
                    curr[b, k] = b1 // zj
                    lost += _LOST_BITS[zj]
                else:
                    out[b, j] = hv
    return OK, lost


@njit(cache=True, nogil=True)
def pop_group(h: np.ndarray, z: np.ndarray, active: np.ndarray, curr: np.ndarray, stack: np.ndarray,
              top: np.ndarray, flags: np.ndarray, first_flag: int, min_numerator: int, out: np.ndarray) -> int:
    """The exact inverse of :func:`push_group` with the same arguments (chunks in reverse order)."""
    if _bad_numerators(z, active, min_numerator):
        return BAD_NUMERATOR
    rows, width = h.shape
    lanes = curr.shape[1]
    status = OK
    for c in range((width + lanes - 1) // lanes - 1, -1, -1):
        start = c * lanes
        chunk = min(lanes, width - start)
        for b in range(rows):
            for k in range(chunk):
                j = start + k
                hv = np.int64(h[b, j])
                if active[b, j]:
                    zj = np.int64(z[b, j])
                    b1 = curr[b, k] * zj + hv % zj
                    value = (hv // zj) * FORGET_ONE + (b1 & _LOW_MASK)
                    curr[b, k] = b1 >> FORGET_RADIX
                    if value < INT32_MIN or value > INT32_MAX:
                        status = OUT_OF_RANGE
                    out[b, j] = value
                else:
                    out[b, j] = hv
        if flags[first_flag + c]:
            top[0] -= 1
            curr[:] = stack[top[0]]
    return status
