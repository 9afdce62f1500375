"""Luong "general" attention over a memory that need not be the encoder's hidden states."""

from __future__ import annotations

import torch
from torch import nn

#: Elements of the memory gradient's temporaries in :class:`_AttendInto`'s backward: blocks of rows of at most this
#: many [S, M] elements (8 MiB), whatever the batch.
GRAD_BLOCK = 1 << 21


class GeneralAttention(nn.Module):
    """score_j = (W_in q)·m_j; context = Σ softmax(score)_j m_j; out = tanh(W_out [context; q]).

    The memory may be source embeddings, stored slices of the encoder state, both, or the full
    hidden states (ordinary models), so its size ``memory_dim`` is independent of the query size.
    """

    def __init__(self, query_dim: int, memory_dim: int) -> None:
        super().__init__()
        self.w_in = nn.Linear(query_dim, memory_dim, bias=False)
        self.w_out = nn.Linear(memory_dim + query_dim, query_dim, bias=False)

    def forward(self, query: torch.Tensor, memory: torch.Tensor, pad_mask: torch.Tensor,
                memory_grad: torch.Tensor | None = None) -> torch.Tensor:
        """query [N, Q] or [N, T, Q]; memory [N, S, M]; pad_mask [N, S] True on padding.

        ``memory_grad`` (shaped as ``memory``): backward adds d loss / d memory into it in place, and the memory
        gets no gradient through autograd (see :class:`_AttendInto`); the values are those autograd computes."""
        single = query.dim() == 2
        q = query.unsqueeze(1) if single else query
        if memory_grad is None:
            context = torch.bmm(self._weights(q, memory, pad_mask), memory)
        else:
            context = _AttendInto.apply(self.w_in(q), memory.detach(), pad_mask, memory_grad)
        out = torch.tanh(self.w_out(torch.cat([context, q], dim=-1)))
        return out.squeeze(1) if single else out

    def weights(self, query: torch.Tensor, memory: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        """The attention distribution [N, S] of a query [N, Q] over the memory (padding gets 0)."""
        return self._weights(query.unsqueeze(1), memory, pad_mask).squeeze(1)

    def _weights(self, q: torch.Tensor, memory: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        scores = torch.bmm(self.w_in(q), memory.transpose(1, 2))  # [N, T, S]
        return torch.softmax(scores.masked_fill(pad_mask.unsqueeze(1), float("-inf")), dim=-1)


class _AttendInto(torch.autograd.Function):
    """The context softmax(q'·memoryᵀ)·memory (padding masked) of projected queries q' [N, T, M], whose backward
    adds d loss / d memory into a given tensor, a block of rows at a time, instead of returning it.

    Autograd would make the memory's gradient of every call a new [N, S, M] tensor, the sum of two more (one per
    product with the memory), and then add it to the memory's accumulated gradient: over a large batch those
    temporaries, three memories' worth, would be the largest part of a reversible training step's peak
    (docs/memory.md). Here they are a block of rows. The values are the same bits: every product is the one
    autograd computes, rows are independent, and the sums are taken in the same order.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, memory: torch.Tensor, pad_mask: torch.Tensor,
                memory_grad: torch.Tensor) -> torch.Tensor:
        scores = torch.bmm(q, memory.transpose(1, 2)).masked_fill(pad_mask.unsqueeze(1), float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        ctx.save_for_backward(q, memory, pad_mask, weights)
        ctx.memory_grad = memory_grad
        return torch.bmm(weights, memory)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, memory, pad_mask, weights = ctx.saved_tensors
        # autograd's derivatives of the forward's ops, in its order
        grad_weights = grad.bmm(memory.transpose(1, 2))
        grad_scores = torch._softmax_backward_data(grad_weights, weights, -1, weights.dtype)
        grad_scores = grad_scores.masked_fill(pad_mask.unsqueeze(1), 0)
        rows = max(1, GRAD_BLOCK // (memory.shape[1] * memory.shape[2]))
        for start in range(0, len(memory), rows):
            block = slice(start, start + rows)
            from_context = weights[block].transpose(1, 2).bmm(grad[block])
            from_scores = q[block].transpose(1, 2).bmm(grad_scores[block]).transpose(1, 2)
            ctx.memory_grad[block] += from_context.add_(from_scores)
        return grad_scores.bmm(memory), None, None, None
