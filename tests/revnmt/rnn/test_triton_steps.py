"""The fused Triton half-steps (revnmt.rnn.kernels.triton_steps): in Triton's interpreter on CPU tensors
where there is no GPU (tests/conftest.py sets ``TRITON_INTERPRET=1`` before triton is imported), so
the shapes are small.

- Given the same gates, the kernels make the integers the torch reference makes: the tests take z and u
  from the kernels' own gate functions (a test kernel calls them) and push them through the torch
  buffer, against the fused kernels on a triton buffer: new states, words, popped states.
- The activations are the numba kernels' bit for bit, and every kernel is one dispatched op.
- A sweep forward and back with ``buffer_backend="triton"`` is exact and its gradients match autograd
  through the same fixed-point model.
- The kernels compile ahead of time for sm_80 and sm_90, in a process without the interpreter.
"""

import textwrap

import pytest
import torch
from conftest import HAS_CUDA, HAS_TRITON, assert_same_words, compile_for_the_gpu
from test_reversible import _assert_close, _autograd_grads, _problem, _reversal_grads

from buffers import ForgetLimit, InformationBuffer, backends, to_float
from revnmt.profiling.launches import LaunchCounter

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install -e .[dev])")

if HAS_TRITON:
    import triton
    import triton.language as tl

    from buffers.backends.triton_kernels import COMPILE_OPTIONS, elements
    from revnmt.rnn.backends import BACKENDS
    from revnmt.rnn.kernels.triton_steps import (
        TRITON_STEPS,
        gru_update,
        lstm_cell_update,
        lstm_hidden_update,
        sigmoid,
        tanh,
    )

    # Which update's pointwise function _terms_kernel runs: RevGRU's h, RevLSTM's c, RevLSTM's h.
    GRU, LSTM_CELL, LSTM_HIDDEN = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)

    @triton.jit
    def _terms_kernel(pre_ptr, pre_rs, proj_ptr, proj_rs, aux_ptr, aux_rs, z_ptr, u_ptr, batch, half, slope,
                      KIND: tl.constexpr, BLOCK: tl.constexpr):
        """The float z and u the walks take for update KIND, written out. ``aux``: RevGRU's σ of [z | r],
        RevLSTM's new cell (for the hidden update)."""
        ok, b, j = elements(0, batch, half, BLOCK)
        if KIND == GRU:
            terms = gru_update((pre_ptr, pre_rs, proj_ptr, proj_rs, aux_ptr, aux_rs, slope), b, j, ok)
        elif KIND == LSTM_CELL:
            terms = lstm_cell_update((pre_ptr, pre_rs, proj_ptr, proj_rs, half, slope), b, j, ok)
        else:
            terms = lstm_hidden_update((pre_ptr, pre_rs, proj_ptr, proj_rs, half, slope, aux_ptr, aux_rs), b, j, ok)
        tl.store(z_ptr + b * half + j, terms[0], mask=ok)
        tl.store(u_ptr + b * half + j, terms[1], mask=ok)

    @triton.jit
    def _activations_kernel(x_ptr, tanh_ptr, sigmoid_ptr, BLOCK: tl.constexpr):
        k = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + k)
        tl.store(tanh_ptr + k, tanh(x))
        tl.store(sigmoid_ptr + k, sigmoid(x))


DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
B, H, STORED = 5, 6, 2
LIMIT = ForgetLimit(3)


def _gate_terms(kind, pre, proj, aux):
    """(z, u) of update ``kind`` from the kernels' own gate functions."""
    z, u = (torch.empty(B, H, device=DEVICE) for _ in range(2))
    _terms_kernel[(1,)](pre, pre.stride(0), proj, proj.stride(0), aux, aux.stride(0), z, u, B, H,
                        LIMIT.slope, KIND=kind, BLOCK=triton.next_power_of_2(B * H),
                        **COMPILE_OPTIONS)  # as the fused kernels are compiled: no FMA contraction on a GPU
    return z, u


