"""The triton backend: one Triton kernel per pushed or popped update, for CUDA.

An update's device work is one walk over its columns (:func:`push_walk`, :func:`pop_walk`), written
here once for every caller. The walk takes z and u from a ``triton.jit`` function passed as an
argument, ``terms(args, rows, columns, valid)``: float gates, which the walk quantizes and rounds as
:meth:`~buffers.InformationBuffer.push_update` does (:func:`fixed_terms`), or, with ``GATES`` off
(``push_mul``, ``pop_div``), numerators the caller checked and no additive term. The buffer's own
kernels load them from tensors (:func:`_load_terms`); a fused RNN kernel computes them from its
products where they would be loaded (:mod:`revnmt.rnn.kernels.triton_steps`), so its words are those
this backend makes from the same z and u. The host keeps the books of a fused call through
:mod:`buffers.plans`.

A walk is one program per tile of the buffer (:mod:`buffers.words`): a tile's rows are independent of
every other tile's, so the tiles of a batch run side by side across the GPU. Inside a tile the walk goes
over the update's chunks in order, as the numba loops do: a chunk's overflow decision is a reduction over
the tile's lanes (rows × lanes) and changes what the next chunk sees, so the chunks of one update cannot
run in parallel. The program goes over the tile's lanes in blocks of at most ``_LANE_TILE``, twice a chunk
(the reduction, then the update); at 16 rows of 16 lanes one block holds them all. The stored columns,
which skip the buffer, take the plain floor product. The walk adds, and checks every int32 range, writing
an error code to ``words.status`` instead of raising, so that nothing is read on the host per step. The
stack heights ``top`` stay on the device; the host sizes the stack from the proven bound
(:mod:`buffers.words`). A kernel finds its tile and reads its height (:func:`open_tile`), runs its walks
and stores the height and the error code (:func:`close_tile`).

The arithmetic is integer and exact, so it is the same on any device; the tests run these kernels
under ``TRITON_INTERPRET=1`` on CPU tensors and compare them bit for bit with the numba and torch
backends, and compile them ahead of time for sm_80 and sm_90 (tests/buffers/test_triton_kernels.py).
Triton's ``//`` and ``%`` truncate toward zero: every division here either has a non-negative
dividend (buffer words, lane indices), where truncation is the floor, or is corrected (:func:`_floor_divmod`).

Each kernel is launched by a plain function (``_push_launch``, ``_pop_launch``), not a torch custom op,
whose dispatch costs more host time than the kernel takes on the GPU.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import fixed
from .. import words as wordstack
from . import triton_interpreted
from .base import BufferBackend

# Kernels may read module globals only as constexprs.
FORGET_ONE = tl.constexpr(fixed.FORGET_ONE)
FORGET_RADIX = tl.constexpr(fixed.FORGET_RADIX)
HIDDEN_SCALE = tl.constexpr(float(1 << fixed.HIDDEN_RADIX))
TO_FLOAT = tl.constexpr(2.0 ** -fixed.HIDDEN_RADIX)
INT32_MIN = tl.constexpr(fixed.INT32_MIN)
INT32_MAX = tl.constexpr(fixed.INT32_MAX)
WORD_LIMIT = tl.constexpr(wordstack.WORD_LIMIT)
TERM_OVERFLOW = tl.constexpr(wordstack.TERM_OVERFLOW)
STATE_OVERFLOW = tl.constexpr(wordstack.STATE_OVERFLOW)
OUT_OF_RANGE = tl.constexpr(wordstack.OUT_OF_RANGE)

_ELEMENT_BLOCK = 1024  # elements per iteration over the stored columns
_LANE_TILE = 4096  # lanes of a tile per iteration of a walk's chunk: 8 a thread with 16 warps


# ---------------------------------------------------------------------------- fixed point


@triton.jit
def _floor_divmod(a, z):
    """Floor quotient and non-negative remainder of ``a`` by ``z`` > 0 (Triton's ``//`` truncates)."""
    q = a // z
    r = a % z
    neg = r < 0
    return tl.where(neg, q - 1, q), tl.where(neg, r + z, r)


@triton.jit
def _rint(x):
    """Round half to even, as torch.round and numpy.rint: exact for any float64, NaN stays NaN."""
    f = tl.floor(x)
    d = x - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    return tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)


