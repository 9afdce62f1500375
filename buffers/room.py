"""How many stack levels a sweep's information buffer gets before the sweep runs.

A sweep on a GPU must not stop to read how high its stacks stand: every read makes the host wait for the device,
and a sweep whose launches depend on what it reads cannot be replayed as a recorded graph. So a sweep's buffer
gets a fixed room when it is made (``InformationBuffer(levels=...)``, :mod:`buffers.words`) and is read once, after
the sweep (:meth:`~buffers.InformationBuffer.settle`).

How much room? The arithmetic alone bounds a tile's height (every push forgetting the limit's bits in every
lane: :meth:`~buffers.words.WordStack.proven_height`), but gates forget far less than that: on IWSLT-size sweeps
the bound is 3.5 times the highest tile's true height (docs/memory.md#buffer-tiles), so a room sized by it would
hold 3.5 times the words. A :class:`StackRoom` learns from the sweeps before instead: the most levels per push
any of them reached, times the pushes of the next, with a margin, and never more than the proven bound. A sweep
that outgrows it runs again with the room it needed (its pushes compute the same states whatever the stack holds,
so the rerun is the same sweep, bit for bit), and the rate learns from it, so reruns stop once the rate has seen
the data: the first sweep of a stack always reruns, as it starts from no room at all, and later ones only when they
set a new highest rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Room above the learned rate. Heights follow the pushes closely: over a trained Multi30K RevLSTM's first 200
#: batches no sweep outgrew the highest rate seen before it but the first, at any margin from 1.0 to 1.5, while each
#: tenth of margin added a tenth of the words (benchmarks/README.md#stack-room-stack_roompy).
MARGIN = 1.0
#: Levels kept above it: short sweeps overflow a few times whatever their rate.
SPARE_LEVELS = 4


@dataclass
class StackRoom:
    """The stack levels to give the next sweep's buffer, learned from the sweeps so far (see the module
    docstring). One per stack of layers: its pushes, and so its rate, are its own."""

    levels_per_push: float = 0.0  # the most any sweep reached, highest tile's height over the sweep's pushes
    margin: float = MARGIN  # room given above that rate ...
    spare: int = SPARE_LEVELS  # ... and levels above that
    sweeps: int = 0  # sweeps recorded ...
    reruns: int = 0  # ... and how many of them outgrew their room

    def levels(self, pushes: int, proven: int) -> int:
        """Levels for a sweep of ``pushes`` pushes whose height the arithmetic bounds by ``proven``."""
        return min(proven, math.ceil(self.levels_per_push * pushes * self.margin) + self.spare)

    def record(self, height: int, pushes: int, rerun: bool) -> None:
        """Learn from a sweep that reached ``height`` in ``pushes`` pushes (``rerun``: it outgrew its room)."""
        self.sweeps += 1
        self.reruns += rerun
        if pushes:
            self.levels_per_push = max(self.levels_per_push, height / pushes)


__all__ = ["MARGIN", "SPARE_LEVELS", "StackRoom"]
