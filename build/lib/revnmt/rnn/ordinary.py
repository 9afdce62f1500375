"""Ordinary recurrent layers (nn.GRU / nn.LSTM, hence cuDNN on GPU): the baselines.

They store every hidden state for backpropagation, which is exactly what reversible layers avoid;
keeping them behind the same options lets every experiment switch with one flag.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

ORDINARY_CELLS = {"gru": nn.GRU, "lstm": nn.LSTM}


class OrdinaryRNN(nn.Module):
    """A stacked GRU or LSTM over padded [T, B, I] input with per-row lengths."""

    def __init__(self, cell: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if cell not in ORDINARY_CELLS:
            raise ValueError(f"unknown ordinary cell {cell!r}; choose one of {sorted(ORDINARY_CELLS)}")
        self.cell = cell
        self.rnn = ORDINARY_CELLS[cell](input_size, hidden_size, num_layers,
                                        dropout=dropout if num_layers > 1 else 0.0)
        self.hidden_size, self.num_layers = hidden_size, num_layers

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None, initial=None):
        """Outputs [T, B, H] (zeros past each row's length) and the final state (h, or (h, c))."""
        if lengths is None:
            return self.rnn(x, initial)
        # Packing makes every row stop at its own length, so the final state is the last real token's.
        packed = pack_padded_sequence(x, lengths.cpu(), enforce_sorted=False)
        out, final = self.rnn(packed, initial)
        return pad_packed_sequence(out, total_length=x.shape[0])[0], final
