"""The numba backend's fused half-steps (revnmt.rnn.kernels.numba_steps) against the reference.

Their gates are their own code (so the whole-sweep tests compare them with backprop, not bit for bit
with the torch steps); here their integer part, the states and buffer words, is compared bit for bit
with the torch buffer backend fed the same gate values, computed by the kernels' own helpers. The
cells' split reverse (reverse_int, then backward_step) must equal the fused reverse_diff exactly.
"""

import numpy as np
import pytest
import torch
from conftest import assert_same_words
from numba import njit

from buffers import ForgetLimit, InformationBuffer, backends, to_float
from revnmt.rnn.backends import BACKENDS
from revnmt.rnn.cells import RevGRUCell, RevLSTMCell, Sweep
from revnmt.rnn.kernels import numba_steps as ns

BATCH, INPUT, HIDDEN, STORED = 5, 4, 14, 3
LIMIT = ForgetLimit(3)
HALF = HIDDEN // 2


def _buffer(backend: str) -> InformationBuffer:
    return InformationBuffer(BATCH, 2, limit=LIMIT, backend=backends.resolve(backend, "cpu"), tile_rows=2)


def _sweep(buf: InformationBuffer, stored: int = 0) -> Sweep:
    """A sweep over ``buf`` with its backend's kernels (the fused ones for numba, the reference for torch)."""
    return Sweep(buf, BACKENDS[buf.backend.name].steps, stored=stored)


@njit
def _gru_terms(s, g_pre, p, col, slope):
    """(z, u) as gru_push computes them: the kernels' own tanh and forget restriction."""
    rows, half = g_pre.shape
    z, u = np.empty((rows, half), np.float32), np.empty((rows, half), np.float32)
    for b in range(rows):
        for j in range(half):
            z[b, j], u[b, j] = ns._gru_terms(s[b, j], ns.tanh(g_pre[b, j] + p[b, col + j]), slope)
    return z, u


@njit
def _lstm_acts(pre, p, col):
    acts = np.empty(pre.shape, np.float32)
    ns._lstm_gates(pre, p, col, acts)
    return acts


@njit
def _restrict(s, slope):
    out = np.empty(s.shape, np.float32)
    for b in range(s.shape[0]):
        for j in range(s.shape[1]):
            out[b, j] = ns._restrict(s[b, j], slope)
    return out


@njit
def _tanh_fixed(c):
    out = np.empty(c.shape, np.float32)
    ns._tanh_of_fixed(c, out)
    return out


def _buffers():
    return [_buffer(backend) for backend in ("numba", "torch")]


def _assert_same_words(a, b):
    assert_same_words(a, b)


def _inputs(cell, seed):
    gen = torch.Generator().manual_seed(seed)
    p = cell.project(torch.randn(BATCH, INPUT, generator=gen)).detach()
    state = torch.randint(-(1 << 23), 1 << 23, (BATCH, cell.state_size), dtype=torch.int32, generator=gen)
    return p, state


def _weight_grads(cell):
    return [param.grad.clone() for param in cell.parameters() if param.grad is not None]


MASK = torch.tensor([True, True, False, True, True])  # a padded row
STEPS = 30  # pushes enough to fill words (3 bits a push): overflow slabs and flags are compared too


