"""Luong "general" attention over a memory that need not be the encoder's hidden states."""

from __future__ import annotations

import torch
from torch import nn


class GeneralAttention(nn.Module):
    """score_j = (W_in q)·m_j; context = Σ softmax(score)_j m_j; out = tanh(W_out [context; q]).

    The memory may be source embeddings, stored slices of the encoder state, both, or the full
    hidden states (ordinary models), so its size ``memory_dim`` is independent of the query size.
    """

    def __init__(self, query_dim: int, memory_dim: int) -> None:
        super().__init__()
        self.w_in = nn.Linear(query_dim, memory_dim, bias=False)
        self.w_out = nn.Linear(memory_dim + query_dim, query_dim, bias=False)

    def forward(self, query: torch.Tensor, memory: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        """query [N, Q] or [N, T, Q]; memory [N, S, M]; pad_mask [N, S] True on padding."""
        single = query.dim() == 2
        q = query.unsqueeze(1) if single else query
        context = torch.bmm(self._weights(q, memory, pad_mask), memory)
        out = torch.tanh(self.w_out(torch.cat([context, q], dim=-1)))
        return out.squeeze(1) if single else out

    def weights(self, query: torch.Tensor, memory: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        """The attention distribution [N, S] of a query [N, Q] over the memory (padding gets 0)."""
        return self._weights(query.unsqueeze(1), memory, pad_mask).squeeze(1)

    def _weights(self, q: torch.Tensor, memory: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        scores = torch.bmm(self.w_in(q), memory.transpose(1, 2))  # [N, T, S]
        return torch.softmax(scores.masked_fill(pad_mask.unsqueeze(1), float("-inf")), dim=-1)
