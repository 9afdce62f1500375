"""The fused half-steps as compiled CPU loops (numba), one call per elementwise stretch.

On a CPU a reversible step written as torch ops is mostly dispatch: about thirty small ops per
half-step around the products, each a pass over a [B, H] tensor and a trip through the dispatcher.
Here each stretch between two products is one loop over the batch that keeps its temporaries in
registers: RevGRU's half is product, :func:`gru_gates`, product, :func:`gru_push` (in the reverse,
:func:`gru_reverse` and, after the g product's backward, :func:`gru_read_grad`); RevLSTM's is one product and
:func:`lstm_push` or :func:`lstm_reverse`. The products go through :mod:`revnmt.rnn.products`, some
of them called by :class:`NumbaSteps` where the Triton kernels compute theirs inside. The integer
part (quantize z, round u, push or pop the buffer, add, range checks) is the buffer's own code,
:func:`buffers.backends.numba_loops.push_terms` and :func:`~buffers.backends.numba_loops.pop_terms`, so
the words are those of the numba buffer.

Exactness. The reverse decodes the buffer with gates it recomputes, so they must equal the
forward's bit for bit. Both kernels take their gates from the same inlined helpers
(:func:`tanh`, :func:`sigmoid`), which are float32 multiplies, adds and one division and call no
math library: with fastmath off (no reassociation, no contraction into fused multiply-adds) each
of those operations is correctly rounded, so the result is the same bit for bit whether LLVM
vectorizes a loop or not, in whichever kernel it is inlined. The gates are not those of the torch
reference to the last ulp, so the numba backend's states are its own; its reverse is exact all
the same (the tests check both, and that the integer part matches the torch backend's given the
same gate values).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from buffers import to_float
from buffers.backends.numba_loops import fixed_term, forget_numerator, pop_terms, push_terms
from buffers.fixed import FORGET_ONE, HIDDEN_RADIX, ForgetLimit
from buffers.plans import PopPlan, PushPlan
from buffers.words import OK, TERM_OVERFLOW, WORD_LIMIT

from .. import products
from . import StepKernels, activations

# The error model "numpy" drops the division-by-zero checks of Python semantics (a float division by
# zero is inf, as in torch); fastmath stays off, see the module docstring.
_JIT = dict(cache=True, nogil=True, error_model="numpy")

_ONE = np.float32(1.0)
_TO_FLOAT = np.float32(2.0 ** -HIDDEN_RADIX)  # to_float: int32 → float32 (rounded), times an exact power of two
_PER_NUMERATOR = np.float32(1.0 / FORGET_ONE)


# ---------------------------------------------------------------------------- shared elementwise helpers


# The rational tanh of .activations, in float32 (see there why it is not libm's).
_TANH_CLAMP = np.float32(activations.TANH_CLAMP)
_A1, _A3, _A5, _A7, _A9, _A11, _A13 = (np.float32(v) for v in activations.TANH_NUMERATOR)
_B0, _B2, _B4, _B6 = (np.float32(v) for v in activations.TANH_DENOMINATOR)
_HALF = np.float32(0.5)


@njit(inline="always", **_JIT)
def tanh(x: np.float32) -> np.float32:
    x = min(max(x, -_TANH_CLAMP), _TANH_CLAMP)
    x2 = x * x
    p = x2 * (x2 * (x2 * (x2 * (x2 * (x2 * _A13 + _A11) + _A9) + _A7) + _A5) + _A3) + _A1
    return x * p / (x2 * (x2 * (x2 * _B6 + _B4) + _B2) + _B0)


@njit(inline="always", **_JIT)
def sigmoid(x: np.float32) -> np.float32:
    return _HALF + _HALF * tanh(_HALF * x)


@njit(inline="always", **_JIT)
def _sigmoid_columns(pre: np.ndarray, p: np.ndarray, col: int, start: int, stop: int, out: np.ndarray) -> None:
    """out[:, start:stop] = σ(pre + p[:, col:]) over those columns. Kept a plain loop over contiguous
    rows (``p`` whole, sliced per row, rather than a strided 2-D slice) indexed from 0, so that it
    vectorizes: an index that might be negative costs a wraparound test per element, and no vectors."""
    for b in range(pre.shape[0]):
        row, p_row, out_row = pre[b, start:stop], p[b, col + start: col + stop], out[b, start:stop]
        for k in range(stop - start):
            out_row[k] = sigmoid(row[k] + p_row[k])


@njit(inline="always", **_JIT)
def _tanh_columns(pre: np.ndarray, p: np.ndarray, col: int, start: int, stop: int, out: np.ndarray) -> None:
    """:func:`_sigmoid_columns` with tanh."""
    for b in range(pre.shape[0]):
        row, p_row, out_row = pre[b, start:stop], p[b, col + start: col + stop], out[b, start:stop]
        for k in range(stop - start):
            out_row[k] = tanh(row[k] + p_row[k])


@njit(inline="always", **_JIT)
def _to_float(v: np.int32) -> np.float32:
    return np.float32(v) * _TO_FLOAT


@njit(inline="always", **_JIT)
def _restrict(s: np.float32, slope: np.float32) -> np.float32:
    """``buffers.restrict_forget``: σ mapped into [2^-k, 1]."""
    return slope * s + (_ONE - slope)


@njit(inline="always", **_JIT)
def _gru_terms(sz: np.float32, g: np.float32, slope: np.float32) -> tuple[np.float32, np.float32]:
    """(z, u) of RevGRU from σ(z's pre-activation) and g: z limited, u = (1 − z)·g."""
    z = _restrict(sz, slope)
    return z, (_ONE - z) * g


@njit(inline="always", **_JIT)
def _lstm_gates(pre: np.ndarray, p: np.ndarray, col: int, acts: np.ndarray) -> None:
    """σ(f), tanh(g), σ(i), σ(o), σ(p) of RevLSTM's half into ``acts`` [B, 5H] (columns [f | g | i | o | p])."""
    half = pre.shape[1] // 5
    _sigmoid_columns(pre, p, col, 0, half, acts)
    _tanh_columns(pre, p, col, half, 2 * half, acts)
    _sigmoid_columns(pre, p, col, 2 * half, 5 * half, acts)


@njit(inline="always", **_JIT)
def _set_terms(zq: np.ndarray, ui: np.ndarray, b: int, j: int, z: np.float32, u: np.float32, live: bool,
               min_numerator: int) -> bool:
    """Write z's numerator and u's fixed-point value (0 on a padded row); True if u left the int32 range."""
    zq[b, j] = forget_numerator(z, min_numerator)
    v, bad = fixed_term(u)
    ui[b, j] = v if live else 0
    return bad


@njit(inline="always", **_JIT)
def _backward_update(grad: np.float32, zq: np.int64, live: bool) -> tuple[np.float32, np.float32]:
    """The derivative of where(live, z*·h + u, h): (d loss / d previous h, d loss / d u); d loss / d z*
    is the second times the previous h."""
    if live:
        return grad * (np.float32(zq) * _PER_NUMERATOR), grad
    return grad, np.float32(0.0)


@njit(inline="always", **_JIT)
def _tanh_of_fixed(ints: np.ndarray, out: np.ndarray) -> None:
    """out = tanh(to_float(ints)), row by row so that it vectorizes (see :func:`_sigmoid_columns`)."""
    for b in range(ints.shape[0]):
        row, out_row = ints[b], out[b]
        for j in range(ints.shape[1]):
            out_row[j] = tanh(_to_float(row[j]))


@njit(**_JIT)
def _write_float(ints: np.ndarray, out: np.ndarray) -> None:
    for b in range(ints.shape[0]):
        for j in range(ints.shape[1]):
            out[b, j] = _to_float(ints[b, j])


# ---------------------------------------------------------------------------- RevGRU
# ``p`` is the step's whole input projection and ``col`` the first column of the gates at hand.


@njit(**_JIT)
def gru_gates(pre_zr: np.ndarray, p: np.ndarray, col: int, read: np.ndarray, s: np.ndarray, rh: np.ndarray) -> None:
    """s = σ(pre_zr + p[:, col:]) ([z | r]) and rh = r·read, the input of g's product."""
    rows, half = read.shape
    _sigmoid_columns(pre_zr, p, col, 0, 2 * half, s)
    for b in range(rows):
        for j in range(half):
            rh[b, j] = s[b, half + j] * read[b, j]


@njit(inline="always", **_JIT)
def _gru_update_terms(pre_g: np.ndarray, p: np.ndarray, col: int, s: np.ndarray, rows_mask: np.ndarray,
                      slope: np.float32, min_numerator: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """g = tanh(pre_g + p[:, col:]) and the update's numerators and fixed-point terms, for the push and the
    pop alike (one code path: the reverse must decode with the forward's terms); also the status."""
    rows, half = pre_g.shape
    g = np.empty((rows, half), np.float32)
    _tanh_columns(pre_g, p, col, 0, half, g)
    zq = np.empty((rows, half), np.int64)
    ui = np.empty((rows, half), np.int64)
    status = OK
    for b in range(rows):
        for j in range(half):
            z, u = _gru_terms(s[b, j], g[b, j], slope)
            if _set_terms(zq, ui, b, j, z, u, rows_mask[b], min_numerator):
                status = TERM_OVERFLOW
    return g, zq, ui, status


@njit(**_JIT)
def gru_push(h: np.ndarray, pre_g: np.ndarray, p: np.ndarray, col: int, s: np.ndarray, rows_mask: np.ndarray,
             stored: int, slope: np.float32, min_numerator: int, curr: np.ndarray, stack: np.ndarray, top: np.ndarray,
             flags: np.ndarray, tile_rows: int, first_flag: int, word_limit: int, out: np.ndarray,
             out_float: np.ndarray) -> tuple[int, float]:
    """RevGRU's half update into ``out`` and ``out_float``; returns (status, bits destroyed)."""
    rows, half = h.shape
    g, zq, ui, status = _gru_update_terms(pre_g, p, col, s, rows_mask, slope, min_numerator)
    pushed, lost = push_terms(h, zq, ui, rows_mask, stored, curr, stack, top, flags, tile_rows, first_flag, word_limit,
                              out)
    _write_float(out, out_float)
    return max(status, pushed), lost


@njit(**_JIT)
def gru_reverse(h: np.ndarray, pre_g: np.ndarray, p: np.ndarray, col: int, s: np.ndarray, rows_mask: np.ndarray,
                slope: np.float32, min_numerator: int, pop: bool, restore: np.ndarray, curr: np.ndarray,
                stack: np.ndarray, top: np.ndarray, flags: np.ndarray, tile_rows: int, first_flag: int,
                prev: np.ndarray,
                diff: bool, grad: np.ndarray, grad_z: np.ndarray, grad_g: np.ndarray) -> int:
    """Recompute :func:`gru_push`'s gates; with ``pop``, pop the previous half into ``prev`` (its first
    columns from ``restore``); with ``diff``, backpropagate (``grad`` in place). Returns the status."""
    rows, half = h.shape
    g, zq, ui, status = _gru_update_terms(pre_g, p, col, s, rows_mask, slope, min_numerator)
    if pop:
        stored = restore.shape[1]
        status = max(status, pop_terms(h, zq, ui, rows_mask, stored, curr, stack, top, flags, tile_rows, first_flag,
                                       prev))
        prev[:, :stored] = restore
    if diff:
        for b in range(rows):
            for j in range(half):
                grad[b, j], grad_u = _backward_update(grad[b, j], zq[b, j], rows_mask[b])
                sz, gj = s[b, j], g[b, j]
                z = _restrict(sz, slope)
                grad_g[b, j] = grad_u * (_ONE - z) * (_ONE - gj * gj)
                grad_z[b, j] = (grad_u * _to_float(prev[b, j]) - grad_u * gj) * slope * sz * (_ONE - sz)
    return status


@njit(**_JIT)
def gru_read_grad(grad_rh: np.ndarray, read: np.ndarray, s: np.ndarray, grad_r: np.ndarray,
                  grad_read: np.ndarray, inputs: np.ndarray) -> None:
    """d loss / d r's pre-activation, r·grad_rh added to d loss / d h_j, and h_j and r·h_j (as
    :func:`gru_gates` computes it) copied into the weight-gradient slots ``inputs`` [2, B, H]."""
    rows, half = read.shape
    for b in range(rows):
        for j in range(half):
            r, x = s[b, half + j], read[b, j]
            grad_r[b, j] = grad_rh[b, j] * x * r * (_ONE - r)
            grad_read[b, j] += grad_rh[b, j] * r
            inputs[0, b, j] = x
            inputs[1, b, j] = r * x


# ---------------------------------------------------------------------------- RevLSTM


@njit(**_JIT)
def lstm_push(h: np.ndarray, c: np.ndarray, pre: np.ndarray, p: np.ndarray, col: int, rows_mask: np.ndarray,
              stored: int, slope: np.float32, min_numerator: int, curr: np.ndarray, stack: np.ndarray,
              top: np.ndarray, flags: np.ndarray, tile_rows: int, flag_c: int, flag_h: int, word_limit: int,
              out_h: np.ndarray,
              out_c: np.ndarray, out_float: np.ndarray) -> tuple[int, float, float]:
    """RevLSTM's half update: c pushed first, then h (whose term needs tanh of the new c). Returns
    (status, bits destroyed by c, by h)."""
    rows, half = h.shape
    acts = np.empty((rows, 5 * half), np.float32)
    _lstm_gates(pre, p, col, acts)
    zq = np.empty((rows, half), np.int64)
    ui = np.empty((rows, half), np.int64)
    status = OK
    for b in range(rows):
        for j in range(half):
            f, ig = _restrict(acts[b, j], slope), acts[b, 2 * half + j]
            if _set_terms(zq, ui, b, j, f, ig * acts[b, half + j], rows_mask[b], min_numerator):
                status = TERM_OVERFLOW
    pushed_c, lost_c = push_terms(c, zq, ui, rows_mask, 0, curr, stack, top, flags, tile_rows, flag_c, word_limit,
                                  out_c)
    tcs = np.empty((rows, half), np.float32)
    _tanh_of_fixed(out_c, tcs)
    for b in range(rows):
        for j in range(half):
            o, pz = acts[b, 3 * half + j], _restrict(acts[b, 4 * half + j], slope)
            if _set_terms(zq, ui, b, j, pz, o * tcs[b, j], rows_mask[b], min_numerator):
                status = TERM_OVERFLOW
    pushed_h, lost_h = push_terms(h, zq, ui, rows_mask, stored, curr, stack, top, flags, tile_rows, flag_h,
                                  word_limit, out_h)
    _write_float(out_h, out_float)
    return max(status, pushed_c, pushed_h), lost_c, lost_h


@njit(**_JIT)
def lstm_reverse(h: np.ndarray, c: np.ndarray, pre: np.ndarray, p: np.ndarray, col: int, rows_mask: np.ndarray,
                 slope: np.float32, min_numerator: int, pop: bool, restore: np.ndarray, curr: np.ndarray,
                 stack: np.ndarray, top: np.ndarray, flags: np.ndarray, tile_rows: int, flag_c: int, flag_h: int,
                 prev_h: np.ndarray, prev_c: np.ndarray, diff: bool, grad_h: np.ndarray, grad_c: np.ndarray,
                 grad_pre: np.ndarray, read: np.ndarray, inputs: np.ndarray) -> int:
    """Recompute :func:`lstm_push`'s gates; with ``pop``, pop h then c into ``prev_h``, ``prev_c``; with
    ``diff``, backpropagate (``grad_h``, ``grad_c`` in place, gate gradients into ``grad_pre``) and copy
    ``read`` (h_j) into its weight-gradient slot ``inputs``."""
    rows, half = h.shape
    acts = np.empty((rows, 5 * half), np.float32)
    _lstm_gates(pre, p, col, acts)
    tcs = np.empty((rows, half), np.float32)
    _tanh_of_fixed(c, tcs)  # of the new cell, which the new h was made from
    zq_h, ui_h = np.empty((rows, half), np.int64), np.empty((rows, half), np.int64)
    zq_c, ui_c = np.empty((rows, half), np.int64), np.empty((rows, half), np.int64)
    status = OK
    for b in range(rows):
        for j in range(half):
            tc = tcs[b, j]
            bad_h = _set_terms(zq_h, ui_h, b, j, _restrict(acts[b, 4 * half + j], slope), acts[b, 3 * half + j] * tc,
                               rows_mask[b], min_numerator)
            bad_c = _set_terms(zq_c, ui_c, b, j, _restrict(acts[b, j], slope),
                               acts[b, 2 * half + j] * acts[b, half + j], rows_mask[b], min_numerator)
            if bad_h or bad_c:
                status = TERM_OVERFLOW
    if pop:
        stored = restore.shape[1]
        status = max(status, pop_terms(h, zq_h, ui_h, rows_mask, stored, curr, stack, top, flags, tile_rows, flag_h,
                                       prev_h))
        prev_h[:, :stored] = restore
        status = max(status, pop_terms(c, zq_c, ui_c, rows_mask, 0, curr, stack, top, flags, tile_rows, flag_c,
                                       prev_c))
    if diff:
        for b in range(rows):
            live = rows_mask[b]
            for j in range(half):
                sf, g, ig = acts[b, j], acts[b, half + j], acts[b, 2 * half + j]
                o, sp, tc = acts[b, 3 * half + j], acts[b, 4 * half + j], tcs[b, j]
                grad_h[b, j], grad_uh = _backward_update(grad_h[b, j], zq_h[b, j], live)
                grad_c[b, j], grad_uc = _backward_update(grad_c[b, j] + grad_uh * o * (_ONE - tc * tc), zq_c[b, j],
                                                         live)
                grad_pre[b, j] = grad_uc * _to_float(prev_c[b, j]) * slope * sf * (_ONE - sf)
                grad_pre[b, half + j] = grad_uc * ig * (_ONE - g * g)
                grad_pre[b, 2 * half + j] = grad_uc * g * ig * (_ONE - ig)
                grad_pre[b, 3 * half + j] = grad_uh * tc * o * (_ONE - o)
                grad_pre[b, 4 * half + j] = grad_uh * _to_float(prev_h[b, j]) * slope * sp * (_ONE - sp)
                inputs[b, j] = read[b, j]
    return status


# ---------------------------------------------------------------------------- the host side


_NO_FLOATS = np.empty((0, 0), np.float32)


def _no_words() -> tuple:
    """Stand-ins for the word arrays where nothing is popped (the derivative-only step), and a tile's rows."""
    return (np.empty((1, 1), np.int64), np.empty((1, 1, 1), np.int64), np.zeros(1, np.int64),
            np.zeros((1, 1), np.uint8), 1)


def _arrays(plan: PushPlan | PopPlan) -> tuple:
    """The word arrays a walk updates in place (live words, stack, heights, flags; errors come back as codes),
    then the rows per tile."""
    return (*(t.numpy() for t in plan.tensors()[:4]), plan.tile_rows)


def _limit(limit: ForgetLimit) -> tuple[np.float32, int]:
    """The forget limit as the loops take it: its slope (as float32, the gates' type) and smallest numerator."""
    return np.float32(limit.slope), limit.min_numerator


def _float(read: torch.Tensor) -> torch.Tensor:
    """h_j as float32: an int32 state converted (``to_float``), a float one as it is."""
    return to_float(read) if read.dtype == torch.int32 else read


def _restore_array(restore: torch.Tensor | None, rows: int) -> np.ndarray:
    return np.empty((rows, 0), np.int32) if restore is None else restore.numpy()


class NumbaSteps(StepKernels):
    """:class:`StepKernels` as numba loops on CPU tensors (see the module docstring)."""

    name = "numba"

    def gru_gates(self, read, weight, p, col, rh):
        read = _float(read)
        pre_zr = products.linear(read, weight)
        s = torch.empty_like(pre_zr)
        gru_gates(pre_zr.numpy(), p.numpy(), col, read.numpy(), s.numpy(), rh.numpy())
        return s

    def gru_push(self, buf, h, pre_g, p, col, s, mask, stored, limit, out):
        plan = buf.plan_push((h.shape[1], stored), limit=limit)
        new_float = torch.empty(h.shape)
        status, lost = gru_push(h.numpy(), pre_g.numpy(), p.numpy(), col, s.numpy(), mask.numpy(), stored,
                                *_limit(limit), *_arrays(plan), plan.flags[0], WORD_LIMIT,
                                out.numpy(), new_float.numpy())
        plan.done(lost, status=status)
        return new_float

    def gru_reverse(self, buf, h, pre_g, p, col, s, mask, limit, restore, prev, grad, grad_z, grad_g,
                    prev_float=None, grad_out=None):
        pop, diff = buf is not None, grad is not None
        if grad_out is not None:  # a pass over the gradient of its own on a CPU, where that launches nothing
            grad.add_(grad_out)
        stored = 0 if restore is None else restore.shape[1]
        plan = buf.plan_pop((h.shape[1], stored), limit=limit) if pop else None
        arrays, flags = (_arrays(plan), plan.flags) if pop else (_no_words(), [0])
        grads = (grad.numpy(), grad_z.numpy(), grad_g.numpy()) if diff else (_NO_FLOATS,) * 3
        status = gru_reverse(h.numpy(), pre_g.numpy(), p.numpy(), col, s.numpy(), mask.numpy(), *_limit(limit), pop,
                             _restore_array(restore, h.shape[0]), *arrays, flags[0], prev.numpy(), diff, *grads)
        if pop:
            plan.done(status)
        if prev_float is not None:
            _write_float(prev.numpy(), prev_float.numpy())

    def gru_read_grad(self, grad_pre, weight_zr, weight_g, read, s, grad_read, inputs):
        half, read = read.shape[1], _float(read)
        grad_rh = products.linear(grad_pre[:, 2 * half:], weight_g.t())
        gru_read_grad(grad_rh.numpy(), read.numpy(), s.numpy(), grad_pre[:, half: 2 * half].numpy(), grad_read.numpy(),
                      inputs.numpy())
        products.accumulate(grad_read, grad_pre[:, : 2 * half], weight_zr.t())

    def lstm_push(self, buf, h, c, pre, p, col, mask, stored, limit, out_h, out_c):
        plan = buf.plan_push((c.shape[1], 0), (h.shape[1], stored), limit=limit)
        new_float = torch.empty(h.shape)
        status, lost_c, lost_h = lstm_push(h.numpy(), c.numpy(), pre.numpy(), p.numpy(), col, mask.numpy(), stored,
                                           *_limit(limit), *_arrays(plan), *plan.flags, WORD_LIMIT, out_h.numpy(),
                                           out_c.numpy(), new_float.numpy())
        plan.done(lost_c, lost_h, status=status)
        return new_float

    def lstm_reverse(self, buf, h, c, pre, p, col, mask, limit, restore, prev, grad, grad_pre, read=None,
                     inputs=None, prev_float=None, grad_out=None):
        pop, diff = buf is not None, grad is not None
        if grad_out is not None:
            grad[0].add_(grad_out)
        stored = 0 if restore is None else restore.shape[1]
        plan = buf.plan_pop((c.shape[1], 0), (h.shape[1], stored), limit=limit) if pop else None
        arrays, flags = (_arrays(plan), plan.flags) if pop else (_no_words(), [0, 0])
        grads = ((grad[0].numpy(), grad[1].numpy(), grad_pre.numpy(), read.numpy(), inputs.numpy()) if diff
                 else (_NO_FLOATS,) * 5)
        status = lstm_reverse(h.numpy(), c.numpy(), pre.numpy(), p.numpy(), col, mask.numpy(), *_limit(limit), pop,
                              _restore_array(restore, h.shape[0]), *arrays, *flags, prev[0].numpy(), prev[1].numpy(),
                              diff, *grads)
        if pop:
            plan.done(status)
        if prev_float is not None:
            _write_float(prev[0].numpy(), prev_float.numpy())


NUMBA_STEPS = NumbaSteps()

__all__ = ["NUMBA_STEPS", "NumbaSteps"]