def _buffers():
    """A triton and a torch buffer alike: one lane per row, so an update makes a push per column and the
    slab overflows within a few steps (the tests' forget gates are small)."""
    return [_buffer(B, 1, backend) for backend in ("triton", "torch")]


def _buffer(batch: int, units: int, backend: str = "triton") -> InformationBuffer:
    # Tiles of two rows: the five rows are three tiles, the last a partial one.
    return InformationBuffer(batch, units, DEVICE, LIMIT, backend=backends.resolve(backend, DEVICE), tile_rows=2,
                             eager_checks=False)


def _mask():
    return torch.tensor([True, True, False, True, True], device=DEVICE)  # a padded row


def test_gru_kernels_make_the_torch_references_integers():
    torch.manual_seed(0)
    ours, ref = _buffers()
    mask, steps = _mask(), 8
    h = torch.randint(-(1 << 23), 1 << 23, (B, H), dtype=torch.int32, device=DEVICE)
    states, saved = [h], []
    for t in range(steps):
        read, weight = torch.randn(B, H, device=DEVICE), torch.randn(2 * H, H, device=DEVICE) / H ** 0.5
        # The step's projection p holds both halves' [z | r | g] columns; these are half 1's.
        pre_g, p = (torch.randn(B, k * H, device=DEVICE) for k in (1, 6))
        p[:, 3 * H: 4 * H] -= 3  # forget about two bits a column
        rh = torch.empty(B, H, device=DEVICE)
        s = TRITON_STEPS.gru_gates(read, weight, p, 3 * H, rh)
        torch.testing.assert_close(s, torch.sigmoid(read @ weight.t() + p[:, 3 * H: 5 * H]))
        assert torch.equal(rh, s[:, H:] * read)
        z, u = _gate_terms(GRU, pre_g, p[:, 5 * H:], s)
        stored = STORED * (t % 2)  # with and without stored columns
        want = ref.push_update(h, z, u, mask, stored)
        out = torch.empty_like(h)
        new_float = TRITON_STEPS.gru_push(ours, h, pre_g, p, 5 * H, s, mask, stored, LIMIT, out)
        assert torch.equal(out, want) and torch.equal(new_float, to_float(out))
        assert_same_words(ours, ref)
        saved.append((pre_g, p, s, stored))
        h = out
        states.append(h)
    assert max(ours.heights()) > 0  # a tile overflowed: the stack is exercised
    for t in reversed(range(steps)):
        pre_g, p, s, stored = saved[t]
        restore = states[t][:, :stored] if stored else None
        grad = torch.randn(B, H, device=DEVICE)
        grad_z, grad_g = torch.empty(B, H, device=DEVICE), torch.empty(B, H, device=DEVICE)
        z, u = _gate_terms(GRU, pre_g, p[:, 5 * H:], s)
        want = ref.pop_update(h, z, u, mask, stored)
        if stored:
            want[:, :stored] = restore
        got_grad = grad.clone()
        prev, prev_float = torch.empty_like(h), torch.empty(B, H, device=DEVICE)
        TRITON_STEPS.gru_reverse(ours, h, pre_g, p, 5 * H, s, mask, LIMIT, restore, prev, got_grad, grad_z, grad_g,
                                 prev_float)
        assert torch.equal(prev, want) and torch.equal(prev, states[t]) and torch.equal(prev_float, to_float(want))
        assert_same_words(ours, ref)
        # The derivative alone, from the given previous half (backward_step), is the same.
        again, again_float = (grad.clone(), torch.empty_like(grad_z), torch.empty_like(grad_g)), torch.empty_like(grad)
        TRITON_STEPS.gru_reverse(None, h, pre_g, p, 5 * H, s, mask, LIMIT, restore, prev, *again, again_float)
        assert all(torch.equal(a, b) for a, b in zip(again, (got_grad, grad_z, grad_g)))
        assert torch.equal(again_float, prev_float)
        # The output's gradient given apart (``grad_out``) is added as the gradient is read: 0 + grad is grad.
        apart = torch.zeros_like(grad), torch.empty_like(grad_z), torch.empty_like(grad_g)
        TRITON_STEPS.gru_reverse(None, h, pre_g, p, 5 * H, s, mask, LIMIT, restore, prev, *apart, grad_out=grad)
        assert all(torch.equal(a, b) for a, b in zip(apart, (got_grad, grad_z, grad_g)))
        h = prev
    assert ours.is_empty() and ref.is_empty()


