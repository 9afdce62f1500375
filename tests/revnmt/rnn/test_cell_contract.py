"""The reversible cell contract (revnmt.rnn.cells.base), checked for every family on every backend.

What a cell promises, whatever computes its half-steps (the torch reference, numba's or Triton's fused
kernels): undoing its steps gives back the state they started from, bit for bit, and leaves the buffer
empty; and the gradients its reverse computes by hand are autograd's through the same fixed-point model
(``forward_diff``). A new family registered in ``REV_CELLS`` is checked here as it is.
"""

import pytest
import torch
from conftest import ALL_BACKENDS

from buffers import ForgetLimit, to_fixed
from revnmt.rnn.backends import on_device
from revnmt.rnn.cells import REV_CELLS, Sweep, SweepWeights

BATCH, INPUT, HIDDEN, STEPS, STORED = 3, 5, 8, 4, 2
LIMIT = ForgetLimit(3)
LENGTHS = [STEPS, 2, 1]  # padding in every row but the first


def _setup(family, impl, seed=0):
    device, name = torch.device(impl[0]), impl[1]
    torch.manual_seed(seed)
    cell = REV_CELLS[family](INPUT, HIDDEN, LIMIT).to(device)
    backend = on_device(name, device)
    buffer = backend.new_buffer(BATCH, 2, device, LIMIT, tile_rows=2)  # tiles of two: a partial one too
    sweep = Sweep(buffer, backend.steps, SweepWeights(cell), STORED)
    x = torch.randn(STEPS, BATCH, INPUT, device=device)
    mask = torch.arange(STEPS, device=device)[:, None] < torch.tensor(LENGTHS, device=device)[None]
    start = to_fixed(torch.randn(BATCH, cell.state_size, device=device) * 0.5)
    with torch.no_grad():
        p = torch.stack([sweep.weights.project(x[t]) for t in range(STEPS)])
    return cell, sweep, p, mask, start


def _forward(cell, sweep, p, mask, start):
    states = [start]
    for t in range(STEPS):
        states.append(cell.forward_int(p[t], states[-1], mask[t], sweep))
    return states


@pytest.mark.parametrize("impl", ALL_BACKENDS)
@pytest.mark.parametrize("family", sorted(REV_CELLS))
def test_reverse_undoes_forward_bit_for_bit(family, impl):
    cell, sweep, p, mask, start = _setup(family, impl)
    states = _forward(cell, sweep, p, mask, start)
    assert not torch.equal(states[-1], start)
    state = states[-1]
    for t in reversed(range(STEPS)):
        state = cell.reverse_int(p[t], state, mask[t], sweep, restore=states[t][:, :STORED])
        assert torch.equal(state, states[t]), f"step {t} not undone exactly"
    assert sweep.buffer.is_empty()


@pytest.mark.parametrize("impl", ALL_BACKENDS)
@pytest.mark.parametrize("family", sorted(REV_CELLS))
def test_reverse_gradients_are_autograds(family, impl):
    cell, sweep, p, mask, start = _setup(family, impl, seed=1)
    states = _forward(cell, sweep, p, mask, start)
    device = start.device
    w_out = torch.randn(STEPS, BATCH, HIDDEN, device=device)
    w_final = torch.randn(BATCH, cell.state_size, device=device)

    # Autograd through the same fixed-point steps: every value exact, the gradient forward_diff's.
    p_leaf = p.clone().requires_grad_()
    first = (start * 2.0 ** -23).requires_grad_()
    h, loss = first, 0
    for t in range(STEPS):
        h = cell.forward_diff(p_leaf[t], h, states[t + 1], mask[t])
        loss = loss + (w_out[t] * h[:, :HIDDEN]).sum()
    (loss + (w_final * h).sum()).backward()
    want = [lin.weight.grad[:, INPUT:].clone() for lin in cell.linears()]
    cell.zero_grad(set_to_none=True)

    # By reversal: the output gradients arrive with each step, as a decoder's do.
    grad, grad_p = w_final.clone(), torch.empty_like(p)
    state = states[-1]
    for t in reversed(range(STEPS)):
        state, grad, step_grad_p = cell.reverse_diff(p[t], state, mask[t], grad, sweep,
                                                     restore=states[t][:, :STORED], grad_out=w_out[t])
        grad_p[t] = step_grad_p
        assert torch.equal(state, states[t])
    assert sweep.buffer.is_empty()
    tolerance = dict(rtol=1e-4, atol=1e-5)  # fused kernels' gates differ from the reference's in the last ulp
    torch.testing.assert_close(grad, first.grad, **tolerance)
    torch.testing.assert_close(grad_p, p_leaf.grad, **tolerance)
    for lin, expected in zip(cell.linears(), want):
        torch.testing.assert_close(lin.weight.grad[:, INPUT:], expected, **tolerance)
