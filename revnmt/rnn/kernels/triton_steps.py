"""The fused half-steps as Triton kernels, for CUDA: one launch per elementwise stretch.

On a GPU every op of a step is a kernel launch, and a reversible half-step written as torch ops
(the cells' reference) is some thirty of them around its matrix products. Here each stretch between
two products is one kernel, and a product that a tiled kernel can compute for itself is computed there
(``tl.dot``, :func:`_linear_tile`): RevGRU's half is :func:`_gru_gates_kernel` (the z, r product and
σ), g's product and :func:`_gru_push_kernel`; in the reverse, the gates kernel, g's product,
:func:`_gru_reverse_kernel` and :func:`_gru_read_grad_kernel` (g's backward product, r's gradient and
the z, r backward product, a program per block of whole rows). RevLSTM's is one product and
:func:`_lstm_push_kernel` or :func:`_lstm_reverse_kernel`: its product feeds the buffer walk, which is one
program, so it stays a cuBLAS product. The gates and read-gradient kernels take h_j as the int32 state
and convert it as they load it; the reverse kernels add the output's loss gradient as they read the
state's (``grad_out``), so neither costs a launch of its own.

The push and pop kernels run the buffer's own walk over the words
(:func:`~buffers.backends.triton_kernels.push_walk`, :func:`~buffers.backends.triton_kernels.pop_walk`),
which the buffer's update kernels run too. What a cell adds is one pointwise function per update that
computes a lane's float z and u from the product and projection columns where the buffer kernel would
load them: :func:`gru_update` (RevGRU's h), :func:`lstm_cell_update` and :func:`lstm_hidden_update`
(RevLSTM's c and h), each beside the torch reference it follows. The walk quantizes, rounds, pushes or
pops, adds and range-checks, so the words are those the triton buffer makes from the same z and u, and
errors go to ``words.status`` as there: nothing is read on the host per step. The reverse kernels then
backpropagate the half elementwise, after a barrier, from the popped previous half, with the same
pointwise functions. The host keeps the buffer's books through :mod:`buffers.plans` (room on the stack,
the flags, the widths that pops must mirror).

Exactness. The reverse decodes the buffer with gates it recomputes, so they must equal the
forward's bit for bit. Every kernel computes a gate with the same ``@triton.jit`` function, which
Triton inlines, and every kernel is compiled with FMA contraction off (``enable_fp_fusion=False``,
pinned for every launch), so no kernel fuses a product and a sum that another rounds twice. The
activations are the rational tanh and σ of :mod:`.activations` (:func:`tanh`), multiplies, adds and
a correctly rounded division (``div_rn``), no approximate ``exp``: each result is IEEE-rounded, so the
kernels compute the same gates on a GPU as in Triton's interpreter, and as the numba kernels on the
same products. The products a kernel computes itself (RevGRU's z, r) are sums in ``tl.dot``'s own order,
in IEEE float32 (no TF32), with one tile size for every kernel (``_TILE``): the same bits in both sweeps
on one device, not the same as cuBLAS's or the interpreter's (numpy's). They are not the torch
reference's to the last ulp, so the states of a run with fused kernels are their own; its reverse is
exact all the same.

Like the buffer kernels, these run on CPU tensors under ``TRITON_INTERPRET=1`` (how the tests run
them without a GPU). Each is launched by a plain function (``_*_launch``), not registered as a torch
custom op: the dispatcher's custom-op path costs more host time a call than the kernel takes on the
GPU, and a step is bound by the host (docs/gpu.md). What counts launches counts Triton's runs beside
the dispatched ATen ops (``benchmarks/layers.py --count-kernels``).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl

from buffers import TILE_ROWS, ForgetLimit, InformationBuffer
from buffers.backends.triton_kernels import (
    COMPILE_OPTIONS,
    close_tile,
    elements,
    fixed_terms,
    lost_table,
    open_tile,
    pop_walk,
    push_walk,
    tile_rows_of,
    to_float,
    walk_launch,
)
from buffers.fixed import FORGET_ONE
from buffers.plans import PopPlan, SliceUpdate

from . import StepKernels, activations

# The rational tanh's constants rounded to float32, as constexprs: the kernels compute in float32.
TANH_CLAMP, A1, A3, A5, A7, A9, A11, A13, B0, B2, B4, B6 = (tl.constexpr(float(np.float32(v))) for v in (
    activations.TANH_CLAMP, *activations.TANH_NUMERATOR, *activations.TANH_DENOMINATOR))
PER_NUMERATOR = tl.constexpr(1.0 / FORGET_ONE)  # z*/2^R_Z as a float: exact

# The tiled kernels' blocks (products with their activations): rows and units per program, and the inner
# dimension per tl.dot. BLOCK_K sets the order of a product's sums, so every kernel computing a gate uses these.
_TILE = {"BLOCK_B": 16, "BLOCK_J": 32, "BLOCK_K": 32}
# The read-gradient kernel's products are gradients that only it computes, so its blocks are its own: 16 units at a
# time keep it within the registers of a thread on sm_90, where 32 spilled (tests/revnmt/rnn/test_triton_steps.py).
_READ_GRAD_TILE = {"BLOCK_B": 16, "BLOCK_J": 16, "BLOCK_K": 32}


# ---------------------------------------------------------------------------- the gates, shared by every kernel


@triton.jit
def tanh(x):
    """The rational tanh of :mod:`.activations` in the numba kernels' order of operations
    (:func:`revnmt.rnn.kernels.numba_steps.tanh`): multiplies, adds and one correctly rounded division, so
    every result is IEEE-rounded and the interpreter, the GPU and the CPU loops agree on it. Clamped with
    comparisons, which leave a NaN a NaN (a range error later), where ``minimum``/``maximum`` may drop it."""
    x = tl.where(x > TANH_CLAMP, TANH_CLAMP, tl.where(x < -TANH_CLAMP, -TANH_CLAMP, x))
    x2 = x * x
    p = x2 * (x2 * (x2 * (x2 * (x2 * (x2 * A13 + A11) + A9) + A7) + A5) + A3) + A1
    return tl.div_rn(x * p, x2 * (x2 * (x2 * B6 + B4) + B2) + B0)


@triton.jit
def sigmoid(x):
    return 0.5 + 0.5 * tanh(0.5 * x)


@triton.jit
def _as_float(v):
    """A loaded h_j as float32: the int32 state converted as ``to_float`` does (so no launch converts it
    beforehand), a float as it is. The dtype is known when the kernel compiles: one branch is compiled."""
    if v.dtype == tl.int32:
        v = to_float(v)
    return v


@triton.jit
def _restrict(s, slope):
    """``buffers.restrict_forget``: σ mapped into [2^-k, 1]."""
    return slope * s + (1.0 - slope)


# The updates' pointwise functions: ``update(args, b, j, valid)`` gives (z, u, ...) of unit j of row b, the
# terms a walk takes (see buffers.backends.triton_kernels.push_walk) followed by what the derivative needs.


@triton.jit
def gru_update(args, b, j, valid):
    """RevGRU's h ← z·h + (1 − z)·g: (z, u, g, σ(z's pre-activation)). ``args``: g's product and projection
    columns, σ of [z | r] and its row stride, the forget slope.

    Reference (:class:`revnmt.rnn.cells.RevGRUCell`, ``_activations`` and ``_terms``)::

        z = restrict_forget(s_z, limit)  # s_z: σ of z's pre-activation, from the gates kernel
        u = (1 - z) * torch.tanh(pre_g + p_g)
    """
    pre_ptr, pre_rs, p_gates_ptr, p_gates_rs, s_ptr, s_rs, slope = args
    sz = tl.load(s_ptr + b * s_rs + j, mask=valid, other=0.0)
    z, u, g = gru_terms(tl.load(pre_ptr + b * pre_rs + j, mask=valid, other=0.0),
                        tl.load(p_gates_ptr + b * p_gates_rs + j, mask=valid, other=0.0), sz, slope)
    return z, u, g, sz


@triton.jit
def gru_terms(pre_g, p_g, sz, slope):
    """RevGRU's (z, u, g) from g's recurrent product, g's projection and σ of z's pre-activation, wherever they
    come from: loaded (:func:`gru_update`) or computed in registers (the persistent sweeps of .triton_sweeps)."""
    g = tanh(pre_g + p_g)
    z = _restrict(sz, slope)
    return z, (1.0 - z) * g, g


@triton.jit
def gru_backward(grad, zq, live, z, g, sz, prev, slope):
    """The derivative of RevGRU's update at a lane, from d loss / d the new h: (d loss / d the previous h,
    d loss / d z's pre-activation, d loss / d g's pre-activation). ``prev`` is the previous h as a float."""
    grad, grad_u = _backward_update(grad, zq, live)
    return grad, (grad_u * prev - grad_u * g) * slope * sz * (1.0 - sz), grad_u * (1.0 - z) * (1.0 - g * g)


@triton.jit
def _lstm_pre(args, b, column, valid):
    """A gate's pre-activation at ``column`` of RevLSTM's [f | g | i | o | p]: its product plus its projection."""
    pre_ptr, pre_rs, p_gates_ptr, p_gates_rs = args[0], args[1], args[2], args[3]
    return (tl.load(pre_ptr + b * pre_rs + column, mask=valid, other=0.0)
            + tl.load(p_gates_ptr + b * p_gates_rs + column, mask=valid, other=0.0))


@triton.jit
def lstm_cell_update(args, b, j, valid):
    """RevLSTM's c ← f·c + i·g: (z, u, σ(f), tanh(g), σ(i)). ``args``: the five gates' product and projection
    columns, ``half`` apart, and the forget slope.

    Reference (:class:`revnmt.rnn.cells.RevLSTMCell`, ``_activations`` and ``_terms``)::

        z = restrict_forget(torch.sigmoid(f), limit)
        u = torch.sigmoid(i) * torch.tanh(g)
    """
    pre_ptr, pre_rs, p_gates_ptr, p_gates_rs, half, slope = args
    return lstm_cell_terms(_lstm_pre(args, b, j, valid), _lstm_pre(args, b, half + j, valid),
                           _lstm_pre(args, b, 2 * half + j, valid), slope)


@triton.jit
def lstm_cell_terms(pre_f, pre_g, pre_i, slope):
    """RevLSTM's c-update (z, u, σ(f), tanh(g), σ(i)) from the f, g and i pre-activations, wherever they come from:
    loaded (:func:`lstm_cell_update`) or computed in registers (the persistent sweeps of .triton_sweeps)."""
    sf = sigmoid(pre_f)
    g = tanh(pre_g)
    ig = sigmoid(pre_i)
    return _restrict(sf, slope), ig * g, sf, g, ig


@triton.jit
def lstm_hidden_update(args, b, j, valid):
    """RevLSTM's h ← p·h + o·tanh(c) with the new cell c: (z, u, σ(o), σ(p), tanh(c)). ``args``: as
    :func:`lstm_cell_update`'s, then the new cell (int32) and its row stride.

    Reference (:class:`revnmt.rnn.cells.RevLSTMCell`, ``_activations``, ``_terms`` and ``_forward_reference``)::

        z = restrict_forget(torch.sigmoid(p), limit)
        u = torch.sigmoid(o) * torch.tanh(to_float(c))  # c: the new cell
    """
    pre_ptr, pre_rs, p_gates_ptr, p_gates_rs, half, slope, c_ptr, c_rs = args
    return lstm_hidden_terms(_lstm_pre(args, b, 3 * half + j, valid), _lstm_pre(args, b, 4 * half + j, valid),
                             tl.load(c_ptr + b * c_rs + j, mask=valid, other=0), slope)


@triton.jit
def lstm_hidden_terms(pre_o, pre_p, c, slope):
    """RevLSTM's h-update (z, u, σ(o), σ(p), tanh(c)) from the o and p pre-activations and the new cell ``c``
    (int32), wherever they come from (as :func:`lstm_cell_terms`)."""
    o = sigmoid(pre_o)
    sp = sigmoid(pre_p)
    tc = tanh(to_float(c))
    return _restrict(sp, slope), o * tc, o, sp, tc


@triton.jit
def lstm_hidden_backward(grad, zq, live, prev, o, sp, tc, slope):
    """The derivative of RevLSTM's h-update at a lane, from d loss / d the new h: (d loss / d the previous h, d loss
    / d o's and p's pre-activations, and d loss / d the new c through tanh(c), which the c-update's derivative adds
    to the cell's gradient). ``prev`` is the previous h as a float."""
    grad, grad_u = _backward_update(grad, zq, live)
    return (grad, grad_u * tc * o * (1.0 - o), grad_u * prev * slope * sp * (1.0 - sp),
            grad_u * o * (1.0 - tc * tc))


