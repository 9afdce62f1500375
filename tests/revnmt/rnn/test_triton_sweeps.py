"""The persistent sweeps (revnmt.rnn.kernels.triton_sweeps) of RevGRU and RevLSTM stacks, in Triton's interpreter on
CPU tensors where there is no GPU, so the shapes are tiny: 20 sentences in buffer tiles of 8 (the last partial) and
programs of 16 rows, so a program holds two tiles and one program only a partial tile; padding; 2 layers of halves of
20 units (a block of 16 and a ragged one, in the units and in the products' sums) on 10 lanes (of the 16 a program's
blocks hold), a stored slice of 5 columns (2 chunks an update, a partial one beside the slice); the forget gates'
biases pushed down (RevGRU's z, RevLSTM's f and p) so that they sit at the forget limit and the tiles overflow.

- The reverse rebuilds the initial states bit for bit and empties the buffer.
- Given the products the sweep computes (a test kernel calls its product functions on the same blocks), the
  per-step kernels' walk makes the same states, slices, words, flags and heights: the push order (RevLSTM's c, then
  h, per half) and each tile's decision are the buffer's.
- A peek (the decoder's first launch a chunk) reads the outputs the reverse meets and changes nothing.
- The gradients match the torch backend's reversal of the same model on a buffer of the same lanes (its products are
  oneDNN's, so its states differ in their lowest bits: the gradients agree to float tolerance, not bit for bit; on
  other lanes the live words, which feed every push, would move the low bits further), with gradients of the
  outputs too (the decoder's reverse by chunks).
- The kernels compile ahead of time for sm_80 and sm_90 without spilling a register.
"""

import textwrap

import pytest
import torch
from conftest import HAS_CUDA, HAS_TRITON, assert_same_words, compile_for_the_gpu
from test_reversible import _assert_close

from buffers import ForgetLimit, InformationBuffer, backends, to_float
from revnmt.profiling.launches import LaunchCounter
from revnmt.profiling.live_bytes import LiveBytesBySite
from revnmt.rnn import ReversibleRNN
from revnmt.rnn.cells import SweepWeights
from revnmt.rnn.inputs import TensorInput

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install -e .[dev])")

