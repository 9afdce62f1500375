"""The information buffer: where a reversible RNN keeps the bits that forgetting destroys.

Layout. Every lane owns a stack of int64 words: ``units`` lanes per batch row, each row's columns
folded onto its own lanes, or (``share_rows``) all rows' columns folded onto all the lanes. The live
word of every lane sits in ``_curr``, [batch, units] or [1, batch·units] when rows share; full
words sit in ``_stack`` [capacity, ...], all lanes together, so adding a word is one slab write
instead of a per-lane branch. When any *active* lane's live word could overflow on the next
multiply (B ≥ 2^(63−R_Z)), the whole live slab is pushed and reset to zero: all lanes grow
together, which keeps the structure one dense tensor. A flag per push call remembers which ones
overflowed, so the pops can undo them at the mirrored call.

No host sync per step. Whether a push overflows is known only on the device, so the stack height
``_top`` is a device tensor and every push writes the live slab into slot ``_top`` unconditionally
(it becomes part of the stack only if the overflow flag adds 1 to ``_top``). The host needs just an
upper bound on ``_top`` to keep the stack large enough: after a reset a word grows by at most k
bits per push (k = max forgotten bits), so two overflows are at least ⌈53/k⌉ pushes apart. The
host reads the true height only when that bound reaches the capacity; capacity then grows
geometrically, so growth copies are amortized O(1) per word.

Two implementations of push and pop share this layout: tensor ops (any device; what CUDA runs)
and, on CPU, fused numba loops (:mod:`buffers.cpu_kernels`) that do a whole group in one call,
since on a CPU the tensor path's time goes into dispatching its many small ops. The tests check
that both give bit-identical results.
"""

from __future__ import annotations

import math

import torch

from . import cpu_kernels
from .fixed import FORGET_ONE, FORGET_RADIX, INT32_MAX, INT32_MIN, FixedPointOverflowError, min_forget_numerator
from .multiply import div_exact, mul_exact

#: A live word at or above this value could exceed int64 in B·2^R_Z + r, so it is pushed first.
WORD_LIMIT = 1 << (63 - FORGET_RADIX)
_MIN_FREE_WORDS = 4  # stack slots kept free after a sync, so syncs stay rare
_POP_RANGE_MESSAGE = "pop_div produced a value outside int32: h was not the output of the matching push"


class BufferError(RuntimeError):
    """Misuse of an :class:`InformationBuffer`: a pop with nothing to pop, or out of LIFO order."""


