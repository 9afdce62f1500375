"""RevGRU sweeps as persistent Triton kernels: one launch for a stack's whole forward sweep, one per chunk of steps
for its reverse (issue #44, docs: gpu-design-study §3).

Why. The per-step kernels (:mod:`.triton_steps`) launch three kernels per layer, half and step, so a small batch's
step is bound by the host's launches, not by the GPU. Here a program owns ``TB`` sentences (:func:`program_rows`)
for the whole sweep and runs, step after step, what those launches ran: every product of its rows (``tl.dot`` from
the weights in global memory, which stay in L2), the gates and the buffer's walk. Nothing couples the programs: a
buffer tile's overflow decision is a reduction over that tile's lanes only (:mod:`buffers.words`), and a program's
rows are whole buffer tiles (``TB`` is a multiple of ``tile_rows``; ``tl.dot`` needs at least 16 rows, and tiles
default to 8), so no program waits for another and there is no grid-wide barrier. A program's live words stay in
registers for the whole launch: every push of a step (every layer, half and chunk) lands on the same lanes of its
rows.

Push order. Inside a program the sweep runs in the buffer's order, time-major: step t, then layer, then half, then
chunk, the order in which :meth:`revnmt.rnn.ReversibleRNN.forward_sweep` pushes with per-step kernels. That is why a
whole stack is one launch: layer 1's step t needs layer 0's step t, and the live words carry from one push to the
next whatever layer made it, so a launch per layer would push in another order and make other words. The pushes'
flags and heights are those of the per-step walk; the reverse pops them in the mirror order (t down, top layer first,
half 1 first, last chunk first).

What runs in the kernel, per layer and half, for the program's rows:

1. the gates phase (:func:`_gates_phase`): σ of z and r, from the layer input's projection and h_j's recurrent
   product, and r·h_j, into a program-private work area (``work``, [batch, 3·half]: g's product reads r·h_j of every
   unit of a row, which other threads computed: a barrier follows);
2. the update, a block of columns at a time: the stored columns (the top layer's attention slice skips the buffer),
   then the buffered chunks, each a [TB, lanes] block of g's products (:func:`_g_gates`) pushed through the tiles'
   walk (:func:`~buffers.backends.triton_kernels.push_chunk`), the state updated in place.

Layer l's input projection is computed in the kernel too, from the layer below's new state (layer 0's from the
sweep's inputs): it is a product like the others, and it cannot be computed before the launch for l > 0.

The reverse (one launch per chunk of steps, :func:`gru_reverse_sweep`) runs the same gates phase and the same
:func:`_g_gates` on the same rows with the same blocks, so every gate is the forward's bit for bit, pops each chunk
(:func:`~buffers.backends.triton_kernels.pop_chunk`, the push's flag read back instead of a reduction redone), and
backpropagates the half elementwise (:func:`~.triton_steps.gru_backward`) and through its recurrent and input
products (``tl.dot`` again). What is a reduction over the batch, the weights' gradients, is not summed in the
kernel (atomics would make it nondeterministic): the kernel writes each step's pre-activation gradients and
products' inputs into slots, and the host reduces a chunk of steps per weight with one product each, as
:class:`~.cells.RecurrentGrads` does for the per-step kernels.

Exactness. The products are ``tl.dot`` in IEEE float32 (no TF32) summed ``BLOCK_K`` at a time in the tile's own
order (:func:`~.triton_steps._linear_tile`), with one set of blocks (``_BLOCKS``) in both sweeps; no FMA contraction
(``COMPILE_OPTIONS``); the gates are :mod:`.triton_steps`' own functions. The projections are the kernel's, not
cuBLAS's or oneDNN's, so a persistent sweep's states are its own, as a fused run's are (the per-step path's g
product and projections are torch products): the same buffer layout and push order, other low bits. Its reverse is
exact all the same, since both sweeps compute every gate with the same code. The tests (tests/revnmt/rnn/
test_triton_sweeps.py) check the walk against the per-step kernels fed the products this module computes.

Capacity. The stack's room is fixed before the launch (``words.capacity`` levels, :mod:`buffers.words`). A push
that would stack a word at a level at or above it stores nothing and still counts the tile's height: the sweep's
end reads the heights (:meth:`~buffers.InformationBuffer.settle`) and runs the sweep again with more room (the
forward is deterministic).

Scope: RevGRU stacks whose buffer tiles are a power of two of at most 32 rows, on at most 16 lanes
(:meth:`TritonSweeps.supports`; the triton backend asks it, :meth:`revnmt.rnn.backends.Backend.persistent`). Layer
0's inputs are taken for every step at once ([T, batch, input]). A stack whose outputs get gradients from outside
(the decoder's attention and loss) is reversed a step per launch: the gradient of step t's output needs the state
after step t, which exists only once the later steps are undone. RevLSTM keeps the per-step kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from buffers import ForgetLimit, InformationBuffer
from buffers.backends.triton_kernels import (
    COMPILE_OPTIONS,
    OUT_OF_RANGE,
    STATE_OVERFLOW,
    TERM_OVERFLOW,
    _outside_int32,
    _record,
    fixed_terms,
    floor_update,
    lane_full,
    load_flag,
    lost_table,
    pop_chunk,
    push_chunk,
    store_flag,
    to_float,
)

from .. import products
from .triton_steps import _linear_tile, gru_backward, gru_terms, sigmoid

#: Columns a g-product block takes: a chunk's lanes, padded to a power of two (at most 16 lanes: revnmt's default).
MAX_LANES = 16
#: Units per gates block and inner dimension per tl.dot: 16 and 16 keep a program's products in the registers of a
#: thread on sm_80 and sm_90 (more spilled in the design study's prototype; tests/revnmt/rnn/test_triton_sweeps.py
#: checks). One set for both sweeps: BLOCK_K sets the order of every product's sums.
_BLOCKS = {"BLOCK_J": 16, "BLOCK_K": 16}


# ---------------------------------------------------------------------------- pieces both sweeps share


@triton.jit
def _tile_any(row_flags, TB: tl.constexpr, TILE_ROWS: tl.constexpr):
    """Per row, whether any row of its buffer tile is flagged (``row_flags`` [TB] int32): the program's rows are
    TB // TILE_ROWS whole tiles, so the reduction stays inside each tile and never sees another tile's words."""
    per_tile = tl.max(tl.reshape(row_flags, (TB // TILE_ROWS, TILE_ROWS)), axis=1)
    return tl.reshape(tl.broadcast_to(per_tile[:, None], (TB // TILE_ROWS, TILE_ROWS)), (TB,)) > 0


@triton.jit
def _projection(x_ptr, x_rs, n_in, w_ptr, b_ptr, rows, outs, batch, n_out, zeros, BLOCK_K: tl.constexpr):
    """Columns ``outs`` of x · wᵀ + b for the rows ``rows`` (w [n_out, n_in] contiguous, from its first row): a
    layer input's share of a gate's pre-activation."""
    acc = _linear_tile(zeros, x_ptr, x_rs, w_ptr, n_in, 1, rows, outs, batch, n_out, n_in, BLOCK_K)
    return acc + tl.load(b_ptr + outs, mask=outs < n_out, other=0.0)[None, :]


@triton.jit
def _layer_input(below_ptr, drop_ptr, out_ptr, rows, batch, hidden, BLOCK_J: tl.constexpr):
    """Layer l > 0's input, the layer below's output times its dropout mask (``ReversibleRNN._layer_input``), into
    ``out`` ([batch, hidden]) for the projection's products to read (other threads' rows: a barrier follows)."""
    for j0 in range(0, hidden, BLOCK_J):
        cols = j0 + tl.arange(0, BLOCK_J)
        ok = (rows[:, None] < batch) & (cols[None, :] < hidden)
        at = rows[:, None] * hidden + cols[None, :]
        x = to_float(tl.load(below_ptr + at, mask=ok, other=0)) * tl.load(drop_ptr + at, mask=ok, other=0.0)
        tl.store(out_ptr + at, x, mask=ok)
    tl.debug_barrier()


@triton.jit
def _gates_phase(x_ptr, x_rs, n_in, w_in_ptr, b_ptr, read_ptr, read_rs, w_rec_ptr, work_ptr, rows, batch, half,
                 TB: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
    """σ(z), σ(r) and r·h_j of a half for the program's rows into ``work`` ([batch, 3·half]). ``w_in_ptr``, ``b_ptr``
    and ``w_rec_ptr`` point at the half's [z | r | g] rows of the layer's input weight, bias and recurrent weight;
    ``read`` is h_j, the int32 state. As :func:`~.triton_steps._gru_gates_kernel` computes them, from a projection
    computed here: sigmoid(h_j · wᵀ + p)."""
    zeros = tl.zeros((TB, BLOCK_J), dtype=tl.float32)
    for j0 in range(0, half, BLOCK_J):
        units = j0 + tl.arange(0, BLOCK_J)
        ok = (rows[:, None] < batch) & (units[None, :] < half)
        p_z = _projection(x_ptr, x_rs, n_in, w_in_ptr, b_ptr, rows, units, batch, half, zeros, BLOCK_K)
        sz = sigmoid(_linear_tile(zeros, read_ptr, read_rs, w_rec_ptr, half, 1, rows, units, batch, half, half, BLOCK_K)
                     + p_z)
        p_r = _projection(x_ptr, x_rs, n_in, w_in_ptr + half * n_in, b_ptr + half, rows, units, batch, half, zeros,
                          BLOCK_K)
        sr = sigmoid(_linear_tile(zeros, read_ptr, read_rs, w_rec_ptr + half * half, half, 1, rows, units, batch, half,
                                  half, BLOCK_K) + p_r)
        read = to_float(tl.load(read_ptr + rows[:, None] * read_rs + units[None, :], mask=ok, other=0))
        at = work_ptr + rows[:, None] * 3 * half + units[None, :]
        tl.store(at, sz, mask=ok)
        tl.store(at + half, sr, mask=ok)
        tl.store(at + 2 * half, sr * read, mask=ok)
    tl.debug_barrier()  # g's products read r·h_j of units other threads computed


@triton.jit
def _g_products(x_ptr, x_rs, n_in, w_in_ptr, b_ptr, w_rec_ptr, work_ptr, rows, cols, batch, half, zeros,
                BLOCK_K: tl.constexpr):
    """g's recurrent product (from r·h_j in ``work``) and its projection at columns ``cols`` of a half."""
    pre_g = _linear_tile(zeros, work_ptr + 2 * half, 3 * half, w_rec_ptr + 2 * half * half, half, 1, rows, cols,
                         batch, half, half, BLOCK_K)
    p_g = _projection(x_ptr, x_rs, n_in, w_in_ptr + 2 * half * n_in, b_ptr + 2 * half, rows, cols, batch, half, zeros,
                      BLOCK_K)
    return pre_g, p_g


@triton.jit
def _g_gates(x_ptr, x_rs, n_in, w_in_ptr, b_ptr, w_rec_ptr, work_ptr, rows, cols, batch, half, slope, zeros,
             BLOCK_K: tl.constexpr):
    """(z, u, g, σ(z's pre-activation)) of a half at columns ``cols`` (a block of a chunk, or of the stored columns):
    :func:`_g_products`, then :func:`~.triton_steps.gru_terms`."""
    pre_g, p_g = _g_products(x_ptr, x_rs, n_in, w_in_ptr, b_ptr, w_rec_ptr, work_ptr, rows, cols, batch, half, zeros,
                             BLOCK_K)
    sz = tl.load(work_ptr + rows[:, None] * 3 * half + cols[None, :],
                 mask=(rows[:, None] < batch) & (cols[None, :] < half), other=0.0)
    z, u, g = gru_terms(pre_g, p_g, sz, slope)
    return z, u, g, sz


@triton.jit
def _add_rows(dst_ptr, dst_rs, src_ptr, rows, batch, width, BLOCK_J: tl.constexpr):
    """dst[rows, :width] += src[rows] ([batch, width], contiguous): a gradient from outside the stack."""
    for j0 in range(0, width, BLOCK_J):
        cols = j0 + tl.arange(0, BLOCK_J)
        ok = (rows[:, None] < batch) & (cols < width)[None, :]
        at = dst_ptr + rows[:, None] * dst_rs + cols[None, :]
        tl.store(at, tl.load(at, mask=ok) + tl.load(src_ptr + rows[:, None] * width + cols[None, :], mask=ok), mask=ok)


@triton.jit
def _stored_count(layer, layers, i, half, slice_dim):
    """Leading columns of half i of ``layer`` that skip the buffer: the top layer's attention slice."""
    return tl.where(layer == layers - 1, tl.minimum(tl.maximum(slice_dim - i * half, 0), half), 0)


# ---------------------------------------------------------------------------- the forward sweep


@triton.jit(do_not_specialize=["first_flag"])
def _gru_forward_kernel(x_ptr, n_in0, w_in0_ptr, w_in_ptr, b_ptr, w_rec_ptr, drop_ptr, mask_ptr, state_ptr,
                        slices_ptr, work_ptr, layer_in_ptr, curr_ptr, stack_ptr, top_ptr, flags_ptr, status_ptr,
                        lost_ptr, lost_table_ptr, batch, steps, layers, half, lanes, slice_dim, capacity, first_flag,
                        min_numerator, slope, TILE_ROWS: tl.constexpr, TB: tl.constexpr, LANES_P2: tl.constexpr,
                        BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
    """A RevGRU stack's forward sweep for the program's TB rows: ``state`` [layers, batch, hidden] int32 in place,
    the top layer's first ``slice_dim`` columns after each step into ``slices`` [steps, batch, slice_dim], pushes
    from flag ``first_flag`` on. ``x`` [steps, batch, n_in0]: layer 0's inputs; ``w_in0`` [6·half, n_in0] and
    ``w_in`` [layers − 1, 6·half, hidden]: the input weights, ``b`` [layers, 6·half] the biases (SweepWeights'
    layout: half 0's [z | r | g] rows, then half 1's); ``w_rec`` [layers, 2, 3·half, half]: each half's recurrent
    [z | r | g] rows; ``drop`` [layers, batch, hidden]: the dropout masks of the layers' inputs (layer 0's unread).
    Each program writes the bits its rows destroyed to ``lost`` [programs]."""
    hidden = 2 * half
    rows = tl.program_id(0) * TB + tl.arange(0, TB)
    row_ok = rows < batch
    tiles = tl.cdiv(batch, TILE_ROWS)
    tile = rows // TILE_ROWS
    head = row_ok & (rows % TILE_ROWS == 0)  # a tile's first row writes the tile's flags and height
    k = tl.arange(0, LANES_P2)
    lane_ok = row_ok[:, None] & (k < lanes)[None, :]
    words = rows[:, None] * lanes + k[None, :]  # the rows' lanes in curr and in every stack level
    level = batch * lanes
    cur = tl.load(curr_ptr + words, mask=lane_ok, other=0)  # the live words, held for the whole sweep
    top = tl.load(top_ptr + tile, mask=row_ok, other=0)  # each row's tile's height
    lost = tl.zeros((TB,), dtype=tl.float64)
    status = tl.full([], 0, tl.int32)
    push = first_flag
    zeros = tl.zeros((TB, LANES_P2), dtype=tl.float32)
    for t in range(0, steps):
        live_rows = tl.load(mask_ptr + t * batch + rows, mask=row_ok, other=0) != 0
        for layer in range(0, layers):
            layer_state = state_ptr + layer * batch * hidden
            if layer == 0:
                x, x_rs, n_in, w_in = x_ptr + t * batch * n_in0, n_in0, n_in0, w_in0_ptr
            else:
                _layer_input(layer_state - batch * hidden, drop_ptr + layer * batch * hidden, layer_in_ptr, rows,
                             batch, hidden, BLOCK_J)
                x, x_rs, n_in, w_in = layer_in_ptr, hidden, hidden, w_in_ptr + (layer - 1) * 3 * hidden * hidden
            for i in range(0, 2):
                w_in_i = w_in + i * 3 * half * n_in
                b_i = b_ptr + layer * 3 * hidden + i * 3 * half
                w_rec_i = w_rec_ptr + (layer * 2 + i) * 3 * half * half
                h_i = layer_state + i * half + rows[:, None] * hidden
                _gates_phase(x, x_rs, n_in, w_in_i, b_i, layer_state + (1 - i) * half, hidden, w_rec_i, work_ptr,
                             rows, batch, half, TB, BLOCK_J, BLOCK_K)
                stored = _stored_count(layer, layers, i, half, slice_dim)
                for j0 in range(0, stored, LANES_P2):  # the stored columns: the floor product, no buffer
                    cols = j0 + k
                    valid = row_ok[:, None] & (cols < stored)[None, :]
                    live = valid & live_rows[:, None]
                    z, u, _, _ = _g_gates(x, x_rs, n_in, w_in_i, b_i, w_rec_i, work_ptr, rows, cols, batch, half,
                                          slope, zeros, BLOCK_K)
                    zq, ui, bad_term = fixed_terms(z, u, live, valid, min_numerator)
                    value, bad = floor_update(tl.load(h_i + cols[None, :], mask=valid, other=0).to(tl.int64), zq, ui,
                                              live, valid)
                    tl.store(h_i + cols[None, :], value.to(tl.int32), mask=valid)
                    status = _record(_record(status, bad_term, TERM_OVERFLOW), bad, STATE_OVERFLOW)
                buffered = half - stored
                for c in range(0, tl.cdiv(buffered, lanes)):  # the buffered chunks, in the walk's order
                    j = c * lanes + k
                    cols = stored + j
                    valid = row_ok[:, None] & ((k < lanes) & (j < buffered))[None, :]
                    live = valid & live_rows[:, None]
                    z, u, _, _ = _g_gates(x, x_rs, n_in, w_in_i, b_i, w_rec_i, work_ptr, rows, cols, batch, half,
                                          slope, zeros, BLOCK_K)
                    zq, ui, bad_term = fixed_terms(z, u, live, valid, min_numerator)
                    hv = tl.load(h_i + cols[None, :], mask=valid, other=0).to(tl.int64)
                    # The tile's decision: a reduction over its own lanes, before any word of the chunk changes.
                    overflow = _tile_any(tl.max(lane_full(cur, valid, live).to(tl.int32), axis=1), TB, TILE_ROWS)
                    store_flag(flags_ptr + tile, push, tiles, overflow, head)
                    room = top < capacity  # a full room stores nothing; the height still counts (buffers.words)
                    tl.store(stack_ptr + top[:, None] * level + words, cur, mask=lane_ok & (overflow & room)[:, None])
                    value, cur, bad = push_chunk(hv, zq, ui, live, valid, cur, overflow[:, None])
                    tl.store(h_i + cols[None, :], value.to(tl.int32), mask=valid)
                    lost += tl.sum(tl.where(live, tl.load(lost_table_ptr + zq, mask=live, other=0.0), 0.0), axis=1)
                    status = _record(_record(status, bad_term, TERM_OVERFLOW), bad, STATE_OVERFLOW)
                    top += overflow.to(tl.int64)
                    push += 1
                tl.debug_barrier()  # the next half's products read this half's new state
        top_state = state_ptr + (layers - 1) * batch * hidden
        for j0 in range(0, slice_dim, BLOCK_J):
            cols = j0 + tl.arange(0, BLOCK_J)
            ok = row_ok[:, None] & (cols < slice_dim)[None, :]
            value = tl.load(top_state + rows[:, None] * hidden + cols[None, :], mask=ok)
            tl.store(slices_ptr + (t * batch + rows[:, None]) * slice_dim + cols[None, :], value, mask=ok)
    tl.store(curr_ptr + words, cur, mask=lane_ok)
    tl.store(top_ptr + tile, top, mask=head)
    tl.store(lost_ptr + tl.program_id(0), tl.sum(lost, axis=0))
    tl.atomic_max(status_ptr, status)


# ---------------------------------------------------------------------------- the reverse sweep


@triton.jit(do_not_specialize=["last_flag", "start", "stop"])
def _gru_reverse_kernel(x_ptr, n_in0, w_in0_ptr, w_in_ptr, b_ptr, w_rec_ptr, drop_ptr, mask_ptr, state_ptr,
                        grads_ptr, slices_ptr, initial_ptr, initial_rs, slice_grad_ptr, out_grad_ptr, work_ptr,
                        grad_pre_ptr, rec_in_ptr, layer_in_ptr, curr_ptr, stack_ptr, top_ptr, flags_ptr, status_ptr,
                        batch, start, stop, chunk, layers, half, lanes, slice_dim, last_flag, min_numerator, slope,
                        SLICE_GRAD: tl.constexpr, OUT_GRAD: tl.constexpr, TILE_ROWS: tl.constexpr, TB: tl.constexpr,
                        LANES_P2: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
    """Undo and backpropagate steps ``start`` … ``stop`` − 1 of :func:`_gru_forward_kernel`, last first, for the
    program's rows: ``state`` back to the state before ``start`` in place, ``grads`` [layers, batch, hidden] (d loss
    / d state) likewise; ``last_flag`` is the last push's flag. ``x`` [stop − start, batch, n_in0]: layer 0's inputs
    at those steps. The stored columns' previous values come from ``slices``, at the first step from ``initial``
    (the top layer's initial state, row stride ``initial_rs``); with SLICE_GRAD, ``slice_grad`` [steps, batch,
    slice_dim] is added to the top layer's gradient before each step, and with OUT_GRAD ``out_grad`` [stop − start,
    batch, hidden] (d loss / d its outputs at those steps). Into slots of ``chunk`` steps (s = t − start)
    the kernel writes what the weights' gradients are reduced from: ``grad_pre`` [layers, chunk, batch, 6·half] (d
    loss / d each gate's pre-activation, also d loss / d the projection), ``rec_in`` [layers, 4, chunk, batch, half]
    (each half's h_j and r·h_j) and ``layer_in`` [layers, chunk, batch, hidden] (the inputs of layers > 0)."""
    hidden = 2 * half
    rows = tl.program_id(0) * TB + tl.arange(0, TB)
    row_ok = rows < batch
    tiles = tl.cdiv(batch, TILE_ROWS)
    tile = rows // TILE_ROWS
    head = row_ok & (rows % TILE_ROWS == 0)
    k = tl.arange(0, LANES_P2)
    lane_ok = row_ok[:, None] & (k < lanes)[None, :]
    words = rows[:, None] * lanes + k[None, :]
    level = batch * lanes
    cur = tl.load(curr_ptr + words, mask=lane_ok, other=0)
    top = tl.load(top_ptr + tile, mask=row_ok, other=0)
    status = tl.full([], 0, tl.int32)
    push = last_flag
    zeros = tl.zeros((TB, LANES_P2), dtype=tl.float32)
    zeros_j = tl.zeros((TB, BLOCK_J), dtype=tl.float32)
    for back in range(0, stop - start):
        t = stop - 1 - back
        s = t - start
        live_rows = tl.load(mask_ptr + t * batch + rows, mask=row_ok, other=0) != 0
        top_grad = grads_ptr + (layers - 1) * batch * hidden
        if OUT_GRAD:
            _add_rows(top_grad, hidden, out_grad_ptr + s * batch * hidden, rows, batch, hidden, BLOCK_J)
        if SLICE_GRAD:
            _add_rows(top_grad, hidden, slice_grad_ptr + t * batch * slice_dim, rows, batch, slice_dim, BLOCK_J)
        tl.debug_barrier()  # the reverse reads the gradients by other threads' blocks
        for layer_back in range(0, layers):
            layer = layers - 1 - layer_back
            layer_state = state_ptr + layer * batch * hidden
            layer_grad = grads_ptr + layer * batch * hidden
            grad_pre = grad_pre_ptr + (layer * chunk + s) * batch * 3 * hidden
            if layer == 0:
                x, x_rs, n_in, w_in = x_ptr + s * batch * n_in0, n_in0, n_in0, w_in0_ptr
            else:
                x = layer_in_ptr + (layer * chunk + s) * batch * hidden  # kept: W_in's gradient is reduced from it
                _layer_input(layer_state - batch * hidden, drop_ptr + layer * batch * hidden, x, rows, batch, hidden,
                             BLOCK_J)
                x_rs, n_in, w_in = hidden, hidden, w_in_ptr + (layer - 1) * 3 * hidden * hidden
            for i_back in range(0, 2):
                i = 1 - i_back
                w_in_i = w_in + i * 3 * half * n_in
                b_i = b_ptr + layer * 3 * hidden + i * 3 * half
                w_rec_i = w_rec_ptr + (layer * 2 + i) * 3 * half * half
                h_i = layer_state + i * half + rows[:, None] * hidden
                grad_i = layer_grad + i * half + rows[:, None] * hidden
                pre_i = grad_pre + i * 3 * half + rows[:, None] * 3 * hidden
                read_ptr = layer_state + (1 - i) * half
                _gates_phase(x, x_rs, n_in, w_in_i, b_i, read_ptr, hidden, w_rec_i, work_ptr, rows, batch, half,
                             TB, BLOCK_J, BLOCK_K)
                stored = _stored_count(layer, layers, i, half, slice_dim)
                buffered = half - stored
                chunks = tl.cdiv(buffered, lanes)
                for c_back in range(0, chunks):  # pop, last chunk first, and backpropagate the chunk
                    c = chunks - 1 - c_back
                    j = c * lanes + k
                    cols = stored + j
                    valid = row_ok[:, None] & ((k < lanes) & (j < buffered))[None, :]
                    live = valid & live_rows[:, None]
                    z, u, g, sz = _g_gates(x, x_rs, n_in, w_in_i, b_i, w_rec_i, work_ptr, rows, cols, batch, half,
                                           slope, zeros, BLOCK_K)
                    zq, ui, bad_term = fixed_terms(z, u, live, valid, min_numerator)
                    hv = tl.load(h_i + cols[None, :], mask=valid, other=0).to(tl.int64)
                    overflow = load_flag(flags_ptr + tile, push, tiles, row_ok)  # the push's decision
                    value, cur, bad = pop_chunk(hv, zq, ui, live, valid, cur)
                    below = tl.load(stack_ptr + (top - 1)[:, None] * level + words, mask=lane_ok & overflow[:, None],
                                    other=0)
                    cur = tl.where(overflow[:, None], below, cur)
                    top -= overflow.to(tl.int64)
                    push -= 1
                    tl.store(h_i + cols[None, :], value.to(tl.int32), mask=valid)
                    status = _record(_record(status, bad_term, TERM_OVERFLOW), bad, STATE_OVERFLOW)
                    status = _record(status, _outside_int32(value, live), OUT_OF_RANGE)
                    grad, grad_z, grad_g = gru_backward(tl.load(grad_i + cols[None, :], mask=valid, other=0.0), zq,
                                                        live, z, g, sz, to_float(value), slope)
                    tl.store(grad_i + cols[None, :], grad, mask=valid)
                    tl.store(pre_i + cols[None, :], grad_z, mask=valid)
                    tl.store(pre_i + 2 * half + cols[None, :], grad_g, mask=valid)
                for j0 in range(0, stored, LANES_P2):  # the stored columns: restored from where they were kept
                    cols = j0 + k
                    valid = row_ok[:, None] & (cols < stored)[None, :]
                    live = valid & live_rows[:, None]
                    z, u, g, sz = _g_gates(x, x_rs, n_in, w_in_i, b_i, w_rec_i, work_ptr, rows, cols, batch, half,
                                           slope, zeros, BLOCK_K)
                    zq, _, _ = fixed_terms(z, u, live, valid, min_numerator)
                    at = rows[:, None] * slice_dim + i * half + cols[None, :]
                    first = tl.where(t == 0, valid, False)  # before step 0 the initial state's columns
                    prev = (tl.load(slices_ptr + (t - 1) * batch * slice_dim + at, mask=valid & ~first, other=0)
                            + tl.load(initial_ptr + rows[:, None] * initial_rs + i * half + cols[None, :], mask=first,
                                      other=0))
                    tl.store(h_i + cols[None, :], prev, mask=valid)
                    grad, grad_z, grad_g = gru_backward(tl.load(grad_i + cols[None, :], mask=valid, other=0.0), zq,
                                                        live, z, g, sz, to_float(prev), slope)
                    tl.store(grad_i + cols[None, :], grad, mask=valid)
                    tl.store(pre_i + cols[None, :], grad_z, mask=valid)
                    tl.store(pre_i + 2 * half + cols[None, :], grad_g, mask=valid)
                tl.debug_barrier()  # the products below read gradients and states other threads wrote
                # d loss / d h_j, as _gru_read_grad_kernel computes it: r's gradient through g's product, then the
                # z, r product's; and the recurrent weights' inputs into their slots.
                grad_j = layer_grad + (1 - i) * half
                rec_in = rec_in_ptr + ((layer * 4 + 2 * i) * chunk + s) * batch * half
                for j0 in range(0, half, BLOCK_J):
                    units = j0 + tl.arange(0, BLOCK_J)
                    ok = row_ok[:, None] & (units[None, :] < half)
                    grad_rh = _linear_tile(zeros_j, grad_pre + i * 3 * half + 2 * half, 3 * hidden,
                                           w_rec_i + 2 * half * half, 1, half, rows, units, batch, half, half, BLOCK_K)
                    work = work_ptr + rows[:, None] * 3 * half + units[None, :]
                    r = tl.load(work + half, mask=ok, other=0.0)
                    read = to_float(tl.load(read_ptr + rows[:, None] * hidden + units[None, :], mask=ok, other=0))
                    tl.store(pre_i + half + units[None, :], grad_rh * read * r * (1.0 - r), mask=ok)
                    at = grad_j + rows[:, None] * hidden + units[None, :]
                    tl.store(at, tl.load(at, mask=ok, other=0.0) + grad_rh * r, mask=ok)
                    slot = rows[:, None] * half + units[None, :]
                    tl.store(rec_in + slot, read, mask=ok)
                    tl.store(rec_in + chunk * batch * half + slot, tl.load(work + 2 * half, mask=ok), mask=ok)
                tl.debug_barrier()
                for j0 in range(0, half, BLOCK_J):
                    units = j0 + tl.arange(0, BLOCK_J)
                    ok = row_ok[:, None] & (units[None, :] < half)
                    at = grad_j + rows[:, None] * hidden + units[None, :]
                    total = _linear_tile(tl.load(at, mask=ok, other=0.0), grad_pre + i * 3 * half, 3 * hidden,
                                         w_rec_i, 1, half, rows, units, batch, half, 2 * half, BLOCK_K)
                    tl.store(at, total, mask=ok)
                tl.debug_barrier()
            if layer > 0:  # d loss / d the layer's input, into the gradient of the layer below's output
                below_grad = layer_grad - batch * hidden
                drop = drop_ptr + layer * batch * hidden
                for j0 in range(0, hidden, BLOCK_J):
                    units = j0 + tl.arange(0, BLOCK_J)
                    ok = row_ok[:, None] & (units[None, :] < hidden)
                    grad_x = _linear_tile(zeros_j, grad_pre, 3 * hidden, w_in, 1, hidden, rows, units, batch, hidden,
                                          3 * hidden, BLOCK_K)
                    at = rows[:, None] * hidden + units[None, :]
                    tl.store(below_grad + at, tl.load(below_grad + at, mask=ok, other=0.0)
                             + grad_x * tl.load(drop + at, mask=ok, other=0.0), mask=ok)
                tl.debug_barrier()
    tl.store(curr_ptr + words, cur, mask=lane_ok)
    tl.store(top_ptr + tile, top, mask=head)
    tl.atomic_max(status_ptr, status)


# ---------------------------------------------------------------------------- the host side


@dataclass
class StackWeights:
    """A RevGRU stack's weights laid out for the sweep kernels, once per sweep (from each layer's
    :class:`~.cells.SweepWeights`, so the same values as the per-step path multiplies by)."""

    w_in0: torch.Tensor  # [6·half, input]: layer 0's input columns of every Linear, in linears() order
    w_in: torch.Tensor  # [layers − 1, 6·half, hidden] (one unread row for a single layer)
    bias: torch.Tensor  # [layers, 6·half]
    w_rec: torch.Tensor  # [layers, 2, 3·half, half]: each half's recurrent [z | r | g] rows

    @classmethod
    def of(cls, layers: list) -> StackWeights:
        """From the layers' SweepWeights (RevGRU: recurrent weights zr_0, g_0, zr_1, g_1)."""
        first = layers[0]
        upper = [w.weight for w in layers[1:]] or [first.weight.new_zeros(1, 1)]
        w_rec = torch.stack([torch.stack([torch.cat(w.recurrent[2 * i: 2 * i + 2]) for i in (0, 1)])
                             for w in layers])
        return cls(first.weight.contiguous(), torch.stack(upper).contiguous(),
                   torch.stack([w.bias for w in layers]).contiguous(), w_rec.contiguous())

    @property
    def half(self) -> int:
        return self.w_rec.shape[-1]

    @property
    def layers(self) -> int:
        return self.w_rec.shape[0]


def program_rows(tile_rows: int) -> int:
    """Rows per program: 16 (tl.dot's least), or a buffer tile of 32; always whole buffer tiles. As few rows as
    tl.dot takes, so that every batch spreads over as many programs as it can: 4 at B = 64, 512 at B = 8,192, each
    streaming the weights from L2 (at larger tiles each would stream them for more rows). Not 64, the design
    study's prototype's tile: this kernel holds more (the stack's projections and the reverse's input gradient), and
    at 64 rows its 8 warps spill in the reverse (255 registers, 180 to 270 bytes; 16 warps get 128 registers and
    spill more). See :func:`_options` for the figures at 16 and 32. (The batch's size does not choose: a sentence's
    bits then do not depend on it.)"""
    if tile_rows & (tile_rows - 1) or tile_rows > 32:
        raise ValueError(f"the persistent sweeps need buffer tiles of a power of two up to 32 rows, got {tile_rows}")
    return max(16, tile_rows)


def _options(tile_rows: int, lanes: int) -> dict:
    """Constexprs and launch options of both sweeps' kernels, the same for both (the blocks set the products' bits).

    8 warps, the K loops not software-pipelined (``num_stages=1``) and ptxas allowed every register a thread can
    have (``maxnreg=255``): with Triton's three stages the operand prefetches pushed the reverse at 32 rows to 255
    registers and a spill on sm_80, and without the explicit limit ptxas capped some variants at 128 registers and
    spilled. So set, the forward takes 164 to 206 registers and the reverse 196 to 244, none spilled, on sm_80 and
    sm_90 (tests/revnmt/rnn/test_triton_sweeps.py prints them). One program of 8 warps then fills an SM's registers:
    the other programs' latency is not there to hide a load's, which is the price of no spills."""
    if lanes > MAX_LANES:
        raise ValueError(f"the persistent sweeps take at most {MAX_LANES} buffer lanes, got {lanes}")
    return dict(TILE_ROWS=tile_rows, TB=program_rows(tile_rows), LANES_P2=MAX_LANES, num_warps=8, num_stages=1,
                maxnreg=255, **_BLOCKS, **COMPILE_OPTIONS)


def _stored(layer: int, layers: int, i: int, half: int, slice_dim: int) -> int:
    """As the kernels' _stored_count: the top layer's slice columns in half i."""
    return min(max(slice_dim - i * half, 0), half) if layer == layers - 1 else 0


def _updates(steps: int, layers: int, half: int, slice_dim: int) -> list[tuple[int, int]]:
    """The sweep's buffered updates in push order: (width, stored) per step, layer and half."""
    return [(half, _stored(layer, layers, i, half, slice_dim))
            for _ in range(steps) for layer in range(layers) for i in (0, 1)]


def gru_forward_sweep(weights: StackWeights, x: torch.Tensor, mask: torch.Tensor, state: torch.Tensor,
                      drop: torch.Tensor, buffer: InformationBuffer, limit: ForgetLimit,
                      slice_dim: int) -> torch.Tensor:
    """Run a RevGRU stack's forward sweep in one launch: ``state`` [layers, batch, hidden] int32 (contiguous) is
    updated in place from the inputs ``x`` [steps, batch, input] under ``mask`` [steps, batch], pushing onto
    ``buffer``; ``drop`` [layers, batch, hidden] holds the dropout masks of the layers' inputs (ones where none).
    Returns the top layer's first ``slice_dim`` columns after each step, [steps, batch, slice_dim] int32. Nothing
    is read on the host; errors wait in the buffer's status, a full room in its heights."""
    steps, batch = mask.shape
    half, layers = weights.half, weights.layers
    words = buffer.words
    plan = buffer.plan_push(*_updates(steps, layers, half, slice_dim), limit=limit)
    options = _options(words.tile_rows, words.lanes)
    grid = (triton.cdiv(batch, options["TB"]),)
    slices = torch.empty(steps, batch, slice_dim, dtype=torch.int32, device=state.device)
    work = torch.empty(batch, 3 * half, device=state.device)
    layer_in = torch.empty(batch, 2 * half, device=state.device)
    lost = torch.empty(grid[0], dtype=torch.float64, device=state.device)
    _gru_forward_kernel[grid](
        x.contiguous(), x.shape[-1], weights.w_in0, weights.w_in, weights.bias, weights.w_rec, drop, mask.contiguous(),
        state, slices, work, layer_in, words.curr, words.stack, words.top, words.flags, words.status, lost,
        lost_table(state.device), batch, steps, layers, half, words.lanes, slice_dim, words.capacity,
        plan.flags[0] if plan.flags else 0, limit.min_numerator, limit.slope, **options)
    plan.done(lost.sum(), *[0.0] * (len(plan.widths) - 1))  # the bits destroyed, for the books: one total
    return slices


@dataclass
class ReverseSlots:
    """What a reverse launch leaves for the weights' gradients, ``chunk`` steps of every layer (see
    :func:`_gru_reverse_kernel`): reduced by :meth:`accumulate`, one product per weight and chunk."""

    grad_pre: torch.Tensor  # [layers, chunk, batch, 6·half]
    rec_in: torch.Tensor  # [layers, 4, chunk, batch, half]
    layer_in: torch.Tensor  # [layers, chunk, batch, hidden]

    @classmethod
    def empty(cls, layers: int, chunk: int, batch: int, half: int, device: torch.device) -> ReverseSlots:
        return cls(torch.empty(layers, chunk, batch, 6 * half, device=device),
                   torch.empty(layers, 4, chunk, batch, half, device=device),
                   torch.empty(layers, chunk, batch, 2 * half, device=device))

    @property
    def chunk(self) -> int:
        return self.grad_pre.shape[1]

    @torch.no_grad()
    def accumulate(self, sweep_weights: list, steps: int, x: torch.Tensor) -> torch.Tensor:
        """Add the first ``steps`` slots' weight gradients: the recurrent ones into the Linears' ``.grad``, the
        input columns' and biases' into each layer's SweepWeights (``grads=True``; flushed by the caller). ``x``:
        layer 0's inputs at those steps. Returns d loss / d ``x``."""
        grad_x = None
        for layer, weights in enumerate(sweep_weights):
            cell = weights.cell
            grad_pre = self.grad_pre[layer, :steps].reshape(-1, self.grad_pre.shape[-1])
            start = 0
            for q, lin in enumerate(cell.linears()):
                stop = start + lin.out_features
                inputs = self.rec_in[layer, q, :steps].reshape(-1, cell.half)
                if lin.weight.grad is None:
                    lin.weight.grad = torch.zeros_like(lin.weight)
                products.accumulate(lin.weight.grad[:, cell.input_size:], grad_pre[:, start:stop].t(), inputs.t())
                start = stop
            if layer == 0:
                grad_x = weights.backward(x, self.grad_pre[0, :steps])
            else:
                inputs = self.layer_in[layer, :steps].reshape(-1, self.layer_in.shape[-1])
                products.accumulate(weights.grad_weight, grad_pre.t(), inputs.t())
                weights.grad_bias.add_(grad_pre.sum(0))
        return grad_x


def gru_reverse_sweep(weights: StackWeights, x: torch.Tensor, mask: torch.Tensor, state: torch.Tensor,
                      grads: torch.Tensor, drop: torch.Tensor, buffer: InformationBuffer, limit: ForgetLimit,
                      slices: torch.Tensor, initial_top: torch.Tensor, slice_grad: torch.Tensor | None, start: int,
                      stop: int, slots: ReverseSlots, out_grad: torch.Tensor | None = None) -> None:
    """Undo and backpropagate steps ``start`` … ``stop`` − 1 of :func:`gru_forward_sweep` in one launch: ``state``
    and ``grads`` ([layers, batch, hidden], d loss / d state) in place, the weights' gradient terms into ``slots``
    (reduced by :meth:`ReverseSlots.accumulate`). ``x``: layer 0's inputs at those steps; ``slices``: what the
    forward returned; ``initial_top``: the top layer's initial state (its stored columns before step 0);
    ``slice_grad`` [steps, batch, slice_dim]: d loss / d the slices, or None; ``out_grad`` [stop − start, batch,
    hidden]: d loss / d the top layer's outputs at those steps, or None."""
    steps, batch = mask.shape
    half, layers = weights.half, weights.layers
    slice_dim = slices.shape[-1]
    words = buffer.words
    plan = buffer.plan_pop(*_updates(stop - start, layers, half, slice_dim), limit=limit)
    last_flag = words.pushes - 1  # the pops mirror the last pushes, the last of them first
    options = _options(words.tile_rows, words.lanes)
    grid = (triton.cdiv(batch, options["TB"]),)
    work = torch.empty(batch, 3 * half, device=state.device)
    _gru_reverse_kernel[grid](
        x.contiguous(), x.shape[-1], weights.w_in0, weights.w_in, weights.bias, weights.w_rec, drop, mask.contiguous(),
        state, grads, slices, initial_top, initial_top.stride(0), work if slice_grad is None else slice_grad,
        work if out_grad is None else out_grad.contiguous(), work, slots.grad_pre, slots.rec_in, slots.layer_in,
        words.curr, words.stack, words.top, words.flags, words.status, batch, start, stop, slots.chunk, layers, half,
        words.lanes, slice_dim, last_flag, limit.min_numerator, limit.slope, SLICE_GRAD=slice_grad is not None,
        OUT_GRAD=out_grad is not None, **options)
    plan.done()


def _dropout_masks(dropout: list[torch.Tensor | None], batch: int, hidden: int, device: torch.device) -> torch.Tensor:
    """The layers' dropout masks as the kernels read them, [layers, batch, hidden]: ones where a layer has none
    (x · 1 is x, bit for bit)."""
    drop = torch.ones(len(dropout), batch, hidden, device=device)
    for layer, mask in enumerate(dropout):
        if layer and mask is not None:
            drop[layer] = mask
    return drop


class TritonSweeps:
    """A reversible stack's sweeps by the persistent kernels: what :class:`~revnmt.rnn.backends.Backend` offers a
    :class:`~revnmt.rnn.ReversibleRNN` whose sweeps they can run (:meth:`supports`), in place of a launch per layer,
    half and step. The stack's forward then keeps what its backward needs on the tape as the per-step path does
    (final states, buffer, slices), and its backward sweep must be :meth:`backward`: the states' low bits are this
    module's products' (see the module docstring)."""

    def supports(self, rnn, buffer: InformationBuffer | None) -> bool:
        """Whether these kernels run ``rnn``'s sweeps over ``buffer``: a RevGRU stack, trained (a buffer), whose
        buffer tiles and lanes the kernels take."""
        from ..cells import RevGRUCell  # the cells import the kernels' package: imported here, when first asked

        words = None if buffer is None else buffer.words
        return (words is not None and isinstance(rnn.cells[0], RevGRUCell) and words.lanes <= MAX_LANES
                and not words.tile_rows & (words.tile_rows - 1) and words.tile_rows <= 32)

    @torch.no_grad()
    def forward(self, rnn, x: torch.Tensor, mask: torch.Tensor, initial: list[torch.Tensor],
                dropout: list[torch.Tensor | None], buffer: InformationBuffer
                ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """The forward sweep of ``rnn`` from the ``initial`` states (left as they are) over the inputs ``x`` [steps,
        batch, input]: (each layer's final state, the slices or None)."""
        from ..cells import SweepWeights

        batch = mask.shape[1]
        weights = StackWeights.of([SweepWeights(cell) for cell in rnn.cells])
        state = torch.stack(initial)
        drop = _dropout_masks(dropout, batch, rnn.hidden_size, mask.device)
        slices = gru_forward_sweep(weights, x, mask, state, drop, buffer, rnn.limit, rnn.slice_dim)
        return list(state.unbind(0)), slices if rnn.slice_dim else None

    @torch.no_grad()
    def backward(self, rnn, tape, inputs, grad_final: list[torch.Tensor | None] | None, output_grads,
                 slice_grad: torch.Tensor | None, chunk: int) -> list[torch.Tensor]:
        """The backward sweep of a tape :meth:`forward` recorded (the arguments of
        :meth:`~revnmt.rnn.ReversibleRNN.backward_sweep`): ``tape.states`` back to the initial states, parameter
        gradients into ``.grad``; returns d loss / d each layer's initial state. ``chunk`` steps per launch, but one
        where ``output_grads`` asks for the outputs' gradients: the top layer's state after step t is known only once
        the steps after it are undone."""
        from ..cells import SweepWeights

        steps, batch = tape.mask.shape
        device = tape.mask.device
        sweep = [SweepWeights(cell, grads=True) for cell in rnn.cells]
        weights = StackWeights.of(sweep)
        state = torch.stack(tape.states)
        grads = torch.stack([torch.zeros(batch, rnn.hidden_size, device=device) if g is None else g
                             for g in (grad_final or [None] * rnn.num_layers)])
        drop = _dropout_masks(tape.dropout, batch, rnn.hidden_size, device)
        chunk = 1 if output_grads is not None else min(chunk, steps)
        slots = ReverseSlots.empty(rnn.num_layers, chunk, batch, weights.half, device)
        slices = tape.slices if tape.slices is not None else torch.empty(steps, batch, 0, dtype=torch.int32,
                                                                          device=device)
        for start in reversed(range(0, steps, chunk)):
            stop = min(start + chunk, steps)
            out_grad = None
            if output_grads is not None:
                out_grad = output_grads(slice(start, stop), rnn.cells[-1].output(state[-1])[None])
            x = inputs.steps(start, stop)
            gru_reverse_sweep(weights, x, tape.mask, state, grads, drop, tape.buffer, rnn.limit, slices,
                              tape.initial[-1], slice_grad, start, stop, slots, out_grad)
            inputs.backward(start, slots.accumulate(sweep, stop - start, x))
        for collected in sweep:
            collected.flush()
        tape.states = list(state.unbind(0))
        return list(grads.unbind(0))


TRITON_SWEEPS = TritonSweeps()

__all__ = ["TRITON_SWEEPS", "ReverseSlots", "StackWeights", "TritonSweeps", "gru_forward_sweep", "gru_reverse_sweep",
           "program_rows"]
