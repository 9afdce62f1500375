"""Token embeddings recomputed per step, so reversible layers need not store their inputs."""

from __future__ import annotations

import torch
from torch import nn


class EmbeddedTokens:
    """A :class:`revnmt.rnn.SequenceInput` over time-major token ids [T, B].

    ``steps(start, stop)`` looks a chunk of steps' embeddings up again (with the batch's locked dropout
    mask) instead of keeping a [T, B, E] tensor, which would cost as much as the hidden states reversal
    saves. ``backward`` adds the chunk's gradient into the embedding rows it used (index_add: O(B·E) per
    step, where autograd through nn.Embedding would write a dense [V, E] gradient every time).
    """

    def __init__(self, embedding: nn.Embedding, ids: torch.Tensor, dropout: torch.Tensor | None) -> None:
        self.embedding, self.ids, self.dropout = embedding, ids, dropout

    def __len__(self) -> int:
        return self.ids.shape[0]

    def steps(self, start: int, stop: int) -> torch.Tensor:
        x = self.embedding.weight.detach()[self.ids[start:stop]]
        return x if self.dropout is None else x * self.dropout  # the mask [B, E] is locked over the steps

    def backward(self, start: int, grad: torch.Tensor) -> None:
        weight = self.embedding.weight
        if self.dropout is not None:
            grad = grad * self.dropout
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        ids, rows = self.ids[start: start + len(grad)].reshape(-1), grad.reshape(-1, grad.shape[-1])
        if self.embedding.padding_idx is not None:
            # as nn.Embedding: PAD's lookups add nothing (the row's gradient may have other sources, as the
            # output layer's when the embeddings are tied to it)
            rows = rows * (ids != self.embedding.padding_idx)[:, None]
        weight.grad.index_add_(0, ids, rows)