if HAS_TRITON:
    import triton
    import triton.language as tl

    from buffers.backends.triton_kernels import COMPILE_OPTIONS
    from revnmt.rnn.kernels import triton_sweeps as ts
    from revnmt.rnn.kernels.triton_steps import TRITON_STEPS

    @triton.jit
    def _products_kernel(x_ptr, x_rs, n_in, w_in_ptr, b_ptr, read_ptr, read_rs, w_rec_ptr, work_ptr, pre_ptr, p_ptr,
                         batch, half, lanes, stored, LSTM: tl.constexpr, TB: tl.constexpr, LANES_P2: tl.constexpr,
                         BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
        """A half's products as the forward sweep computes them (its functions, its blocks), into the per-step
        kernels' arguments: RevGRU's σ(z), σ(r) and r·h_j into ``work`` and g's recurrent product and projection into
        ``pre`` and ``p`` [batch, half]; RevLSTM's five gates' into ``pre`` and ``p`` [batch, 5·half] (f, g and i
        at c's blocks, which store no column, o and p at h's)."""
        rows = tl.program_id(0) * TB + tl.arange(0, TB)
        src = (x_ptr, x_rs, n_in, w_in_ptr, b_ptr, read_ptr, read_rs, w_rec_ptr, batch, half)
        if not LSTM:
            ts._gates_phase(src, work_ptr, rows, TB, BLOCK_J, BLOCK_K)
            src = ts._g_source(src, work_ptr)
        first = 2 - 2 * LSTM
        width = (3 + 2 * LSTM - first) * half
        zeros = tl.zeros((TB, LANES_P2), dtype=tl.float32)
        k = tl.arange(0, LANES_P2)
        for q in range(first, 3 + 2 * LSTM):
            q_stored = 0 if LSTM and q < 3 else stored
            buffered = half - q_stored
            for block in range(0, tl.cdiv(q_stored, LANES_P2) + tl.cdiv(buffered, lanes)):
                c = block - tl.cdiv(q_stored, LANES_P2)
                chunk = c >= 0
                cols = tl.where(chunk, q_stored + c * lanes + k, block * LANES_P2 + k)
                ok = tl.where(chunk, (k < lanes) & (c * lanes + k < buffered), cols < q_stored)
                rec, proj = ts._gate(src, q, rows, cols, zeros, BLOCK_K)
                at = rows[:, None] * width + (q - first) * half + cols[None, :]
                ok = (rows[:, None] < batch) & ok[None, :]
                tl.store(pre_ptr + at, rec, mask=ok)
                tl.store(p_ptr + at, proj, mask=ok)


DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
BATCH, IN, HIDDEN, LAYERS, STEPS, SLICE, TILE, LANES = 20, 7, 40, 2, 6, 5, 8, 10
HALF = HIDDEN // 2
LIMIT = ForgetLimit(3)
CELLS = ["revgru", "revlstm"]


def _problem(cell, seed=0, dropout=True):
    """A stack near the forget limit, its inputs, a mask with padding, dropout masks and initial states."""
    torch.manual_seed(seed)
    rnn = ReversibleRNN(cell, IN, HIDDEN, num_layers=LAYERS, slice_dim=SLICE, buffer_lanes=LANES, buffer_tile=TILE,
                        buffer_backend="torch").to(DEVICE)
    with torch.no_grad():  # σ(forget) mostly below 2^-3: z at the limit, 3 bits a lane and push
        for lin in rnn.cells[0].linears() + rnn.cells[1].linears():
            if cell == "revgru":
                if lin.out_features == 2 * HALF:  # [z | r]
                    lin.bias[:HALF] -= 3.0
            else:  # [f | g | i | o | p]
                lin.bias[:HALF] -= 3.0
                lin.bias[4 * HALF:] -= 3.0
    x = torch.randn(STEPS, BATCH, IN, device=DEVICE)
    lengths = torch.randint(1, STEPS + 1, (BATCH,))
    lengths[0] = STEPS
    mask = (torch.arange(STEPS)[:, None] < lengths[None, :]).to(DEVICE)
    drop = torch.ones(LAYERS, BATCH, HIDDEN, device=DEVICE)
    if dropout:
        drop[1:] = torch.bernoulli(torch.full((LAYERS - 1, BATCH, HIDDEN), 0.8, device=DEVICE)) / 0.8
    initial = torch.randint(-(1 << 22), 1 << 22, (LAYERS, BATCH, rnn.state_size), dtype=torch.int32, device=DEVICE)
    return rnn, x, mask, drop, initial


def _buffer(levels=40):
    """A triton buffer with a fixed room of ``levels`` stack levels, as a sweep gets it."""
    return InformationBuffer(BATCH, LANES, DEVICE, LIMIT, backend=backends.resolve("triton", DEVICE), tile_rows=TILE,
                             levels=levels, eager_checks=False)


def _weights(rnn, grads=False):
    sweep = [SweepWeights(cell, grads=grads) for cell in rnn.cells]
    return sweep, ts.StackWeights.of(sweep)


def _reverse(rnn, weights, sweep, x, mask, state, grads, drop, buf, slices, initial, slice_grad, chunk):
    """The reverse sweep a chunk of steps per launch, last chunk first, the weights' gradients reduced per chunk;
    returns d loss / d x."""
    slots = ts.ReverseSlots.empty(rnn.cells[0], LAYERS, chunk, BATCH, DEVICE)
    grad_x = torch.zeros_like(x)
    for start in reversed(range(0, STEPS, chunk)):
        stop = min(start + chunk, STEPS)
        ts.reverse_sweep(weights, x[start:stop], mask, state, grads, drop, buf, LIMIT, slices, initial[-1], slice_grad,
                         start, stop, slots)
        grad_x[start:stop] = slots.accumulate(sweep, stop - start, x[start:stop])
    return grad_x


def _swept(cell):
    """:func:`_problem`'s stack swept forward by the kernel: (rnn, its SweepWeights collecting gradients, their
    StackWeights, x, mask, drop, initial, the buffer, the states after the sweep, the slices)."""
    rnn, x, mask, drop, initial = _problem(cell)
    sweep, weights = _weights(rnn, grads=True)
    buf, state = _buffer(), initial.clone()
    slices = ts.forward_sweep(weights, x, mask, state, drop, buf, LIMIT, SLICE)
    return rnn, sweep, weights, x, mask, drop, initial, buf, state, slices


@pytest.mark.parametrize("cell", CELLS)
def test_the_reverse_rebuilds_the_initial_states_and_empties_the_buffer(cell):
    rnn, sweep, weights, x, mask, drop, initial, buf, state, slices = _swept(cell)
    buf.check()
    heights = buf.words.heights()
    assert min(heights) > 0 and buf.words.overflows().any(0).all()  # every tile overflowed, the partial one too
    assert not torch.equal(state, initial)
    grads = torch.randn(LAYERS, BATCH, rnn.state_size, device=DEVICE)
    slice_grad = torch.randn(slices.shape, device=DEVICE)
    _reverse(rnn, weights, sweep, x, mask, state, grads, drop, buf, slices, initial, slice_grad, chunk=4)
    assert torch.equal(state, initial)
    assert buf.is_empty() and buf.words.heights() == [0] * buf.words.tiles and int(buf.words.status) == 0


@pytest.mark.parametrize("cell", CELLS)
def test_a_peek_reads_the_outputs_and_leaves_the_states_and_the_buffer_as_they_were(cell):
    # The decoder's reverse peeks at a chunk's outputs before it backpropagates them. A peek's outputs are the top
    # layer's states the reverse meets step by step, and it changes nothing the reverse then reads.
    rnn, _, weights, x, mask, drop, initial, buf, state, slices = _swept(cell)
    words = buf.words
    kept = [state, words.curr, words.top, words.stack, words.flags, words.status]
    before, pushes = [t.clone() for t in kept], words.pushes
    slots = ts.ReverseSlots.empty(rnn.cells[0], LAYERS, STEPS, BATCH, DEVICE)
    outs = ts.peek_outputs(weights, x, mask, state, drop, buf, LIMIT, slices, initial[-1], 0, STEPS, slots)
    part = ts.peek_outputs(weights, x[2:], mask, state, drop, buf, LIMIT, slices, initial[-1], 2, STEPS, slots)
    assert all(torch.equal(a, b) for a, b in zip(before, kept)) and words.pushes == pushes
    assert outs.shape == (STEPS, BATCH, HIDDEN) and torch.equal(part, outs[2:])
    slots = ts.ReverseSlots.empty(rnn.cells[0], LAYERS, 1, BATCH, DEVICE)
    grads = torch.zeros(LAYERS, BATCH, rnn.state_size, device=DEVICE)
    for t in reversed(range(STEPS)):  # a step a launch: the state before undoing step t is the one after it
        assert torch.equal(outs[t], state[-1, :, :HIDDEN]), f"step {t}"
        ts.reverse_sweep(weights, x[t:t + 1], mask, state, grads, drop, buf, LIMIT, slices, initial[-1], None, t,
                         t + 1, slots)
    assert torch.equal(state, initial) and buf.is_empty()


def _per_step_half(cell, ref, ref_state, layer, i, inp, w_in, weights, mask, stored, work, grid, blocks):
    """Half i of ``layer`` by the per-step kernels (``ref``'s walk, ``ref_state`` in place), fed the sweep's
    products of it."""
    lstm = cell == "revlstm"
    width = (5 if lstm else 1) * HALF
    gates = 5 if lstm else 3
    pre, p = (torch.empty(BATCH, width, device=DEVICE) for _ in range(2))
    read = ref_state[layer, :, (1 - i) * HALF:]
    _products_kernel[grid](inp, inp.shape[1], inp.shape[1], w_in[i * gates * HALF:],
                           weights.bias[layer, i * gates * HALF:], read, read.stride(0), weights.w_rec[layer, i], work,
                           pre, p, BATCH, HALF, LANES, stored, LSTM=lstm, **blocks, **COMPILE_OPTIONS)
    out = torch.empty_like(ref_state[layer])
    h = ref_state[layer, :, i * HALF: (i + 1) * HALF]
    out_h = out[:, i * HALF: (i + 1) * HALF]
    if lstm:
        c = ref_state[layer, :, HIDDEN + i * HALF: HIDDEN + (i + 1) * HALF]
        out_c = out[:, HIDDEN + i * HALF: HIDDEN + (i + 1) * HALF]
        TRITON_STEPS.lstm_push(ref, h, c, pre, p, 0, mask, stored, LIMIT, out_h, out_c)
        c.copy_(out_c)
    else:
        TRITON_STEPS.gru_push(ref, h, pre, p, 0, work[:, : 2 * HALF].contiguous(), mask, stored, LIMIT, out_h)
    h.copy_(out_h)


@pytest.mark.parametrize("cell", CELLS)
def test_the_sweep_makes_the_per_step_kernels_words(cell):
    rnn, x, mask, drop, initial = _problem(cell, 1)
    x, mask = x[:4], mask[:4]  # 4 steps: the reference walk is slow in the interpreter
    sweep, weights = _weights(rnn)
    ours, state = _buffer(), initial.clone()
    slices = ts.forward_sweep(weights, x, mask, state, drop, ours, LIMIT, SLICE)
    ref, ref_state = _buffer(), initial.clone()
    options = ts._options(TILE, LANES)
    blocks = {name: options[name] for name in ("TB", "LANES_P2", "BLOCK_J", "BLOCK_K")}
    grid = (triton.cdiv(BATCH, options["TB"]),)
    work = torch.empty(BATCH, 3 * HALF, device=DEVICE)
    for t in range(len(mask)):
        for layer in range(LAYERS):
            if layer == 0:
                inp, w_in = x[t], weights.w_in0
            else:
                inp, w_in = to_float(ref_state[layer - 1, :, :HIDDEN]) * drop[layer], weights.w_in[layer - 1]
            for i in (0, 1):
                _per_step_half(cell, ref, ref_state, layer, i, inp, w_in, weights, mask[t],
                               ts._stored(layer, LAYERS, i, HALF, SLICE), work, grid, blocks)
        assert torch.equal(slices[t], ref_state[-1, :, :SLICE]), f"step {t}"
    assert torch.equal(state, ref_state)
    assert max(ours.heights()) > 0
    assert_same_words(ours, ref)


@pytest.mark.parametrize("cell", CELLS)
def test_the_gradients_match_the_torch_reversal(cell):
    # The torch reference's gates (torch's σ and tanh) are not the kernels' to the last bit, and where that flips a
    # forget numerator the gradients move by up to about the tolerance: RevLSTM's with seed 2 by 9.9e-5 (the per-step
    # kernels' as much as these). Seed 3 leaves a margin for both cells (2e-5).
    rnn, x, mask, drop, initial = _problem(cell, 3)
    grad_final = torch.randn(LAYERS, BATCH, rnn.state_size, device=DEVICE)
    slice_grad = torch.randn(STEPS, BATCH, SLICE, device=DEVICE)
    dropout = [None] + [drop[layer] for layer in range(1, LAYERS)]

    inputs = TensorInput(x)
    tape = rnn.forward_sweep(inputs, mask, initial=list(initial.clone()), dropout=dropout)
    assert tape.buffer.words.lanes == LANES  # the sweep's layout: the live words feed every push
    want_init = rnn.backward_sweep(tape, inputs, grad_final=list(grad_final), slice_grad=slice_grad)
    want = {name: p.grad.clone() for name, p in rnn.named_parameters()}
    rnn.zero_grad(set_to_none=True)

    sweep, weights = _weights(rnn, grads=True)
    buf, state, grads = _buffer(), initial.clone(), grad_final.clone()
    slices = ts.forward_sweep(weights, x, mask, state, drop, buf, LIMIT, SLICE)
    grad_x = _reverse(rnn, weights, sweep, x, mask, state, grads, drop, buf, slices, initial, slice_grad, chunk=4)
    for collected in sweep:
        collected.flush()
    assert torch.equal(state, initial) and buf.is_empty()
    for name, p in rnn.named_parameters():
        _assert_close(p.grad, want[name])
    _assert_close(grad_x, inputs.grad)
    _assert_close(grads, torch.stack(want_init))


@pytest.mark.parametrize("cell", CELLS)
def test_the_decoders_reverse_by_chunks_matches_the_torch_reversal(cell):
    # With gradients of its outputs (the decoder's attention and loss) a stack is reversed a chunk of its chunk_steps
    # at a time, a peek and a reverse launch each: 6 steps in chunks of 4, the last partial. Each chunk's gradients
    # are asked once, for its outputs, and the parameters' and inputs' gradients match the torch backend's reversal.
    rnn, x, mask, drop, initial = _problem(cell, 3)
    w_out = torch.randn(STEPS, BATCH, HIDDEN, device=DEVICE)
    dropout = [None] + [drop[layer] for layer in range(1, LAYERS)]
    runs = []
    for backend in ("torch", "triton"):
        stack = ReversibleRNN(cell, IN, HIDDEN, num_layers=LAYERS, slice_dim=SLICE, buffer_lanes=LANES,
                              buffer_tile=TILE, buffer_backend=backend, chunk_steps=4,
                              sweep_kernels="persistent").to(DEVICE)
        stack.load_state_dict(rnn.state_dict())
        inputs, asked = TensorInput(x), []

        def output_grads(steps, outs, asked=asked):
            asked.append((steps, outs))
            return w_out[steps]

        tape = stack.forward_sweep(inputs, mask, initial=list(initial.clone()), dropout=dropout)
        init = stack.backward_sweep(tape, inputs, output_grads=output_grads)
        runs.append((asked, {name: p.grad for name, p in stack.named_parameters()}, inputs.grad, init))
    (want_asked, want, want_x, want_init), (asked, got, got_x, got_init) = runs
    assert [steps for steps, _ in asked] == [steps for steps, _ in want_asked] == [slice(4, 6), slice(0, 4)]
    for (_, outs), (_, want_outs) in zip(asked, want_asked):
        _assert_close(outs, want_outs)  # the same outputs, but for the products' low bits
    for name in want:
        _assert_close(got[name], want[name])
    _assert_close(got_x, want_x)
    _assert_close(torch.stack(got_init), torch.stack(want_init))


@pytest.mark.parametrize("outputs", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("cell", CELLS)
def test_a_backward_sweep_holds_what_its_accounting_charges(cell, outputs):
    # What a memory budget plans with (ReversibleRNN.work_bytes, the persistent kernels' own count): the tensors the
    # backward sweep makes stay within it at their peak, and it is not a loose bound.
    torch.manual_seed(0)
    rnn = ReversibleRNN(cell, IN, HIDDEN, num_layers=LAYERS, slice_dim=SLICE, buffer_lanes=LANES, buffer_tile=TILE,
                        buffer_backend="triton", chunk_steps=4, sweep_kernels="persistent").to(DEVICE)
    x = torch.randn(STEPS, BATCH, IN, device=DEVICE)
    inputs, mask = TensorInput(x), torch.ones(STEPS, BATCH, dtype=torch.bool, device=DEVICE)
    tape = rnn.forward_sweep(inputs, mask)
    inputs.grad = torch.zeros_like(x)  # the caller's, as the parameters' gradients are
    for p in rnn.parameters():
        p.grad = torch.zeros_like(p)
    w_out = torch.randn(STEPS, BATCH, HIDDEN, device=DEVICE)
    grads = (dict(output_grads=lambda steps, outs: w_out[steps]) if outputs
             else dict(grad_final=[torch.ones(BATCH, rnn.state_size, device=DEVICE)] * LAYERS))
    with LiveBytesBySite() as meter:
        rnn.backward_sweep(tape, inputs, **grads)
    charged = rnn.work_bytes(BATCH, DEVICE, outputs=outputs)
    assert 0.6 * charged <= meter.peak <= charged, (meter.peak, charged, meter.at_peak.most_common(8))


@pytest.mark.parametrize("cell", CELLS)
def test_a_full_room_counts_the_heights_and_stores_nothing_past_it(cell):
    # A push past the fixed room stores nothing and counts the height: the sweep's end reads how much room it
    # needed (settle), and the levels that fitted hold the words they would have held.
    rnn, x, mask, drop, initial = _problem(cell)
    _, weights = _weights(rnn)
    full, state = _buffer(), initial.clone()
    ts.forward_sweep(weights, x, mask, state, drop, full, LIMIT, SLICE)
    buf, state = _buffer(levels=1), initial.clone()
    ts.forward_sweep(weights, x, mask, state, drop, buf, LIMIT, SLICE)
    assert buf.words.heights() == full.words.heights() and max(buf.words.heights()) > 1  # counted all the same
    assert buf.settle() == [max(full.words.heights())] and buf.capacity == 1
    assert torch.equal(buf.words.stack[:1], full.words.stack[:1])  # the level that fits
    assert not buf.words.stack[1].any()  # and nothing in the spare level above it


@pytest.mark.parametrize("cell", CELLS)
def test_the_triton_backend_runs_a_stack_sweep_in_one_launch_and_a_launch_a_chunk(cell):
    # The seam: ReversibleRNN asks its backend (revnmt.rnn.backends.Backend.persistent) once per sweep. A stack's
    # forward is one launch for all its steps and layers, its reverse one per chunk of weight_grad_steps steps (4: 6
    # steps are 2 launches), or, with gradients of its outputs, two (a peek and a reverse) per chunk of its
    # chunk_steps (2: 6 steps are 6 launches). Only a stack that asks for the persistent kernels gets them.
    steps, batch = 6, 4
    x = torch.randn(steps, batch, IN, device=DEVICE)
    mask = torch.ones(steps, batch, dtype=torch.bool, device=DEVICE)
    inputs = TensorInput(x)
    default = ReversibleRNN(cell, IN, 16, num_layers=2, slice_dim=3, buffer_backend="triton").to(DEVICE)
    with LaunchCounter() as steps_run:
        default.forward_sweep(inputs, mask)
    assert "_forward_kernel" not in steps_run.names and any(name.startswith("_") for name in steps_run.names)
    rnn = ReversibleRNN(cell, IN, 16, num_layers=2, slice_dim=3, buffer_backend="triton",
                        sweep_kernels="persistent").to(DEVICE)
    with LaunchCounter() as forward:
        tape = rnn.forward_sweep(inputs, mask)
    with LaunchCounter() as backward:
        rnn.backward_sweep(tape, inputs, grad_final=[torch.randn(batch, rnn.state_size, device=DEVICE)] * 2)
    kernels = [name for name in forward.names + backward.names if name.startswith("_")]
    assert kernels == ["_forward_kernel", "_reverse_kernel", "_reverse_kernel"]
    tape = rnn.forward_sweep(inputs, mask)
    with LaunchCounter() as decoder:
        rnn.backward_sweep(tape, inputs, output_grads=lambda steps, outs: torch.ones_like(outs))
    assert [name for name in decoder.names if name.startswith("_")] == ["_reverse_kernel"] * 6


_COMPILE = textwrap.dedent(r"""
    import sys

    from ptxas_log import compile_reported

    from revnmt.rnn.kernels import triton_sweeps as ts

    INTS = {"state", "slices", "initial", "status", "outs"}
    BOOLS, BYTES, LONGS, DOUBLES = {"mask"}, {"flags"}, {"curr", "stack", "top"}, {"lost", "lost_table"}


    def arg_type(name):
        if not name.endswith("_ptr"):
            return "fp32" if name == "slope" else "i32"
        base = name[:-4]
        for names, kind in ((INTS, "*i32"), (BOOLS, "*i1"), (BYTES, "*u8"), (LONGS, "*i64"), (DOUBLES, "*fp64")):
            if base in names:
                return kind
        return "*fp32"


    spilled = []
    arch = int(sys.argv[1])
    # Programs of 16 rows (buffer tiles of 8, the default) and of 32 (tiles of 32). The model's sizes are arguments,
    # not constants: what changes the compiled kernel is its program's rows.
    for tile in (8, 32):
        options = ts._options(tile, ts.MAX_LANES)
        values = {name: options.pop(name) for name in ("TILE_ROWS", "TB", "LANES_P2", "BLOCK_J", "BLOCK_K")}
        for lstm in (False, True):
            # the reverse with both outside gradients (a superset of the encoder's and the decoder's), and a peek
            reverse = {"SLICE_GRAD": True, "OUT_GRAD": True, "PEEK": False}
            peek = {"SLICE_GRAD": False, "OUT_GRAD": False, "PEEK": True}
            for kernel, extra, label in ((ts._forward_kernel, {}, "_forward_kernel"),
                                         (ts._reverse_kernel, reverse, "_reverse_kernel"),
                                         (ts._reverse_kernel, peek, "_reverse_kernel PEEK")):
                constants = dict(values, LSTM=lstm, **extra)
                signature = {name: "constexpr" if name in constants else arg_type(name) for name in kernel.arg_names}
                cell = "revlstm" if lstm else "revgru"
                variant = f"sm_{arch} tile={tile} TB={values['TB']} {cell} {label}"
                compile_reported(kernel, signature, constants, arch, options, variant, spilled)
    assert not spilled, "registers spill:\n" + "\n".join(spilled)
""")


@pytest.mark.parametrize("arch", [80, 90])
def test_sweep_kernels_compile_for_the_gpu(arch):
    printed = compile_for_the_gpu(_COMPILE, arch, timeout=900)
    assert printed.count(f"sm_{arch}") == 12
