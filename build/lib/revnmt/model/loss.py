"""Cross-entropy of a linear output layer without materializing the logits over the vocabulary.

The output layer is where an NMT model's activations peak: [rows, V] logits, their log-softmax and
their gradient, for every target token. Reversal removes the hidden states from memory, so this
would otherwise be what is left. Here the logits are computed a vocabulary chunk at a time: the
forward pass keeps only the log-sum-exp per row; the backward pass recomputes each chunk's logits,
turns them into softmax − one-hot in place, and multiplies out the gradients. Peak extra memory is
one [rows, VOCAB_CHUNK] block; the price is computing the output layer's logits twice.
"""

from __future__ import annotations

import torch

VOCAB_CHUNK = 2048


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, target, ignore_index):
        rows = hidden.shape[0]
        lse = torch.full((rows,), float("-inf"), device=hidden.device, dtype=hidden.dtype)
        for start in range(0, weight.shape[0], VOCAB_CHUNK):
            logits = torch.addmm(bias[start:start + VOCAB_CHUNK], hidden, weight[start:start + VOCAB_CHUNK].t())
            lse = torch.logaddexp(lse, torch.logsumexp(logits, dim=1))
        keep = target != ignore_index
        safe = torch.where(keep, target, 0)
        target_logit = (hidden * weight[safe]).sum(1) + bias[safe]
        ctx.save_for_backward(hidden, weight, bias, safe, keep, lse)
        return ((lse - target_logit) * keep).sum()

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, safe, keep, lse = ctx.saved_tensors
        scale = (grad_out * keep).to(hidden.dtype)[:, None]  # ignored rows contribute nothing
        grad_hidden = torch.zeros_like(hidden)
        grad_weight = torch.empty_like(weight)
        grad_bias = torch.empty_like(bias)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        for start in range(0, weight.shape[0], VOCAB_CHUNK):
            w = weight[start:start + VOCAB_CHUNK]
            # softmax − one-hot, built in place in the recomputed logits
            p = torch.addmm(bias[start:start + VOCAB_CHUNK], hidden, w.t()).sub_(lse[:, None]).exp_()
            inside = (safe >= start) & (safe < start + w.shape[0])
            p[rows[inside], safe[inside] - start] -= 1
            p.mul_(scale)
            grad_hidden.addmm_(p, w)
            grad_weight[start:start + VOCAB_CHUNK] = p.t() @ hidden
            grad_bias[start:start + VOCAB_CHUNK] = p.sum(0)
        return grad_hidden, grad_weight, grad_bias, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, target: torch.Tensor,
                         ignore_index: int) -> torch.Tensor:
    """Σ over rows of cross-entropy(hidden @ weightᵀ + bias, target), rows with ``ignore_index`` skipped.

    Equal to ``F.cross_entropy(F.linear(hidden, weight, bias), target, reduction="sum")`` in value
    and gradients (up to float rounding), without a [rows, V] tensor in the forward pass.
    """
    return _LinearCrossEntropy.apply(hidden, weight, bias, target, ignore_index)


def logit_work_bytes(rows: int, vocab: int, element_size: int = 4) -> int:
    """Memory the backward pass of :func:`linear_cross_entropy` needs beyond its saved tensors."""
    return rows * min(vocab, VOCAB_CHUNK) * element_size
