"""The decoder's initial state from a bidirectional encoder's two final states.

A unidirectional encoder's final state is the decoder's initial state as it is. With two directions, each
decoder layer l starts from ``tanh(W_l [forward_l ; backward_l] + b_l)`` (the "bridge" of JoeyNMT and
OpenNMT-py; Bahdanau et al. 2015 use the backward state alone). A state is a layer's whole recurrent state,
``[h | c]`` for LSTMs, in both families, so a reversible model and its ordinary twin have the same bridge.

A reversible decoder takes its initial state in fixed point: the bridge's output is rounded to it, and its
gradient reaches the bridge straight through the rounding, as every fixed-point value of the model does
(:func:`buffers.straight_through`).
"""

from __future__ import annotations

import torch
from torch import nn


class Bridge(nn.Module):
    """One ``Linear(2·state, state)`` and tanh per decoder layer."""

    def __init__(self, state_size: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(2 * state_size, state_size) for _ in range(layers))

    def forward(self, forward: list[torch.Tensor], backward: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each layer's initial state [B, state] from the two directions' final states of that layer."""
        return [torch.tanh(layer(torch.cat([f, b], dim=-1))) for layer, f, b in zip(self.layers, forward, backward)]
