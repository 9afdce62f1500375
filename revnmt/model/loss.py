"""Cross-entropy of a linear output layer without materializing the logits over the vocabulary.

The output layer is where an NMT model's activations peak: [rows, V] logits, their log-softmax and
their gradient, for every target token. Reversal removes the hidden states from memory, so this
would otherwise be what is left. Here the logits are computed a vocabulary chunk at a time: the
forward pass keeps only the log-sum-exp per row; the backward pass recomputes each chunk's logits,
turns them into softmax − one-hot in place, and multiplies out the gradients. Peak extra memory is
one [rows, chunk] block; the price is computing the output layer's logits twice.

Label smoothing fits the same scheme: its extra term needs only each row's sum of logits, accumulated
chunk by chunk in the forward pass, and its gradient is a constant taken off the recomputed block in
place. The unsmoothed negative log-likelihood is returned beside the smoothed loss, for reporting.

The chunk narrows as the rows grow (:func:`vocab_chunk`), so that the block stays within a number of
elements (:func:`logit_block`): many rows (several decoder steps of a large batch) would otherwise make it
a cost per sentence that a memory budget feels. On a CPU the block is about 64 rows' full-width chunk; on a
GPU it is larger, since each chunk is a few kernel launches whose cost the host pays whatever their size,
and a narrow chunk would make the loss's launches grow with the rows (the decoder steps of a chunk).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

VOCAB_CHUNK = 2048  # the widest chunk
MIN_VOCAB_CHUNK = 256
#: Elements of the block where the rows allow, by device type, unless asked otherwise (``--logit-block``): on a CPU
#: 64 rows' widest chunk (512 KiB), on a GPU 2^24 (64 MiB): up to 8,192 rows there get the widest chunk.
LOGIT_BLOCKS = {"cpu": 64 * VOCAB_CHUNK, "cuda": 1 << 24}


def logit_block(device: torch.device | str, asked: int | None = None) -> int:
    """Elements of the loss's logit block on ``device``: ``asked``, or the device type's default."""
    return asked if asked is not None else LOGIT_BLOCKS.get(torch.device(device).type, LOGIT_BLOCKS["cpu"])


def vocab_chunk(rows: int, block: int = LOGIT_BLOCKS["cpu"]) -> int:
    """Vocabulary columns per chunk over ``rows`` rows, keeping the chunk's logits within ``block`` elements where
    the narrowest chunk allows."""
    return min(VOCAB_CHUNK, max(MIN_VOCAB_CHUNK, block // max(rows, 1)))


class LossSums(NamedTuple):
    """What :func:`linear_cross_entropy` returns: sums over the rows that are not ignored."""

    objective: torch.Tensor  # the loss trained on (label-smoothed if asked), differentiable
    nll: torch.Tensor  # the unsmoothed negative log-likelihood, for reporting (no gradient)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, target, ignore_index, label_smoothing, block):
        rows, vocab = hidden.shape[0], weight.shape[0]
        chunk = vocab_chunk(rows, block)
        lse = torch.full((rows,), float("-inf"), device=hidden.device, dtype=hidden.dtype)
        logit_sum = torch.zeros((rows,), device=hidden.device, dtype=hidden.dtype)
        for start in range(0, vocab, chunk):
            logits = torch.addmm(bias[start:start + chunk], hidden, weight[start:start + chunk].t())
            lse = torch.logaddexp(lse, torch.logsumexp(logits, dim=1))
            if label_smoothing:
                logit_sum += logits.sum(1)
        keep = target != ignore_index
        safe = torch.where(keep, target, 0)
        target_logit = (hidden * weight[safe]).sum(1) + bias[safe]
        nll = ((lse - target_logit) * keep).sum()
        # ε × the cross-entropy against the uniform distribution, lse − the mean logit
        smoothing = label_smoothing * ((lse - logit_sum / vocab) * keep).sum() if label_smoothing else 0.0
        ctx.save_for_backward(hidden, weight, bias, safe, keep, lse)
        ctx.label_smoothing, ctx.chunk = label_smoothing, chunk
        ctx.mark_non_differentiable(nll)
        # a tensor of its own even at ε = 0: the objective has a gradient, nll none
        return (1 - label_smoothing) * nll + smoothing, nll

    @staticmethod
    def backward(ctx, grad_out, _grad_nll):
        hidden, weight, bias, safe, keep, lse = ctx.saved_tensors
        eps, vocab = ctx.label_smoothing, weight.shape[0]
        scale = (grad_out * keep).to(hidden.dtype)[:, None]  # ignored rows contribute nothing
        grad_hidden = torch.zeros_like(hidden)
        grad_weight = torch.empty_like(weight)
        grad_bias = torch.empty_like(bias)
        chunk = ctx.chunk
        for start in range(0, vocab, chunk):
            w = weight[start:start + chunk]
            # softmax − (1 − ε)·one-hot − ε/V, built in place in the recomputed logits
            p = torch.addmm(bias[start:start + chunk], hidden, w.t()).sub_(lse[:, None]).exp_()
            if eps:
                p.sub_(eps / vocab)
            # Each row's target column, where it falls in this chunk: a scatter of 0 elsewhere, not indexing with a
            # mask, whose size the host would have to read (on a GPU, a wait per chunk).
            inside = (safe >= start) & (safe < start + w.shape[0])
            column = (safe - start).clamp(0, w.shape[0] - 1)[:, None]
            p.scatter_add_(1, column, torch.where(inside, eps - 1, 0.0).to(p.dtype)[:, None])
            p.mul_(scale)
            grad_hidden.addmm_(p, w)
            grad_weight[start:start + chunk] = p.t() @ hidden
            grad_bias[start:start + chunk] = p.sum(0)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, target: torch.Tensor,
                         ignore_index: int, label_smoothing: float = 0.0, block: int | None = None) -> LossSums:
    """Σ over rows of cross-entropy(hidden @ weightᵀ + bias, target), rows with ``ignore_index`` skipped.

    ``objective`` is PyTorch's label-smoothed cross-entropy: the target distribution is
    (1 − ε)·one-hot + ε/V uniform over the whole vocabulary V (ε = ``label_smoothing``), and it equals
    ``F.cross_entropy(F.linear(hidden, weight, bias), target, ignore_index=ignore_index,
    label_smoothing=ε, reduction="sum")`` in value and gradients (up to float rounding); ε = 0 is plain
    cross-entropy. ``nll`` is the unsmoothed sum (ε = 0), without gradient. Neither pass holds a
    [rows, V] tensor, but a block of at most ``block`` elements where the rows allow (None: :func:`logit_block`'s
    default on ``hidden``'s device; it sets the sums' order, so their low bits): see :func:`logit_work_bytes`.
    """
    block = logit_block(hidden.device, block)
    return LossSums(*_LinearCrossEntropy.apply(hidden, weight, bias, target, ignore_index, label_smoothing, block))


def logit_work_bytes(rows: int, vocab: int, element_size: int = 4, block: int = LOGIT_BLOCKS["cpu"]) -> int:
    """Memory the backward pass of :func:`linear_cross_entropy` (with ``block``) needs beyond its saved tensors."""
    return rows * min(vocab, vocab_chunk(rows, block)) * element_size
