"""Push and pop plans: the buffer's books for a caller that runs the update inside a kernel of its own (a fused step).

An RNN cell's half-step computes its gates and then updates its state, h ← z·h + u, through the
buffer. A fused kernel does both in one launch: it computes each lane's z and u where the buffer's
own update kernel would load them, then runs the backend's walk over the words (for Triton,
:func:`buffers.backends.triton_kernels.push_walk` with the gate computation as a ``triton.jit``
function argument; for numba, :func:`buffers.backends.numba_loops.push_terms` on the integer terms
the caller's loop computed). What stays on the host is the bookkeeping, the same for every backend
and for :meth:`~buffers.InformationBuffer.push_update` itself: room on the stack, the flag each push
writes, the widths that check that pops mirror pushes, the bits destroyed. That is this module:

    plan = buf.plan_push((width_c, 0), (width_h, stored), limit=limit)  # updates in push order
    kernel[tiles](..., *plan.tensors(), plan.tile_rows, plan.flags[0], plan.flags[1], ..., limit.min_numerator)
    plan.done(lost_c, lost_h)  # after the kernel: record the pushes (and raise eager errors)

    plan = buf.plan_pop((width_c, 0), (width_h, stored), limit=limit)  # the same updates, in push order
    kernel[tiles](..., *plan.tensors(), plan.tile_rows, plan.flags[0], plan.flags[1], ...)  # pops h, then c
    plan.done()

An update is ``(width, stored)``: a [batch, width] state slice whose first ``stored`` columns are
kept exactly elsewhere and skip the buffer (see :meth:`~buffers.InformationBuffer.push_update`). The
caller's gates obey a :class:`~buffers.fixed.ForgetLimit`, which must be the buffer's: the walk clamps
the numerators to its ``min_numerator``, and the buffer sizes its stack by it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .words import OK, WordStack

#: An update of a [batch, width] state slice whose first ``stored`` columns skip the buffer.
SliceUpdate = tuple[int, int]


class _Plan:
    def __init__(self, words: WordStack, updates: Sequence[SliceUpdate]) -> None:
        self.words = words
        self.widths = [words.update_widths(width, stored) for width, stored in updates]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The word tensors a walk reads and writes in place: live words, stack, heights, flags, error code."""
        w = self.words
        return w.curr, w.stack, w.top, w.flags, w.status

    @property
    def tile_rows(self) -> int:
        """Rows per tile of the buffer (see :mod:`buffers.words`): a walk's program takes one tile."""
        return self.words.tile_rows

    def _flags_from(self, first: int) -> list[int]:
        flags = []
        for widths in self.widths:
            flags.append(first)
            first += len(widths)
        return flags


class PushPlan(_Plan):
    """The pushes of one fused call: made by :meth:`InformationBuffer.plan_push`, the stack already
    large enough for them. ``flags[k]`` is the first overflow flag update k writes."""

    def __init__(self, words: WordStack, updates: Sequence[SliceUpdate]) -> None:
        super().__init__(words, updates)
        words.reserve(sum(len(w) for w in self.widths))
        self.flags = self._flags_from(words.pushes)

    def done(self, *lost: torch.Tensor | float, status: int = OK) -> None:
        """Record the pushes after the kernel ran: the bits each update destroyed (a float, or a device
        scalar that is never read per step) and, from a CPU walk that returns it, its error code."""
        words = self.words
        words.record_code(status)
        for widths, bits in zip(self.widths, lost, strict=True):
            if widths:  # an update whose columns are all stored pushes nothing
                words.record_push(widths, bits)
        words.after_call()


class PopPlan(_Plan):
    """The pops of one fused call, checked to mirror the last pushes: made by
    :meth:`InformationBuffer.plan_pop` with the updates in push order (the walk pops them in reverse).
    ``flags[k]`` is the first overflow flag update k's push wrote."""

    def __init__(self, words: WordStack, updates: Sequence[SliceUpdate]) -> None:
        super().__init__(words, updates)
        popped = [w for widths in self.widths for w in widths]
        words.check_pop(popped)
        self.flags = self._flags_from(words.pushes - len(popped))

    def done(self, status: int = OK) -> None:
        """Record the pops after the kernel ran (and, from a CPU walk that returns it, its error code)."""
        words = self.words
        words.record_code(status)
        for widths in reversed(self.widths):
            if widths:
                words.record_pop(widths)
        words.after_call()


__all__ = ["PopPlan", "PushPlan", "SliceUpdate"]