def _h_j(rows, half, device, int_state):
    """A half's h_j as the kernels may take it: float, or a column block of an int32 state (and its floats)."""
    if not int_state:
        read = torch.randn(rows, half, device=device)
        return read, read
    state = torch.randint(-(1 << 24), 1 << 24, (rows, 3 * half), dtype=torch.int32, device=device)
    return state[:, half: 2 * half], to_float(state[:, half: 2 * half])


@pytest.mark.parametrize("int_state", [False, True])
@pytest.mark.parametrize("rows, half", [(B, H), (37, 70)])  # one tile; several tiles, inner blocks and a ragged edge
@pytest.mark.parametrize("backend", ["numba", "triton"])
def test_gru_gates_compute_their_product_and_activations(backend, rows, half, int_state):
    torch.manual_seed(3)
    device = DEVICE if backend == "triton" else torch.device("cpu")
    read, h_j = _h_j(rows, half, device, int_state)
    weight = torch.randn(2 * half, half, device=device) / half ** 0.5
    p = torch.randn(rows, 6 * half, device=device)[:, 1:]  # a projection whose rows are not contiguous with its width
    rh = torch.empty(rows, half, device=device)
    s = BACKENDS[backend].steps.gru_gates(read, weight, p, 2, rh)
    torch.testing.assert_close(s, torch.sigmoid(h_j @ weight.t() + p[:, 2: 2 + 2 * half]))
    assert torch.equal(rh, s[:, half:] * h_j)  # r·h_j from the gates the kernel returns


@pytest.mark.parametrize("int_state", [False, True])
@pytest.mark.parametrize("rows, half", [(B, H), (37, 70)])
@pytest.mark.parametrize("backend", ["numba", "triton"])
def test_gru_read_grad_follows_its_formulas_and_fills_the_weight_gradient_slots(backend, rows, half, int_state):
    torch.manual_seed(2)
    device = DEVICE if backend == "triton" else torch.device("cpu")
    read, h_j = _h_j(rows, half, device, int_state)
    s = torch.sigmoid(torch.randn(rows, 2 * half, device=device))
    grad_pre = torch.randn(rows, 4 * half, device=device)[:, half:]  # a slot's [z | r | g] columns, rows apart
    weight_zr, weight_g = (torch.randn(k * half, half, device=device) / half ** 0.5 for k in (2, 1))
    grad_read = torch.randn(rows, half, device=device)
    inputs = torch.empty(4, rows, half, device=device)[1:3]  # the half's two slots of a step: h_j and r·h_j
    grad_z, grad_g = grad_pre[:, :half].clone(), grad_pre[:, 2 * half:].clone()
    r = s[:, half:]
    grad_rh = grad_g @ weight_g
    grad_r = grad_rh * h_j * r * (1 - r)
    want_read = grad_read + grad_rh * r + torch.cat([grad_z, grad_r], 1) @ weight_zr
    BACKENDS[backend].steps.gru_read_grad(grad_pre, weight_zr, weight_g, read, s, grad_read, inputs)
    torch.testing.assert_close(grad_pre[:, half: 2 * half], grad_r)
    assert torch.equal(grad_pre[:, :half], grad_z) and torch.equal(grad_pre[:, 2 * half:], grad_g)  # read only
    torch.testing.assert_close(grad_read, want_read)
    assert torch.equal(inputs[0], h_j) and torch.equal(inputs[1], r * h_j)  # r·h_j as the gates kernel makes it