class InformationBuffer:
    """Stacks of int64 words, one per (batch row, unit) lane, for exactly reversible multiplication.

    Args:
        batch: rows of every tensor pushed.
        units: lanes per row. A state group narrower than this uses the first lanes, a wider one
            is folded onto them, so groups of any width can share one buffer.
        device: where the words live.
        max_bits: the most bits a push may forget (z* ≥ 2^(R_Z − max_bits)); ``None`` for R_Z.
            A tighter limit lets the host sync less often. Numerators below it are rejected.
        fused: on CPU, push and pop each group in one compiled loop (default) instead of tensor
            ops; the results are the same bit for bit. Ignored on other devices.
        eager_checks: raise bad input at once, reading a flag on the host at every push (default: on
            CPU, where that costs nothing), or keep it on the device until the next host sync that the
            stack needs anyway (default elsewhere: a read per push would stall CUDA every time step).
        share_rows: fold every row's columns, row after row, onto all ``batch × units`` lanes
            together instead of each row onto its own ``units`` lanes. Every lane then takes
            columns of many rows and fills at about the batch's mean rate, where a lane of its own
            fills at its row's: rows that forget more, or fewer that end early (padding), no
            longer set the height of the whole stack. Same memory layout, same words.
    """

    def __init__(self, batch: int, units: int, device: torch.device | str | None = None,
                 max_bits: int | None = None, fused: bool = True, share_rows: bool = False,
                 eager_checks: bool | None = None) -> None:
        if batch < 1 or units < 1:
            raise ValueError(f"InformationBuffer needs batch >= 1 and units >= 1, got {batch} x {units}")
        self.batch, self.units, self.share_rows = batch, units, share_rows
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.fused = fused and self.device.type == "cpu"
        self.eager_checks = self.device.type == "cpu" if eager_checks is None else eager_checks
        self.max_bits = max_bits
        self.min_numerator = min_forget_numerator(max_bits)
        bits_per_push = FORGET_RADIX if max_bits is None else max_bits
        self._overflow_gap = math.ceil((63 - FORGET_RADIX) / bits_per_push)

        long = dict(dtype=torch.int64, device=self.device)
        # The lanes as the pushes see them: [rows, lanes], one row of all lanes when rows share them.
        lane_rows, lanes = (1, batch * units) if share_rows else (batch, units)
        self._curr = torch.zeros(lane_rows, lanes, **long)
        self._stack = torch.zeros(1 + _MIN_FREE_WORDS, lane_rows, lanes, **long)
        self._top = torch.zeros((), **long)
        # One overflow flag per push (a byte each: one indexed write per push, where a packed bit
        # log costs half a dozen ops; the flags are < 1 % of the words for any real batch).
        self._flags = torch.zeros(64, dtype=torch.bool, device=self.device)
        self._group_optimal: list[torch.Tensor] = []  # bits each push_mul group destroyed (device scalars)
        self._bad_input = torch.zeros((), dtype=torch.bool, device=self.device)
        self._widths: list[int] = []  # width of every push, host side: checks LIFO order for free
        self._widths_of: dict[int, list[int]] = {}  # _chunk_widths by group width: the same few every step
        self._known_top = 0  # true stack height at the last host sync ...
        self._pushes_at_sync = 0  # ... and the number of pushes then
        self.syncs = 0  # host syncs done to size the stack (reported by the benchmark)

    # ------------------------------------------------------------------ public API

    @property
    def pushes(self) -> int:
        """Push calls not yet popped."""
        return len(self._widths)

    def push_mul(self, h: torch.Tensor, z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Return h·z/2^R_Z (int32), storing the bits the product loses.

        ``h`` is int32 [batch, w], ``z`` integer numerators of the same shape in
        [min_numerator, 2^R_Z], ``mask`` bool [batch] or [batch, w]: False leaves a lane (padding)
        bit-for-bit unchanged, in ``h`` and in the buffer. A group narrower than the buffer uses
        its first lanes; a wider one is folded onto the lanes in chunks of ``units`` columns, one
        push per chunk, so that few lanes fill whole words instead of many lanes holding a
        mostly empty one each.
        """
        _, active = self._check_args("push_mul", h, z, mask)
        shape = h.shape
        h, z, active = self._fold(h), self._fold(z), None if active is None else self._fold(active)
        if self.fused:
            return self._push_fused(h, z, active).reshape(shape)
        zl = self._checked_numerators(z, active)
        hl = h.long()
        chunks = [self._push(hl[:, c], zl[:, c], None if active is None else active[:, c])
                  for c in self._chunks(h.shape[1])]
        # Information destroyed by the whole group, kept per group: pops come in the same groups.
        lost = FORGET_RADIX - torch.log2(zl.double())
        self._group_optimal.append((lost if active is None else lost * active).sum())
        out = torch.cat(chunks, 1) if len(chunks) > 1 else chunks[0]
        return out.to(torch.int32).reshape(shape)  # |h·z/2^R| ≤ |h| + 1: no int32 overflow possible

    def pop_div(self, h: torch.Tensor, z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The exact inverse of the matching (last unpopped) :meth:`push_mul`; same z and mask."""
        _, active = self._check_args("pop_div", h, z, mask)
        shape = h.shape
        h, z, active = self._fold(h), self._fold(z), None if active is None else self._fold(active)
        if self.fused:
            return self._pop_fused(h, z, active).reshape(shape)
        zl = self._checked_numerators(z, active)
        hl = h.long()
        out = [self._pop(hl[:, c], zl[:, c], None if active is None else active[:, c])
               for c in reversed(self._chunks(h.shape[1]))]
        h_new = torch.cat(out[::-1], 1) if len(out) > 1 else out[0]
        self._group_optimal.pop()
        out_of_range = (h_new < INT32_MIN) | (h_new > INT32_MAX)
        self._flag_bad(out_of_range, _POP_RANGE_MESSAGE, BufferError)
        return h_new.to(torch.int32).reshape(shape)

    def push_update(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, mask: torch.Tensor,
                    stored: int = 0) -> torch.Tensor:
        """A whole update h ← z·h + u in one compiled call (``fused`` buffers, CPU), the same bit for
        bit as ``quantize_forget``, ``to_fixed``, :meth:`push_mul` and ``checked_add`` in turn.

        ``z`` and ``u`` are float gates and additive terms [batch, w]; ``mask`` [batch] leaves padded
        rows unchanged. The first ``stored`` columns are kept exactly elsewhere (e.g. an attention
        slice): they take the plain floor product and skip the buffer. Range errors raise at once.
        """
        self._check_fused("push_update", h, mask)
        widths = self._update_widths(h, stored)
        self._reserve_fused(widths)
        out = torch.empty_like(h)
        status, lost = cpu_kernels.push_update(
            h.numpy(), z.detach().numpy(), u.detach().numpy(), mask.numpy(), stored, self._curr.numpy(),
            self._stack.numpy(), self._top.view(1).numpy(), self._flags.numpy(), self.pushes, WORD_LIMIT,
            self.min_numerator, out.numpy())
        if widths:
            self._record_fused_push(widths, lost)
        self._raise_update_error(status)
        return out

    def pop_update(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, mask: torch.Tensor,
                   stored: int = 0) -> torch.Tensor:
        """The exact inverse of :meth:`push_update`, but for the first ``stored`` columns, which hold
        h − u: the caller restores them from where they were kept."""
        self._check_fused("pop_update", h, mask)
        widths = self._update_widths(h, stored)
        self._check_pop(widths)
        out = torch.empty_like(h)
        status = cpu_kernels.pop_update(
            h.numpy(), z.detach().numpy(), u.detach().numpy(), mask.numpy(), stored, self._curr.numpy(),
            self._stack.numpy(), self._top.view(1).numpy(), self._flags.numpy(), self.pushes - len(widths),
            self.min_numerator, out.numpy())
        if widths:
            del self._widths[-len(widths):]
            self._group_optimal.pop()
        self._raise_update_error(status)
        return out

    def _check_fused(self, op: str, h: torch.Tensor, mask: torch.Tensor) -> None:
        if not self.fused:
            raise BufferError(f"{op} is the compiled CPU path: this buffer uses tensor ops (push_mul, pop_div)")
        if h.dtype != torch.int32 or h.dim() != 2 or h.shape[0] != self.batch or mask.shape != (self.batch,):
            raise ValueError(f"{op}: h must be int32 [{self.batch}, width] and mask [{self.batch}]")

    @staticmethod
    def _raise_update_error(status: int) -> None:
        if status == cpu_kernels.TERM_OVERFLOW:
            raise FixedPointOverflowError("fixed-point overflow in to_fixed: a value left the int32 range")
        if status == cpu_kernels.STATE_OVERFLOW:
            raise FixedPointOverflowError("fixed-point overflow in state update: a value left the int32 range")
        if status == cpu_kernels.OUT_OF_RANGE:
            raise BufferError(_POP_RANGE_MESSAGE)

    def _fold(self, t: torch.Tensor) -> torch.Tensor:
        """[batch, w] as the lanes take it: unchanged, or one row of batch·w columns when rows share lanes."""
        return t.reshape(1, -1) if self.share_rows else t

    def _chunks(self, width: int) -> list[slice]:
        """The columns of a (folded) group of this width that each push takes, one per lane."""
        lanes = self._curr.shape[1]
        return [slice(i, min(i + lanes, width)) for i in range(0, width, lanes)]

    def _chunk_widths(self, width: int) -> list[int]:
        """The width of each push that a (folded) group of this width makes (not to be modified)."""
        # Memoized: with shared rows a group makes dozens of pushes, and building their list per call
        # took a sixth of a fused update's time.
        if width not in self._widths_of:
            self._widths_of[width] = [c.stop - c.start for c in self._chunks(width)]
        return self._widths_of[width]

    def _update_widths(self, h: torch.Tensor, stored: int) -> list[int]:
        """Push widths of a fused update: its buffered columns (all but the first ``stored``), folded
        onto the lane rows as :meth:`_fold` folds a tensor (and the compiled loops, by ``_curr``'s shape)."""
        return self._chunk_widths((h.shape[1] - stored) * h.shape[0] // self._curr.shape[0])

    def _push(self, h: torch.Tensor, zl: torch.Tensor, active: torch.Tensor | None) -> torch.Tensor:
        width = h.shape[1]
        self._reserve_slot()
        p = self.pushes

        live = self._curr[:, :width]
        overflow = live >= WORD_LIMIT
        if active is not None:
            overflow &= active
        overflow = overflow.any()
        # Save the live slab into the scratch slot above the stack; the flag decides whether it
        # counts (``_top`` advances) and whether the live words restart from zero.
        self._stack.index_copy_(0, self._top.view(1), self._curr.unsqueeze(0))
        self._curr.masked_fill_(overflow, 0)
        self._top += overflow
        self._flags[p] = overflow

        h_new, buf_new = mul_exact(h, live, zl)
        if active is not None:
            h_new = torch.where(active, h_new, h)
            buf_new = torch.where(active, buf_new, live)
        live.copy_(buf_new)
        self._widths.append(width)
        return h_new

    def _check_pop(self, widths: list[int]) -> None:
        """Raise unless the last pushes had these widths (in push order): pops must mirror pushes."""
        if len(self._widths) >= len(widths) and self._widths[len(self._widths) - len(widths):] == widths:
            return  # the usual case, one list comparison; the loop below finds what is wrong
        for back, width in enumerate(reversed(widths), 1):
            if len(self._widths) < back:
                raise BufferError("pop_div on an empty InformationBuffer: every pop needs a matching push_mul")
            if self._widths[-back] != width:
                raise BufferError(
                    f"pop_div of width {width} does not mirror the last push_mul (width {self._widths[-back]}): "
                    "pops must come in exactly the reverse order of pushes"
                )

    def _push_fused(self, h: torch.Tensor, z: torch.Tensor, active: torch.Tensor | None) -> torch.Tensor:
        widths = self._chunk_widths(h.shape[1])
        self._reserve_fused(widths)
        out = torch.empty_like(h)
        status, lost = cpu_kernels.push_group(
            h.numpy(), z.numpy(), self._active_array(h, active), self._curr.numpy(), self._stack.numpy(),
            self._top.view(1).numpy(), self._flags.numpy(), self.pushes, WORD_LIMIT, self.min_numerator, out.numpy())
        if status == cpu_kernels.BAD_NUMERATOR:
            raise ValueError(self._numerator_message())
        self._record_fused_push(widths, lost)
        return out

    def _pop_fused(self, h: torch.Tensor, z: torch.Tensor, active: torch.Tensor | None) -> torch.Tensor:
        widths = self._chunk_widths(h.shape[1])
        self._check_pop(widths)
        out = torch.empty_like(h)
        status = cpu_kernels.pop_group(
            h.numpy(), z.numpy(), self._active_array(h, active), self._curr.numpy(), self._stack.numpy(),
            self._top.view(1).numpy(), self._flags.numpy(), self.pushes - len(widths), self.min_numerator, out.numpy())
        if status == cpu_kernels.BAD_NUMERATOR:
            raise ValueError(self._numerator_message())
        del self._widths[-len(widths):]
        self._group_optimal.pop()
        if status == cpu_kernels.OUT_OF_RANGE:
            raise BufferError(_POP_RANGE_MESSAGE)
        return out

    @staticmethod
    def _active_array(h: torch.Tensor, active: torch.Tensor | None):
        return (torch.ones((), dtype=torch.bool) if active is None else active).expand_as(h).numpy()

    def _reserve_fused(self, widths: list[int]) -> None:
        # On CPU the true height costs nothing to read: size the stack for this group exactly.
        self._ensure_capacity(int(self._top) + len(widths) + 1, self.pushes + len(widths))

    def _record_fused_push(self, widths: list[int], lost: float) -> None:
        self._widths.extend(widths)
        self._group_optimal.append(torch.tensor(lost, dtype=torch.float64))

    def _ensure_capacity(self, words: int, pushes: int) -> None:
        if words > self._stack.shape[0]:
            self._stack = _grow(self._stack, max(words + _MIN_FREE_WORDS, self._stack.shape[0] * 3 // 2))
        if pushes > self._flags.shape[0]:
            self._flags = _grow(self._flags, max(pushes, 2 * self._flags.shape[0]))

    def _pop(self, h: torch.Tensor, zl: torch.Tensor, active: torch.Tensor | None) -> torch.Tensor:
        width = h.shape[1]
        self._check_pop([width])
        p = self.pushes - 1

        live = self._curr[:, :width]
        h_new, buf_new = div_exact(h, live, zl)
        if active is not None:
            h_new = torch.where(active, h_new, h)
            buf_new = torch.where(active, buf_new, live)
        live.copy_(buf_new)
        overflow = self._flags[p]
        below = self._stack.index_select(0, (self._top - 1).clamp(min=0)).squeeze(0)
        self._curr.copy_(torch.where(overflow, below, self._curr))
        self._top -= overflow.long()

        self._widths.pop()
        # After popping below the last sync point the old height still bounds the stack.
        self._pushes_at_sync = min(self._pushes_at_sync, self.pushes)
        return h_new

    def is_empty(self) -> bool:
        """True when every push has been popped and every word is back to zero (one host sync)."""
        self._raise_bad_input()
        return not self._widths and int(self._top) == 0 and not bool(self._curr.any())

    def word_count(self) -> int:
        """Words per lane in use: the stacked ones plus the live one (one host sync)."""
        return int(self._top) + 1

    def allocated_bits(self) -> int:
        """Bits of information storage in use: every lane's words plus the overflow log.

        This counts words that hold (or are ready to hold) forgotten bits; spare stack slots
        allocated ahead of need are in :meth:`reserved_bits`. The overflow flags count 8 bits each (bytes).
        """
        return 64 * self.word_count() * self.batch * self.units + 8 * self.pushes

    def reserved_bits(self) -> int:
        """Bits of device memory the buffer's tensors occupy, spare capacity and bookkeeping included."""
        tensors = (self._curr, self._stack, self._top, self._flags, self._bad_input, *self._group_optimal)
        return 8 * sum(t.numel() * t.element_size() for t in tensors)

    def optimal_bits(self) -> float:
        """Σ −log2(z* / 2^R_Z) over active lanes of the pushes not yet popped: the information
        the multiplications destroyed, hence the least any exact scheme must store."""
        return float(torch.stack(self._group_optimal).sum()) if self._group_optimal else 0.0

    # ------------------------------------------------------------------ internals

    def _check_args(self, op: str, h: torch.Tensor, z: torch.Tensor,
                    mask: torch.Tensor | None) -> tuple[int, torch.Tensor | None]:
        if not isinstance(h, torch.Tensor) or h.dtype != torch.int32:
            raise TypeError(f"{op}: h must be an int32 fixed-point tensor, got {getattr(h, 'dtype', type(h))}")
        if not isinstance(z, torch.Tensor) or z.dtype.is_floating_point or z.dtype.is_complex or z.dtype == torch.bool:
            raise TypeError(f"{op}: z must be an integer tensor of numerators, got {getattr(z, 'dtype', type(z))}")
        if h.dim() != 2 or h.shape[0] != self.batch or h.shape[1] == 0:
            raise ValueError(f"{op}: h must have shape [{self.batch}, width], got {list(h.shape)}")
        if z.shape != h.shape:
            raise ValueError(f"{op}: z must have the shape of h {list(h.shape)}, got {list(z.shape)}")
        for name, t in (("h", h), ("z", z)) + ((("mask", mask),) if mask is not None else ()):
            if t.device != self.device:
                raise ValueError(f"{op}: {name} is on {t.device} but the buffer is on {self.device}")
        if mask is None:
            return h.shape[1], None
        if mask.dtype != torch.bool:
            raise TypeError(f"{op}: mask must be a bool tensor, got {mask.dtype}")
        if mask.shape == (self.batch,):
            mask = mask.unsqueeze(1)
        elif mask.shape != h.shape:
            raise ValueError(f"{op}: mask must have shape [{self.batch}] or {list(h.shape)}, got {list(mask.shape)}")
        return h.shape[1], mask.expand_as(h)

    def _checked_numerators(self, z: torch.Tensor, active: torch.Tensor | None) -> torch.Tensor:
        """z as int64, with inactive lanes set to 2^R_Z (a no-op) so that padding needs no valid z."""
        zl = z.long()
        if active is not None:
            zl = torch.where(active, zl, FORGET_ONE)
        bad = (zl < self.min_numerator) | (zl > FORGET_ONE)
        self._flag_bad(bad, self._numerator_message())
        return zl.clamp(self.min_numerator, FORGET_ONE)

    def _numerator_message(self) -> str:
        return f"forget numerators must lie in [{self.min_numerator}, {FORGET_ONE}]"

    def _flag_bad(self, bad: torch.Tensor, message: str, error: type[Exception] = ValueError) -> None:
        # On CPU a check costs nothing, so raise at once; on CUDA keep the flag on the device and
        # raise at the next host sync (stack sizing, is_empty), as a per-step check would stall.
        if self.eager_checks:
            if bool(bad.any()):
                raise error(message)
        else:
            self._bad_input |= bad.any()
            self._bad_error = (error, message)

    def _raise_bad_input(self) -> None:
        if not self.eager_checks and bool(self._bad_input):
            error, message = self._bad_error
            raise error(message)

    def _reserve_slot(self) -> None:
        """Make sure slot ``_top`` exists for this push without reading ``_top`` unless needed."""
        pushes_since_sync = self.pushes + 1 - self._pushes_at_sync
        bound = self._known_top + math.ceil(pushes_since_sync / self._overflow_gap)
        if bound + 1 > self._stack.shape[0]:
            self.syncs += 1
            self._raise_bad_input()
            self._known_top, self._pushes_at_sync = int(self._top), self.pushes
            # Keep free a share of the height, not a fixed number of words: the bound assumes every
            # push forgets max_bits, so it outruns the true height, and a fixed margin would be used
            # up every few steps. With half the height free the syncs grow with log T, not with T.
            needed = self._known_top + 2 + max(_MIN_FREE_WORDS, self._known_top // 2)
            if needed > self._stack.shape[0]:
                self._stack = _grow(self._stack, max(needed, self._stack.shape[0] * 3 // 2))
        if self.pushes >= self._flags.shape[0]:
            self._flags = _grow(self._flags, 2 * self._flags.shape[0])


def _grow(t: torch.Tensor, rows: int) -> torch.Tensor:
    """A copy of ``t`` with ``rows`` rows along dim 0 (new rows zero)."""
    out = torch.zeros((rows,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out
