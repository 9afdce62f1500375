"""What a forward sweep keeps for the backward sweep: the tape of a reversible stack."""

from __future__ import annotations

from dataclasses import dataclass

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

    def held_bytes(self) -> int:
        """Bytes the tape holds for the backward sweep: the buffer's reserved words and the int slices."""
        slices = 0 if self.slices is None else self.slices.numel() * self.slices.element_size()
        return self.buffer.reserved_bits() // 8 + slices

    def stored_bits(self) -> dict[str, float]:
        """Analytic bits this tape holds for backward: buffer words and stored slices."""
        slice_bits = 0 if self.slices is None else 32 * self.slices.numel()
        return {"buffer_bits": self.buffer.allocated_bits(), "optimal_buffer_bits": self.buffer.optimal_bits(),
                "slice_bits": slice_bits}