def test_lstm_kernels_make_the_torch_references_integers():
    torch.manual_seed(1)
    ours, ref = _buffers()
    mask, steps = _mask(), 6
    h, c = (torch.randint(-(1 << 23), 1 << 23, (B, H), dtype=torch.int32, device=DEVICE) for _ in range(2))
    states, saved = [(h, c)], []
    for t in range(steps):
        pre, p = torch.randn(B, 5 * H, device=DEVICE), torch.randn(B, 10 * H, device=DEVICE)  # half 1's columns
        proj = p[:, 5 * H:]
        pre[:, :H] -= 3  # forget about two bits a column in c, and in h
        pre[:, 4 * H:] -= 3
        stored = STORED * (t % 2)
        z_c, u_c = _gate_terms(LSTM_CELL, pre, proj, c)
        want_c = ref.push_update(c, z_c, u_c, mask)
        z_h, u_h = _gate_terms(LSTM_HIDDEN, pre, proj, want_c)
        want_h = ref.push_update(h, z_h, u_h, mask, stored)
        out = torch.empty(B, 2 * H, dtype=torch.int32, device=DEVICE)  # as the cell's state: [h | c] of one tensor
        out_h, out_c = out.split(H, 1)
        new_float = TRITON_STEPS.lstm_push(ours, h, c, pre, p, 5 * H, mask, stored, LIMIT, out_h, out_c)
        assert torch.equal(out_c, want_c) and torch.equal(out_h, want_h) and torch.equal(new_float, to_float(out_h))
        assert_same_words(ours, ref)
        saved.append((pre, p, stored))
        h, c = out_h, out_c
        states.append((h, c))
    assert max(ours.heights()) > 0
    for t in reversed(range(steps)):
        pre, p, stored = saved[t]
        proj = p[:, 5 * H:]
        restore = states[t][0][:, :stored] if stored else None
        z_h, u_h = _gate_terms(LSTM_HIDDEN, pre, proj, c)
        want_h = ref.pop_update(h, z_h, u_h, mask, stored)
        if stored:
            want_h[:, :stored] = restore
        z_c, u_c = _gate_terms(LSTM_CELL, pre, proj, c)
        want_c = ref.pop_update(c, z_c, u_c, mask)
        grad = torch.randn(B, H, device=DEVICE), torch.randn(B, H, device=DEVICE)
        got_grad, grad_pre = tuple(g.clone() for g in grad), torch.empty(B, 5 * H, device=DEVICE)
        prev = torch.empty_like(h), torch.empty_like(c)
        read, slot = torch.randn(B, H, device=DEVICE), torch.empty(B, H, device=DEVICE)
        prev_float = torch.empty(B, H, device=DEVICE)
        TRITON_STEPS.lstm_reverse(ours, h, c, pre, p, 5 * H, mask, LIMIT, restore, prev, got_grad, grad_pre, read,
                                  slot, prev_float)
        assert torch.equal(slot, read)  # the weight gradient's input, copied by the kernel
        assert torch.equal(prev[0], want_h) and torch.equal(prev[1], want_c)
        assert torch.equal(prev_float, to_float(want_h))  # the next half's recurrent input
        assert torch.equal(prev[0], states[t][0]) and torch.equal(prev[1], states[t][1])
        assert_same_words(ours, ref)
        again, again_pre = tuple(g.clone() for g in grad), torch.empty_like(grad_pre)
        again_float = torch.empty_like(slot)
        TRITON_STEPS.lstm_reverse(None, h, c, pre, p, 5 * H, mask, LIMIT, restore, prev, again, again_pre, read,
                                  torch.empty_like(slot), again_float)
        assert all(torch.equal(a, b) for a, b in zip(again + (again_pre,), got_grad + (grad_pre,)))
        assert torch.equal(again_float, prev_float)
        apart, apart_pre = (torch.zeros_like(grad[0]), grad[1].clone()), torch.empty_like(grad_pre)
        TRITON_STEPS.lstm_reverse(None, h, c, pre, p, 5 * H, mask, LIMIT, restore, prev, apart, apart_pre, read,
                                  torch.empty_like(slot), grad_out=grad[0])  # h's output gradient given apart
        assert all(torch.equal(a, b) for a, b in zip(apart + (apart_pre,), got_grad + (grad_pre,)))
        h, c = prev
    assert ours.is_empty() and ref.is_empty()


