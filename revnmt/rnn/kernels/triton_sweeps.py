"""RevGRU and RevLSTM sweeps as persistent Triton kernels: one launch for a stack's whole forward sweep, one per
chunk of steps for its reverse (issue #44, docs: gpu-design-study §3). A stack runs them when it asks
(``--sweep-kernels persistent``): exact, but slower on an H200 than the per-step kernels
(docs/gpu.md#persistent-sweeps-measured has the figures and what would change them).

Why. The per-step kernels (:mod:`.triton_steps`) launch a few kernels per layer, half and step, so a small batch's
step is bound by the host's launches, not by the GPU. Here a program owns ``TB`` sentences (:func:`program_rows`)
for the whole sweep and runs, step after step, what those launches ran: every product of its rows (``tl.dot`` from
the weights in global memory, which stay in L2), the gates and the buffer's walk. Nothing couples the programs: a
buffer tile's overflow decision is a reduction over that tile's lanes only (:mod:`buffers.words`), and a program's
rows are whole buffer tiles (``TB`` is a multiple of ``tile_rows``; ``tl.dot`` needs at least 16 rows, and tiles
default to 8), so no program waits for another and there is no grid-wide barrier. A program's live words stay in
registers for the whole launch: every push of a step (every layer, half, update and chunk) lands on the same lanes
of its rows.

One kernel a sweep for both cells. The two cells differ only in a half's updates; the walk around them is one: the
program's books (:func:`_open_program`, :func:`_close_program`), the layers' inputs and weights
(:func:`_layer_source`, :func:`_half_source`), the products (:func:`_gate`), and a buffered update's pushes
(:func:`_push_update`) and pops (:func:`_pop_update`). An update is a pair of ``triton.jit`` functions passed to the
walk, its terms (z, u, and what its derivative needs, computed by :mod:`.triton_steps`' own gate functions from
products computed here) and its derivative; ``LSTM`` (a constexpr) picks the cell's pairs, so each cell compiles
only its own code. RevGRU's half is one update (h), after a gates phase; RevLSTM's is two (c, then h, which reads
the new c).

Push order. Inside a program the sweep runs in the buffer's order, time-major: step t, then layer, then half, then
update, then chunk, the order in which :meth:`revnmt.rnn.ReversibleRNN.forward_sweep` pushes with per-step
kernels (a RevLSTM half pushes all of c's chunks, then all of h's, as ``_lstm_push_kernel`` does). That is why a
whole stack is one launch: layer 1's step t needs layer 0's step t, and the live words carry from one push to the
next whatever layer made it, so a launch per layer would push in another order and make other words. The pushes'
flags and heights are those of the per-step walk; the reverse pops them in the mirror order (t down, top layer first,
half 1 first, RevLSTM's h before its c, last chunk first).

What runs in the kernel, per layer and half, for the program's rows:

1. RevGRU's gates phase (:func:`_gates_phase`): σ of z and r, from the layer input's projection and h_j's recurrent
   product, and r·h_j, into a program-private work area (``work``, [batch, 3·half]: g's product reads r·h_j of every
   unit of a row, which other threads computed: a barrier follows). RevLSTM has none: each of its gates is a
   product of h_j and the layer input, which no update of the half changes.
2. each update, a block of columns at a time: the stored columns (the top layer's attention slice skips the
   buffer; RevLSTM's c stores none), then the buffered chunks, each a [TB, lanes] block of its gates' products
   pushed through the tiles' walk (:func:`~buffers.backends.triton_kernels.push_chunk`), the state updated in
   place. RevLSTM computes f, g and i for c's blocks and o and p for h's: the five [TB, 16] gate tiles a half that
   the design study counts against the registers, split between the two updates, so a block holds three at most
   (the register figures: :func:`_options`).

Layer l's input projection is computed in the kernel too, from the layer below's new state (layer 0's from the
sweep's inputs): it is a product like the others, and it cannot be computed before the launch for l > 0.

The reverse (one launch per chunk of steps, :func:`reverse_sweep`) computes every gate with the same functions on
the same rows and blocks, so each is the forward's bit for bit, pops each chunk
(:func:`~buffers.backends.triton_kernels.pop_chunk`, the push's flag read back instead of a reduction redone), and
backpropagates each update elementwise (:func:`~.triton_steps.gru_backward`, or RevLSTM's
:func:`~.triton_steps.lstm_hidden_backward`, which adds d loss / d the new c through tanh(c) to c's gradient, then
:func:`~.triton_steps.lstm_cell_backward`) and the half through its recurrent and input products (``tl.dot``
again). What is a reduction over the batch, the weights' gradients, is not summed in the kernel (atomics would make
it nondeterministic): the kernel writes each step's pre-activation gradients and products' inputs into slots, and the
host reduces a chunk of steps per weight with one product each, as :class:`~.cells.RecurrentGrads` does for the
per-step kernels.

Exactness. The products are ``tl.dot`` in IEEE float32 (no TF32) summed ``BLOCK_K`` at a time in the tile's own
order (:func:`~.triton_steps._linear_tile`), with one set of blocks (``_BLOCKS``) in both sweeps; no FMA contraction
(``COMPILE_OPTIONS``); the gates are :mod:`.triton_steps`' own functions. The projections are the kernel's, not
cuBLAS's or oneDNN's, so a persistent sweep's states are its own, as a fused run's are (the per-step path's
products and projections are torch products): the same buffer layout and push order, other low bits. Its reverse is
exact all the same, since both sweeps compute every gate with the same code. The tests (tests/revnmt/rnn/
test_triton_sweeps.py) check the walk against the per-step kernels fed the products this module computes.

Capacity. The stack's room is fixed before the launch (``words.capacity`` levels, :mod:`buffers.words`). A push
that would stack a word at a level at or above it stores nothing and still counts the tile's height: the sweep's
end reads the heights (:meth:`~buffers.InformationBuffer.settle`) and runs the sweep again with more room (the
forward is deterministic).

Scope: RevGRU and RevLSTM stacks whose buffer tiles are a power of two of at most 32 rows, on at most 16 lanes
(:meth:`TritonSweeps.supports`; the triton backend asks it, :meth:`revnmt.rnn.backends.Backend.persistent`). Layer
0's inputs are taken for every step at once ([T, batch, input]). A stack whose outputs get gradients from outside
(the decoder's attention and loss) is reversed two launches a chunk of its ``chunk_steps`` steps: the gradient of
step t's output needs the state after step t, which exists only once the later steps are undone, so a first launch
undoes the chunk's steps on a copy of the state to read their outputs and leaves the buffer as it was (a *peek*:
pops read the stack and never write it), the chunk's attention and loss run as batched products, and a second
launch undoes and backpropagates the chunk.
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
from .triton_steps import (
    _linear_tile,
    gru_backward,
    gru_terms,
    lstm_cell_backward,
    lstm_cell_terms,
    lstm_hidden_backward,
    lstm_hidden_terms,
    sigmoid,
)

#: Columns a gate-product block takes: a chunk's lanes, padded to a power of two (at most 16 lanes: revnmt's default).
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
def _open_program(curr_ptr, top_ptr, batch, lanes, TB: tl.constexpr, TILE_ROWS: tl.constexpr,
                  LANES_P2: tl.constexpr):
    """A program's start: ``geo``, its rows and their buffer tiles' layout ((rows, row_ok, tile, tiles, head, k,
    lane_ok, words, level): ``head`` marks a tile's first row, which writes the tile's flags and height; ``words``
    the rows' lanes in ``curr`` and in every stack level, ``level`` apart), then the tiles' live words, held in
    registers for the whole launch, and each row's tile's height."""
    rows = tl.program_id(0) * TB + tl.arange(0, TB)
    row_ok = rows < batch
    tile = rows // TILE_ROWS
    k = tl.arange(0, LANES_P2)
    lane_ok = row_ok[:, None] & (k < lanes)[None, :]
    words = rows[:, None] * lanes + k[None, :]
    geo = (rows, row_ok, tile, tl.cdiv(batch, TILE_ROWS), row_ok & (rows % TILE_ROWS == 0), k, lane_ok, words,
           batch * lanes)
    return geo, tl.load(curr_ptr + words, mask=lane_ok, other=0), tl.load(top_ptr + tile, mask=row_ok, other=0)


@triton.jit
def _close_program(curr_ptr, top_ptr, status_ptr, geo, cur, top, status):
    """A program's end: its tiles' live words and heights back to the buffer, its error code into the status."""
    rows, row_ok, tile, tiles, head, k, lane_ok, words, level = geo
    tl.store(curr_ptr + words, cur, mask=lane_ok)
    tl.store(top_ptr + tile, top, mask=head)
    tl.atomic_max(status_ptr, status)


@triton.jit
def _projection(x_ptr, x_rs, n_in, w_ptr, b_ptr, rows, outs, batch, n_out, zeros, BLOCK_K: tl.constexpr):
    """Columns ``outs`` of x · wᵀ + b for the rows ``rows`` (w [n_out, n_in] contiguous, from its first row): a
    layer input's share of a gate's pre-activation."""
    acc = _linear_tile(zeros, x_ptr, x_rs, w_ptr, n_in, 1, rows, outs, batch, n_out, n_in, BLOCK_K)
    return acc + tl.load(b_ptr + outs, mask=outs < n_out, other=0.0)[None, :]


@triton.jit
def _layer_input(below_ptr, below_rs, drop_ptr, out_ptr, rows, batch, hidden, BLOCK_J: tl.constexpr):
    """Layer l > 0's input, the layer below's output (its state's first ``hidden`` columns, row stride
    ``below_rs``) times its dropout mask (``ReversibleRNN._layer_input``), into ``out`` ([batch, hidden]) for the
    projection's products to read (other threads' rows: a barrier follows)."""
    for j0 in range(0, hidden, BLOCK_J):
        cols = j0 + tl.arange(0, BLOCK_J)
        ok = (rows[:, None] < batch) & (cols[None, :] < hidden)
        at = rows[:, None] * hidden + cols[None, :]
        x = (to_float(tl.load(below_ptr + rows[:, None] * below_rs + cols[None, :], mask=ok, other=0))
             * tl.load(drop_ptr + at, mask=ok, other=0.0))
        tl.store(out_ptr + at, x, mask=ok)
    tl.debug_barrier()


@triton.jit
def _layer_source(layer, x_ptr, n_in0, w_in0_ptr, w_in_ptr, state_ptr, width, drop_ptr, out_ptr, rows, batch,
                  hidden, gates, BLOCK_J: tl.constexpr):
    """What a layer's projections read: (its input, row stride, columns, its input weight). Layer 0's input is
    ``x`` (the step's); layer l's is made into ``out`` from the layer below's state (:func:`_layer_input`)."""
    if layer == 0:
        x, x_rs, n_in, w_in = x_ptr, n_in0, n_in0, w_in0_ptr
    else:
        _layer_input(state_ptr - batch * width, width, drop_ptr + layer * batch * hidden, out_ptr, rows, batch,
                     hidden, BLOCK_J)
        x, x_rs, n_in, w_in = out_ptr, hidden, hidden, w_in_ptr + (layer - 1) * gates * hidden * hidden
    return x, x_rs, n_in, w_in


@triton.jit
def _half_source(x, x_rs, n_in, w_in, b_ptr, w_rec_ptr, state_ptr, width, layer, i, batch, half, gates):
    """``src``, what half i's products read (see :func:`_gate`): the layer's input, the half's rows of the input
    weight, bias and recurrent weight (its ``gates`` gates, SweepWeights' order), and h_j, the other half of the
    layer's state (int32)."""
    return (x, x_rs, n_in, w_in + i * gates * half * n_in, b_ptr + (2 * layer + i) * gates * half,
            state_ptr + (1 - i) * half, width, w_rec_ptr + (layer * 2 + i) * gates * half * half, batch, half)


@triton.jit
def _gate(src, q, rows, cols, zeros, BLOCK_K: tl.constexpr):
    """Gate q's recurrent product and input projection at columns ``cols`` of a half, for the program's ``rows``.
    ``src`` = (x, x_rs, n_in, w_in, b, read, read_rs, w_rec, batch, half): the layer input (row stride ``x_rs``,
    ``n_in`` columns), the half's input weight rows and biases from its first gate's, the recurrent input (h_j, or
    RevGRU's r·h_j; row stride ``read_rs``) and the half's recurrent weight rows [gates·half, half]. The two come
    back apart, as the per-step kernels get them (a product, the projection's columns), and the gates functions add
    them, so the sum is theirs."""
    x, x_rs, n_in, w_in, b, read, read_rs, w_rec, batch, half = src
    rec = _linear_tile(zeros, read, read_rs, w_rec + q * half * half, half, 1, rows, cols, batch, half, half, BLOCK_K)
    return rec, _projection(x, x_rs, n_in, w_in + q * half * n_in, b + q * half, rows, cols, batch, half, zeros,
                            BLOCK_K)


@triton.jit
def _add_rows(dst_ptr, dst_rs, src_ptr, rows, batch, width, BLOCK_J: tl.constexpr):
    """dst[rows, :width] += src[rows] ([batch, width], contiguous): a gradient from outside the stack."""
    for j0 in range(0, width, BLOCK_J):
        cols = j0 + tl.arange(0, BLOCK_J)
        ok = (rows[:, None] < batch) & (cols < width)[None, :]
        at = dst_ptr + rows[:, None] * dst_rs + cols[None, :]
        tl.store(at, tl.load(at, mask=ok) + tl.load(src_ptr + rows[:, None] * width + cols[None, :], mask=ok), mask=ok)


@triton.jit
def _copy_leading(state_ptr, width, out_ptr, rows, batch, n, BLOCK_J: tl.constexpr):
    """The rows' first ``n`` columns of a layer's state (row stride ``width``) into ``out`` ([batch, n]): the
    forward's slices, a peek's outputs."""
    for j0 in range(0, n, BLOCK_J):
        cols = j0 + tl.arange(0, BLOCK_J)
        ok = (rows[:, None] < batch) & (cols < n)[None, :]
        value = tl.load(state_ptr + rows[:, None] * width + cols[None, :], mask=ok)
        tl.store(out_ptr + rows[:, None] * n + cols[None, :], value, mask=ok)


@triton.jit
def _stored_count(layer, layers, i, half, slice_dim):
    """Leading columns of half i of ``layer`` that skip the buffer: the top layer's attention slice."""
    return tl.where(layer == layers - 1, tl.minimum(tl.maximum(slice_dim - i * half, 0), half), 0)


# ---------------------------------------------------------------------------- the cells' updates
#
# A buffered update is a pair of functions, which :func:`_push_update` and :func:`_pop_update` run over a half's
# columns: ``terms(args, rows, cols, valid, zeros, BLOCK_K)``, its (z, u, acts) at a block of columns, computed by
# the per-step kernels' own functions from products computed here; and ``diff(args, acts, grad, grad_at, pre_at, zq,
# live, prev, valid)``, its derivative from ``acts``: d loss / d the previous value, the gates' pre-activation
# gradients stored at ``pre_at`` (the half's first gate's columns). RevGRU's half is one update, RevLSTM's two
# (c's, then h's, which reads the new c).


@triton.jit
def _gates_phase(src, work_ptr, rows, TB: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
    """RevGRU: σ(z), σ(r) and r·h_j of a half for the program's rows into ``work`` ([batch, 3·half]), as
    :func:`~.triton_steps._gru_gates_kernel` computes them: g's product reads r·h_j of every unit of a row, which
    other threads computed (a barrier follows)."""
    x, x_rs, n_in, w_in, b, read_ptr, read_rs, w_rec, batch, half = src
    zeros = tl.zeros((TB, BLOCK_J), dtype=tl.float32)
    for j0 in range(0, half, BLOCK_J):
        units = j0 + tl.arange(0, BLOCK_J)
        ok = (rows[:, None] < batch) & (units[None, :] < half)
        rec_z, p_z = _gate(src, 0, rows, units, zeros, BLOCK_K)
        sz = sigmoid(rec_z + p_z)
        rec_r, p_r = _gate(src, 1, rows, units, zeros, BLOCK_K)
        sr = sigmoid(rec_r + p_r)
        read = to_float(tl.load(read_ptr + rows[:, None] * read_rs + units[None, :], mask=ok, other=0))
        at = work_ptr + rows[:, None] * 3 * half + units[None, :]
        tl.store(at, sz, mask=ok)
        tl.store(at + half, sr, mask=ok)
        tl.store(at + 2 * half, sr * read, mask=ok)
    tl.debug_barrier()  # g's products read r·h_j of units other threads computed


@triton.jit
def _g_source(src, work_ptr):
    """RevGRU: ``src`` with g's recurrent input, r·h_j in the gates phase's work area, in place of h_j."""
    x, x_rs, n_in, w_in, b, read, read_rs, w_rec, batch, half = src
    return x, x_rs, n_in, w_in, b, work_ptr + 2 * half, 3 * half, w_rec, batch, half


@triton.jit
def _gru_terms(args, rows, cols, valid, zeros, BLOCK_K: tl.constexpr):
    """RevGRU's h-update: g's products (``args`` = (:func:`_g_source`'s src, work, slope)) and σ(z) from the gates
    phase's work area, then :func:`~.triton_steps.gru_terms`; acts (z, g, σ(z))."""
    src, work_ptr, slope = args
    pre_g, p_g = _gate(src, 2, rows, cols, zeros, BLOCK_K)
    sz = tl.load(work_ptr + rows[:, None] * 3 * src[9] + cols[None, :], mask=valid, other=0.0)
    z, u, g = gru_terms(pre_g, p_g, sz, slope)
    return z, u, (z, g, sz)


@triton.jit
def _gru_diff(args, acts, grad, grad_at, pre_at, zq, live, prev, valid):
    """RevGRU's h-update backpropagated (:func:`~.triton_steps.gru_backward`): z's and g's pre-activation
    gradients stored (r's needs a product: :func:`_gru_rh_grad`)."""
    src, work_ptr, slope = args
    z, g, sz = acts
    grad, grad_z, grad_g = gru_backward(grad, zq, live, z, g, sz, prev, slope)
    tl.store(pre_at, grad_z, mask=valid)
    tl.store(pre_at + 2 * src[9], grad_g, mask=valid)
    return grad


@triton.jit
def _lstm_cell_terms(args, rows, cols, valid, zeros, BLOCK_K: tl.constexpr):
    """RevLSTM's c-update: f's, g's and i's products (``args`` = (src, slope, c_rows), the args of both RevLSTM
    updates: ``c_rows`` points at the rows' c_i, which h's terms read), then :func:`~.triton_steps.lstm_cell_terms`;
    acts (σ(f), tanh(g), σ(i))."""
    src, slope, c_rows = args
    pre_f, p_f = _gate(src, 0, rows, cols, zeros, BLOCK_K)
    pre_g, p_g = _gate(src, 1, rows, cols, zeros, BLOCK_K)
    pre_i, p_i = _gate(src, 2, rows, cols, zeros, BLOCK_K)
    z, u, sf, g, ig = lstm_cell_terms(pre_f + p_f, pre_g + p_g, pre_i + p_i, slope)
    return z, u, (sf, g, ig)


@triton.jit
def _lstm_cell_diff(args, acts, grad, grad_at, pre_at, zq, live, prev, valid):
    """RevLSTM's c-update backpropagated (:func:`~.triton_steps.lstm_cell_backward`) from d loss / d the new c,
    h's share included: f's, g's and i's pre-activation gradients stored."""
    src, slope, c_rows = args
    sf, g, ig = acts
    grad, grad_f, grad_g, grad_i = lstm_cell_backward(grad, zq, live, prev, sf, g, ig, slope)
    tl.store(pre_at, grad_f, mask=valid)
    tl.store(pre_at + src[9], grad_g, mask=valid)
    tl.store(pre_at + 2 * src[9], grad_i, mask=valid)
    return grad


@triton.jit
def _lstm_hidden_terms(args, rows, cols, valid, zeros, BLOCK_K: tl.constexpr):
    """RevLSTM's h-update: o's and p's products and the new c (``c_rows``: the rows' c_i), then
    :func:`~.triton_steps.lstm_hidden_terms`; acts (σ(o), σ(p), tanh(c))."""
    src, slope, c_rows = args
    pre_o, p_o = _gate(src, 3, rows, cols, zeros, BLOCK_K)
    pre_p, p_p = _gate(src, 4, rows, cols, zeros, BLOCK_K)
    z, u, o, sp, tc = lstm_hidden_terms(pre_o + p_o, pre_p + p_p, tl.load(c_rows + cols[None, :], mask=valid, other=0),
                                        slope)
    return z, u, (o, sp, tc)


@triton.jit
def _lstm_hidden_diff(args, acts, grad, grad_at, pre_at, zq, live, prev, valid):
    """RevLSTM's h-update backpropagated (:func:`~.triton_steps.lstm_hidden_backward`): o's and p's pre-activation
    gradients stored, and d loss / d the new c through tanh(c) added to c's gradient (c_i's columns are h_i's plus
    hidden), which the c-update's derivative then reads."""
    src, slope, c_rows = args
    o, sp, tc = acts
    half = src[9]
    grad, grad_o, grad_p, grad_c = lstm_hidden_backward(grad, zq, live, prev, o, sp, tc, slope)
    tl.store(pre_at + 3 * half, grad_o, mask=valid)
    tl.store(pre_at + 4 * half, grad_p, mask=valid)
    cell = grad_at + 2 * half
    tl.store(cell, tl.load(cell, mask=valid, other=0.0) + grad_c, mask=valid)
    return grad


# ---------------------------------------------------------------------------- the forward sweep


@triton.jit
def _stored_block(j0, stored, row_ok, k):
    """The columns of a block of an update's stored ones, from ``j0`` on, and which of them are the rows'."""
    cols = j0 + k
    return cols, row_ok[:, None] & (cols < stored)[None, :]


@triton.jit
def _chunk_block(c, stored, buffered, lanes, row_ok, k):
    """The columns of an update's buffered chunk ``c`` (``lanes`` of them after the ``stored`` ones; a block holds
    LANES_P2), and which of them are the rows' lanes."""
    j = c * lanes + k
    return stored + j, row_ok[:, None] & ((k < lanes) & (j < buffered))[None, :]


@triton.jit
def _block_terms(terms, args, h_rows, rows, cols, valid, live_rows, min_numerator, zeros, BLOCK_K: tl.constexpr):
    """An update at a block of columns: its live lanes, its integer terms (z*, fixed-point u, where u left int32:
    :func:`~buffers.backends.triton_kernels.fixed_terms`), what its derivative needs (``terms``' acts) and the
    state there (int64)."""
    live = valid & live_rows[:, None]
    z, u, acts = terms(args, rows, cols, valid, zeros, BLOCK_K)
    zq, ui, bad_term = fixed_terms(z, u, live, valid, min_numerator)
    return live, zq, ui, bad_term, acts, tl.load(h_rows + cols[None, :], mask=valid, other=0).to(tl.int64)


@triton.jit
def _push_update(terms, args, h_rows, stored, walk, geo, live_rows, books, lost_table_ptr, capacity, zeros,
                 TB: tl.constexpr, TILE_ROWS: tl.constexpr, LANES_P2: tl.constexpr, BLOCK_K: tl.constexpr):
    """One buffered update of a half for the program's rows, as the per-step walk runs it: h ← z·h + u at
    ``h_rows`` (the rows' first column of it), the first ``stored`` columns by the floor product (no buffer), the
    others a chunk of ``lanes`` columns at a time, in order, each pushed through its tiles' walk
    (:func:`~buffers.backends.triton_kernels.push_chunk`), with (z, u) from ``terms``. ``walk`` = (the live words,
    each row's tile's height, the next push's flag, the bits each row destroyed, the error code), returned updated;
    ``books`` = (stack, flags, half, lanes, min_numerator)."""
    cur, top, push, lost, status = walk
    rows, row_ok, tile, tiles, head, k, lane_ok, words, level = geo
    stack_ptr, flags_ptr, half, lanes, min_numerator = books
    for j0 in range(0, stored, LANES_P2):  # the stored columns: the floor product, no buffer
        cols, valid = _stored_block(j0, stored, row_ok, k)
        live, zq, ui, bad_term, _, hv = _block_terms(terms, args, h_rows, rows, cols, valid, live_rows,
                                                     min_numerator, zeros, BLOCK_K)
        value, bad = floor_update(hv, zq, ui, live, valid)
        tl.store(h_rows + cols[None, :], value.to(tl.int32), mask=valid)
        status = _record(_record(status, bad_term, TERM_OVERFLOW), bad, STATE_OVERFLOW)
    buffered = half - stored
    for c in range(0, tl.cdiv(buffered, lanes)):  # the buffered chunks, in the walk's order
        cols, valid = _chunk_block(c, stored, buffered, lanes, row_ok, k)
        live, zq, ui, bad_term, _, hv = _block_terms(terms, args, h_rows, rows, cols, valid, live_rows,
                                                     min_numerator, zeros, BLOCK_K)
        # The tile's decision: a reduction over its own lanes, before any word of the chunk changes.
        overflow = _tile_any(tl.max(lane_full(cur, valid, live).to(tl.int32), axis=1), TB, TILE_ROWS)
        store_flag(flags_ptr + tile, push, tiles, overflow, head)
        room = top < capacity  # a full room stores nothing; the height still counts (buffers.words)
        tl.store(stack_ptr + top[:, None] * level + words, cur, mask=lane_ok & (overflow & room)[:, None])
        value, cur, bad = push_chunk(hv, zq, ui, live, valid, cur, overflow[:, None])
        tl.store(h_rows + cols[None, :], value.to(tl.int32), mask=valid)
        lost += tl.sum(tl.where(live, tl.load(lost_table_ptr + zq, mask=live, other=0.0), 0.0), axis=1)
        status = _record(_record(status, bad_term, TERM_OVERFLOW), bad, STATE_OVERFLOW)
        top += overflow.to(tl.int64)
        push += 1
    return cur, top, push, lost, status


@triton.jit(do_not_specialize=["first_flag"])
def _forward_kernel(x_ptr, n_in0, w_in0_ptr, w_in_ptr, b_ptr, w_rec_ptr, drop_ptr, mask_ptr, state_ptr, slices_ptr,
                    work_ptr, layer_in_ptr, curr_ptr, stack_ptr, top_ptr, flags_ptr, status_ptr, lost_ptr,
                    lost_table_ptr, batch, steps, layers, half, lanes, slice_dim, capacity, first_flag, min_numerator,
                    slope, LSTM: tl.constexpr, TILE_ROWS: tl.constexpr, TB: tl.constexpr, LANES_P2: tl.constexpr,
                    BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
    """A reversible stack's forward sweep for the program's TB rows (RevLSTM's with LSTM, else RevGRU's):
    ``state`` [layers, batch, width] int32 in place (width: hidden, or RevLSTM's 2·hidden, [h1 | h2 | c1 | c2]),
    the top layer's first ``slice_dim`` columns after each step into ``slices`` [steps, batch, slice_dim], pushes
    from flag ``first_flag`` on. ``x`` [steps, batch, n_in0]: layer 0's inputs; ``w_in0`` [2·G·half, n_in0] and
    ``w_in`` [layers − 1, 2·G·half, hidden]: the input weights, ``b`` [layers, 2·G·half] the biases (SweepWeights'
    layout: half 0's G gates' rows, then half 1's; G = 3, [z | r | g], or 5, [f | g | i | o | p]); ``w_rec``
    [layers, 2, G·half, half]: each half's recurrent rows; ``drop`` [layers, batch, hidden]: the dropout masks of
    the layers' inputs (layer 0's unread); ``work``: RevGRU's gates phase's [batch, 3·half]. Each program writes the
    bits its rows destroyed to ``lost`` [programs]."""
    hidden = 2 * half
    gates = 3 + 2 * LSTM
    width = hidden + LSTM * hidden
    geo, cur, top = _open_program(curr_ptr, top_ptr, batch, lanes, TB, TILE_ROWS, LANES_P2)
    rows, row_ok = geo[0], geo[1]
    walk = (cur, top, first_flag, tl.zeros((TB,), dtype=tl.float64), tl.full([], 0, tl.int32))
    books = (stack_ptr, flags_ptr, half, lanes, min_numerator)
    zeros = tl.zeros((TB, LANES_P2), dtype=tl.float32)
    for t in range(0, steps):
        live_rows = tl.load(mask_ptr + t * batch + rows, mask=row_ok, other=0) != 0
        for layer in range(0, layers):
            layer_state = state_ptr + layer * batch * width
            x, x_rs, n_in, w_in = _layer_source(layer, x_ptr + t * batch * n_in0, n_in0, w_in0_ptr, w_in_ptr,
                                                layer_state, width, drop_ptr, layer_in_ptr, rows, batch, hidden,
                                                gates, BLOCK_J)
            for i in range(0, 2):
                src = _half_source(x, x_rs, n_in, w_in, b_ptr, w_rec_ptr, layer_state, width, layer, i, batch, half,
                                   gates)
                h_rows = layer_state + i * half + rows[:, None] * width
                stored = _stored_count(layer, layers, i, half, slice_dim)
                if LSTM:
                    args = (src, slope, h_rows + hidden)
                    walk = _push_update(_lstm_cell_terms, args, h_rows + hidden, 0, walk, geo, live_rows, books,
                                        lost_table_ptr, capacity, zeros, TB, TILE_ROWS, LANES_P2, BLOCK_K)
                    tl.debug_barrier()  # h's terms read the new cell, which other threads wrote
                    walk = _push_update(_lstm_hidden_terms, args, h_rows, stored, walk, geo, live_rows, books,
                                        lost_table_ptr, capacity, zeros, TB, TILE_ROWS, LANES_P2, BLOCK_K)
                else:
                    _gates_phase(src, work_ptr, rows, TB, BLOCK_J, BLOCK_K)
                    walk = _push_update(_gru_terms, (_g_source(src, work_ptr), work_ptr, slope), h_rows, stored, walk,
                                        geo, live_rows, books, lost_table_ptr, capacity, zeros, TB, TILE_ROWS,
                                        LANES_P2, BLOCK_K)
                tl.debug_barrier()  # the next half's products read this half's new state
        _copy_leading(state_ptr + (layers - 1) * batch * width, width, slices_ptr + t * batch * slice_dim, rows, batch,
                      slice_dim, BLOCK_J)
    cur, top, push, lost, status = walk
    tl.store(lost_ptr + tl.program_id(0), tl.sum(lost, axis=0))
    _close_program(curr_ptr, top_ptr, status_ptr, geo, cur, top, status)


# ---------------------------------------------------------------------------- the reverse sweep


@triton.jit
def _pop_update(terms, diff, args, h_rows, grad_rows, pre_rows, stored, restore, walk, geo, live_rows, books, zeros,
                LANES_P2: tl.constexpr, BLOCK_K: tl.constexpr, GRADS: tl.constexpr):
    """Undo and backpropagate :func:`_push_update` for the program's rows: pop the buffered chunks, last first
    (:func:`~buffers.backends.triton_kernels.pop_chunk`, the push's flag read back instead of a reduction redone),
    then restore the stored columns from ``restore`` = (the rows' slice before the step, the rows' initial state,
    whether the step is the first); at each block the update's ``diff`` turns d loss / d the new value at
    ``grad_rows`` into d loss / d the previous one and stores the gates' pre-activation gradients at ``pre_rows``.
    ``walk`` = (the live words, each row's tile's height, the flag of the push to undo, the error code), returned
    updated; ``books`` as :func:`_push_update`'s. Without GRADS it only undoes (a peek, see :func:`_reverse_kernel`)."""
    cur, top, push, status = walk
    rows, row_ok, tile, tiles, head, k, lane_ok, words, level = geo
    stack_ptr, flags_ptr, half, lanes, min_numerator = books
    buffered = half - stored
    chunks = tl.cdiv(buffered, lanes)
    for c_back in range(0, chunks):
        cols, valid = _chunk_block(chunks - 1 - c_back, stored, buffered, lanes, row_ok, k)
        live, zq, ui, bad_term, acts, hv = _block_terms(terms, args, h_rows, rows, cols, valid, live_rows,
                                                        min_numerator, zeros, BLOCK_K)
        overflow = load_flag(flags_ptr + tile, push, tiles, row_ok)  # the push's decision
        value, cur, bad = pop_chunk(hv, zq, ui, live, valid, cur)
        below = tl.load(stack_ptr + (top - 1)[:, None] * level + words, mask=lane_ok & overflow[:, None], other=0)
        cur = tl.where(overflow[:, None], below, cur)
        top -= overflow.to(tl.int64)
        push -= 1
        tl.store(h_rows + cols[None, :], value.to(tl.int32), mask=valid)
        status = _record(_record(status, bad_term, TERM_OVERFLOW), bad, STATE_OVERFLOW)
        status = _record(status, _outside_int32(value, live), OUT_OF_RANGE)
        if GRADS:
            grad_at = grad_rows + cols[None, :]
            grad = diff(args, acts, tl.load(grad_at, mask=valid, other=0.0), grad_at, pre_rows + cols[None, :], zq,
                        live, to_float(value), valid)
            tl.store(grad_at, grad, mask=valid)
    before, initial, first_step = restore
    for j0 in range(0, stored, LANES_P2):  # the stored columns: restored from where they were kept
        cols, valid = _stored_block(j0, stored, row_ok, k)
        live, zq, _, _, acts, _ = _block_terms(terms, args, h_rows, rows, cols, valid, live_rows, min_numerator,
                                               zeros, BLOCK_K)
        first = tl.where(first_step, valid, False)  # before step 0 the initial state's columns
        prev = (tl.load(before + cols[None, :], mask=valid & ~first, other=0)
                + tl.load(initial + cols[None, :], mask=first, other=0))
        tl.store(h_rows + cols[None, :], prev, mask=valid)
        if GRADS:
            grad_at = grad_rows + cols[None, :]
            grad = diff(args, acts, tl.load(grad_at, mask=valid, other=0.0), grad_at, pre_rows + cols[None, :], zq,
                        live, to_float(prev), valid)
            tl.store(grad_at, grad, mask=valid)
    return cur, top, push, status


@triton.jit
def _gru_rh_grad(src, work_ptr, pre_ptr, pre_rs, grad_j, grad_rs, slot_ptr, rows, zeros, BLOCK_J: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """RevGRU, as :func:`~.triton_steps._gru_read_grad_kernel`'s first pass: d loss / d r·h_j through g's product
    (``pre`` [batch, 3·half] from z's column, row stride ``pre_rs``), from it r's pre-activation gradient into
    ``pre`` and r times it added to d loss / d h_j; r·h_j into its weight-gradient slot ``slot`` [batch, half]."""
    x, x_rs, n_in, w_in, b, read_ptr, read_rs, w_rec, batch, half = src
    for j0 in range(0, half, BLOCK_J):
        units = j0 + tl.arange(0, BLOCK_J)
        ok = (rows[:, None] < batch) & (units[None, :] < half)
        grad_rh = _linear_tile(zeros, pre_ptr + 2 * half, pre_rs, w_rec + 2 * half * half, 1, half, rows, units, batch,
                               half, half, BLOCK_K)
        work = work_ptr + rows[:, None] * 3 * half + units[None, :]
        r = tl.load(work + half, mask=ok, other=0.0)
        read = to_float(tl.load(read_ptr + rows[:, None] * read_rs + units[None, :], mask=ok, other=0))
        tl.store(pre_ptr + rows[:, None] * pre_rs + half + units[None, :], grad_rh * read * r * (1.0 - r), mask=ok)
        at = grad_j + rows[:, None] * grad_rs + units[None, :]
        tl.store(at, tl.load(at, mask=ok, other=0.0) + grad_rh * r, mask=ok)
        tl.store(slot_ptr + rows[:, None] * half + units[None, :], tl.load(work + 2 * half, mask=ok), mask=ok)
    tl.debug_barrier()  # the product below reads gradients that other threads wrote


@triton.jit
def _add_read_grad(src, pre_ptr, pre_rs, inner, grad_j, grad_rs, slot_ptr, rows, zeros, BLOCK_J: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """d loss / d h_j += the half's first ``inner`` pre-activation gradient columns (``pre``, row stride
    ``pre_rs``) times the matching rows of its recurrent weight (RevGRU's z and r, RevLSTM's five gates), and h_j
    into its weight-gradient slot ``slot`` [batch, half]: a loop of its own, which the product's registers need
    (copied beside the product, RevGRU's reverse took 10 registers more at 32 rows on sm_80)."""
    x, x_rs, n_in, w_in, b, read_ptr, read_rs, w_rec, batch, half = src
    for j0 in range(0, half, BLOCK_J):
        units = j0 + tl.arange(0, BLOCK_J)
        ok = (rows[:, None] < batch) & (units[None, :] < half)
        at = grad_j + rows[:, None] * grad_rs + units[None, :]
        total = _linear_tile(tl.load(at, mask=ok, other=0.0), pre_ptr, pre_rs, w_rec, 1, half, rows, units, batch,
                             half, inner, BLOCK_K)
        tl.store(at, total, mask=ok)
    for j0 in range(0, half, BLOCK_J):
        units = j0 + tl.arange(0, BLOCK_J)
        ok = (rows[:, None] < batch) & (units[None, :] < half)
        read = to_float(tl.load(read_ptr + rows[:, None] * read_rs + units[None, :], mask=ok, other=0))
        tl.store(slot_ptr + rows[:, None] * half + units[None, :], read, mask=ok)
    tl.debug_barrier()


@triton.jit(do_not_specialize=["last_flag", "start", "stop"])
def _reverse_kernel(x_ptr, n_in0, w_in0_ptr, w_in_ptr, b_ptr, w_rec_ptr, drop_ptr, mask_ptr, state_ptr, grads_ptr,
                    slices_ptr, initial_ptr, initial_rs, slice_grad_ptr, out_grad_ptr, outs_ptr, work_ptr,
                    grad_pre_ptr, rec_in_ptr, layer_in_ptr, curr_ptr, stack_ptr, top_ptr, flags_ptr, status_ptr, batch,
                    start, stop, chunk, layers, half, lanes, slice_dim, last_flag, min_numerator, slope,
                    LSTM: tl.constexpr, SLICE_GRAD: tl.constexpr, OUT_GRAD: tl.constexpr, PEEK: tl.constexpr,
                    TILE_ROWS: tl.constexpr, TB: tl.constexpr, LANES_P2: tl.constexpr, BLOCK_J: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    """Undo and backpropagate steps ``start`` … ``stop`` − 1 of :func:`_forward_kernel`, last first, for the
    program's rows: ``state`` back to the state before ``start`` in place, ``grads`` [layers, batch, width] (d loss
    / d state) likewise; ``last_flag`` is the last push's flag. ``x`` [stop − start, batch, n_in0]: layer 0's inputs
    at those steps. The stored columns' previous values come from ``slices``, at the first step from ``initial``
    (the top layer's initial state, row stride ``initial_rs``); with SLICE_GRAD, ``slice_grad`` [steps, batch,
    slice_dim] is added to the top layer's gradient before each step, and with OUT_GRAD ``out_grad`` [stop − start,
    batch, hidden] (d loss / d its outputs at those steps). Into slots of ``chunk`` steps (s = t − start) the kernel
    writes what the weights' gradients are reduced from: ``grad_pre`` [layers, chunk, batch, 2·G·half] (d loss / d
    each gate's pre-activation, also d loss / d the projection), ``rec_in`` [layers, linears, chunk, batch, half]
    (each Linear's recurrent input: RevGRU's h_j and r·h_j per half, RevLSTM's h_j) and ``layer_in`` [layers,
    chunk, batch, hidden] (the inputs of layers > 0).

    With PEEK the launch only reads what the steps' outputs were, to compute their gradients before the launch that
    backpropagates them: it undoes the steps on ``state`` (a copy), writes the top layer's output (int32) after each
    step t into ``outs`` [stop − start + 1, batch, hidden] at t − start + 1, and after the last undo the one at 0 (so
    a peek at steps a … b is called with start = a + 1: the state after step a is the one it stops at), computes no
    gradient and leaves the buffer as it found it (a pop reads the stack and never writes it, and the live words
    and heights stay in registers)."""
    hidden = 2 * half
    gates = 3 + 2 * LSTM
    width = hidden + LSTM * hidden
    linears = 4 - 2 * LSTM
    geo, cur, top = _open_program(curr_ptr, top_ptr, batch, lanes, TB, TILE_ROWS, LANES_P2)
    rows, row_ok = geo[0], geo[1]
    walk = (cur, top, last_flag, tl.full([], 0, tl.int32))
    books = (stack_ptr, flags_ptr, half, lanes, min_numerator)
    zeros = tl.zeros((TB, LANES_P2), dtype=tl.float32)
    zeros_j = tl.zeros((TB, BLOCK_J), dtype=tl.float32)
    top_state = state_ptr + (layers - 1) * batch * width
    for back in range(0, stop - start):
        t = stop - 1 - back
        s = t - start
        live_rows = tl.load(mask_ptr + t * batch + rows, mask=row_ok, other=0) != 0
        top_grad = grads_ptr + (layers - 1) * batch * width
        if PEEK:
            _copy_leading(top_state, width, outs_ptr + (s + 1) * batch * hidden, rows, batch, hidden, BLOCK_J)
        if OUT_GRAD:
            _add_rows(top_grad, width, out_grad_ptr + s * batch * hidden, rows, batch, hidden, BLOCK_J)
        if SLICE_GRAD:
            _add_rows(top_grad, width, slice_grad_ptr + t * batch * slice_dim, rows, batch, slice_dim, BLOCK_J)
        tl.debug_barrier()  # the reverse reads the gradients by other threads' blocks
        for layer_back in range(0, layers):
            layer = layers - 1 - layer_back
            layer_state = state_ptr + layer * batch * width
            layer_grad = grads_ptr + layer * batch * width
            grad_pre = grad_pre_ptr + (layer * chunk + s) * batch * gates * hidden
            # A layer's input is kept in its slot: W_in's gradient is reduced from it.
            x, x_rs, n_in, w_in = _layer_source(layer, x_ptr + s * batch * n_in0, n_in0, w_in0_ptr, w_in_ptr,
                                                layer_state, width, drop_ptr, layer_in_ptr + (layer * chunk + s)
                                                * batch * hidden, rows, batch, hidden, gates, BLOCK_J)
            for i_back in range(0, 2):
                i = 1 - i_back
                src = _half_source(x, x_rs, n_in, w_in, b_ptr, w_rec_ptr, layer_state, width, layer, i, batch, half,
                                   gates)
                h_rows = layer_state + i * half + rows[:, None] * width
                grad_rows = layer_grad + i * half + rows[:, None] * width
                pre_i = grad_pre + i * gates * half
                pre_rows = pre_i + rows[:, None] * gates * hidden
                stored = _stored_count(layer, layers, i, half, slice_dim)
                restore = (slices_ptr + ((t - 1) * batch + rows[:, None]) * slice_dim + i * half,
                           initial_ptr + rows[:, None] * initial_rs + i * half, t == 0)
                grad_j = layer_grad + (1 - i) * half
                slot = rec_in_ptr + ((layer * linears + i * (linears // 2)) * chunk + s) * batch * half
                if LSTM:  # pop h, then c: the mirror of the pushes
                    args = (src, slope, h_rows + hidden)
                    walk = _pop_update(_lstm_hidden_terms, _lstm_hidden_diff, args, h_rows, grad_rows, pre_rows,
                                       stored, restore, walk, geo, live_rows, books, zeros, LANES_P2, BLOCK_K,
                                       not PEEK)
                    tl.debug_barrier()  # c's pops overwrite the cells h's read and read the gradients h's wrote
                    walk = _pop_update(_lstm_cell_terms, _lstm_cell_diff, args, h_rows + hidden, grad_rows + hidden,
                                       pre_rows, 0, restore, walk, geo, live_rows, books, zeros, LANES_P2, BLOCK_K,
                                       not PEEK)
                    tl.debug_barrier()  # the products below read gradients and states other threads wrote
                    inner = gates * half
                else:
                    _gates_phase(src, work_ptr, rows, TB, BLOCK_J, BLOCK_K)
                    walk = _pop_update(_gru_terms, _gru_diff, (_g_source(src, work_ptr), work_ptr, slope), h_rows,
                                       grad_rows, pre_rows, stored, restore, walk, geo, live_rows, books, zeros,
                                       LANES_P2, BLOCK_K, not PEEK)
                    tl.debug_barrier()  # the products below read gradients and states other threads wrote
                    if not PEEK:
                        _gru_rh_grad(src, work_ptr, pre_i, gates * hidden, grad_j, width, slot + chunk * batch * half,
                                     rows, zeros_j, BLOCK_J, BLOCK_K)
                    inner = 2 * half
                if not PEEK:
                    _add_read_grad(src, pre_i, gates * hidden, inner, grad_j, width, slot, rows, zeros_j, BLOCK_J,
                                   BLOCK_K)
            if layer > 0 and not PEEK:  # d loss / d the layer's input, into the gradient of the layer below's output
                below_grad = layer_grad - batch * width
                drop = drop_ptr + layer * batch * hidden
                for j0 in range(0, hidden, BLOCK_J):
                    units = j0 + tl.arange(0, BLOCK_J)
                    ok = row_ok[:, None] & (units[None, :] < hidden)
                    grad_x = _linear_tile(zeros_j, grad_pre, gates * hidden, w_in, 1, hidden, rows, units, batch,
                                          hidden, gates * hidden, BLOCK_K)
                    at = below_grad + rows[:, None] * width + units[None, :]
                    tl.store(at, tl.load(at, mask=ok, other=0.0)
                             + grad_x * tl.load(drop + rows[:, None] * hidden + units[None, :], mask=ok, other=0.0),
                             mask=ok)
                tl.debug_barrier()
    cur, top, push, status = walk
    if PEEK:  # the buffer stays as it was: only an error is reported
        _copy_leading(top_state, width, outs_ptr, rows, batch, hidden, BLOCK_J)
        tl.atomic_max(status_ptr, status)
    else:
        _close_program(curr_ptr, top_ptr, status_ptr, geo, cur, top, status)


# ---------------------------------------------------------------------------- the host side


@dataclass
class StackWeights:
    """A reversible stack's weights laid out for the sweep kernels, once per sweep (from each layer's
    :class:`~.cells.SweepWeights`, so the same values as the per-step path multiplies by). G gates a half: RevGRU's
    [z | r | g], RevLSTM's [f | g | i | o | p]."""

    w_in0: torch.Tensor  # [2·G·half, input]: layer 0's input columns of every Linear, in linears() order
    w_in: torch.Tensor  # [layers − 1, 2·G·half, hidden] (one unread row for a single layer)
    bias: torch.Tensor  # [layers, 2·G·half]
    w_rec: torch.Tensor  # [layers, 2, G·half, half]: each half's recurrent rows

    @classmethod
    def of(cls, layers: list) -> StackWeights:
        """From the layers' SweepWeights (recurrent weights in linears() order, half 0's Linears first: RevGRU's
        zr_0, g_0, zr_1, g_1, RevLSTM's gates_0, gates_1)."""
        first = layers[0]
        per_half = len(first.recurrent) // 2
        upper = [w.weight for w in layers[1:]] or [first.weight.new_zeros(1, 1)]
        w_rec = torch.stack([torch.stack([torch.cat(w.recurrent[per_half * i: per_half * (i + 1)]) for i in (0, 1)])
                             for w in layers])
        return cls(first.weight.contiguous(), torch.stack(upper).contiguous(),
                   torch.stack([w.bias for w in layers]).contiguous(), w_rec.contiguous())

    @property
    def half(self) -> int:
        return self.w_rec.shape[-1]

    @property
    def layers(self) -> int:
        return self.w_rec.shape[0]

    @property
    def lstm(self) -> bool:
        """Whether the cells are RevLSTM's: 5 gates a half (RevGRU's have 3)."""
        return self.w_rec.shape[2] == 5 * self.half


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
    spilled. So set, none spills on sm_80 or sm_90 (tests/revnmt/rnn/test_triton_sweeps.py prints the registers;
    docs/gpu.md#persistent-sweeps-a-stacks-sweep-in-one-launch has them), though RevLSTM's reverse at 32 rows takes
    every register there is. One program of 8 warps then fills an SM's registers: the other programs' latency is not
    there to hide a load's, which is the price of no spills."""
    if lanes > MAX_LANES:
        raise ValueError(f"the persistent sweeps take at most {MAX_LANES} buffer lanes, got {lanes}")
    return dict(TILE_ROWS=tile_rows, TB=program_rows(tile_rows), LANES_P2=MAX_LANES, num_warps=8, num_stages=1,
                maxnreg=255, **_BLOCKS, **COMPILE_OPTIONS)


def _stored(layer: int, layers: int, i: int, half: int, slice_dim: int) -> int:
    """As the kernels' _stored_count: the top layer's slice columns in half i."""
    return min(max(slice_dim - i * half, 0), half) if layer == layers - 1 else 0


def _updates(steps: int, layers: int, half: int, slice_dim: int, lstm: bool) -> list[tuple[int, int]]:
    """The sweep's buffered updates in push order: (width, stored) per step, layer and half; RevLSTM's half pushes
    its c (no stored columns), then its h."""
    per_half = [(half, 0)] if lstm else []
    return [update for _ in range(steps) for layer in range(layers) for i in (0, 1)
            for update in per_half + [(half, _stored(layer, layers, i, half, slice_dim))]]


def _work(weights: StackWeights, batch: int, device: torch.device) -> torch.Tensor:
    """RevGRU's gates phase's work area, [batch, 3·half] (σ(z), σ(r), r·h_j); RevLSTM's gates read none of other
    threads' values: one unread float."""
    return torch.empty(1 if weights.lstm else batch * 3 * weights.half, device=device)


def forward_sweep(weights: StackWeights, x: torch.Tensor, mask: torch.Tensor, state: torch.Tensor,
                  drop: torch.Tensor, buffer: InformationBuffer, limit: ForgetLimit, slice_dim: int) -> torch.Tensor:
    """Run a RevGRU or RevLSTM stack's forward sweep in one launch: ``state`` [layers, batch, width] int32
    (contiguous; width is hidden, or RevLSTM's 2·hidden) is updated in place from the inputs ``x`` [steps, batch,
    input] under ``mask`` [steps, batch], pushing onto ``buffer``; ``drop`` [layers, batch, hidden] holds the
    dropout masks of the layers' inputs (ones where none). Returns the top layer's first ``slice_dim`` columns after
    each step, [steps, batch, slice_dim] int32. Nothing is read on the host; errors wait in the buffer's status, a
    full room in its heights."""
    steps, batch = mask.shape
    half, layers = weights.half, weights.layers
    words = buffer.words
    plan = buffer.plan_push(*_updates(steps, layers, half, slice_dim, weights.lstm), limit=limit)
    options = _options(words.tile_rows, words.lanes)
    grid = (triton.cdiv(batch, options["TB"]),)
    slices = torch.empty(steps, batch, slice_dim, dtype=torch.int32, device=state.device)
    layer_in = torch.empty(batch, 2 * half, device=state.device)
    lost = torch.empty(grid[0], dtype=torch.float64, device=state.device)
    _forward_kernel[grid](
        x.contiguous(), x.shape[-1], weights.w_in0, weights.w_in, weights.bias, weights.w_rec, drop, mask.contiguous(),
        state, slices, _work(weights, batch, state.device), layer_in, words.curr, words.stack, words.top, words.flags,
        words.status, lost, lost_table(state.device), batch, steps, layers, half, words.lanes, slice_dim,
        words.capacity, plan.flags[0] if plan.flags else 0, limit.min_numerator, limit.slope, LSTM=weights.lstm,
        **options)
    plan.done(lost.sum(), *[0.0] * (len(plan.widths) - 1))  # the bits destroyed, for the books: one total
    return slices


@dataclass
class ReverseSlots:
    """What a reverse launch leaves for the weights' gradients, ``chunk`` steps of every layer (see
    :func:`_reverse_kernel`): reduced by :meth:`accumulate`, one product per weight and chunk."""

    grad_pre: torch.Tensor  # [layers, chunk, batch, 2·G·half]: the cell's projection width
    rec_in: torch.Tensor  # [layers, linears, chunk, batch, half]: each Linear's recurrent input
    layer_in: torch.Tensor  # [layers, chunk, batch, hidden]

    @classmethod
    def empty(cls, cell, layers: int, chunk: int, batch: int, device: torch.device) -> ReverseSlots:
        """Slots for a stack of ``layers`` cells like ``cell`` (a RevCell)."""
        return cls(torch.empty(layers, chunk, batch, cell.project_width, device=device),
                   torch.empty(layers, len(cell.linears()), chunk, batch, cell.half, device=device),
                   torch.empty(layers, chunk, batch, cell.hidden_size, device=device))

    @staticmethod
    def held_bytes(cell, layers: int, chunk: int, batch: int) -> int:
        """Bytes of :meth:`empty`'s slots (memory accounting)."""
        return layers * chunk * batch * (cell.project_width + len(cell.linears()) * cell.half + cell.hidden_size) * 4

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


def reverse_sweep(weights: StackWeights, x: torch.Tensor, mask: torch.Tensor, state: torch.Tensor,
                  grads: torch.Tensor, drop: torch.Tensor, buffer: InformationBuffer, limit: ForgetLimit,
                  slices: torch.Tensor, initial_top: torch.Tensor, slice_grad: torch.Tensor | None, start: int,
                  stop: int, slots: ReverseSlots, out_grad: torch.Tensor | None = None) -> None:
    """Undo and backpropagate steps ``start`` … ``stop`` − 1 of :func:`forward_sweep` in one launch: ``state`` and
    ``grads`` ([layers, batch, width], d loss / d state) in place, the weights' gradient terms into ``slots``
    (reduced by :meth:`ReverseSlots.accumulate`). ``x``: layer 0's inputs at those steps; ``slices``: what the
    forward returned; ``initial_top``: the top layer's initial state (its stored columns before step 0);
    ``slice_grad`` [steps, batch, slice_dim]: d loss / d the slices, or None; ``out_grad`` [stop − start, batch,
    hidden]: d loss / d the top layer's outputs at those steps, or None (:func:`peek_outputs` gives the outputs)."""
    plan = buffer.plan_pop(*_updates(stop - start, weights.layers, weights.half, slices.shape[-1], weights.lstm),
                           limit=limit)
    _reverse_launch(weights, x, mask, state, grads, drop, buffer, limit, slices, initial_top, start, stop, slots,
                    slice_grad=slice_grad, out_grad=out_grad)
    plan.done()


def peek_outputs(weights: StackWeights, x: torch.Tensor, mask: torch.Tensor, state: torch.Tensor,
                 drop: torch.Tensor, buffer: InformationBuffer, limit: ForgetLimit, slices: torch.Tensor,
                 initial_top: torch.Tensor, start: int, stop: int, slots: ReverseSlots) -> torch.Tensor:
    """The top layer's outputs after steps ``start`` … ``stop`` − 1 (int32, [stop − start, batch, hidden]; the
    arguments as :func:`reverse_sweep`'s), in one launch that undoes the steps after ``start`` on a copy of
    ``state`` and leaves ``state`` and the buffer as they were. A stack whose outputs get gradients from outside (the
    decoder's attention and loss) is reversed a chunk at a time with it: the chunk's outputs, their gradients in one
    batched call, then :func:`reverse_sweep` of the chunk, two launches a chunk, not one a step."""
    outs = torch.empty(stop - start, mask.shape[1], 2 * weights.half, dtype=torch.int32, device=state.device)
    _reverse_launch(weights, x[1:], mask, state.clone(), _work(weights, mask.shape[1], state.device), drop, buffer,
                    limit, slices, initial_top, start + 1, stop, slots, outs=outs)
    return outs


def _reverse_launch(weights: StackWeights, x: torch.Tensor, mask: torch.Tensor, state: torch.Tensor,
                    grads: torch.Tensor, drop: torch.Tensor, buffer: InformationBuffer, limit: ForgetLimit,
                    slices: torch.Tensor, initial_top: torch.Tensor, start: int, stop: int, slots: ReverseSlots,
                    slice_grad: torch.Tensor | None = None, out_grad: torch.Tensor | None = None,
                    outs: torch.Tensor | None = None) -> None:
    """One launch of :func:`_reverse_kernel` over steps ``start`` … ``stop`` − 1: a peek where ``outs`` is given."""
    batch = mask.shape[1]
    words = buffer.words
    options = _options(words.tile_rows, words.lanes)
    grid = (triton.cdiv(batch, options["TB"]),)
    work = _work(weights, batch, state.device)
    _reverse_kernel[grid](
        x.contiguous(), x.shape[-1], weights.w_in0, weights.w_in, weights.bias, weights.w_rec, drop, mask.contiguous(),
        state, grads, slices, initial_top, initial_top.stride(0), work if slice_grad is None else slice_grad,
        work if out_grad is None else out_grad.contiguous(), work if outs is None else outs, work, slots.grad_pre,
        slots.rec_in, slots.layer_in, words.curr, words.stack, words.top, words.flags, words.status, batch, start,
        stop, slots.chunk, weights.layers, weights.half, words.lanes, slices.shape[-1],
        words.pushes - 1,  # the last push's flag: the pops mirror the pushes, the last of them first
        limit.min_numerator, limit.slope, LSTM=weights.lstm, SLICE_GRAD=slice_grad is not None,
        OUT_GRAD=out_grad is not None, PEEK=outs is not None, **options)


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

    def supports(self, rnn, lanes: int, tile_rows: int) -> bool:
        """Whether these kernels run the trained sweeps of ``rnn`` on a buffer of ``lanes`` lanes a row in tiles of
        ``tile_rows`` rows: a RevGRU or RevLSTM stack, whose buffer tiles and lanes the kernels take."""
        from ..cells import RevGRUCell, RevLSTMCell  # the cells import the kernels' package: imported when asked

        return (isinstance(rnn.cells[0], (RevGRUCell, RevLSTMCell)) and lanes <= MAX_LANES
                and not tile_rows & (tile_rows - 1) and tile_rows <= 32)

    def work_bytes(self, rnn, batch: int, outputs: bool, chunk: int) -> int:
        """Bytes :meth:`backward` holds besides the tape over ``batch`` rows, none of it seen by autograd (the
        arguments as :meth:`~revnmt.rnn.ReversibleRNN.work_bytes`'; ``chunk`` as :meth:`backward`'s): the layers'
        copied weights with their gradients and the kernels' stacked copy of them, a chunk's slots, the product that
        reduces them into a weight's gradient (before it is added), the states and their gradients stacked, the
        dropout masks, the gates' work area, a chunk of layer 0's inputs and their gradient; with ``outputs``, a
        chunk of the stack's own steps, and its peek's outputs (int32 and float) and copy of the states."""
        from ..cells import SweepWeights

        cell = rnn.cells[0]
        chunk = rnn.chunk_steps if outputs else chunk
        held = (sum(SweepWeights.held_bytes(c, grads=True) + SweepWeights.held_bytes(c, grads=False)
                    for c in rnn.cells)
                + ReverseSlots.held_bytes(cell, rnn.num_layers, chunk, batch)
                + max(c.project_width * (c.input_size + c.half) for c in rnn.cells) * 4
                + batch * (rnn.num_layers * (2 * rnn.state_size + rnn.hidden_size) + 3 * cell.half
                           + 2 * chunk * cell.input_size) * 4)
        if outputs:
            held += batch * (2 * chunk * rnn.hidden_size + rnn.num_layers * rnn.state_size + 3 * cell.half) * 4
        return held

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
        slices = forward_sweep(weights, x, mask, state, drop, buffer, rnn.limit, rnn.slice_dim)
        return list(state.unbind(0)), slices if rnn.slice_dim else None

    @torch.no_grad()
    def backward(self, rnn, tape, inputs, grad_final: list[torch.Tensor | None] | None, output_grads,
                 slice_grad: torch.Tensor | None, chunk: int) -> list[torch.Tensor]:
        """The backward sweep of a tape :meth:`forward` recorded (the arguments of
        :meth:`~revnmt.rnn.ReversibleRNN.backward_sweep`): ``tape.states`` back to the initial states, parameter
        gradients into ``.grad``; returns d loss / d each layer's initial state. ``chunk`` steps per launch; where
        ``output_grads`` asks for the outputs' gradients, the stack's own ``chunk_steps``, each chunk a peek at its
        outputs (:func:`peek_outputs`: the top layer's state after step t is known only once the steps after it are
        undone), their gradients and the launch that backpropagates them."""
        from ..cells import SweepWeights

        steps, batch = tape.mask.shape
        device = tape.mask.device
        sweep = [SweepWeights(cell, grads=True) for cell in rnn.cells]
        weights = StackWeights.of(sweep)
        state = torch.stack(tape.states)
        grads = torch.stack([torch.zeros(batch, rnn.state_size, device=device) if g is None else g
                             for g in (grad_final or [None] * rnn.num_layers)])
        drop = _dropout_masks(tape.dropout, batch, rnn.hidden_size, device)
        chunk = min(rnn.chunk_steps if output_grads is not None else chunk, steps)
        slots = ReverseSlots.empty(rnn.cells[0], rnn.num_layers, chunk, batch, device)
        slices = tape.slices if tape.slices is not None else torch.empty(steps, batch, 0, dtype=torch.int32,
                                                                          device=device)
        for start in reversed(range(0, steps, chunk)):
            stop = min(start + chunk, steps)
            x = inputs.steps(start, stop)
            out_grad = None
            if output_grads is not None:
                outs = peek_outputs(weights, x, tape.mask, state, drop, tape.buffer, rnn.limit, slices,
                                    tape.initial[-1], start, stop, slots)
                out_grad = output_grads(slice(start, stop), rnn.cells[-1].output(outs))
            reverse_sweep(weights, x, tape.mask, state, grads, drop, tape.buffer, rnn.limit, slices, tape.initial[-1],
                          slice_grad, start, stop, slots, out_grad)
            inputs.backward(start, slots.accumulate(sweep, stop - start, x))
        for collected in sweep:
            collected.flush()
        tape.states = list(state.unbind(0))
        return list(grads.unbind(0))


TRITON_SWEEPS = TritonSweeps()

__all__ = ["TRITON_SWEEPS", "ReverseSlots", "StackWeights", "TritonSweeps", "forward_sweep", "peek_outputs",
           "program_rows", "reverse_sweep"]
