"""What a forward sweep keeps for the backward sweep: the tape of a reversible stack, and the checks its sweeps leave
on the device until the caller reads them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from buffers import InformationBuffer, OverflowGuard

from .backends import Backend


@dataclass
class Tape:
    """What a forward sweep keeps for the backward sweep (and nothing per step but ``slices``)."""

    states: list[torch.Tensor]  # final int32 state of every layer
    initial: list[torch.Tensor]  # the true initial states (the tensors the sweep started from), for the exactness check
    buffer: InformationBuffer | None  # None: recorded for inference, not reversible
    backend: Backend  # where the sweep ran: the backward sweep must compute every gate the same way
    mask: torch.Tensor  # [T, B] bool, True on real tokens
    dropout: list[torch.Tensor | None]  # per layer: mask on its input (layer 0's is the caller's)
    slices: torch.Tensor | None  # [T, B, k] int32: top layer output[:, :k] after each step
    guard: OverflowGuard | None  # range errors of an inference sweep (a buffer keeps its own)
    checks: list[Check] = field(default_factory=list)  # what its sweeps left to read (:func:`settle`)

    def pop_checks(self) -> list[Check]:
        """The checks its sweeps left, now the caller's to read."""
        checks, self.checks = self.checks, []
        return checks

    def held_bytes(self) -> int:
        """Bytes the tape holds for the backward sweep: the buffer's reserved words and the int slices."""
        slices = 0 if self.slices is None else self.slices.numel() * self.slices.element_size()
        return self.buffer.reserved_bits() // 8 + slices

    def stored_bits(self) -> dict[str, float]:
        """Analytic bits this tape holds for backward: buffer words and stored slices."""
        slice_bits = 0 if self.slices is None else 32 * self.slices.numel()
        return {"buffer_bits": self.buffer.allocated_bits(), "optimal_buffer_bits": self.buffer.optimal_bits(),
                "slice_bits": slice_bits}


@dataclass
class Check:
    """What a sweep left to check on the device: integer device scalars (its buffer's error code and height, or
    the exactness guard's counts) and what to do with their values once read (raise, or run the sweep again).

    A sweep reads nothing on the host, and its end needs one read; a caller that runs several sweeps in a row
    (a model's encoder and decoder) may leave them all unread and read them together (:func:`settle`): one wait for
    the device instead of one a sweep, and a run of sweeps with no read between them, as a CUDA graph needs."""

    values: list[torch.Tensor]
    conclude: Callable[[list[int]], None]
    # whether concluding these values would run the sweep again, its stack having outgrown its room: a sweep
    # replayed from a CUDA graph, whose room is fixed, cannot be (revnmt.training.graphs)
    outgrown: Callable[[list[int]], bool] = lambda values: False


def read(checks: list[Check]) -> list[list[int]]:
    """Each check's values, in one host read for them all (none for no checks)."""
    if not checks:
        return []
    values = torch.stack([value for check in checks for value in check.values]).tolist()
    split = []
    for check in checks:
        split.append(values[:len(check.values)])
        values = values[len(check.values):]
    return split


def pop_checks(*tapes) -> list[Check]:
    """The checks the tapes' sweeps left (each tape's ``pop_checks()``), in the order of the tapes."""
    return [check for tape in tapes for check in tape.pop_checks()]


def conclude(checks: list[Check], room_fixed: bool = False) -> bool:
    """Read ``checks`` in one host read and conclude each in order (bad input and a failed guard raise).

    ``room_fixed``: the sweeps cannot run again with more room (they were replayed from a CUDA graph): if a stack
    outgrew its room, conclude none and return False, for the caller to run the step another way."""
    values = read(checks)
    if room_fixed and any(check.outgrown(v) for check, v in zip(checks, values)):
        return False
    for check, v in zip(checks, values):
        check.conclude(v)
    return True


def settle(*tapes) -> None:
    """Read the checks the tapes' sweeps left (:class:`Check`, taken from each tape's ``pop_checks()``) in one
    host read, and conclude each in the order the sweeps ran. Nothing to read, nothing read."""
    conclude(pop_checks(*tapes))