def test_activations_are_the_numba_kernels_bit_for_bit():
    # IEEE-rounded multiplies, adds and division in the same order: the same floats on any device.
    from numba import njit

    from revnmt.rnn.kernels import numba_steps

    @njit
    def numba_acts(x, t, s):
        for k in range(x.shape[0]):
            t[k], s[k] = numba_steps.tanh(x[k]), numba_steps.sigmoid(x[k])

    x = torch.cat([torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0]), torch.linspace(-12, 12, 4092),
                   torch.randn(4096) * 1e-3])  # a power of two in all
    want = torch.empty_like(x), torch.empty_like(x)
    numba_acts(x.numpy(), *(w.numpy() for w in want))
    got = torch.empty_like(x, device=DEVICE), torch.empty_like(x, device=DEVICE)
    _activations_kernel[(1,)](x.to(DEVICE), *got, BLOCK=x.numel(), **COMPILE_OPTIONS)
    assert all(torch.equal(g.cpu().nan_to_num(7.0), w.nan_to_num(7.0)) for g, w in zip(got, want))
    assert got[0][0].isnan() and got[1][0].isnan()  # a NaN stays one (the update reports it)


def test_each_kernel_is_one_launch():
    # What benchmarks/layers.py --count-kernels counts: a fused step is one Triton launch, and its host-side books
    # dispatch nothing that launches (allocations and views only).
    buf = _buffer(B, 2)
    h = torch.zeros(B, H, dtype=torch.int32, device=DEVICE)
    pre, proj, mask = torch.randn(B, 5 * H, device=DEVICE), torch.randn(B, 5 * H, device=DEVICE), _mask()
    out = torch.empty(B, 2 * H, dtype=torch.int32, device=DEVICE)
    TRITON_STEPS.lstm_push(buf, h, h, pre, proj, 0, mask, 0, LIMIT, *out.split(H, 1))  # builds the device's tables
    with LaunchCounter() as launches:
        TRITON_STEPS.lstm_push(buf, h, h, pre, proj, 0, mask, 0, LIMIT, *out.split(H, 1))
    assert launches.names == ["_lstm_push_kernel"]
    assert BACKENDS["triton"].steps is TRITON_STEPS


def test_a_mask_of_strided_rows_is_refused():
    # A step's row of a transposed [T, B] mask: the kernels read B adjacent booleans, so they would read others.
    buf = _buffer(B, 2)
    h = torch.zeros(B, H, dtype=torch.int32, device=DEVICE)
    pre, proj = torch.randn(B, 5 * H, device=DEVICE), torch.randn(B, 5 * H, device=DEVICE)
    out = torch.empty(B, 2 * H, dtype=torch.int32, device=DEVICE)
    strided = torch.ones(B, 3, dtype=torch.bool, device=DEVICE)[:, 0]
    with pytest.raises(ValueError, match="adjacent rows"):
        TRITON_STEPS.lstm_push(buf, h, h, pre, proj, 0, strided, 0, LIMIT, *out.split(H, 1))


def test_a_one_row_mask_is_taken_whatever_its_stride():
    # A one-sentence batch (the budget planner probes one): its [T, 1] mask is contiguous to torch, so a step's
    # row keeps the stride T of the batch-major mask it was transposed from. One row reads one boolean.
    buf = _buffer(1, 2)
    h = torch.zeros(1, H, dtype=torch.int32, device=DEVICE)
    pre, proj = torch.randn(1, 5 * H, device=DEVICE), torch.randn(1, 5 * H, device=DEVICE)
    out = torch.empty(1, 2 * H, dtype=torch.int32, device=DEVICE)
    row = torch.ones(1, 4, dtype=torch.bool, device=DEVICE).t().contiguous()[0]
    assert row.stride(0) == 4
    TRITON_STEPS.lstm_push(buf, h, h, pre, proj, 0, row, 0, LIMIT, *out.split(H, 1))
    assert buf.pushes > 0


