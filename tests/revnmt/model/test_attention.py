"""The attention's memory gradient added in place (``memory_grad``) is autograd's, bit for bit, in a block of rows."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from revnmt.model import attention as attention_module
from revnmt.model.attention import GeneralAttention


def _inputs(rows: int = 13, steps: int = 2, source: int = 7):
    torch.manual_seed(0)
    attention = GeneralAttention(10, 6)
    queries = [torch.randn(rows, steps, 10, requires_grad=True) for _ in range(3)]
    # time-major, as a model builds it: the batch-major memory is a transposed view
    memory = torch.randn(source, rows, 6).transpose(0, 1)
    pad_mask = torch.zeros(rows, source, dtype=torch.bool)
    pad_mask[3:, 5:] = True
    return attention, queries, memory, pad_mask


@pytest.mark.parametrize("block", [attention_module.GRAD_BLOCK, 7 * 6 * 4])
def test_memory_gradient_in_place_is_autograds(block, monkeypatch):
    monkeypatch.setattr(attention_module, "GRAD_BLOCK", block)  # one block of rows, or 4 rows per block
    attention, queries, memory, pad_mask = _inputs()
    weights = torch.randn(3, 13, 2, 10)
    leaf = memory.detach().requires_grad_()
    for q, w in zip(queries, weights):  # several calls accumulate, as a decoder's chunks do
        (attention(q, leaf, pad_mask) * w).sum().backward()
    want = [leaf.grad] + [q.grad.clone() for q in queries] + [p.grad.clone() for p in attention.parameters()]
    for t in [*queries, *attention.parameters()]:
        t.grad = None
    memory_grad = torch.zeros_like(memory)
    for q, w in zip(queries, weights):
        (attention(q, memory, pad_mask, memory_grad) * w).sum().backward()
    got = [memory_grad] + [q.grad for q in queries] + [p.grad for p in attention.parameters()]
    assert all(torch.equal(g, w) for g, w in zip(got, want))


class _Largest(TorchDispatchMode):
    """The largest tensor an op makes (views and in-place results are not new)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs))[0]
                  if isinstance(a, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.numel())
        return out


def test_memory_gradient_has_no_temporary_of_the_memorys_size(monkeypatch):
    monkeypatch.setattr(attention_module, "GRAD_BLOCK", 7 * 6 * 4)
    attention, queries, memory, pad_mask = _inputs()
    largest = []
    for memory_grad in (None, torch.zeros_like(memory)):
        leaf = memory.detach().requires_grad_(memory_grad is None)
        out = attention(queries[0], leaf, pad_mask, memory_grad)
        with _Largest() as meter:
            out.sum().backward()
        largest.append(meter.largest)
    # autograd makes the memory's gradient whole; blocks of 4 of the 13 rows are smaller than anything else
    assert largest[0] == memory.numel() > largest[1]
