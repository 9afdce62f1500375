"""The numba backend: the buffer's arithmetic as compiled CPU loops, one call per update.

The tensor implementation of a push costs about twenty small torch ops per chunk of lanes, and a
300-unit RNN on 16 lanes a row pushes 19 chunks per half-step: on a CPU the time goes into op
dispatch, not arithmetic. These loops do the same integer arithmetic (Algorithm 1, floor
semantics, see :mod:`buffers.multiply`) and the same bookkeeping (overflow slab pushes, flags) on
the buffer's own arrays, compiled by numba. Their results are bit-identical to the torch backend,
which the tests compare them against.

Algorithm 1 needs floor division and a non-negative remainder for positive divisors; ``>>`` on int64
is arithmetic. The divisions go through :func:`_divmod` rather than ``//`` and ``%``: a 64-bit
integer division costs tens of cycles, and a pop spent most of its time in it.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from ..fixed import FORGET_ONE, FORGET_RADIX, HIDDEN_RADIX, INT32_MAX, INT32_MIN
from ..words import OK, OUT_OF_RANGE, STATE_OVERFLOW, TERM_OVERFLOW, WORD_LIMIT, WordStack
from .base import BufferBackend

_LOW_MASK = (1 << FORGET_RADIX) - 1

# Bits destroyed by a numerator z*, R − log2 z*, looked up: a log2 per lane would cost more than the
# arithmetic itself. numba freezes a global array into the compiled code.
_LOST_BITS = FORGET_RADIX - np.log2(np.maximum(np.arange(FORGET_ONE + 1), 1).astype(np.float64))


# 1/z* for every numerator, looked up by _divmod.
_RECIPROCAL = 1.0 / np.maximum(np.arange(FORGET_ONE + 1), 1).astype(np.float64)


@njit(cache=True, nogil=True, inline="always")
def _divmod(a: np.int64, z: np.int64) -> tuple[np.int64, np.int64]:
    """Floor quotient and remainder of ``a`` by a numerator ``z`` in [1, 2^R_Z], |a| < 2^53.

    The float estimate a·(1/z) is off by less than one (|a| < 2^53 is exact in float64 and the
    product's relative error is ~2^-52), so one correction step lands on the exact floor; the loops
    keep a = q·z + r whatever the estimate, so exactness does not hang on that bound.
    """
    q = np.int64(np.floor(np.float64(a) * _RECIPROCAL[z]))
    r = a - q * z
    while r < 0:
        q -= 1
        r += z
    while r >= z:
        q += 1
        r -= z
    return q, r


@njit(cache=True, nogil=True, inline="always")
def _set_flag(flags: np.ndarray, push: int, tile: int, overflow: bool) -> None:
    """Push ``push``'s overflow bit of ``tile`` (see buffers.words: 8 pushes to a byte)."""
    bit = np.uint8(1 << (push & 7))
    row = push >> 3
    flags[row, tile] = (flags[row, tile] | bit) if overflow else (flags[row, tile] & ~bit)


@njit(cache=True, nogil=True, inline="always")
def _flag(flags: np.ndarray, push: int, tile: int) -> bool:
    return (flags[push >> 3, tile] >> (push & 7)) & 1 != 0


@njit(cache=True, nogil=True)
def push_group(h: np.ndarray, z: np.ndarray, active: np.ndarray, curr: np.ndarray, stack: np.ndarray,
               top: np.ndarray, flags: np.ndarray, tile_rows: int, first_flag: int, word_limit: int,
               out: np.ndarray) -> float:
    """Push the columns of ``h`` [B, W] chunk by chunk onto each row's lanes ``curr`` [B, L], tile by tile,
    writing h·z/2^R into ``out`` (numerators ``z`` already checked). Returns the bits destroyed over active
    lanes."""
    rows, width = h.shape
    lanes = curr.shape[1]
    lost = 0.0
    for tile in range((rows + tile_rows - 1) // tile_rows):
        first, end = tile * tile_rows, min(rows, (tile + 1) * tile_rows)
        for c in range((width + lanes - 1) // lanes):
            start = c * lanes
            chunk = min(lanes, width - start)
            # A tile's lanes grow together when any active one's live word could overflow (see words.py).
            overflow = False
            for b in range(first, end):
                for k in range(chunk):
                    if active[b, start + k] and curr[b, k] >= word_limit:
                        overflow = True
            if overflow:
                # A full fixed room stores the words in the spare level above it; the height still counts.
                stack[min(top[tile], stack.shape[0] - 1), first:end] = curr[first:end]
                curr[first:end] = 0
                top[tile] += 1
            _set_flag(flags, first_flag + c, tile, overflow)
            for b in range(first, end):
                for k in range(chunk):
                    j = start + k
                    hv = np.int64(h[b, j])
                    if active[b, j]:
                        zj = np.int64(z[b, j])
                        # b1 = curr·2^R + low bits of h reaches 2^63: divide curr (< WORD_LIMIT = 2^53) and
                        # the small rest separately, b1 // z = (curr // z)·2^R + ((curr % z)·2^R + low) // z.
                        q_curr, r_curr = _divmod(curr[b, k], zj)
                        q_rest, r_rest = _divmod(r_curr * FORGET_ONE + (hv & _LOW_MASK), zj)
                        out[b, j] = (hv >> FORGET_RADIX) * zj + r_rest
                        curr[b, k] = q_curr * FORGET_ONE + q_rest
                        lost += _LOST_BITS[zj]
                    else:
                        out[b, j] = hv
    return lost


@njit(cache=True, nogil=True)
def pop_group(h: np.ndarray, z: np.ndarray, active: np.ndarray, curr: np.ndarray, stack: np.ndarray,
              top: np.ndarray, flags: np.ndarray, tile_rows: int, first_flag: int, out: np.ndarray) -> int:
    """The exact inverse of :func:`push_group` with the same arguments (chunks in reverse order);
    returns OUT_OF_RANGE if a value decoded outside int32 (h was not what the push returned)."""
    rows, width = h.shape
    lanes = curr.shape[1]
    status = OK
    for tile in range((rows + tile_rows - 1) // tile_rows):
        first, end = tile * tile_rows, min(rows, (tile + 1) * tile_rows)
        for c in range((width + lanes - 1) // lanes - 1, -1, -1):
            start = c * lanes
            chunk = min(lanes, width - start)
            for b in range(first, end):
                for k in range(chunk):
                    j = start + k
                    hv = np.int64(h[b, j])
                    if active[b, j]:
                        zj = np.int64(z[b, j])
                        q, r = _divmod(hv, zj)
                        b1 = curr[b, k] * zj + r
                        value = q * FORGET_ONE + (b1 & _LOW_MASK)
                        curr[b, k] = b1 >> FORGET_RADIX
                        if value < INT32_MIN or value > INT32_MAX:
                            status = OUT_OF_RANGE
                        out[b, j] = value
                    else:
                        out[b, j] = hv
            if _flag(flags, first_flag + c, tile):
                top[tile] -= 1
                curr[first:end] = stack[top[tile], first:end]
    return status


# ---------------------------------------------------------------------------- whole updates h ← z·h + u

_HIDDEN_SCALE = float(1 << HIDDEN_RADIX)


@njit(cache=True, nogil=True, inline="always")
def forget_numerator(z: float, min_numerator: int) -> np.int64:
    """``quantize_forget`` of one gate value: round(z·2^R_Z) (half to even, in float64), clamped to
    [min_numerator, 2^R_Z]; NaN becomes min_numerator."""
    q = np.rint(np.float64(z) * FORGET_ONE)
    return np.int64(min_numerator) if not q >= min_numerator else (np.int64(FORGET_ONE) if q > FORGET_ONE
                                                                   else np.int64(q))


@njit(cache=True, nogil=True, inline="always")
def fixed_term(u: float) -> tuple[np.int64, bool]:
    """``to_fixed`` of one additive term (half to even, in float64), and whether it left the int32 range
    (then 0, as the tensor backend adds nothing there)."""
    v = np.rint(np.float64(u) * _HIDDEN_SCALE)
    if not abs(v + 0.5) <= INT32_MAX + 0.5:  # "not <=" so that NaN counts as out of range
        return np.int64(0), True
    return np.int64(v), False


@njit(cache=True, nogil=True)
def _update_terms(z: np.ndarray, u: np.ndarray, rows_mask: np.ndarray, min_numerator: int, zq: np.ndarray,
                  ui: np.ndarray) -> int:
    """``quantize_forget(z)`` and ``to_fixed(u) · mask`` of :mod:`buffers.fixed`, element by element
    with the same rounding and clamps."""
    status = OK
    rows, width = z.shape
    for b in range(rows):
        for j in range(width):
            zq[b, j] = forget_numerator(z[b, j], min_numerator)
            v, bad = fixed_term(u[b, j])
            if bad:
                status = TERM_OVERFLOW
            ui[b, j] = v if rows_mask[b] else 0
    return status


@njit(cache=True, nogil=True)
def _rows_active(rows_mask: np.ndarray, width: int) -> np.ndarray:
    active = np.empty((rows_mask.shape[0], width), np.bool_)
    for b in range(rows_mask.shape[0]):
        active[b, :] = rows_mask[b]
    return active


@njit(cache=True, nogil=True)
def _buffered(a: np.ndarray, stored: int) -> np.ndarray:
    """The columns after ``stored``, the ones the buffer takes, as a contiguous copy."""
    return np.ascontiguousarray(a[:, stored:])


@njit(cache=True, nogil=True)
def push_terms(h: np.ndarray, zq: np.ndarray, ui: np.ndarray, rows_mask: np.ndarray, stored: int, curr: np.ndarray,
               stack: np.ndarray, top: np.ndarray, flags: np.ndarray, tile_rows: int, first_flag: int,
               word_limit: int, out: np.ndarray) -> tuple[int, float]:
    """h ← z*·h/2^R_Z + u on rows where ``rows_mask``, from integer terms: numerators ``zq`` (checked) and
    fixed-point ``ui`` (0 on padded rows). The first ``stored`` columns take the plain floor product
    (kept exactly elsewhere), the rest go through the buffer (:func:`push_group`). Returns (status, bits
    destroyed). The fused RNN steps of
    :mod:`revnmt.rnn.kernels` call this after computing the terms from their gates."""
    rows, width = h.shape
    status = OK
    for b in range(rows):
        for j in range(stored):
            hv = np.int64(h[b, j])
            out[b, j] = (hv >> FORGET_RADIX) * zq[b, j] if rows_mask[b] else hv
    lost = 0.0
    if stored < width:
        pushed = np.empty((rows, width - stored), h.dtype)
        lost = push_group(_buffered(h, stored), _buffered(zq, stored), _rows_active(rows_mask, width - stored), curr,
                          stack, top, flags, tile_rows, first_flag, word_limit, pushed)
        out[:, stored:] = pushed
    for b in range(rows):
        for j in range(width):
            s = np.int64(out[b, j]) + ui[b, j]
            if s < INT32_MIN or s > INT32_MAX:
                status = STATE_OVERFLOW
                s = 0
            out[b, j] = s
    return status, lost


@njit(cache=True, nogil=True)
def pop_terms(h: np.ndarray, zq: np.ndarray, ui: np.ndarray, rows_mask: np.ndarray, stored: int, curr: np.ndarray,
              stack: np.ndarray, top: np.ndarray, flags: np.ndarray, tile_rows: int, first_flag: int,
              out: np.ndarray) -> int:
    """The inverse of :func:`push_terms` for the buffered columns; the first ``stored`` columns of
    ``out`` get h − u, for the caller to replace with the stored values. Returns the status."""
    rows, width = h.shape
    status = OK
    before = np.empty((rows, width), np.int32)
    for b in range(rows):
        for j in range(width):
            s = np.int64(h[b, j]) - ui[b, j]
            if s < INT32_MIN or s > INT32_MAX:
                status = STATE_OVERFLOW
                s = 0
            before[b, j] = s
    out[:, :stored] = before[:, :stored]
    if stored < width:
        popped_h = np.empty((rows, width - stored), np.int32)
        popped = pop_group(_buffered(before, stored), _buffered(zq, stored), _rows_active(rows_mask, width - stored),
                           curr, stack, top, flags, tile_rows, first_flag, popped_h)
        out[:, stored:] = popped_h
        status = max(status, popped)
    return status


@njit(cache=True, nogil=True)
def push_update(h: np.ndarray, z: np.ndarray, u: np.ndarray, rows_mask: np.ndarray, stored: int, curr: np.ndarray,
                stack: np.ndarray, top: np.ndarray, flags: np.ndarray, tile_rows: int, first_flag: int,
                word_limit: int, min_numerator: int, out: np.ndarray) -> tuple[int, float]:
    """h ← z·h + u on rows where ``rows_mask``: z and u as floats, quantized and rounded here, then
    :func:`push_terms`. Returns (status, bits destroyed)."""
    zq = np.empty(h.shape, np.int64)
    ui = np.empty(h.shape, np.int64)
    status = _update_terms(z, u, rows_mask, min_numerator, zq, ui)
    pushed, lost = push_terms(h, zq, ui, rows_mask, stored, curr, stack, top, flags, tile_rows, first_flag,
                              word_limit, out)
    return max(status, pushed), lost


@njit(cache=True, nogil=True)
def pop_update(h: np.ndarray, z: np.ndarray, u: np.ndarray, rows_mask: np.ndarray, stored: int, curr: np.ndarray,
               stack: np.ndarray, top: np.ndarray, flags: np.ndarray, tile_rows: int, first_flag: int,
               min_numerator: int, out: np.ndarray) -> int:
    """The inverse of :func:`push_update` for the buffered columns (see :func:`pop_terms`)."""
    zq = np.empty(h.shape, np.int64)
    ui = np.empty(h.shape, np.int64)
    status = _update_terms(z, u, rows_mask, min_numerator, zq, ui)
    return max(status, pop_terms(h, zq, ui, rows_mask, stored, curr, stack, top, flags, tile_rows, first_flag, out))


# ---------------------------------------------------------------------------- the backend


class NumbaBackend(BufferBackend):
    """Runs each call as one compiled loop over the words' numpy views (CPU tensors only)."""

    name = "numba"

    def check_device(self, device):
        if device.type != "cpu":
            raise ValueError(f"the numba buffer backend runs on CPU only, not on {device}; use triton or torch")

    def push_mul(self, words, h, zl, active, first_flag):
        out = torch.empty_like(h)
        lost = push_group(h.numpy(), zl.numpy(), _active_array(h, active), *word_arrays(words), first_flag,
                          WORD_LIMIT, out.numpy())
        return out, lost

    def pop_div(self, words, h, zl, active, first_flag):
        out = torch.empty_like(h)
        words.record_code(pop_group(h.numpy(), zl.numpy(), _active_array(h, active), *word_arrays(words), first_flag,
                                    out.numpy()))
        return out

    def push_update(self, words, h, z, u, mask, stored, first_flag):
        out = torch.empty_like(h)
        status, lost = push_update(h.numpy(), z.detach().numpy(), u.detach().numpy(), mask.numpy(), stored,
                                   *word_arrays(words), first_flag, WORD_LIMIT, words.limit.min_numerator, out.numpy())
        words.record_code(status)
        return out, lost

    def pop_update(self, words, h, z, u, mask, stored, first_flag):
        out = torch.empty_like(h)
        words.record_code(pop_update(h.numpy(), z.detach().numpy(), u.detach().numpy(), mask.numpy(), stored,
                                     *word_arrays(words), first_flag, words.limit.min_numerator, out.numpy()))
        return out


def word_arrays(words: WordStack) -> tuple:
    """What the loops update in place (live words, stack, heights, flags), then the rows per tile."""
    return words.curr.numpy(), words.stack.numpy(), words.top.numpy(), words.flags.numpy(), words.tile_rows


def _active_array(h: torch.Tensor, active: torch.Tensor | None) -> np.ndarray:
    return (torch.ones((), dtype=torch.bool) if active is None else active).expand_as(h).numpy()