@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_triton_sweep_is_exact_and_its_gradients_match_autograd(cell):
    # Padding in three rows and a stored slice: the backward sweep's guard
    # raises unless the reverse rebuilt the initial state and emptied the buffer.
    rnn, x, mask, w_out, w_fin, w_slice = _problem(cell, 1, 5, device=DEVICE, buffer_backend="triton")
    rev, rev_x, _, tape = _reversal_grads(rnn, x, mask, w_out, w_fin, w_slice)
    assert tape.buffer.backend.name == "triton" and tape.buffer.is_empty()
    ref, ref_x = _autograd_grads(rnn, x, mask, w_out, w_fin, w_slice)
    for name in ref:
        _assert_close(rev[name], ref[name])
    _assert_close(rev_x, ref_x)


_COMPILE = textwrap.dedent(r"""
    import sys

    from ptxas_log import compile_reported

    from buffers import TILE_ROWS
    from buffers.backends.triton_kernels import launch_options
    from revnmt.rnn.kernels import triton_steps as ts

    INTS = {"h", "c", "out", "out_h", "out_c", "prev", "prev_h", "prev_c", "restore", "status"}
    BOOLS, BYTES, LONGS, DOUBLES = {"mask"}, {"flags"}, {"curr", "stack", "top"}, {"lost", "lost_table"}
    FLOAT_SCALARS = {"slope"}


    def arg_type(name):
        # The types TritonSteps passes: states int32, masks bool, flags bytes, words int64, gates and gradients fp32.
        if not name.endswith("_ptr"):
            return "fp32" if name in FLOAT_SCALARS else "i32"
        base = name[:-4]
        for names, kind in ((INTS, "*i32"), (BOOLS, "*i1"), (BYTES, "*u8"), (LONGS, "*i64"), (DOUBLES, "*fp64")):
            if base in names:
                return kind
        return "*fp32"


    options = launch_options(TILE_ROWS * 16)  # a tile of the default rows on 16 lanes, the CUDA default
    walk = {"LANE_BLOCK": options.pop("LANE_BLOCK"), "ELEMENT_BLOCK": options.pop("ELEMENT_BLOCK")}
    variants = [(ts._gru_gates_kernel, ts._TILE), (ts._gru_read_grad_kernel, ts._READ_GRAD_TILE),
                (ts._gru_push_kernel, walk), (ts._lstm_push_kernel, walk)]
    # tl.dot sums its products by FMA: that is the product's own arithmetic, done by the one kernel that computes
    # the gate (or gradient), in both sweeps. Everywhere else no multiply and add may contract.
    with_products = {ts._gru_gates_kernel, ts._gru_read_grad_kernel}
    variants += [(kernel, dict(walk, POP=pop, DIFF=diff))
                 for kernel in (ts._gru_reverse_kernel, ts._lstm_reverse_kernel)
                 for pop, diff in ((True, True), (True, False), (False, True))]
    # The tiled kernels also take h_j as the int32 state (converted as they load it).
    typed = [(kernel, values, {}) for kernel, values in variants]
    typed += [(kernel, values, {"read_ptr": "*i32"}) for kernel, values in variants if kernel in with_products]
    spilled = []  # a spill is local memory traffic on every step: none may be there
    for arch in map(int, sys.argv[1:]):
        for kernel, values, types in typed:
            signature = {name: "constexpr" if name in values else types.get(name, arg_type(name))
                         for name in kernel.arg_names}
            variant = f"sm_{arch} {kernel.fn.__name__} {dict(POP=values.get('POP'), DIFF=values.get('DIFF'))} {types}"
            compiled = compile_reported(kernel, signature, values, arch, options, variant, spilled)
            assert kernel in with_products or "fma.rn.f32" not in compiled.asm["ptx"], "FMA contraction must stay off"
    assert not spilled, "registers spill:\n" + "\n".join(spilled)
""")


@pytest.mark.parametrize("arch", [80, 90])
def test_step_kernels_compile_for_the_gpu(arch):
    printed = compile_for_the_gpu(_COMPILE, arch, timeout=600)
    assert printed.count(f"sm_{arch}") == 12
