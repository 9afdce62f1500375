"""The information buffer's words and their bookkeeping, shared by every backend.

Layout. Every lane owns a stack of int64 words: ``units`` lanes per batch row, each row's columns
folded onto its own lanes, or (``share_rows``) all rows' columns folded onto all the lanes. The live
word of every lane sits in ``curr``, [batch, units] or [1, batch·units] when rows share; full words
sit in ``stack`` [capacity, ...], all lanes together, so adding a word is one slab write instead
of a per-lane branch. When any *active* lane's live word could overflow on the next multiply
(B ≥ 2^(63−R_Z)), the whole live slab is pushed and reset to zero: all lanes grow together, which
keeps the structure one dense tensor. A flag per push remembers which ones overflowed, so the pops
can undo them at the mirrored push.

A *group* (one update of a state slice) makes one push per chunk of ``lanes`` folded columns; the
host keeps every push's width, which checks that pops mirror pushes without reading the device.

No host sync per step. Whether a push overflows is known only on the device, so the stack height
``top`` is a device tensor. The host needs just an upper bound on it to keep the stack large enough:
after a reset a word grows by at most k bits per push (k = max forgotten bits), so two overflows
are at least ⌈53/k⌉ pushes apart. The host reads the true height only when that bound reaches the
capacity; capacity then grows with the height, so the reads grow with log T and growth copies are
amortized O(1) per word. Bad input (a range error, a bad numerator) is likewise an error code on
the device, ``status``: raised at once with ``eager_checks`` (a CPU reads it for free), else at the
next read the stack needs anyway or at :meth:`WordStack.check`.
"""

from __future__ import annotations

import math

import torch

from .fixed import FORGET_ONE, FORGET_RADIX, FixedPointOverflowError, ForgetLimit

#: A live word at or above this value could exceed int64 in B·2^R_Z + r, so it is pushed first.
WORD_LIMIT = 1 << (63 - FORGET_RADIX)
_MIN_FREE_WORDS = 4  # stack slots kept free after a read of the height, so reads stay rare

# Error codes in ``WordStack.status``; backends record the largest they meet, so the most specific
# wins (a pop that decodes out of range says the pop did not mirror its push).
OK, BAD_NUMERATOR, TERM_OVERFLOW, STATE_OVERFLOW, OUT_OF_RANGE = 0, 1, 2, 3, 4


class BufferError(RuntimeError):
    """Misuse of an :class:`~buffers.InformationBuffer`: a pop with nothing to pop, or out of LIFO order."""


def status_error(code: int, min_numerator: int) -> Exception:
    """The exception an error code of ``WordStack.status`` stands for."""
    if code == BAD_NUMERATOR:
        return ValueError(numerator_message(min_numerator))
    if code == TERM_OVERFLOW:
        return FixedPointOverflowError("fixed-point overflow in to_fixed: a value left the int32 range")
    if code == STATE_OVERFLOW:
        return FixedPointOverflowError("fixed-point overflow in state update: a value left the int32 range")
    if code == OUT_OF_RANGE:
        return BufferError("pop produced a value outside int32: h was not the output of the matching push")
    raise AssertionError(f"unknown buffer status {code}")


def numerator_message(min_numerator: int) -> str:
    """What a push with a numerator outside [min_numerator, 2^R_Z] is told."""
    return f"forget numerators must lie in [{min_numerator}, {FORGET_ONE}]"