@torch.no_grad()
def test_gru_kernels_match_the_torch_buffer_given_the_same_gates():
    torch.manual_seed(0)
    cell = RevGRUCell(INPUT, HIDDEN, LIMIT)
    slope = np.float32(LIMIT.slope)
    fused, ref = _buffers()
    col = 2 * HALF  # half 0's g columns
    pushed = []
    for step in range(STEPS):
        p, state = _inputs(cell, step)
        h, read = state[:, :HALF], to_float(state[:, HALF:])
        rh = torch.empty_like(read)
        s = ns.NUMBA_STEPS.gru_gates(read, cell.zr[0].weight[:, INPUT:].contiguous(), p, 0, rh)
        torch.testing.assert_close(s, torch.sigmoid(read @ cell.zr[0].weight[:, INPUT:].t() + p[:, : 2 * HALF]))
        assert torch.equal(rh, s[:, HALF:] * read)
        pre_g = torch.mm(rh, cell.g[0].weight[:, INPUT:].t())
        out = torch.empty_like(h)
        new_float = ns.NUMBA_STEPS.gru_push(fused, h, pre_g, p, col, s, MASK, STORED, LIMIT, out)
        z, u = (torch.from_numpy(a) for a in _gru_terms(s.numpy(), pre_g.numpy(), p.numpy(), col, slope))
        want = ref.push_update(h, z, u, MASK, STORED)
        assert torch.equal(out, want) and torch.equal(new_float, to_float(want))
        _assert_same_words(fused, ref)
        pushed.append((h, out, pre_g, p, s, z, u))
    for h, out, pre_g, p, s, z, u in reversed(pushed):
        restore = h[:, :STORED]
        prev, prev_float = torch.empty_like(out), torch.empty(out.shape)
        ns.NUMBA_STEPS.gru_reverse(fused, out, pre_g, p, col, s, MASK, LIMIT, restore, prev, None, None, None,
                                   prev_float)
        want = ref.pop_update(out, z, u, MASK, STORED)
        want[:, :STORED] = restore
        assert torch.equal(prev, want) and torch.equal(prev, h) and torch.equal(prev_float, to_float(want))
        _assert_same_words(fused, ref)
    assert fused.is_empty() and ref.is_empty()