@triton.jit
def lstm_cell_backward(grad, zq, live, prev, sf, g, ig, slope):
    """The derivative of RevLSTM's c-update at a lane, from d loss / d the new c (h's share included): (d loss / d
    the previous c, d loss / d f's, g's and i's pre-activations). ``prev`` is the previous c as a float."""
    grad, grad_u = _backward_update(grad, zq, live)
    return grad, grad_u * prev * slope * sf * (1.0 - sf), grad_u * ig * (1.0 - g * g), grad_u * g * ig * (1.0 - ig)


@triton.jit
def _backward_update(grad, zq, live):
    """The derivative of where(live, z*·h + u, h): (d loss / d previous h, d loss / d u); d loss / d z*
    is the second times the previous h."""
    return tl.where(live, grad * (zq.to(tl.float32) * PER_NUMERATOR), grad), tl.where(live, grad, 0.0)


# ---------------------------------------------------------------------------- RevGRU


@triton.jit
def _linear_tile(acc, x_ptr, x_rs, w_ptr, w_os, w_ks, rows, outs, batch, n_out, inner, BLOCK_K: tl.constexpr):
    """acc + x[rows] · w[outs]ᵀ, a [rows, outs] tile of ``products.linear(x, w)`` (w [n_out, inner] with strides
    ``w_os``, ``w_ks``), summed over ``inner`` BLOCK_K at a time, each a ``tl.dot`` in IEEE float32 (no TF32). The
    order of the sums is the tile's own, not torch's: a gate computed here is the same bits in every kernel that
    calls this with the same blocks, which is what the reverse needs."""
    for k0 in range(0, inner, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = _as_float(tl.load(x_ptr + rows[:, None] * x_rs + ks[None, :],
                              mask=(rows[:, None] < batch) & (ks[None, :] < inner), other=0))
        w = tl.load(w_ptr + outs[None, :] * w_os + ks[:, None] * w_ks,
                    mask=(outs[None, :] < n_out) & (ks[:, None] < inner), other=0.0)
        acc = tl.dot(x, w, acc, input_precision="ieee")
    return acc


@triton.jit
def _tile(rows, unit0, BLOCK_J: tl.constexpr, batch, half):
    """The units of a tile of ``rows`` from unit ``unit0`` on, and (row, unit, valid) as 2-D blocks."""
    units = unit0 + tl.arange(0, BLOCK_J)
    return units, rows[:, None], units[None, :], (rows[:, None] < batch) & (units[None, :] < half)


@triton.jit
def _gru_gates_kernel(read_ptr, read_rs, w_ptr, w_os, w_ks, p_ptr, p_rs, s_ptr, rh_ptr, rh_rs, batch, half,
                      BLOCK_B: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
    """s = σ(read · w_zrᵀ + p_zr) ([z | r], [batch, 2·half]) and rh = r·read, the input of g's product: the
    product and its activations in one launch, a tile of rows and units per program. ``read`` (h_j) may be the
    int32 state: it is converted as it is loaded."""
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    units, b, j, ok = _tile(rows, tl.program_id(1) * BLOCK_J, BLOCK_J, batch, half)
    zeros = tl.zeros((BLOCK_B, BLOCK_J), dtype=tl.float32)
    pre_z = _linear_tile(zeros, read_ptr, read_rs, w_ptr, w_os, w_ks, rows, units, batch, half, half, BLOCK_K)
    pre_r = _linear_tile(zeros, read_ptr, read_rs, w_ptr + half * w_os, w_os, w_ks, rows, units, batch, half, half,
                         BLOCK_K)
    sz = sigmoid(pre_z + tl.load(p_ptr + b * p_rs + j, mask=ok, other=0.0))
    sr = sigmoid(pre_r + tl.load(p_ptr + b * p_rs + half + j, mask=ok, other=0.0))
    tl.store(s_ptr + b * 2 * half + j, sz, mask=ok)
    tl.store(s_ptr + b * 2 * half + half + j, sr, mask=ok)
    tl.store(rh_ptr + b * rh_rs + j, sr * _as_float(tl.load(read_ptr + b * read_rs + j, mask=ok, other=0)), mask=ok)


@triton.jit
def _gru_push_kernel(h_ptr, h_rs, pre_g_ptr, pre_g_rs, p_g_ptr, p_g_rs, s_ptr, mask_ptr, out_ptr, out_rs, float_ptr,
                     curr_ptr, stack_ptr, capacity, top_ptr, flags_ptr, status_ptr, lost_ptr, lost_table_ptr,
                     batch, half, stored, tile_rows, lanes, first_flag, min_numerator, slope,
                     LANE_BLOCK: tl.constexpr, ELEMENT_BLOCK: tl.constexpr):
    """RevGRU's half update h ← z·h + (1 − z)·g, its first ``stored`` columns unbuffered, and its float copy; a
    program per buffer tile, each writing its tile's bits destroyed to ``lost`` [tiles]."""
    gates = (pre_g_ptr, pre_g_rs, p_g_ptr, p_g_rs, s_ptr, 2 * half, slope)
    first, rows, top, status = open_tile(top_ptr, batch, tile_rows)
    tiles = tl.num_programs(0)
    # h's columns are adjacent; the row mask applies across a row (column stride 0).
    top, lost, status = push_walk(gru_update, gates, h_ptr, h_rs, 1, mask_ptr, 1, 0, out_ptr, out_rs, float_ptr,
                                  curr_ptr, stack_ptr, capacity, flags_ptr + tl.program_id(0), first_flag, tiles,
                                  lost_table_ptr, top, status, batch, first, rows, half, stored, lanes, min_numerator,
                                  GATES=True, FLOAT=True, LANE_BLOCK=LANE_BLOCK, ELEMENT_BLOCK=ELEMENT_BLOCK)
    tl.store(lost_ptr + tl.program_id(0), lost)
    close_tile(top_ptr, status_ptr, top, status)


@triton.jit
def _gru_reverse_kernel(h_ptr, h_rs, pre_g_ptr, pre_g_rs, p_g_ptr, p_g_rs, s_ptr, mask_ptr, restore_ptr, restore_rs,
                        prev_ptr, prev_rs, float_ptr, grad_ptr, grad_rs, grad_out_ptr, grad_out_rs, grad_z_ptr,
                        grad_g_ptr, grad_zg_rs, curr_ptr, stack_ptr, top_ptr, flags_ptr, status_ptr,
                        batch, half, stored, tile_rows, lanes, first_flag, min_numerator, slope,
                        POP: tl.constexpr, DIFF: tl.constexpr, FLOAT: tl.constexpr, GRAD_OUT: tl.constexpr,
                        LANE_BLOCK: tl.constexpr, ELEMENT_BLOCK: tl.constexpr):
    """Undo :func:`_gru_push_kernel` (with POP: pop into ``prev``, else ``prev`` is given) and, with DIFF,
    backpropagate the update: ``grad`` in place, d loss / d pre-activation of z and g into ``grad_z``, ``grad_g``
    (column blocks of the step's gradient slot: one row stride, ``grad_zg_rs``); with GRAD_OUT, ``grad_out`` (the
    loss gradient of the step's output) is added to ``grad`` first. With FLOAT, the float copy of ``prev`` goes
    to ``float_ptr``. A program per buffer tile."""
    gates = (pre_g_ptr, pre_g_rs, p_g_ptr, p_g_rs, s_ptr, 2 * half, slope)
    first, rows = tile_rows_of(batch, tile_rows)
    if POP:
        first, rows, top, status = open_tile(top_ptr, batch, tile_rows)
        tiles = tl.num_programs(0)
        top, status = pop_walk(gru_update, gates, h_ptr, h_rs, 1, mask_ptr, 1, 0, prev_ptr, prev_rs, float_ptr,
                               restore_ptr, restore_rs, curr_ptr, stack_ptr,
                               flags_ptr + tl.program_id(0), first_flag, tiles, top, status, batch, first,
                               rows, half, stored, lanes, min_numerator, GATES=True, RESTORE=True, FLOAT=FLOAT,
                               LANE_BLOCK=LANE_BLOCK, ELEMENT_BLOCK=ELEMENT_BLOCK)
        close_tile(top_ptr, status_ptr, top, status)
        tl.debug_barrier()  # the derivative reads what other threads popped
    if DIFF:
        for start in range(0, rows * half, ELEMENT_BLOCK):
            ok, r, j = elements(start, rows, half, ELEMENT_BLOCK)
            b = first + r
            live = tl.load(mask_ptr + b, mask=ok, other=0) != 0
            z, u, g, sz = gru_update(gates, b, j, ok)
            zq, _, _ = fixed_terms(z, u, live, ok, min_numerator)
            grad = tl.load(grad_ptr + b * grad_rs + j, mask=ok, other=0.0)
            if GRAD_OUT:
                grad += tl.load(grad_out_ptr + b * grad_out_rs + j, mask=ok, other=0.0)
            prev = to_float(tl.load(prev_ptr + b * prev_rs + j, mask=ok, other=0))
            grad, grad_z, grad_g = gru_backward(grad, zq, live, z, g, sz, prev, slope)
            tl.store(grad_ptr + b * grad_rs + j, grad, mask=ok)
            tl.store(grad_g_ptr + b * grad_zg_rs + j, grad_g, mask=ok)
            tl.store(grad_z_ptr + b * grad_zg_rs + j, grad_z, mask=ok)
            if FLOAT and not POP:  # else the pop wrote it
                tl.store(float_ptr + b * half + j, prev, mask=ok)


@triton.jit
def _gru_read_grad_kernel(grad_pre_ptr, grad_pre_rs, w_g_ptr, w_g_os, w_g_ks, w_zr_ptr, w_zr_os, w_zr_ks, read_ptr,
                          read_rs, s_ptr, grad_read_ptr, grad_read_rs, inputs_ptr, inputs_rs, inputs_ps, batch, half,
                          BLOCK_B: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
    """d loss / d h_j of a RevGRU half from its pre-activation gradients ``grad_pre`` [z | r | g] (z's and g's
    given): grad_rh = grad_g · w_g (d loss / d r·h_j), then d loss / d r's pre-activation into the r columns,
    r·grad_rh + [grad_z | grad_r] · w_zr added to ``grad_read``, and h_j and r·h_j (as :func:`_gru_gates_kernel`
    computes it) copied into the weight-gradient slots ``inputs`` (two planes, ``inputs_ps`` apart). ``read``
    may be the int32 state, as in the gates kernel.

    The last product needs grad_r of every unit of a row, so a program takes whole rows (BLOCK_B of them, all
    units in BLOCK_J tiles): one launch where a tiled kernel and a product would be two."""
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    zeros = tl.zeros((BLOCK_B, BLOCK_J), dtype=tl.float32)
    for unit0 in range(0, half, BLOCK_J):
        units, b, j, ok = _tile(rows, unit0, BLOCK_J, batch, half)
        grad_rh = _linear_tile(zeros, grad_pre_ptr + 2 * half, grad_pre_rs, w_g_ptr, w_g_os, w_g_ks, rows, units,
                               batch, half, half, BLOCK_K)
        r = tl.load(s_ptr + b * 2 * half + half + j, mask=ok, other=0.0)
        read = _as_float(tl.load(read_ptr + b * read_rs + j, mask=ok, other=0))
        tl.store(grad_pre_ptr + b * grad_pre_rs + half + j, grad_rh * read * r * (1.0 - r), mask=ok)
        grad_read = grad_read_ptr + b * grad_read_rs + j
        tl.store(grad_read, tl.load(grad_read, mask=ok, other=0.0) + grad_rh * r, mask=ok)
        tl.store(inputs_ptr + b * inputs_rs + j, read, mask=ok)
        tl.store(inputs_ptr + inputs_ps + b * inputs_rs + j, r * read, mask=ok)
    tl.debug_barrier()  # the product below reads grad_r and grad_read that other threads of the program wrote
    for unit0 in range(0, half, BLOCK_J):
        units, b, j, ok = _tile(rows, unit0, BLOCK_J, batch, half)
        grad_read = grad_read_ptr + b * grad_read_rs + j
        total = _linear_tile(tl.load(grad_read, mask=ok, other=0.0), grad_pre_ptr, grad_pre_rs, w_zr_ptr, w_zr_os,
                             w_zr_ks, rows, units, batch, half, 2 * half, BLOCK_K)
        tl.store(grad_read, total, mask=ok)


# ---------------------------------------------------------------------------- RevLSTM


@triton.jit
def _lstm_push_kernel(h_ptr, h_rs, c_ptr, c_rs, pre_ptr, pre_rs, p_gates_ptr, p_gates_rs, mask_ptr, out_h_ptr,
                      out_c_ptr, out_rs, float_ptr, curr_ptr, stack_ptr, capacity, top_ptr, flags_ptr, status_ptr,
                      lost_ptr, lost_table_ptr, batch, half, stored, tile_rows, lanes, flag_c, flag_h, min_numerator,
                      slope, LANE_BLOCK: tl.constexpr, ELEMENT_BLOCK: tl.constexpr):
    """RevLSTM's half update: c ← f·c + i·g, then h ← p·h + o·tanh(new c) and its float copy; a program per
    buffer tile. The bits destroyed go to ``lost`` [2, tiles] (c's, h's)."""
    cell = (pre_ptr, pre_rs, p_gates_ptr, p_gates_rs, half, slope)
    hidden = (pre_ptr, pre_rs, p_gates_ptr, p_gates_rs, half, slope, out_c_ptr, out_rs)
    first, rows, top, status = open_tile(top_ptr, batch, tile_rows)
    tile, tiles = tl.program_id(0), tl.num_programs(0)
    top, lost, status = push_walk(lstm_cell_update, cell, c_ptr, c_rs, 1, mask_ptr, 1, 0, out_c_ptr, out_rs,
                                  float_ptr, curr_ptr, stack_ptr, capacity, flags_ptr + tile, flag_c, tiles,
                                  lost_table_ptr, top, status, batch, first, rows, half, 0, lanes, min_numerator,
                                  GATES=True, FLOAT=False, LANE_BLOCK=LANE_BLOCK, ELEMENT_BLOCK=ELEMENT_BLOCK)
    tl.store(lost_ptr + tile, lost)
    tl.debug_barrier()  # h's terms read the new cell that other threads wrote
    top, lost, status = push_walk(lstm_hidden_update, hidden, h_ptr, h_rs, 1, mask_ptr, 1, 0, out_h_ptr, out_rs,
                                  float_ptr, curr_ptr, stack_ptr, capacity, flags_ptr + tile, flag_h, tiles,
                                  lost_table_ptr, top, status, batch, first, rows, half, stored, lanes, min_numerator,
                                  GATES=True, FLOAT=True, LANE_BLOCK=LANE_BLOCK, ELEMENT_BLOCK=ELEMENT_BLOCK)
    tl.store(lost_ptr + tiles + tile, lost)
    close_tile(top_ptr, status_ptr, top, status)


@triton.jit
def _lstm_reverse_kernel(h_ptr, h_rs, c_ptr, c_rs, pre_ptr, pre_rs, p_gates_ptr, p_gates_rs, mask_ptr, restore_ptr,
                         restore_rs, prev_h_ptr, prev_h_rs, prev_c_ptr, prev_c_rs, float_ptr, grad_h_ptr, grad_h_rs,
                         grad_out_ptr, grad_out_rs, grad_c_ptr, grad_c_rs, grad_pre_ptr, grad_pre_rs, read_ptr, read_rs,
                         inputs_ptr, inputs_rs, curr_ptr, stack_ptr, top_ptr, flags_ptr, status_ptr,
                         batch, half, stored, tile_rows, lanes, flag_c, flag_h, min_numerator, slope,
                         POP: tl.constexpr, DIFF: tl.constexpr, FLOAT: tl.constexpr, GRAD_OUT: tl.constexpr,
                         LANE_BLOCK: tl.constexpr, ELEMENT_BLOCK: tl.constexpr):
    """Undo :func:`_lstm_push_kernel` (with POP: pop h, then c; else ``prev`` is given) and, with DIFF,
    backpropagate it: ``grad_h``, ``grad_c`` in place, the gates' pre-activation gradients into ``grad_pre``,
    and ``read`` (h_j) copied into its weight-gradient slot ``inputs``; with GRAD_OUT, ``grad_out`` (the loss gradient
    of the step's output h) is added to ``grad_h`` first. With FLOAT, the float copy of the previous h goes to
    ``float_ptr``. A program per buffer tile."""
    cell = (pre_ptr, pre_rs, p_gates_ptr, p_gates_rs, half, slope)
    hidden = (pre_ptr, pre_rs, p_gates_ptr, p_gates_rs, half, slope, c_ptr, c_rs)
    first, rows = tile_rows_of(batch, tile_rows)
    if POP:
        first, rows, top, status = open_tile(top_ptr, batch, tile_rows)
        tile, tiles = tl.program_id(0), tl.num_programs(0)
        top, status = pop_walk(lstm_hidden_update, hidden, h_ptr, h_rs, 1, mask_ptr, 1, 0, prev_h_ptr,
                               prev_h_rs, float_ptr, restore_ptr, restore_rs, curr_ptr, stack_ptr,
                               flags_ptr + tile, flag_h, tiles, top, status, batch, first, rows, half, stored,
                               lanes, min_numerator, GATES=True, RESTORE=True, FLOAT=FLOAT, LANE_BLOCK=LANE_BLOCK,
                               ELEMENT_BLOCK=ELEMENT_BLOCK)
        top, status = pop_walk(lstm_cell_update, cell, c_ptr, c_rs, 1, mask_ptr, 1, 0, prev_c_ptr, prev_c_rs,
                               float_ptr, restore_ptr, restore_rs, curr_ptr, stack_ptr,
                               flags_ptr + tile, flag_c, tiles, top, status, batch, first, rows, half, 0,
                               lanes, min_numerator, GATES=True, RESTORE=True, FLOAT=False, LANE_BLOCK=LANE_BLOCK,
                               ELEMENT_BLOCK=ELEMENT_BLOCK)
        close_tile(top_ptr, status_ptr, top, status)
        tl.debug_barrier()  # the derivative reads what other threads popped
    if DIFF:
        for start in range(0, rows * half, ELEMENT_BLOCK):
            ok, r, j = elements(start, rows, half, ELEMENT_BLOCK)
            b = first + r
            live = tl.load(mask_ptr + b, mask=ok, other=0) != 0
            z_c, u_c, sf, g, ig = lstm_cell_update(cell, b, j, ok)
            z_h, u_h, o, sp, tc = lstm_hidden_update(hidden, b, j, ok)
            zq_c, _, _ = fixed_terms(z_c, u_c, live, ok, min_numerator)
            zq_h, _, _ = fixed_terms(z_h, u_h, live, ok, min_numerator)
            grad_h = tl.load(grad_h_ptr + b * grad_h_rs + j, mask=ok, other=0.0)
            if GRAD_OUT:
                grad_h += tl.load(grad_out_ptr + b * grad_out_rs + j, mask=ok, other=0.0)
            prev_c = to_float(tl.load(prev_c_ptr + b * prev_c_rs + j, mask=ok, other=0))
            prev_h = to_float(tl.load(prev_h_ptr + b * prev_h_rs + j, mask=ok, other=0))
            grad_h, grad_o, grad_p, grad_tc = lstm_hidden_backward(grad_h, zq_h, live, prev_h, o, sp, tc, slope)
            grad_c, grad_f, grad_g, grad_i = lstm_cell_backward(
                tl.load(grad_c_ptr + b * grad_c_rs + j, mask=ok, other=0.0) + grad_tc, zq_c, live, prev_c, sf, g, ig,
                slope)
            tl.store(grad_h_ptr + b * grad_h_rs + j, grad_h, mask=ok)
            tl.store(grad_c_ptr + b * grad_c_rs + j, grad_c, mask=ok)
            if FLOAT and not POP:  # else the pop wrote it
                tl.store(float_ptr + b * half + j, prev_h, mask=ok)
            row = grad_pre_ptr + b * grad_pre_rs + j
            tl.store(row, grad_f, mask=ok)
            tl.store(row + half, grad_g, mask=ok)
            tl.store(row + 2 * half, grad_i, mask=ok)
            tl.store(row + 3 * half, grad_o, mask=ok)
            tl.store(row + 4 * half, grad_p, mask=ok)
            tl.store(inputs_ptr + b * inputs_rs + j, tl.load(read_ptr + b * read_rs + j, mask=ok), mask=ok)


# ---------------------------------------------------------------------------- the launches (one kernel each)


def _rows(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A [rows, columns] tensor as the kernels take it: itself and its row stride. The columns must be
    adjacent (slices of a product or of the projection are); rows need not be."""
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"the triton step kernels need unit column stride, got strides {t.stride()}")
    return t, t.stride(0)


def _row_mask(mask: torch.Tensor) -> torch.Tensor:
    """A step's row mask [B] as the kernels read it: B adjacent booleans (one row has no stride to speak of:
    a one-sentence batch's row of a [T, 1] mask is contiguous to torch whatever its stride says)."""
    if mask.shape[0] > 1 and mask.stride(0) != 1:
        raise ValueError(f"the triton step kernels need a mask of adjacent rows, got stride {mask.stride(0)}")
    return mask


def _tiles(batch: int, half: int) -> tuple[int, int]:
    """The launch grid of the tiled kernels: row blocks x unit blocks."""
    return triton.cdiv(batch, _TILE["BLOCK_B"]), triton.cdiv(half, _TILE["BLOCK_J"])


def _gru_gates_launch(read: torch.Tensor, weight: torch.Tensor, p_zr: torch.Tensor, s: torch.Tensor,
                      rh: torch.Tensor) -> None:
    batch, half = read.shape
    _gru_gates_kernel[_tiles(batch, half)](*_rows(read), weight, *weight.stride(), *_rows(p_zr), s, *_rows(rh), batch,
                                           half, **_TILE, **COMPILE_OPTIONS)


def _gru_push_launch(h: torch.Tensor, pre_g: torch.Tensor, p_g: torch.Tensor, s: torch.Tensor, mask: torch.Tensor,
                     out: torch.Tensor, new_float: torch.Tensor, curr: torch.Tensor, stack: torch.Tensor,
                     top: torch.Tensor, flags: torch.Tensor, status: torch.Tensor, tile_rows: int, lost: torch.Tensor,
                     lost_table: torch.Tensor, stored: int, first_flag: int, min_numerator: int, slope: float) -> None:
    grid, options = walk_launch(h.shape[0], tile_rows, curr.shape[1])
    _gru_push_kernel[grid](*_rows(h), *_rows(pre_g), *_rows(p_g), s, _row_mask(mask), *_rows(out), new_float, curr,
                           stack, _capacity(stack), top, flags, status, lost, lost_table, h.shape[0], h.shape[1],
                           stored, tile_rows, curr.shape[1], first_flag, min_numerator, slope, **options)


def _gru_reverse_launch(h: torch.Tensor, pre_g: torch.Tensor, p_g: torch.Tensor, s: torch.Tensor, mask: torch.Tensor,
                        restore: torch.Tensor | None, prev: torch.Tensor, prev_float: torch.Tensor | None,
                        grad: torch.Tensor | None, grad_out: torch.Tensor | None, grad_z: torch.Tensor | None,
                        grad_g: torch.Tensor | None, curr: torch.Tensor, stack: torch.Tensor, top: torch.Tensor,
                        flags: torch.Tensor, status: torch.Tensor, tile_rows: int, first_flag: int, min_numerator: int,
                        slope: float, pop: bool) -> None:
    restore = _or_no_columns(restore, h)
    diff, write_float, add = grad is not None, prev_float is not None, grad_out is not None
    grad, grad_z, grad_g = (grad, grad_z, grad_g) if diff else (pre_g,) * 3  # untouched without DIFF
    grid, options = walk_launch(h.shape[0], tile_rows, curr.shape[1])
    _gru_reverse_kernel[grid](*_rows(h), *_rows(pre_g), *_rows(p_g), s, _row_mask(mask), *_rows(restore), *_rows(prev),
                              prev_float if write_float else pre_g, *_rows(grad), *_rows(grad_out if add else grad),
                              grad_z, grad_g, grad_z.stride(0), curr, stack, top, flags, status, h.shape[0], h.shape[1],
                              restore.shape[1], tile_rows, curr.shape[1], first_flag, min_numerator, slope, POP=pop,
                              DIFF=diff, FLOAT=write_float, GRAD_OUT=add, **options)


def _gru_read_grad_launch(grad_pre: torch.Tensor, weight_zr: torch.Tensor, weight_g: torch.Tensor, read: torch.Tensor,
                          s: torch.Tensor, grad_read: torch.Tensor, inputs: torch.Tensor) -> None:
    batch, half = read.shape
    # grad_g · weight_g and grad_zr · weight_zr are products.linear(grad, weight.t()): the transposes' strides.
    w_g, w_zr = weight_g.t(), weight_zr.t()
    _gru_read_grad_kernel[(triton.cdiv(batch, _READ_GRAD_TILE["BLOCK_B"]),)](
        *_rows(grad_pre), w_g, *w_g.stride(), w_zr, *w_zr.stride(), *_rows(read), s, *_rows(grad_read),
        *_rows(inputs[0]), inputs.stride(0), batch, half, **_READ_GRAD_TILE, **COMPILE_OPTIONS)


def _lstm_push_launch(h: torch.Tensor, c: torch.Tensor, pre: torch.Tensor, p_gates: torch.Tensor, mask: torch.Tensor,
                      out_h: torch.Tensor, out_c: torch.Tensor, new_float: torch.Tensor, curr: torch.Tensor,
                      stack: torch.Tensor, top: torch.Tensor, flags: torch.Tensor, status: torch.Tensor,
                      tile_rows: int, lost: torch.Tensor, lost_table: torch.Tensor, stored: int, flag_c: int,
                      flag_h: int, min_numerator: int, slope: float) -> None:
    if out_h.stride() != out_c.stride():
        raise ValueError("the new h and c must be laid out alike (halves of one state tensor)")
    grid, options = walk_launch(h.shape[0], tile_rows, curr.shape[1])
    _lstm_push_kernel[grid](*_rows(h), *_rows(c), *_rows(pre), *_rows(p_gates), _row_mask(mask), out_h, *_rows(out_c),
                            new_float, curr, stack, _capacity(stack), top, flags, status, lost, lost_table, h.shape[0],
                            h.shape[1], stored, tile_rows, curr.shape[1], flag_c, flag_h, min_numerator, slope,
                            **options)


def _lstm_reverse_launch(h: torch.Tensor, c: torch.Tensor, pre: torch.Tensor, p_gates: torch.Tensor, mask: torch.Tensor,
                         restore: torch.Tensor | None, prev_h: torch.Tensor, prev_c: torch.Tensor,
                         prev_float: torch.Tensor | None, grad_h: torch.Tensor | None, grad_out: torch.Tensor | None,
                         grad_c: torch.Tensor | None, grad_pre: torch.Tensor | None, read: torch.Tensor | None,
                         inputs: torch.Tensor | None, curr: torch.Tensor, stack: torch.Tensor, top: torch.Tensor,
                         flags: torch.Tensor, status: torch.Tensor, tile_rows: int, flag_c: int, flag_h: int,
                         min_numerator: int, slope: float, pop: bool) -> None:
    restore = _or_no_columns(restore, h)
    diff, write_float, add = grad_h is not None, prev_float is not None, grad_out is not None
    # Untouched without DIFF:
    grad_h, grad_c, grad_pre, read, inputs = (grad_h, grad_c, grad_pre, read, inputs) if diff else (pre,) * 5
    grid, options = walk_launch(h.shape[0], tile_rows, curr.shape[1])
    _lstm_reverse_kernel[grid](*_rows(h), *_rows(c), *_rows(pre), *_rows(p_gates), _row_mask(mask), *_rows(restore),
                               *_rows(prev_h), *_rows(prev_c), prev_float if write_float else pre, *_rows(grad_h),
                               *_rows(grad_out if add else grad_h), *_rows(grad_c), *_rows(grad_pre), *_rows(read),
                               *_rows(inputs), curr, stack, top, flags, status, h.shape[0], h.shape[1],
                               restore.shape[1], tile_rows, curr.shape[1], flag_c, flag_h, min_numerator, slope,
                               POP=pop, DIFF=diff, FLOAT=write_float, GRAD_OUT=add, **options)


def _or_no_columns(restore: torch.Tensor | None, h: torch.Tensor) -> torch.Tensor:
    """The stored columns' previous values, or none: a [rows, 0] view."""
    return h[:, :0] if restore is None else restore


# ---------------------------------------------------------------------------- the host side


@functools.lru_cache(maxsize=None)
def _no_words(device: torch.device) -> tuple:
    """Stand-ins for the word tensors where nothing is popped (the derivative-only step; never written), and the
    rows a program takes there."""
    long = dict(dtype=torch.int64, device=device)
    return (torch.zeros(1, 1, **long), torch.zeros(1, 1, 1, **long), torch.zeros(1, **long),
            torch.zeros(1, 1, dtype=torch.uint8, device=device), torch.zeros(1, dtype=torch.int32, device=device),
            TILE_ROWS)


def _pops(buf: InformationBuffer | None, device: torch.device, limit: ForgetLimit,
          *updates: SliceUpdate) -> tuple[PopPlan | None, list[int], tuple]:
    """A reverse step's books: the plan of its pops (``updates`` in push order), each update's first flag, and the
    word tensors and rows per tile. Without a buffer (the derivative alone) nothing is popped: no plan, stand-in
    word tensors."""
    if buf is None:
        return None, [0] * len(updates), _no_words(device)
    plan = buf.plan_pop(*updates, limit=limit)
    return plan, plan.flags, (*plan.tensors(), plan.tile_rows)


def _capacity(stack: torch.Tensor) -> int:
    """The stack levels a push may fill: all but the spare one on top (buffers.words)."""
    return stack.shape[0] - 1


def _columns(p: torch.Tensor, col: int, pre: torch.Tensor) -> torch.Tensor:
    """The projection's columns that match the product ``pre`` from column ``col`` on (a view: the kernels
    take row strides)."""
    return p[:, col: col + pre.shape[1]]


def _stored(restore: torch.Tensor | None) -> int:
    return 0 if restore is None else restore.shape[1]


class TritonSteps(StepKernels):
    """:class:`StepKernels` as Triton kernels on CUDA tensors (or CPU tensors under ``TRITON_INTERPRET=1``);
    see the module docstring."""

    name = "triton"

    def gru_gates(self, read, weight, p, col, rh):
        s = torch.empty(read.shape[0], 2 * read.shape[1], device=read.device)
        _gru_gates_launch(read, weight, _columns(p, col, s), s, rh)
        return s

    def gru_push(self, buf, h, pre_g, p, col, s, mask, stored, limit, out):
        plan = buf.plan_push((h.shape[1], stored), limit=limit)
        new_float = torch.empty(h.shape, device=h.device)
        lost = torch.empty(buf.words.tiles, dtype=torch.float64, device=h.device)
        _gru_push_launch(h, pre_g, _columns(p, col, pre_g), s, mask, out, new_float, *plan.tensors(), plan.tile_rows,
                         lost, lost_table(h.device), stored, plan.flags[0], limit.min_numerator, limit.slope)
        plan.done(lost)
        return new_float

    def gru_reverse(self, buf, h, pre_g, p, col, s, mask, limit, restore, prev, grad, grad_z, grad_g,
                    prev_float=None, grad_out=None):
        plan, flags, words = _pops(buf, h.device, limit, (h.shape[1], _stored(restore)))
        _gru_reverse_launch(h, pre_g, _columns(p, col, pre_g), s, mask, restore, prev, prev_float, grad, grad_out,
                            grad_z, grad_g, *words, flags[0], limit.min_numerator, limit.slope, plan is not None)
        if plan is not None:
            plan.done()

    def gru_read_grad(self, grad_pre, weight_zr, weight_g, read, s, grad_read, inputs):
        _gru_read_grad_launch(grad_pre, weight_zr, weight_g, read, s, grad_read, inputs)

    def lstm_push(self, buf, h, c, pre, p, col, mask, stored, limit, out_h, out_c):
        plan = buf.plan_push((c.shape[1], 0), (h.shape[1], stored), limit=limit)
        new_float = torch.empty(h.shape, device=h.device)
        lost = torch.empty(2, buf.words.tiles, dtype=torch.float64, device=h.device)
        _lstm_push_launch(h, c, pre, _columns(p, col, pre), mask, out_h, out_c, new_float, *plan.tensors(),
                          plan.tile_rows, lost, lost_table(h.device), stored, *plan.flags, limit.min_numerator,
                          limit.slope)
        plan.done(lost[0], lost[1])
        return new_float

    def lstm_reverse(self, buf, h, c, pre, p, col, mask, limit, restore, prev, grad, grad_pre, read=None,
                     inputs=None, prev_float=None, grad_out=None):
        plan, flags, words = _pops(buf, h.device, limit, (c.shape[1], 0), (h.shape[1], _stored(restore)))
        grad_h, grad_c = (None, None) if grad is None else grad
        _lstm_reverse_launch(h, c, pre, _columns(p, col, pre), mask, restore, *prev, prev_float, grad_h, grad_out,
                             grad_c, grad_pre, read, inputs, *words, *flags, limit.min_numerator, limit.slope,
                             plan is not None)
        if plan is not None:
            plan.done()


TRITON_STEPS = TritonSteps()

__all__ = ["TRITON_STEPS", "TritonSteps"]
