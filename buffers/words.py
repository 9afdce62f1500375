"""The information buffer's words and their bookkeeping, shared by every backend.

Layout. Every batch row owns ``units`` lanes, each a stack of int64 words: the live word in ``curr``
[batch, units], full words below it in ``stack`` [capacity, batch, units]. A group (one update of a
state slice, [batch, width]) is pushed in chunks of ``units`` columns: chunk c puts columns
[c·units, (c+1)·units) of every row on that row's lanes. The rows form *tiles* of ``tile_rows``
sentences (the last may have fewer), and a tile is the unit of the stack: when any *active* lane of
a tile has a live word that could overflow on the next multiply (B ≥ 2^(63−R_Z)), the tile's live
words are pushed together and reset to zero, and the tile's height ``top[tile]`` grows by one. So a
stack level is a dense slab of the tile's lanes, and a bit per push and tile remembers which tiles
overflowed, so the pops can undo them at the mirrored push: ``flags`` [⌈pushes/8⌉, tiles] uint8, push
p's bit being bit p mod 8 of row ⌊p/8⌋ (:func:`flag_position`).

Tiles are independent: what a tile's rows compute depends on those rows only, never on their batch
mates in other tiles (the words feed the lowest bits of every product, so a batch-wide slab would make
every sentence's low bits depend on the whole batch), and each tile's walk is a program of its own on
a GPU. ``tile_rows`` and ``units`` are part of what a run computes.

The host keeps every push's width, which checks that pops mirror pushes without reading the device.

No host sync per step. Whether a push overflows is known only on the device, so the heights ``top``
are a device tensor, and the stack's room is decided one of two ways:

- *Fixed room* (``levels``): a sweep, which knows how many pushes it will make, gets ``levels`` stack levels
  before it starts and never reads the device while it runs. A push that finds its tile's stack full stores
  nothing but still counts the height, so after the sweep one read (:meth:`WordStack.settle`) tells whether
  the room held, and if not, exactly how much the sweep needed: its caller runs it again with that room
  (pushes compute the same states whatever the stack holds, so the rerun is the same sweep, bit for bit).
- *Growing room* (the default, for a caller that pushes and pops as it goes): the host needs an upper
  bound on the highest stack. After a reset a word grows by at most k bits per push (k = max forgotten
  bits), so two overflows of a tile are at least ⌈53/k⌉ pushes apart, and every tile sees every push. The
  host reads the heights only when that bound reaches the capacity; capacity then grows with the highest,
  so the reads grow with log T and growth copies are amortized O(1) per word.

Either way the stack keeps one level above its room that no height reaches: the backends store a tile's
live words there when it does not overflow (a store without a branch) or when a fixed room is full.

Bad input (a range error, a bad numerator) is an error code on the device, ``status``: raised at once with
``eager_checks`` (a CPU reads it for free), else at the next read the stack needs anyway or at
:meth:`WordStack.check`.
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


#: Sentences per tile when a caller names none. Smaller tiles waste fewer words on rows that forget less than
#: their tile's fullest (or are padding) and cost more flag bits; 8 keeps the words in use at or below those of
#: lanes shared by a whole batch (docs/memory.md#buffer-tiles). On a GPU a tile is one program's work.
TILE_ROWS = 8


class WordStack:
    """The device tensors of an information buffer and the host-side record of its pushes.

    Backends read and write ``curr``, ``stack``, ``top``, ``flags`` and ``status`` in place; the
    host side (:meth:`reserve`, :meth:`record_push`, :meth:`check_pop`, :meth:`record_pop`) keeps
    them large enough and the pops in mirror order. See the module docstring for the layout.
    """

    def __init__(self, batch: int, units: int, device: torch.device, limit: ForgetLimit, tile_rows: int,
                 eager_checks: bool, levels: int | None = None) -> None:
        self.batch, self.units, self.device, self.eager_checks = batch, units, device, eager_checks
        self.limit = limit  # numerators below limit.min_numerator are rejected
        self._overflow_gap = _overflow_gap(limit)

        self.tile_rows = min(tile_rows, batch)
        self.tiles = math.ceil(batch / self.tile_rows)
        long = dict(dtype=torch.int64, device=device)
        self.curr = torch.zeros(batch, units, **long)
        self.fixed_room = levels is not None  # see the module docstring: fixed or growing room
        self.stack = torch.zeros(1 + (_MIN_FREE_WORDS if levels is None else levels), batch, units, **long)
        self.top = torch.zeros(self.tiles, **long)
        # One overflow bit per push and tile, 8 to a byte: with few lanes (3, numba's default) a push is a few
        # words a tile, and a byte a flag would cost as much again as the words (docs/memory.md#buffer-tiles).
        self.flags = torch.zeros(8, self.tiles, dtype=torch.uint8, device=device)
        self.status = torch.zeros(1, dtype=torch.int32, device=device)
        self._rows_and_tiles: tuple[torch.Tensor, torch.Tensor] | None = None  # made when a backend asks for them
        self._group_lost: list[torch.Tensor | float] = []  # bits each pushed group destroyed
        self._widths: list[int] = []  # width of every push, host side: checks LIFO order for free
        self._widths_of: dict[int, list[int]] = {}  # chunk_widths by group width: the same few every step
        self._known_top = 0  # highest stack at the last read ...
        self._pushes_at_read = 0  # ... and the number of pushes then
        self.syncs = 0  # reads of the heights done to size the stack (reported by the benchmarks)

    @property
    def lanes(self) -> int:
        """Lanes per row: the columns one push takes from each row."""
        return self.units

    @property
    def capacity(self) -> int:
        """Stack levels a tile may fill: the stack's but the spare one above them (see the module docstring)."""
        return self.stack.shape[0] - 1

    @property
    def pushes(self) -> int:
        """Pushes not yet popped."""
        return len(self._widths)

    def rows_and_tiles(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's index and its tile, [batch] int64 each on the device (for backends that index by them), made
        once per buffer: the torch backend indexes by them at every push and pop."""
        if self._rows_and_tiles is None:
            rows = torch.arange(self.batch, device=self.device)
            self._rows_and_tiles = rows, rows // self.tile_rows
        return self._rows_and_tiles

    # ------------------------------------------------------------------ widths and order

    def chunk_widths(self, width: int) -> list[int]:
        """The width of each push that a group of this width makes (not to be modified)."""
        # Memoized: a group makes up to dozens of pushes, and building their list per call would cost a
        # noticeable share of a compiled update (docs/performance.md#memoized-push-widths).
        if width not in self._widths_of:
            lanes = self.lanes
            self._widths_of[width] = [min(lanes, width - start) for start in range(0, width, lanes)]
        return self._widths_of[width]

    def update_widths(self, width: int, stored: int) -> list[int]:
        """Push widths of an update of ``width`` columns of every row whose first ``stored`` skip the buffer."""
        return self.chunk_widths(width - stored)

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

    def proven_height(self, pushes: int) -> int:
        """The highest a tile's stack can stand after ``pushes`` pushes from empty (:func:`proven_height`)."""
        return math.ceil(pushes / self._overflow_gap)

    def reserve(self, pushes: int) -> None:
        """Make sure the next ``pushes`` pushes have flags and, with growing room, stack slots, reading the
        heights on the host only when the proven bound says the highest stack might be full. A fixed room is
        checked after the sweep instead (:meth:`settle`)."""
        after = len(self._widths) + pushes
        if _flag_bytes(after) > self.flags.shape[0]:
            self.flags = _grow(self.flags, max(_flag_bytes(after), 2 * self.flags.shape[0]))
        if self.fixed_room:
            return
        bound = self._known_top + self.proven_height(after - self._pushes_at_read)
        if bound + 1 > self.stack.shape[0]:
            self.syncs += 1
            self.check()
            self._known_top, self._pushes_at_read = int(self.top.max()), len(self._widths)
            # Keep free a share of the height, not a fixed number of words: the bound assumes every
            # push forgets limit.bits, so it outruns the true height, and a fixed margin would be used
            # up every few steps. With a quarter of the height free the reads grow with log T, not with T,
            # and the stack grows geometrically with the height (each growth a copy). No more than that:
            # the highest tile sizes every tile's stack (docs/memory.md#buffer-tiles).
            needed = (self._known_top + 1 + math.ceil(pushes / self._overflow_gap)
                      + max(_MIN_FREE_WORDS, self._known_top // 4))
            if needed > self.stack.shape[0]:
                self.stack = _grow(self.stack, needed)

    def reserve_flags(self, pushes: int) -> None:
        """Room in the flag log for ``pushes`` more pushes, grown to exactly that (:meth:`reserve` doubles)."""
        after = _flag_bytes(len(self._widths) + pushes)
        if after > self.flags.shape[0]:
            self.flags = _grow(self.flags, after)

    def overflows(self) -> torch.Tensor:
        """Which tiles each unpopped push stacked, [pushes, tiles] bool: the flags unpacked (for tests and
        diagnosis; the backends read and write the bits in place)."""
        bits = (self.flags[:, None, :] >> torch.arange(8, dtype=torch.uint8, device=self.device)[None, :, None]) & 1
        return bits.reshape(-1, self.tiles)[: self.pushes].bool()

    # ------------------------------------------------------------------ records

    def record_push(self, widths: list[int], lost: torch.Tensor | float) -> None:
        """Note a pushed group: its pushes' widths and the bits it destroyed (a float, or a device tensor of
        them, summed when :meth:`optimal_bits` reads them)."""
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
        self._raise(int(self.status))

    def settle(self, *scalars: torch.Tensor) -> list[int]:
        """Raise the recorded error, if any, else return the highest tile's stack height and the integer device
        ``scalars`` a caller needs at the same time: one host read of them all, after a sweep. A height above
        :attr:`capacity` means a fixed room was too small, and by how much."""
        return self.conclude(torch.stack(self.to_settle(*scalars)).tolist())

    def to_settle(self, *scalars: torch.Tensor) -> list[torch.Tensor]:
        """What :meth:`settle` reads, as device scalars (int64), for a caller that reads several buffers' at once
        and passes each its values back (:meth:`conclude`)."""
        return [self.status.long()[0], self.top.max(), *(x.long() for x in scalars)]

    def conclude(self, values: list[int]) -> list[int]:
        """:meth:`settle`'s end, from the values :meth:`to_settle` named, read: raise the recorded error, if any,
        else return the height and the scalars' values."""
        code, *rest = values
        self._raise(code)
        return rest

    def _raise(self, code: int) -> None:
        if code != OK:
            self.status.zero_()
            raise status_error(code, self.limit.min_numerator)

    # ------------------------------------------------------------------ accounting

    def is_empty(self) -> bool:
        """True when every push has been popped and every word is back to zero (one host sync)."""
        self.check()
        return not self._widths and not bool(self.top.any()) and not bool(self.curr.any())

    def heights(self) -> list[int]:
        """Each tile's stack height (one host sync)."""
        return self.top.tolist()

    def words_in_use(self) -> int:
        """Words in use, over all lanes: each tile's stacked ones plus its live one (one host sync)."""
        rows = [min(self.tile_rows, self.batch - tile * self.tile_rows) for tile in range(self.tiles)]
        return self.units * sum((height + 1) * n for height, n in zip(self.heights(), rows))

    def allocated_bits(self) -> int:
        """Words in use plus the overflow log (a bit per push and tile), in bits."""
        return 64 * self.words_in_use() + self.pushes * self.tiles

    def reserved_bits(self) -> int:
        """Bits of device memory the tensors occupy, spare capacity and bookkeeping included."""
        tensors = [self.curr, self.stack, self.top, self.flags, self.status]
        tensors += [t for t in self._group_lost if isinstance(t, torch.Tensor)]
        return 8 * sum(t.numel() * t.element_size() for t in tensors)

    def optimal_bits(self) -> float:
        """Σ −log2(z* / 2^R_Z) over active lanes of the groups not yet popped."""
        on_host = sum(x for x in self._group_lost if not isinstance(x, torch.Tensor))
        on_device = [t.reshape(-1) for t in self._group_lost if isinstance(t, torch.Tensor)]  # a scalar or per tile
        return float(on_host) + (float(torch.cat(on_device).sum()) if on_device else 0.0)


def proven_height(limit: ForgetLimit, pushes: int) -> int:
    """The highest a tile's stack can stand after ``pushes`` pushes from empty, by the arithmetic alone (every push
    forgetting ``limit.bits`` in every lane): a room no sweep can outgrow."""
    return math.ceil(pushes / _overflow_gap(limit))


def _overflow_gap(limit: ForgetLimit) -> int:
    """The fewest pushes between two overflows of a tile: a reset word takes that many to reach WORD_LIMIT."""
    bits_per_push = FORGET_RADIX if limit.bits is None else limit.bits
    return math.ceil((63 - FORGET_RADIX) / bits_per_push)


def flag_position(push: int) -> tuple[int, int]:
    """Where push ``push``'s overflow bits are: (row of ``flags``, bit in each tile's byte)."""
    return push >> 3, push & 7


def _flag_bytes(pushes: int) -> int:
    return (pushes + 7) >> 3


def _grow(t: torch.Tensor, rows: int) -> torch.Tensor:
    """A copy of ``t`` with ``rows`` rows along dim 0 (new rows zero)."""
    out = torch.zeros((rows,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out
