"""Ordinary recurrent layers with gradient checkpointing over time: what a user with a memory problem
would try first (``torch.utils.checkpoint``; Chen et al. 2016; Gruslys et al. 2016; Marian's
``--gradient-checkpointing``).

The sequence is cut into segments of K time steps. The forward pass runs each segment without keeping
what the layer computes inside it (gates, the states of its steps) and keeps only the segment's input and
the state it starts from; backward recomputes one segment at a time (with cuDNN on a GPU) and
backpropagates through it. The layer then holds O(T/K) states and one segment's internals instead of
every step's: with K = ⌈√T⌉ both are O(√T), for one more forward pass of the layer.

Unlike reversal, checkpointing keeps the layer's outputs alive whenever something downstream needs them
(the decoder's outputs feed attention and the loss), and the inputs of every segment.
"""

from __future__ import annotations

import math

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence
from torch.utils.checkpoint import checkpoint

from .ordinary import OrdinaryRNN

AUTO = "auto"  # K = ⌈√T⌉ for each batch


def segment_steps(setting: int | str, steps: int) -> int:
    """Time steps per checkpointed segment: ``setting`` itself, or ⌈√steps⌉ for ``"auto"``."""
    return max(1, math.ceil(math.sqrt(steps))) if setting == AUTO else int(setting)


def _select(state, index: torch.Tensor):
    """Rows ``index`` (dimension 1) of a state: h, or (h, c)."""
    if isinstance(state, tuple):
        return tuple(s.index_select(1, index) for s in state)
    return state.index_select(1, index)


def _head(state, rows: int):
    """The first ``rows`` rows of a [layers, N, H] state, contiguous as cuDNN wants its hx (a slice of dim 1 is not)."""
    if isinstance(state, tuple):
        return tuple(s[:, :rows].contiguous() for s in state)
    return state[:, :rows].contiguous()


def _joined(head, rest):
    """A segment's new state for its ``head`` rows, the rows that had already ended kept as they were."""
    if isinstance(head, tuple):
        return tuple(torch.cat([h, r[:, h.shape[1]:]], dim=1) for h, r in zip(head, rest))
    return torch.cat([head, rest[:, head.shape[1]:]], dim=1)


class RecomputedRNN(OrdinaryRNN):
    """An :class:`OrdinaryRNN` whose training forward pass is checkpointed every ``steps`` time steps
    (an int, or ``"auto"``: ⌈√T⌉ per batch). Without gradients (validation, translation) it is the
    ordinary layer; with them it gives the same outputs and gradients."""

    def __init__(self, cell: str, input_size: int, hidden_size: int, num_layers: int = 1, dropout: float = 0.0,
                 steps: int | str = AUTO) -> None:
        super().__init__(cell, input_size, hidden_size, num_layers, dropout)
        if steps != AUTO and (not isinstance(steps, int) or steps < 1):
            raise ValueError(f"checkpointed segments must be a positive number of steps or {AUTO!r}, got {steps!r}")
        self.steps = steps

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None, initial=None):
        """Outputs [T, B, H] (zeros past each row's length) and the final state, as OrdinaryRNN's."""
        if not torch.is_grad_enabled():
            return super().forward(x, lengths, initial)
        steps, batch = x.shape[0], x.shape[1]
        if lengths is None:
            lengths = torch.full((batch,), steps, dtype=torch.long)
        # One packing for the whole sequence: rows sorted by length, so that the rows still running at
        # any step are the first batch_sizes[t]; a segment of steps is then a contiguous slice of it.
        packed = pack_padded_sequence(x, lengths.cpu(), enforce_sorted=False)
        if initial is None:
            zeros = x.new_zeros(self.num_layers, batch, self.hidden_size)
            initial = (zeros, zeros) if self.cell == "lstm" else zeros
        state = _select(initial, packed.sorted_indices)
        k = segment_steps(self.steps, len(packed.batch_sizes))
        outputs, offset = [], 0
        for start in range(0, len(packed.batch_sizes), k):
            sizes = packed.batch_sizes[start: start + k]
            rows, count = int(sizes[0]), int(sizes.sum())
            out, head = checkpoint(self._segment, packed.data[offset: offset + count], sizes, _head(state, rows),
                                   use_reentrant=False)
            outputs.append(out)
            state = _joined(head, state)
            offset += count
        out = PackedSequence(torch.cat(outputs), packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)
        return pad_packed_sequence(out, total_length=steps)[0], _select(state, packed.unsorted_indices)

    def _segment(self, data: torch.Tensor, sizes: torch.Tensor, state):
        out, final = self.rnn(PackedSequence(data, sizes), state)
        return out.data, final

    def held_bytes(self, steps: int, batch: int) -> int:
        """What the checkpoints hold outside autograd's saved tensors in a forward pass of ``steps`` steps:
        every segment's input and starting state (the input is held only by them when nothing else needs
        it)."""
        k = segment_steps(self.steps, steps)
        states = math.ceil(steps / k) * self.num_layers * batch * self.hidden_size * (2 if self.cell == "lstm" else 1)
        inputs = steps * batch * self.rnn.input_size
        return next(self.parameters()).element_size() * (states + inputs)