@triton.jit
def fixed_terms(z, u, live, valid, min_numerator):
    """The integer terms of float gates: (z*, fixed-point u, where u left int32).

    z* = round(z·2^R_Z) clamped to [min_numerator, 2^R_Z] and u = round(u·2^23), 0 on padded rows
    (as buffers.fixed.quantize_forget and to_fixed). A NaN z takes the minimum numerator and a NaN u
    counts as out of range. A fused kernel's derivative takes its z* from here too: it must be the
    walk's to the bit.
    """
    q = _rint(z.to(tl.float64) * FORGET_ONE)
    q = tl.where(q >= min_numerator, q, min_numerator)  # written so that NaN takes the minimum
    zq = tl.where(q > FORGET_ONE, FORGET_ONE, q).to(tl.int64)
    v = _rint(u.to(tl.float64) * HIDDEN_SCALE)
    bad_term = valid & ~(tl.abs(v + 0.5) <= INT32_MAX + 0.5)  # "not <=" so that NaN counts as out of range
    ui = tl.where(bad_term | ~live, 0.0, v).to(tl.int64)
    return zq, ui, bad_term


@triton.jit
def to_float(v):
    """A fixed-point state as float32, as buffers.to_float: converted (rounded), times an exact power of two."""
    return v.to(tl.float32) * TO_FLOAT


@triton.jit
def _outside_int32(value, valid):
    return valid & ((value < INT32_MIN) | (value > INT32_MAX))


@triton.jit
def _record(status, bad, code):
    """The error code so far, raised to ``code`` where any of ``bad`` (a block of any rank) is set (codes:
    buffers.words)."""
    return tl.maximum(status, tl.max(tl.where(bad, code, 0)))


# ---------------------------------------------------------------------------- the lanes


@triton.jit
def elements(start, rows, columns, ELEMENT_BLOCK: tl.constexpr):
    """A block of the first ``columns`` columns of ``rows`` rows, read row after row from element ``start``:
    (valid, row, column). The stored columns are walked this way, elementwise."""
    e = start + tl.arange(0, ELEMENT_BLOCK)
    return e < rows * columns, e // columns, e % columns


@triton.jit
def tile_rows_of(batch, tile_rows):
    """The program's tile of the batch: (its first row, its number of rows: ``tile_rows`` but in the last)."""
    first = tl.program_id(0) * tile_rows
    return first, tl.minimum(tile_rows, batch - first)


@triton.jit
def _lane_columns(c, block, rows, lanes, buffered, stored, LANE_BLOCK: tl.constexpr):
    """The block of a tile's lanes from lane ``block`` on, and where each takes its column of chunk ``c``:
    (lane in the tile, lane in the tile and valid, valid for the chunk, row in the tile, column of
    [batch, width]). Lane (r, k) of chunk c takes column stored + c·lanes + k of the tile's row r."""
    lane = block + tl.arange(0, LANE_BLOCK)
    lane_ok = lane < rows * lanes
    j = c * lanes + lane % lanes
    return lane, lane_ok, lane_ok & (j < buffered), lane // lanes, stored + j


@triton.jit
def _flag_byte(flags_ptr, push, tiles):
    """Where push ``push``'s overflow bit is in a tile's column of flags (buffers.words): (its byte, the bit)."""
    return flags_ptr + (push >> 3) * tiles, push & 7


