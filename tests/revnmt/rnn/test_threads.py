"""The sweeps at one and at two threads: the same bits, and an exact reversal at each.

``revnmt-train`` runs with every core, while most tests run on whatever torch picks. The products of a sweep are
oneDNN's (or torch's), which split their work across threads; a product whose sums were split differently would
round differently, and the states, the buffer's words and the gradients would then depend on the thread count. The
reversal must stay exact whatever the count (the backward sweep raises otherwise), and a run must not change with
the machine's cores. The shapes are the paper's (300 units, batch 64), large enough for the products to use both
threads.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from revnmt.rnn import ReversibleRNN, TensorInput


@contextmanager
def _threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _sweep(cell: str, backend: str) -> dict[str, torch.Tensor]:
    """A forward and a backward sweep of a 2-layer stack: its states, slices and every gradient."""
    torch.manual_seed(0)
    steps, batch, size = 6, 64, 300
    rnn = ReversibleRNN(cell, size, size, num_layers=2, slice_dim=20, max_forget_bits=3, buffer_backend=backend)
    lengths = torch.randint(1, steps + 1, (batch,))
    lengths[0] = steps
    mask = torch.arange(steps)[:, None] < lengths[None, :]
    x = torch.randn(steps, batch, size, requires_grad=True)
    w_out = torch.randn(steps, batch, size)
    inputs = TensorInput(x)
    tape = rnn.forward_sweep(inputs, mask)
    result = {f"state {i}": s.clone() for i, s in enumerate(tape.states)}
    result["slices"] = tape.slices.clone()
    rnn.backward_sweep(tape, inputs, output_grads=lambda s, out: w_out[s])  # raises unless exact
    result.update({name: p.grad.clone() for name, p in rnn.named_parameters()})
    result["input"] = inputs.grad.clone()
    return result


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_one_and_two_threads_give_the_same_bits(cell: str, backend: str) -> None:
    with _threads(1):
        one = _sweep(cell, backend)
    with _threads(2):
        two = _sweep(cell, backend)
    assert one.keys() == two.keys()
    differ = [name for name in one if not torch.equal(one[name], two[name])]
    assert not differ, f"different bits at two threads: {differ}"
