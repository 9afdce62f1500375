"""The dense products of the reversible sweeps, and the library that computes them.

A sweep's time goes mostly to matrix products: the input projections, each half-step's recurrent
product and, in the reverse, the products of the hand-written backward. On a CPU, ``torch.mm`` runs
them on the BLAS torch was built with (MKL), while torch's own CPU LSTM runs on oneDNN; on some CPUs
(AMD EPYC, where MKL takes its AVX2 code) oneDNN's float32 products are about twice as fast for these
shapes (figures and command: docs/performance.md#products-on-onednn). :func:`linear` is the one place
that picks: oneDNN's linear (``torch.ops.mkldnn._linear_pointwise``, the kernel PyTorch's compiler
emits for a CPU ``nn.Linear``) where torch has it and the data is on the CPU, ``F.linear`` elsewhere
(CUDA: cuBLAS), or on a CPU with torch's oneDNN switched off (``torch.backends.mkldnn.flags(enabled=False)``).

Exactness: the reverse recomputes the forward's gates, so a product that feeds a gate must be computed
by the same call on the same data in both sweeps, which holds as long as both call :func:`linear`.
oneDNN's result does not depend on where the data lies in memory (tests/revnmt/rnn/test_products.py),
but it does on the number of rows (one row takes another kernel) and the thread count: both are the
same in a batch's two sweeps. Its weight must be contiguous: a column slice of a bigger weight sends
oneDNN down a path hundreds of times slower, so the sweeps copy the weights once (``SweepWeights``);
a transposed one is as fast.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

#: Kernels each of oneDNN's two caches keeps (its primitive cache and torch's ideep cache; 1,024 by default). Each
#: product of a new row count compiles a kernel that both keep, so with the default sizes a process held more after
#: every new batch shape it met, and a memory budget's batches shrank as it did. A training step's products need
#: far fewer than this many kernels, so they stay cached from one step to the next; beyond this, the least recently
#: used go (figures: benchmarks/onednn_caches.py). The libraries read the sizes at their first product: set here, as
#: the module that picks oneDNN is imported; a size the user set wins.
ONEDNN_CACHE_ENTRIES = 64
ONEDNN_CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # the variables that size them
for _cache in ONEDNN_CACHES:
    os.environ.setdefault(_cache, str(ONEDNN_CACHE_ENTRIES))

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """oneDNN's linear with its derivative (the op has none): the autograd reference model projects
    with the same values as the sweeps, and differentiates through them."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad2 = grad.reshape(-1, grad.shape[-1])
        grad_x = grad.matmul(weight) if ctx.needs_input_grad[0] else None
        grad_w = grad2.t().mm(x.reshape(-1, x.shape[-1])) if ctx.needs_input_grad[1] else None
        grad_b = grad2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


def uses_onednn(device: torch.device) -> bool:
    """Whether :func:`linear` runs on oneDNN on ``device``: on a CPU, unless torch's switch for oneDNN is off
    (``torch.backends.mkldnn.flags(enabled=False)``; it must stay the same through a batch's two sweeps)."""
    return _ONEDNN and device.type == "cpu" and torch.backends.mkldnn.enabled


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x · weightᵀ (+ bias): [..., in] x [out, in] -> [..., out], float32, ``weight`` contiguous or transposed.

    Differentiable where autograd needs it; the sweeps call it under ``no_grad``."""
    if not uses_onednn(x.device):
        return F.linear(x, weight, bias)
    if not (weight.is_contiguous() or weight.t().is_contiguous()):
        raise ValueError("products.linear takes a contiguous weight or the transpose of one (a slice of a bigger "
                         "weight is far slower on oneDNN): copy it once, as SweepWeights does")
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return _OneDNNLinear.apply(x, weight, bias)
    return _onednn_linear(x, weight, bias)


def accumulate(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """out += x · weightᵀ, as :func:`linear` computes the product: the hand-written backward's gradient sums,
    called under ``no_grad`` (a per-step call: no context of its own). Off oneDNN it is one ``addmm_``: on
    CUDA one launch, not a product and an add."""
    if uses_onednn(x.device):
        out.add_(linear(x, weight))
    else:
        out.addmm_(x, weight.t())