@triton.jit
def store_flag(flags_ptr, push, tiles, overflow, mask):
    """Write push ``push``'s overflow bit of the tiles' columns of flags at ``flags_ptr`` (one tile's, or a block of
    pointers: one per tile, where ``mask``), keeping the byte's other pushes' bits."""
    flag, bit = _flag_byte(flags_ptr, push, tiles)
    byte = tl.load(flag, mask=mask, other=0).to(tl.int32)
    tl.store(flag, ((byte & ~(1 << bit)) | (overflow.to(tl.int32) << bit)).to(tl.uint8), mask=mask)


@triton.jit
def load_flag(flags_ptr, push, tiles, mask):
    """Push ``push``'s overflow bit of the tiles' columns at ``flags_ptr`` (see :func:`store_flag`): the pop's
    decision, made by the push, so nothing is reduced again."""
    flag, bit = _flag_byte(flags_ptr, push, tiles)
    return ((tl.load(flag, mask=mask, other=0).to(tl.int32) >> bit) & 1) != 0


@triton.jit
def open_tile(top_ptr, batch, tile_rows):
    """A kernel's start: its tile (first row, rows), the tile's stack height, and its error code (none yet)."""
    first, rows = tile_rows_of(batch, tile_rows)
    return first, rows, tl.load(top_ptr + tl.program_id(0)), tl.full([], 0, tl.int32)


@triton.jit
def close_tile(top_ptr, status_ptr, top, status):
    """Store the tile's height, and raise the buffer's error code to the tile's (the largest wins)."""
    tl.store(top_ptr + tl.program_id(0), top)
    tl.atomic_max(status_ptr, status)


# ---------------------------------------------------------------------------- the walks