class WordStack:
    """The device tensors of an information buffer and the host-side record of its pushes.

    Backends read and write ``curr``, ``stack``, ``top``, ``flags`` and ``status`` in place; the
    host side (:meth:`reserve`, :meth:`record_push`, :meth:`check_pop`, :meth:`record_pop`) keeps
    them large enough and the pops in mirror order. See the module docstring for the layout.
    """

    def __init__(self, batch: int, units: int, device: torch.device, limit: ForgetLimit, share_rows: bool,
                 eager_checks: bool) -> None:
        self.batch, self.units, self.device, self.eager_checks = batch, units, device, eager_checks
        self.limit = limit  # numerators below limit.min_numerator are rejected
        bits_per_push = FORGET_RADIX if limit.bits is None else limit.bits
        self._overflow_gap = math.ceil((63 - FORGET_RADIX) / bits_per_push)

        long = dict(dtype=torch.int64, device=device)
        # The lanes as the pushes see them: [rows, lanes], one row of all lanes when rows share them.
        self.lane_rows, lanes = (1, batch * units) if share_rows else (batch, units)
        self.curr = torch.zeros(self.lane_rows, lanes, **long)
        self.stack = torch.zeros(1 + _MIN_FREE_WORDS, self.lane_rows, lanes, **long)
        self.top = torch.zeros(1, **long)
        # One overflow flag per push (a byte each: one indexed write per push, where a packed bit
        # log costs half a dozen ops; the flags are < 1 % of the words for any real batch).
        self.flags = torch.zeros(64, dtype=torch.bool, device=device)
        self.status = torch.zeros(1, dtype=torch.int32, device=device)
        self._group_lost: list[torch.Tensor | float] = []  # bits each pushed group destroyed
        self._widths: list[int] = []  # width of every push, host side: checks LIFO order for free
        self._widths_of: dict[int, list[int]] = {}  # chunk_widths by group width: the same few every step
        self._known_top = 0  # true stack height at the last read ...
        self._pushes_at_read = 0  # ... and the number of pushes then
        self.syncs = 0  # reads of the height done to size the stack (reported by the benchmarks)

    @property
    def lanes(self) -> int:
        """Lanes per lane row: the columns one push takes from each (folded) row."""
        return self.curr.shape[1]

    @property
    def pushes(self) -> int:
        """Pushes not yet popped."""
        return len(self._widths)

    # ------------------------------------------------------------------ widths and order

    def fold(self, t: torch.Tensor) -> torch.Tensor:
        """[batch, w] as the lanes take it: unchanged, or one row of batch·w columns when rows share lanes."""
        return t.reshape(self.lane_rows, -1)

    def chunk_widths(self, width: int) -> list[int]:
        """The width of each push that a folded group of this width makes (not to be modified)."""
        # Memoized: with shared rows a group makes dozens of pushes, and building their list per call
        # would cost a noticeable share of a compiled update (docs/performance.md#memoized-push-widths).
        if width not in self._widths_of:
            lanes = self.lanes
            self._widths_of[width] = [min(lanes, width - start) for start in range(0, width, lanes)]
        return self._widths_of[width]

    def update_widths(self, width: int, stored: int) -> list[int]:
        """Push widths of an update of ``width`` columns of every row whose first ``stored`` skip the buffer."""
        return self.chunk_widths((width - stored) * self.batch // self.lane_rows)

    def check_pop(self, widths: list[int]) -> None:
        """Raise unless the last pushes had these widths (in push order): pops must mirror pushes."""
        if len(self._widths) >= len(widths) and self._widths[len(self._widths) - len(widths):] == widths:
            return  # the usual case, one list comparison; the loop below finds what is wrong
        for back, width in enumerate(reversed(widths), 1):
            if len(self._widths) < back:
                raise BufferError("pop on an empty InformationBuffer: every pop needs a matching push")
            if self._widths[-back] != width:
                raise BufferError(
                    f"pop of width {width} does not mirror the last push (width {self._widths[-back]}): "
                    "pops must come in exactly the reverse order of pushes"
                )

    # ------------------------------------------------------------------ capacity

    def reserve(self, pushes: int) -> None:
        """Make sure the next ``pushes`` pushes have stack slots and flags, reading the height on the
        host only when the proven bound says the stack might be full."""
        after = len(self._widths) + pushes
        bound = self._known_top + math.ceil((after - self._pushes_at_read) / self._overflow_gap)
        if bound + 1 > self.stack.shape[0]:
            self.syncs += 1
            self.check()
            self._known_top, self._pushes_at_read = int(self.top), len(self._widths)
            # Keep free a share of the height, not a fixed number of words: the bound assumes every
            # push forgets limit.bits, so it outruns the true height, and a fixed margin would be used
            # up every few steps. With half the height free the reads grow with log T, not with T.
            needed = (self._known_top + 1 + math.ceil(pushes / self._overflow_gap)
                      + max(_MIN_FREE_WORDS, self._known_top // 2))
            if needed > self.stack.shape[0]:
                self.stack = _grow(self.stack, max(needed, self.stack.shape[0] * 3 // 2))
        if after > self.flags.shape[0]:
            self.flags = _grow(self.flags, max(after, 2 * self.flags.shape[0]))

    def reserve_flags(self, pushes: int) -> None:
        """Room in the flag log for ``pushes`` more pushes, grown to exactly that (:meth:`reserve` doubles)."""
        after = len(self._widths) + pushes
        if after > self.flags.shape[0]:
            self.flags = _grow(self.flags, after)

    # ------------------------------------------------------------------ records

    def record_push(self, widths: list[int], lost: torch.Tensor | float) -> None:
        """Note a pushed group: its pushes' widths and the bits it destroyed."""
        self._widths.extend(widths)
        self._group_lost.append(lost)

    def record_pop(self, widths: list[int]) -> None:
        """Note a popped group (after :meth:`check_pop`)."""
        del self._widths[-len(widths):]
        self._group_lost.pop()
        # After popping below the last read the old height still bounds the stack.
        self._pushes_at_read = min(self._pushes_at_read, len(self._widths))

    def record_error(self, bad: torch.Tensor, code: int) -> None:
        """Record ``code`` where any element of ``bad`` is set, without reading the device."""
        torch.maximum(self.status, bad.any().int() * code, out=self.status)

    def record_code(self, code: int) -> None:
        """Record an error code known on the host (the compiled CPU loops return theirs)."""
        if code != OK:
            self.status.clamp_(min=code)

    def after_call(self) -> None:
        """With eager checks, raise a recorded error now (one read of a CPU scalar)."""
        if self.eager_checks:
            self.check()

    def check(self) -> None:
        """Raise the recorded error, if any (one host read); the error is cleared once raised."""
        code = int(self.status)
        if code != OK:
            self.status.zero_()
            raise status_error(code, self.limit.min_numerator)

    # ------------------------------------------------------------------ accounting

    def is_empty(self) -> bool:
        """True when every push has been popped and every word is back to zero (one host sync)."""
        self.check()
        return not self._widths and int(self.top) == 0 and not bool(self.curr.any())

    def word_count(self) -> int:
        """Words per lane in use: the stacked ones plus the live one (one host sync)."""
        return int(self.top) + 1

    def allocated_bits(self) -> int:
        """Words in use plus the overflow log, in bits (flags count 8 bits each: bytes)."""
        return 64 * self.word_count() * self.batch * self.units + 8 * self.pushes

    def reserved_bits(self) -> int:
        """Bits of device memory the tensors occupy, spare capacity and bookkeeping included."""
        tensors = [self.curr, self.stack, self.top, self.flags, self.status]
        tensors += [t for t in self._group_lost if isinstance(t, torch.Tensor)]
        return 8 * sum(t.numel() * t.element_size() for t in tensors)

    def optimal_bits(self) -> float:
        """Σ −log2(z* / 2^R_Z) over active lanes of the groups not yet popped."""
        on_host = sum(x for x in self._group_lost if not isinstance(x, torch.Tensor))
        on_device = [t.reshape(()) for t in self._group_lost if isinstance(t, torch.Tensor)]
        return float(on_host) + (float(torch.stack(on_device).sum()) if on_device else 0.0)


def _grow(t: torch.Tensor, rows: int) -> torch.Tensor:
    """A copy of ``t`` with ``rows`` rows along dim 0 (new rows zero)."""
    out = torch.zeros((rows,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out