@torch.no_grad()
def test_lstm_kernels_match_the_torch_buffer_given_the_same_gates():
    torch.manual_seed(0)
    cell = RevLSTMCell(INPUT, HIDDEN, LIMIT)
    slope = np.float32(LIMIT.slope)
    fused, ref = _buffers()
    col = 5 * HALF  # half 1's gates
    pushed = []
    for step in range(STEPS):
        p, state = _inputs(cell, step)
        h, c = state[:, HALF:HIDDEN], state[:, HIDDEN + HALF:]
        pre = torch.mm(to_float(state[:, :HALF]), cell.gates[1].weight[:, INPUT:].t())
        out_h, out_c = torch.empty_like(h), torch.empty_like(c)
        new_float = ns.NUMBA_STEPS.lstm_push(fused, h, c, pre, p, col, MASK, STORED, LIMIT, out_h, out_c)
        f, g, i, o, sp = torch.from_numpy(_lstm_acts(pre.numpy(), p.numpy(), col)).chunk(5, 1)
        f, sp = (torch.from_numpy(_restrict(a.contiguous().numpy(), slope)) for a in (f, sp))
        want_c = ref.push_update(c, f, i * g, MASK)
        tanh_c = torch.from_numpy(_tanh_fixed(want_c.numpy()))
        want_h = ref.push_update(h, sp, o * tanh_c, MASK, STORED)
        assert torch.equal(out_c, want_c) and torch.equal(out_h, want_h) and torch.equal(new_float, to_float(want_h))
        _assert_same_words(fused, ref)
        pushed.append((h, c, out_h, out_c, pre, p, f, i * g, sp, o * tanh_c))
    for h, c, out_h, out_c, pre, p, f, u_c, sp, u_h in reversed(pushed):
        restore = h[:, :STORED]
        prev_h, prev_c, prev_float = torch.empty_like(out_h), torch.empty_like(out_c), torch.empty(out_h.shape)
        ns.NUMBA_STEPS.lstm_reverse(fused, out_h, out_c, pre, p, col, MASK, LIMIT, restore, (prev_h, prev_c), None,
                                    None, prev_float=prev_float)
        want_h = ref.pop_update(out_h, sp, u_h, MASK, STORED)
        want_h[:, :STORED] = restore
        want_c = ref.pop_update(out_c, f, u_c, MASK)
        assert torch.equal(prev_h, want_h) and torch.equal(prev_c, want_c) and torch.equal(prev_float, to_float(want_h))
        assert torch.equal(prev_h, h) and torch.equal(prev_c, c)
        _assert_same_words(fused, ref)
    assert fused.is_empty() and ref.is_empty()


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("cell_type", [RevGRUCell, RevLSTMCell])
def test_reverse_int_then_backward_step_equals_reverse_diff(cell_type, backend):
    # The decoder's chunked reverse pops a chunk of steps first and differentiates them afterwards, from the
    # gates the pop kept (fused kernels) or recomputed: both must give what the one-pass step does, bit for bit.
    torch.manual_seed(0)
    cell = cell_type(INPUT, HIDDEN, LIMIT)
    bufs = [_buffer(backend) for _ in range(3)]
    p, start = _inputs(cell, 0)
    new = [cell.forward_int(p, start, MASK, _sweep(buf, STORED)) for buf in bufs]
    assert torch.equal(new[0], new[1]) and torch.equal(new[0], new[2])
    grad = torch.randn(BATCH, cell.state_size)
    restore = start[:, :STORED]
    runs = []
    for run, (buf, state) in enumerate(zip(bufs, new)):
        cell.zero_grad()
        given = grad.clone()
        if run == 0:
            prev, grad_prev, grad_p = cell.reverse_diff(p, state, MASK, given, _sweep(buf, STORED), restore)
        else:
            gates = {} if run == 2 else None
            prev = cell.reverse_int(p, state, MASK, _sweep(buf, STORED), restore, gates)
            if gates is not None:  # fused kernels keep both halves' gates; the torch reference keeps none
                assert sorted(gates) == ([0, 1] if backend == "numba" else [])
            grad_prev, grad_p = cell.backward_step(p, prev, state, MASK, given, _sweep(buf, STORED), gates)
        assert grad_prev is given  # updated in place: no copy per step
        runs.append((prev, grad_prev, grad_p, _weight_grads(cell)))
        assert torch.equal(prev, start) and buf.is_empty()
    (prev, grad_prev, grad_p, weights) = runs[0]
    assert len(weights) > 0
    for _, grad_prev2, grad_p2, weights2 in runs[1:]:
        assert torch.equal(grad_prev, grad_prev2) and torch.equal(grad_p, grad_p2)
        assert len(weights) == len(weights2) and all(torch.equal(a, b) for a, b in zip(weights, weights2))


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("cell_type", [RevGRUCell, RevLSTMCell])
def test_an_output_gradient_given_apart_is_added_to_the_state_gradient(cell_type, backend):
    # A decoder's loss gradient on a step's output goes to the reverse step as ``grad_out`` (the fused kernels add
    # it as they read the state gradient, saving a launch): the same as adding it to the h columns beforehand.
    torch.manual_seed(3)
    cell = cell_type(INPUT, HIDDEN, LIMIT)
    p, start = _inputs(cell, 0)
    bufs = [_buffer(backend) for _ in range(2)]
    new = [cell.forward_int(p, start, MASK, _sweep(buf)) for buf in bufs]
    grad, grad_out = torch.randn(BATCH, cell.state_size), torch.randn(BATCH, HIDDEN)
    summed = grad.clone()
    summed[:, :HIDDEN] += grad_out
    results = []
    for buf, state, given, out in zip(bufs, new, (summed, grad.clone()), (None, grad_out)):
        cell.zero_grad()
        prev, grad_prev, grad_p = cell.reverse_diff(p, state, MASK, given, _sweep(buf), grad_out=out)
        assert torch.equal(prev, start) and buf.is_empty()
        results.append([grad_prev, grad_p] + _weight_grads(cell))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cell_type", [RevGRUCell, RevLSTMCell])
def test_fused_and_reference_derivatives_agree_on_the_same_states(cell_type):
    # Given the same exact states, the fused kernels' hand-written derivative and the torch reference's
    # differ only by their gates' last ulp.
    torch.manual_seed(0)
    cell = cell_type(INPUT, HIDDEN, LIMIT)
    p, prev = _inputs(cell, 1)
    new = cell.forward_int(p, prev, MASK, _sweep(_buffer("numba")))
    grad = torch.randn(BATCH, cell.state_size)
    results = []
    for backend in ("numba", "torch"):
        cell.zero_grad()
        grad_prev, grad_p = cell.backward_step(p, prev, new, MASK, grad.clone(), Sweep(kernels=BACKENDS[backend].steps))
        results.append([grad_prev, grad_p] + _weight_grads(cell))
    for got, want in zip(*results):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