@triton.jit
def _push_lanes(hv, zq, active, cur):
    """Algorithm 1 (buffers.multiply.mul_exact) on a tile of lanes whose live words are ``cur``:
    (floor(h·z*/2^R_Z) on the active lanes, h elsewhere; the new words)."""
    # b1 ≥ 0 and z* > 0, so // and % are the floor ones.
    b1 = cur * FORGET_ONE + (hv & (FORGET_ONE - 1))
    product = tl.where(active, (hv >> FORGET_RADIX) * zq + b1 % zq, hv)
    return product, tl.where(active, b1 // zq, cur)


@triton.jit
def _pop_lanes(before, zq, active, cur):
    """The inverse of :func:`_push_lanes` on ``before`` = its product (h − u): (the h it was made from on
    the active lanes, ``before`` elsewhere; the words before the push)."""
    # The inverse of Algorithm 1 (buffers.multiply.div_exact); ``before`` may be negative.
    q, r = _floor_divmod(before, zq)
    b1 = cur * zq + r
    value = tl.where(active, q * FORGET_ONE + (b1 & (FORGET_ONE - 1)), before)
    return value, tl.where(active, b1 >> FORGET_RADIX, cur)


@triton.jit
def lane_full(cur, valid, live):
    """The lanes that make their tile push its words: active ones whose live word could overflow on the next
    multiply (see buffers.words). A tile pushes when any of its lanes is full: the caller reduces over the tile."""
    return valid & live & (cur >= WORD_LIMIT)


@triton.jit
def push_chunk(hv, zq, ui, active, valid, cur, overflow):
    """A chunk's lanes once their tile decided (``overflow``: the live words were stacked and start from zero):
    Algorithm 1, then + u. Returns (the new h, zero where it left int32; the new live words; where it left)."""
    product, cur = _push_lanes(hv, zq, active, tl.where(overflow, 0, cur))
    value = product + ui
    bad = _outside_int32(value, valid)
    return tl.where(bad, 0, value), cur, bad


@triton.jit
def pop_chunk(hv, zq, ui, active, valid, cur):
    """The inverse of :func:`push_chunk` before its tile's word is restored: (the previous h; the live words as
    they were after the stacking, if any; where h − u left int32)."""
    before = hv - ui
    bad = _outside_int32(before, valid)
    value, cur = _pop_lanes(tl.where(bad, 0, before), zq, active, cur)
    return value, cur, bad


@triton.jit
def floor_update(hv, zq, ui, live, valid):
    """A stored column's update, which skips the buffer: floor(h·z*/2^R_Z) + u on live lanes. Returns (the new h,
    zero where it left int32; where it left)."""
    value = tl.where(live, (hv >> FORGET_RADIX) * zq, hv) + ui
    bad = _outside_int32(value, valid)
    return tl.where(bad, 0, value), bad


@triton.jit
def _live(mask_ptr, m_rs, m_cs, b, col, valid):
    """Which lanes (b, col) are on live (unpadded) rows."""
    return tl.load(mask_ptr + b * m_rs + col * m_cs, mask=valid, other=0) != 0


@triton.jit
def _lane_terms(terms, args, b, col, valid, h_ptr, h_rs, h_cs, mask_ptr, m_rs, m_cs, min_numerator,
                GATES: tl.constexpr):
    """Lanes (b, col) of an update: (live row, z*, fixed-point u, where u left int32, h as int64).

    ``terms(args, b, col, valid)`` returns (z, u, ...): with GATES float gates, quantized here
    (:func:`fixed_terms`); without, z* and u as int64, taken as they are (the caller checked them).
    """
    live = _live(mask_ptr, m_rs, m_cs, b, col, valid)
    hv = tl.load(h_ptr + b * h_rs + col * h_cs, mask=valid, other=0).to(tl.int64)
    gates = terms(args, b, col, valid)
    if GATES:
        zq, ui, bad_term = fixed_terms(gates[0], gates[1], live, valid, min_numerator)
    else:
        zq, ui, bad_term = gates[0], gates[1], tl.zeros_like(valid)
    return live, zq, ui, bad_term, hv


@triton.jit
def push_walk(terms, args, h_ptr, h_rs, h_cs, mask_ptr, m_rs, m_cs, out_ptr, out_rs, float_ptr, curr_ptr, stack_ptr,
              capacity, flags_ptr, first_flag, tiles, lost_table_ptr, top, status, batch, first, rows, width, stored,
              lanes, min_numerator, GATES: tl.constexpr, FLOAT: tl.constexpr, LANE_BLOCK: tl.constexpr,
              ELEMENT_BLOCK: tl.constexpr):
    """h ← z·h + u on the tile of ``rows`` rows from row ``first`` of one update of a [batch, width] state, into
    ``out``: the first ``stored`` columns by the floor product, the rest through the buffer, one chunk after
    another onto the tile's lanes (its stack height ``top``; ``curr_ptr`` and ``stack_ptr`` are the buffer's
    [batch, lanes] and [capacity + 1, batch, lanes]: a push onto a full stack stores in the spare level
    ``capacity`` and still counts the height, see buffers.words). Chunk c writes its overflow bit as push
    ``first_flag`` + c of the tile's column of flags at ``flags_ptr`` (:func:`_flag_byte`). z and u come from
    ``terms`` (see :func:`_lane_terms`); ``mask`` marks the live lanes (strided as h is, or a row mask: column
    stride 0). With FLOAT, the new h as float32 also goes to ``float_ptr`` ([batch, width]). Returns (height, bits
    destroyed, error code)."""
    for start in range(0, rows * stored, ELEMENT_BLOCK):
        ok, r, col = elements(start, rows, stored, ELEMENT_BLOCK)
        b = first + r
        live, zq, ui, bad_term, hv = _lane_terms(terms, args, b, col, ok, h_ptr, h_rs, h_cs, mask_ptr, m_rs, m_cs,
                                                 min_numerator, GATES)
        value, bad = floor_update(hv, zq, ui, live, ok)
        tl.store(out_ptr + b * out_rs + col, value.to(tl.int32), mask=ok)
        if FLOAT:
            tl.store(float_ptr + b * width + col, to_float(value), mask=ok)
        status = _record(_record(status, bad_term, TERM_OVERFLOW), bad, STATE_OVERFLOW)

    buffered = width - stored
    words = first * lanes  # the tile's lanes in curr and in every stack level: rows × lanes from here
    level = batch * lanes  # one stack level
    lost = tl.zeros((LANE_BLOCK,), dtype=tl.float64)
    for c in range(0, tl.cdiv(buffered, lanes)):
        # The tile's lanes grow together when any active one's live word could overflow (see words.py): a
        # reduction over the tile's lanes, block by block, before any word of the chunk changes.
        full = tl.zeros((LANE_BLOCK,), dtype=tl.int32)
        for block in range(0, rows * lanes, LANE_BLOCK):
            lane, lane_ok, valid, r, col = _lane_columns(c, block, rows, lanes, buffered, stored, LANE_BLOCK)
            cur = tl.load(curr_ptr + words + lane, mask=lane_ok, other=0)
            live = _live(mask_ptr, m_rs, m_cs, first + r, col, valid)
            full = tl.maximum(full, tl.where(lane_full(cur, valid, live), 1, 0))
        overflow = tl.max(full, axis=0) > 0
        store_flag(flags_ptr, first_flag + c, tiles, overflow, True)
        for block in range(0, rows * lanes, LANE_BLOCK):
            lane, lane_ok, valid, r, col = _lane_columns(c, block, rows, lanes, buffered, stored, LANE_BLOCK)
            b = first + r
            live, zq, ui, bad_term, hv = _lane_terms(terms, args, b, col, valid, h_ptr, h_rs, h_cs, mask_ptr, m_rs,
                                                     m_cs, min_numerator, GATES)
            active = valid & live
            cur = tl.load(curr_ptr + words + lane, mask=lane_ok, other=0)
            tl.store(stack_ptr + tl.minimum(top, capacity) * level + words + lane, cur,
                     mask=tl.where(overflow, lane_ok, False))
            value, cur, bad = push_chunk(hv, zq, ui, active, valid, cur, overflow)
            tl.store(curr_ptr + words + lane, cur, mask=lane_ok)
            tl.store(out_ptr + b * out_rs + col, value.to(tl.int32), mask=valid)
            if FLOAT:
                tl.store(float_ptr + b * width + col, to_float(value), mask=valid)
            lost += tl.where(active, tl.load(lost_table_ptr + zq, mask=active, other=0.0), 0.0)
            status = _record(_record(status, bad_term, TERM_OVERFLOW), bad, STATE_OVERFLOW)
        top += overflow.to(tl.int64)
        tl.debug_barrier()  # the next chunk's reduction reads the words this one wrote, across threads
    return top, tl.sum(lost, axis=0), status


@triton.jit
def pop_walk(terms, args, h_ptr, h_rs, h_cs, mask_ptr, m_rs, m_cs, out_ptr, out_rs, float_ptr, restore_ptr,
             restore_rs, curr_ptr, stack_ptr, flags_ptr, first_flag, tiles, top, status, batch, first, rows, width,
             stored, lanes, min_numerator, GATES: tl.constexpr, RESTORE: tl.constexpr, FLOAT: tl.constexpr,
             LANE_BLOCK: tl.constexpr, ELEMENT_BLOCK: tl.constexpr):
    """The exact inverse of :func:`push_walk` on the same tile with the same z and u, the chunks popped last
    first, but for the stored columns: they get h − u, or with RESTORE their previous values, copied from
    ``restore`` (where the caller kept them). Returns (height, error code)."""
    for start in range(0, rows * stored, ELEMENT_BLOCK):
        ok, r, col = elements(start, rows, stored, ELEMENT_BLOCK)
        b = first + r
        if RESTORE:
            value = tl.load(restore_ptr + b * restore_rs + col, mask=ok)
        else:
            _, _, ui, bad_term, hv = _lane_terms(terms, args, b, col, ok, h_ptr, h_rs, h_cs, mask_ptr, m_rs,
                                                 m_cs, min_numerator, GATES)
            before = hv - ui
            bad = _outside_int32(before, ok)
            value = tl.where(bad, 0, before)
            status = _record(_record(status, bad_term, TERM_OVERFLOW), bad, STATE_OVERFLOW)
        tl.store(out_ptr + b * out_rs + col, value.to(tl.int32), mask=ok)
        if FLOAT:
            tl.store(float_ptr + b * width + col, to_float(value), mask=ok)

    buffered = width - stored
    words = first * lanes
    level = batch * lanes
    chunks = tl.cdiv(buffered, lanes)
    for back in range(0, chunks):
        c = chunks - 1 - back
        overflow = load_flag(flags_ptr, first_flag + c, tiles, True)
        for block in range(0, rows * lanes, LANE_BLOCK):
            lane, lane_ok, valid, r, col = _lane_columns(c, block, rows, lanes, buffered, stored, LANE_BLOCK)
            b = first + r
            live, zq, ui, bad_term, hv = _lane_terms(terms, args, b, col, valid, h_ptr, h_rs, h_cs, mask_ptr, m_rs,
                                                     m_cs, min_numerator, GATES)
            active = valid & live
            value, cur, bad = pop_chunk(hv, zq, ui, active, valid, tl.load(curr_ptr + words + lane, mask=lane_ok,
                                                                           other=0))
            below = tl.load(stack_ptr + (top - 1) * level + words + lane, mask=tl.where(overflow, lane_ok, False),
                            other=0)
            tl.store(curr_ptr + words + lane, tl.where(overflow, below, cur), mask=lane_ok)
            tl.store(out_ptr + b * out_rs + col, value.to(tl.int32), mask=valid)
            if FLOAT:
                tl.store(float_ptr + b * width + col, to_float(value), mask=valid)
            status = _record(_record(status, bad_term, TERM_OVERFLOW), bad, STATE_OVERFLOW)
            status = _record(status, _outside_int32(value, active), OUT_OF_RANGE)
        top -= overflow.to(tl.int64)
        tl.debug_barrier()  # a block's lanes are the same threads' in every chunk; kept for any layout
    return top, status


# ---------------------------------------------------------------------------- the buffer's kernels


@triton.jit
def _load_terms(args, b, col, valid):
    """z and u as an update is given them: float gates, or int64 numerators and no u (GATES off). The
    pointer's type tells them apart when the kernel compiles (a constexpr in ``args`` would not stay one)."""
    z_ptr, z_rs, z_cs, u_ptr, u_rs, u_cs = args
    if z_ptr.dtype.element_ty.is_floating():
        z = tl.load(z_ptr + b * z_rs + col * z_cs, mask=valid, other=1.0)
        u = tl.load(u_ptr + b * u_rs + col * u_cs, mask=valid, other=0.0)
    else:
        z = tl.load(z_ptr + b * z_rs + col * z_cs, mask=valid, other=FORGET_ONE).to(tl.int64)
        u = tl.zeros_like(z)
    return z, u


@triton.jit
def _push_kernel(h_ptr, h_rs, h_cs, z_ptr, z_rs, z_cs, u_ptr, u_rs, u_cs, mask_ptr, m_rs, m_cs, out_ptr,
                 curr_ptr, stack_ptr, capacity, top_ptr, flags_ptr, status_ptr, lost_ptr, lost_table_ptr,
                 batch, width, stored, tile_rows, lanes, first_flag, min_numerator,
                 GATES: tl.constexpr, LANE_BLOCK: tl.constexpr, ELEMENT_BLOCK: tl.constexpr):
    """h ← z·h + u for one update (``out`` is [batch, width], contiguous), a program per tile; each writes its
    tile's bits destroyed to ``lost`` [tiles]."""
    first, rows, top, status = open_tile(top_ptr, batch, tile_rows)
    tiles = tl.num_programs(0)
    top, lost, status = push_walk(_load_terms, (z_ptr, z_rs, z_cs, u_ptr, u_rs, u_cs), h_ptr, h_rs, h_cs,
                                  mask_ptr, m_rs, m_cs, out_ptr, width, out_ptr, curr_ptr, stack_ptr, capacity,
                                  flags_ptr + tl.program_id(0), first_flag, tiles, lost_table_ptr, top, status, batch,
                                  first, rows, width, stored, lanes, min_numerator, GATES=GATES, FLOAT=False,
                                  LANE_BLOCK=LANE_BLOCK, ELEMENT_BLOCK=ELEMENT_BLOCK)
    tl.store(lost_ptr + tl.program_id(0), lost)
    close_tile(top_ptr, status_ptr, top, status)


@triton.jit
def _pop_kernel(h_ptr, h_rs, h_cs, z_ptr, z_rs, z_cs, u_ptr, u_rs, u_cs, mask_ptr, m_rs, m_cs, out_ptr,
                curr_ptr, stack_ptr, top_ptr, flags_ptr, status_ptr,
                batch, width, stored, tile_rows, lanes, first_flag, min_numerator,
                GATES: tl.constexpr, LANE_BLOCK: tl.constexpr, ELEMENT_BLOCK: tl.constexpr):
    """The exact inverse of :func:`_push_kernel`, but for the stored columns, which get h − u."""
    first, rows, top, status = open_tile(top_ptr, batch, tile_rows)
    tiles = tl.num_programs(0)
    top, status = pop_walk(_load_terms, (z_ptr, z_rs, z_cs, u_ptr, u_rs, u_cs), h_ptr, h_rs, h_cs,
                           mask_ptr, m_rs, m_cs, out_ptr, width, out_ptr, out_ptr, width, curr_ptr, stack_ptr,
                           flags_ptr + tl.program_id(0), first_flag, tiles, top, status, batch, first, rows, width,
                           stored, lanes, min_numerator, GATES=GATES, RESTORE=False, FLOAT=False,
                           LANE_BLOCK=LANE_BLOCK, ELEMENT_BLOCK=ELEMENT_BLOCK)
    close_tile(top_ptr, status_ptr, top, status)


#: Compiler options every launch pins. No contraction of a·b + c into an FMA: the kernels' float
#: arithmetic (scaling by powers of two, rounding) is exact either way, but what a kernel computes must
#: not depend on a Triton default, which changes in 3.10.
COMPILE_OPTIONS = {"enable_fp_fusion": False}


def launch_options(tile_lanes: int) -> dict:
    """Constexprs and launch options for tiles of ``tile_lanes`` lanes (a program walks its tile's a block at a
    time)."""
    block = min(triton.next_power_of_2(tile_lanes), _LANE_TILE)
    return dict(LANE_BLOCK=block, ELEMENT_BLOCK=_ELEMENT_BLOCK, num_warps=max(4, min(16, block // 256)),
                **COMPILE_OPTIONS)


def walk_launch(batch: int, tile_rows: int, lanes: int) -> tuple[tuple[int], dict]:
    """The launch grid of a walk over ``batch`` rows, a program per tile of ``tile_rows`` rows on ``lanes`` lanes
    each, and its launch options: the buffer's kernels and the fused steps launch their walks alike."""
    return (triton.cdiv(batch, tile_rows),), launch_options(min(tile_rows, batch) * lanes)


def _push_launch(h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, mask: torch.Tensor, out: torch.Tensor,
                 words: wordstack.WordStack, lost: torch.Tensor, lost_table: torch.Tensor, stored: int,
                 first_flag: int, gates: bool) -> None:
    grid, options = walk_launch(h.shape[0], words.tile_rows, words.lanes)
    _push_kernel[grid](
        *_strided(h), *_strided(z), *_strided(u), *_strided(mask), out, words.curr, words.stack, words.capacity,
        words.top, words.flags, words.status, lost, lost_table, h.shape[0], h.shape[1], stored, words.tile_rows,
        words.lanes, first_flag, words.limit.min_numerator, GATES=gates, **options)


def _pop_launch(h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, mask: torch.Tensor, out: torch.Tensor,
                words: wordstack.WordStack, stored: int, first_flag: int, gates: bool) -> None:
    grid, options = walk_launch(h.shape[0], words.tile_rows, words.lanes)
    _pop_kernel[grid](
        *_strided(h), *_strided(z), *_strided(u), *_strided(mask), out, words.curr, words.stack, words.top,
        words.flags, words.status, h.shape[0], h.shape[1], stored, words.tile_rows, words.lanes, first_flag,
        words.limit.min_numerator, GATES=gates, **options)


def _strided(t: torch.Tensor) -> tuple:
    """A [rows, columns] tensor as the kernels take it: itself, its row stride, its column stride.
    Strides, not a contiguous copy: the gates arrive as column slices of one activation tensor."""
    return t, t.stride(0), t.stride(1)


@functools.lru_cache(maxsize=None)
def lost_table(device: torch.device) -> torch.Tensor:
    """R_Z − log2 z* for every numerator z* (index 0 unused), as the numba loops look it up."""
    z = torch.arange(fixed.FORGET_ONE + 1, dtype=torch.float64).clamp(min=1)
    return (fixed.FORGET_RADIX - torch.log2(z)).to(device)


class TritonBackend(BufferBackend):
    """One kernel launch per update (``push_update``/``pop_update``) or per group (``push_mul``/``pop_div``)."""

    name = "triton"

    def check_device(self, device):
        if device.type != "cuda" and not (device.type == "cpu" and triton_interpreted()):
            raise ValueError(f"the triton buffer backend runs on CUDA (or on CPU with TRITON_INTERPRET=1), "
                             f"not on {device}")

    def push_mul(self, words, h, zl, active, first_flag):
        return self._push(words, h, zl, zl, _lanes_mask(h, active), 0, first_flag, gates=False)

    def pop_div(self, words, h, zl, active, first_flag):
        return self._pop(words, h, zl, zl, _lanes_mask(h, active), 0, first_flag, gates=False)

    def push_update(self, words, h, z, u, mask, stored, first_flag):
        return self._push(words, h, z.detach(), u.detach(), mask[:, None].expand_as(h), stored, first_flag,
                          gates=True)

    def pop_update(self, words, h, z, u, mask, stored, first_flag):
        return self._pop(words, h, z.detach(), u.detach(), mask[:, None].expand_as(h), stored, first_flag,
                         gates=True)

    @staticmethod
    def _push(words: wordstack.WordStack, h, z, u, mask, stored, first_flag, gates):
        out = torch.empty(h.shape, dtype=h.dtype, device=h.device)
        lost = torch.empty(words.tiles, dtype=torch.float64, device=h.device)
        _push_launch(h, z, u, mask, out, words, lost, lost_table(h.device), stored, first_flag, gates)
        return out, lost  # per tile, summed when the books are read

    @staticmethod
    def _pop(words: wordstack.WordStack, h, z, u, mask, stored, first_flag, gates):
        out = torch.empty(h.shape, dtype=h.dtype, device=h.device)
        _pop_launch(h, z, u, mask, out, words, stored, first_flag, gates)
        return out


def _lanes_mask(h: torch.Tensor, active: torch.Tensor | None) -> torch.Tensor:
    """The active lanes as a [rows, width] bool tensor (a broadcast view when all are)."""
    if active is None:
        return torch.ones((1, 1), dtype=torch.bool, device=h.device).expand_as(h)
    return active


__all__ = [
    "COMPILE_OPTIONS", "FORGET_ONE", "FORGET_RADIX", "HIDDEN_SCALE", "INT32_MAX", "INT32_MIN", "OUT_OF_RANGE",
    "STATE_OVERFLOW", "TERM_OVERFLOW", "TO_FLOAT", "WORD_LIMIT", "TritonBackend", "close_tile", "elements",
    "fixed_terms", "floor_update", "lane_full", "launch_options", "load_flag", "lost_table", "open_tile",
    "pop_chunk", "pop_walk", "push_chunk", "push_walk", "store_flag", "walk_launch", "tile_rows_of",
    "to_float",
]
