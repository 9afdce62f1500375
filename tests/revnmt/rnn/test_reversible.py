import contextlib
import warnings

import pytest
import torch
from conftest import FAST_BACKENDS, INTERPRETED_TRITON

import buffers
from buffers import FixedPointOverflowError, StackRoom
from revnmt.profiling.launches import LaunchCounter, check_lazily
from revnmt.rnn import ReversalError, ReversibleRNN, TensorInput
from revnmt.rnn.tape import settle

IN, HID, SLICE = 6, 10, 3


def _mask(steps, lengths, device="cpu"):
    return torch.arange(steps, device=device)[:, None] < torch.tensor(lengths, device=device)[None]


def _problem(cell, layers, steps, seed=0, dropout=0.0, device="cpu", **buffer_options):
    torch.manual_seed(seed)
    buffer_options.setdefault("buffer_lanes", 2)
    rnn = ReversibleRNN(cell, IN, HID, num_layers=layers, dropout=dropout, slice_dim=SLICE, **buffer_options).to(device)
    batch = 4
    lengths = [steps, max(1, steps - 3), max(1, steps // 2), 1]  # padding in every row but the first
    mask = _mask(steps, lengths, device)
    x = torch.randn(steps, batch, IN, device=device, requires_grad=True)
    # random "loss weights" on every output, final state and slice: the loss touches everything
    w_out = torch.randn(steps, batch, HID, device=device)
    w_fin = [torch.randn(batch, rnn.state_size, device=device) for _ in range(layers)]
    w_slice = torch.randn(steps, batch, SLICE, device=device)
    return rnn, x, mask, w_out, w_fin, w_slice


def _reversal_grads(rnn, x, mask, w_out, w_fin, w_slice):
    rnn.zero_grad()
    inputs = TensorInput(x)
    tape = rnn.forward_sweep(inputs, mask)
    init_grads = rnn.backward_sweep(tape, inputs, grad_final=w_fin, output_grads=lambda s, out: w_out[s],
                                    slice_grad=w_slice)
    grads = {n: p.grad.clone() for n, p in rnn.named_parameters()}
    return grads, inputs.grad, init_grads, tape


def _autograd_grads(rnn, x, mask, w_out, w_fin, w_slice, dropout=None):
    rnn.zero_grad()
    x.grad = None
    out, final, slices, _ = rnn.forward_autograd(x, mask, dropout=dropout)
    loss = (out * w_out).sum() + sum((f * w).sum() for f, w in zip(final, w_fin)) + (slices * w_slice).sum()
    loss.backward()
    return {n: p.grad.clone() for n, p in rnn.named_parameters()}, x.grad.clone()


def _assert_close(got, want):
    cos = torch.nn.functional.cosine_similarity(got.flatten().double(), want.flatten().double(), dim=0)
    rel = (got - want).norm() / want.norm()
    assert cos >= 0.9999 and rel <= 1e-4, f"cos {cos:.7f} rel {rel:.2e}"


# The backends whose reverse steps differ: the numba backend's fused kernels (its own gate code) and
# the torch reference. (The Triton backend's fused kernels, with gate code of their own too, are too slow
# in the interpreter for these sizes: test_triton_steps.py runs a smaller sweep.)
_STEP_BACKENDS = ["numba", "torch"]


@pytest.mark.parametrize("backend", _STEP_BACKENDS)
@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("steps", [1, 10, 100])
def test_reversal_gradients_match_backprop(cell, layers, steps, backend):
    rnn, x, mask, w_out, w_fin, w_slice = _problem(cell, layers, steps, buffer_backend=backend)
    rev, rev_x, _, _ = _reversal_grads(rnn, x, mask, w_out, w_fin, w_slice)
    ref, ref_x = _autograd_grads(rnn, x, mask, w_out, w_fin, w_slice)
    for name in ref:
        _assert_close(rev[name], ref[name])
    _assert_close(rev_x, ref_x)


@pytest.mark.parametrize("backend", _STEP_BACKENDS)
@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
@pytest.mark.parametrize("chunk_steps", [1, 3, 4])
def test_chunked_reverse_gradients_match_backprop(cell, chunk_steps, backend):
    # 10 steps: the last chunk is partial for 3 and 4; two layers with dropout between them
    rnn, x, mask, w_out, w_fin, w_slice = _problem(cell, 2, 10, dropout=0.5, chunk_steps=chunk_steps,
                                                   buffer_backend=backend)
    rnn.train()
    rev, rev_x, _, tape = _reversal_grads(rnn, x, mask, w_out, w_fin, w_slice)
    ref, ref_x = _autograd_grads(rnn, x, mask, w_out, w_fin, w_slice, dropout=tape.dropout)
    for name in ref:
        _assert_close(rev[name], ref[name])
    _assert_close(rev_x, ref_x)


def test_chunked_reverse_asks_for_each_chunks_output_gradients_once():
    rnn, x, mask, w_out, *_ = _problem("revgru", 2, 10, chunk_steps=4)
    inputs = TensorInput(x)
    tape = rnn.forward_sweep(inputs, mask)
    out, *_ = rnn.forward_autograd(x, mask)
    asked = []

    def output_grads(steps, outs):
        asked.append(steps)
        assert torch.equal(outs, out[steps].detach())  # the exact outputs of the chunk's steps
        return w_out[steps]

    rnn.backward_sweep(tape, inputs, output_grads=output_grads)
    assert asked == [slice(8, 10), slice(4, 8), slice(0, 4)]


@pytest.mark.parametrize("backend", _STEP_BACKENDS)
@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_reversal_with_between_layer_dropout_reuses_the_masks(cell, backend):
    rnn, x, mask, w_out, w_fin, w_slice = _problem(cell, 2, 12, dropout=0.5, buffer_backend=backend)
    rnn.train()
    rev, rev_x, _, tape = _reversal_grads(rnn, x, mask, w_out, w_fin, w_slice)
    assert tape.dropout[1] is not None and (tape.dropout[1] == 0).any()
    ref, ref_x = _autograd_grads(rnn, x, mask, w_out, w_fin, w_slice, dropout=tape.dropout)
    for name in ref:
        _assert_close(rev[name], ref[name])


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_sweep_reconstructs_initial_state_and_empties_buffer(cell, backend, device):
    rnn, x, mask, *_ = _problem(cell, 2, 30, device=device, buffer_backend=backend)
    start = [torch.randint(-(1 << 22), 1 << 22, (4, rnn.state_size), dtype=torch.int32, device=device)
             for _ in range(2)]
    inputs = TensorInput(x)
    before = [s.clone() for s in start]
    tape = rnn.forward_sweep(inputs, mask, initial=start)
    assert not torch.equal(tape.states[0], start[0])
    # the tape checks against the caller's tensors themselves, not copies: no sweep writes into them
    assert all(kept is given for kept, given in zip(tape.initial, start))
    rnn.backward_sweep(tape, inputs)  # raises unless exact
    assert all(torch.equal(s, i) for s, i in zip(tape.states, before)) and tape.buffer.is_empty()
    assert all(torch.equal(s, i) for s, i in zip(start, before))


def test_padded_steps_leave_state_unchanged():
    rnn, x, _, *_ = _problem("revgru", 1, 8)
    mask = _mask(8, [8, 3, 0, 8])
    start = [torch.randint(-(1 << 22), 1 << 22, (4, rnn.state_size), dtype=torch.int32)]
    tape = rnn.forward_sweep(TensorInput(x), mask, initial=start)
    assert torch.equal(tape.states[0][2], start[0][2])  # an all-padding row is untouched
    # Row 1 stopped after its 3 tokens while rows 0 and 3 of its tile went on pushing: its state is what the
    # first 3 steps left.
    short = rnn.forward_sweep(TensorInput(x[:3]), mask[:3], initial=start)
    assert torch.equal(tape.states[0][1], short.states[0][1])


@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_inference_sweep_rows_do_not_depend_on_their_batch_mates(cell):
    # Without a buffer nothing is shared between rows, so a sentence's translation does not depend on
    # the batch it came in. (A buffer's words are shared by the rows and feed the lowest bits of every
    # product.) The batch keeps its shape, so the matrix products block their rows alike.
    rnn, x, mask, *_ = _problem(cell, 2, 12)
    other = torch.randn_like(x)
    other[:, 0] = x[:, 0]
    sweeps = [rnn.forward_sweep(TensorInput(inp), mask, reversible=False) for inp in (x, other)]
    for a, b in zip(sweeps[0].states, sweeps[1].states):
        assert torch.equal(a[0], b[0]) and not torch.equal(a[1:], b[1:])
    assert torch.equal(sweeps[0].slices[:, 0], sweeps[1].slices[:, 0])
    with pytest.raises(ValueError, match="cannot be reversed"):
        rnn.backward_sweep(sweeps[0], TensorInput(x))


@pytest.mark.parametrize("backend", _STEP_BACKENDS + ["triton"])
@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_a_tile_of_sentences_never_depends_on_the_rest_of_the_batch(cell, backend):
    # Two batches of 4 in tiles of 2 whose first tile holds the same sentences, and whose second tile holds others
    # (other words, other lengths, other loss weights): in the first tile the states, slices, the buffer's words,
    # the reconstructed states and the input and initial-state gradients are the same, bit for bit.
    steps = 6 if backend == "triton" else 12  # Triton runs in its interpreter here
    rnn, x, mask, w_out, w_fin, w_slice = _problem(cell, 2, steps, buffer_backend=backend, buffer_tile=2)
    mine = slice(0, 2)
    second = [t.detach().clone() for t in (x, mask, w_out, w_slice)]
    for t in second:
        t[:, 2:] = torch.randn_like(t[:, 2:].float()) > 0 if t.dtype == torch.bool else torch.randn_like(t[:, 2:])
    second[1][:, 2:] = _mask(steps, [steps - 2, steps])
    second[0].requires_grad_()
    runs = [(x, mask, w_out, w_fin, w_slice), (second[0], second[1], second[2], w_fin, second[3])]
    tapes = [rnn.forward_sweep(TensorInput(inp), m) for inp, m, *_ in runs]
    words = [tape.buffer.words for tape in tapes]
    height = words[0].heights()[0]
    assert height == words[1].heights()[0] and (height > 0 or backend == "triton")  # its stack is exercised
    assert torch.equal(words[0].curr[mine], words[1].curr[mine]) and not torch.equal(words[0].curr[2:],
                                                                                       words[1].curr[2:])
    assert torch.equal(words[0].stack[:height, mine], words[1].stack[:height, mine])
    assert torch.equal(words[0].overflows()[:, 0], words[1].overflows()[:, 0])
    for a, b in zip(tapes[0].states, tapes[1].states):
        assert torch.equal(a[mine], b[mine]) and not torch.equal(a[2:], b[2:])
    assert torch.equal(tapes[0].slices[:, mine], tapes[1].slices[:, mine])
    grads = [_reversal_grads(rnn, *run) for run in runs]
    (_, x_a, init_a, tape_a), (_, x_b, init_b, tape_b) = grads
    assert torch.equal(x_a[:, mine], x_b[:, mine]) and not torch.equal(x_a[:, 2:], x_b[:, 2:])
    for a, b in zip(init_a, init_b):
        assert torch.equal(a[mine], b[mine])
    for a, b in zip(tape_a.states, tape_b.states):  # reconstructed: the initial zeros, in both
        assert torch.equal(a[mine], b[mine])


@pytest.mark.parametrize("backend", _STEP_BACKENDS + ["triton"])
@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_a_sweep_that_outgrows_its_room_runs_again_to_the_same_bits(cell, backend):
    # A stack that has learned nothing and keeps no spare level gives its buffer no room: the first overflow
    # outgrows it, the pushes go on storing nothing, and the sweep runs again with the room it turned out to need.
    # What it hands the reverse (states, slices, words, flags, heights) and what the reverse computes are those of
    # a sweep that had room from the start, bit for bit.
    # (a lane a row and 5 bits forgotten a step at most: the words overflow within a few steps)
    # Triton runs in its interpreter here: one layer, and as few steps as make the words overflow
    steps, layers = ((12 if cell == "revgru" else 8), 1) if backend == "triton" else (12, 2)
    rnn, x, mask, w_out, w_fin, w_slice = _problem(cell, layers, steps, buffer_backend=backend, buffer_tile=2,
                                                   buffer_lanes=1, max_forget_bits=5)
    runs = []
    for room in (StackRoom(levels_per_push=1.0), StackRoom(spare=0)):  # a level a push is room no sweep outgrows
        rnn.stack_room = room
        tape = rnn.forward_sweep(TensorInput(x), mask)
        words = tape.buffer.words
        height = max(words.heights())
        kept = [*tape.states, tape.slices, words.curr, words.stack[:height], words.top, words.overflows()]
        # the proven bound (never outgrown), or after the rerun the room the sweep's rate gives it, which holds it
        pushes = rnn.sweep_pushes(steps, torch.device("cpu"))
        proven = buffers.words.proven_height(rnn.limit, pushes)
        assert words.capacity == (room.levels(pushes, proven) if room.levels_per_push < 1 else proven) >= height
        runs.append(([t.clone() for t in kept], _reversal_grads(rnn, x, mask, w_out, w_fin, w_slice)))
    assert height > 0 and rnn.stack_room.reruns == 1 and rnn.stack_room.sweeps == 2  # outgrown once, at first
    (kept_a, (grads_a, x_a, init_a, _)), (kept_b, (grads_b, x_b, init_b, _)) = runs
    for a, b in zip(kept_a + list(init_a) + [x_a], kept_b + list(init_b) + [x_b]):
        assert torch.equal(a, b)
    assert all(torch.equal(grads_a[name], grads_b[name]) for name in grads_a)


@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_deferred_checks_of_sweeps_in_a_row_are_one_host_read(cell):
    # A caller that runs sweeps in a row (a model's encoder and decoder) leaves their checks on the tapes and reads
    # them together (revnmt.rnn.tape.settle): one host read for two forward sweeps, one for two reverses, where a
    # sweep alone reads once at its end. Nothing is read inside a sweep. A tape whose check is unread cannot be
    # reversed. (The torch buffer, checking lazily as on CUDA.)
    rnn, x, mask, w_out, w_fin, w_slice = _problem(cell, 2, 6, buffer_backend="torch")
    check_lazily(rnn)
    inputs = TensorInput(x)
    rnn.forward_sweep(inputs, mask)  # teaches the stack its room: nothing below runs again
    with LaunchCounter() as alone:
        rnn.forward_sweep(inputs, mask)
    with LaunchCounter() as forward:
        tapes = [rnn.forward_sweep(inputs, mask, defer_checks=True) for _ in range(2)]
    assert all(tape.checks for tape in tapes) and forward.host_reads == 0
    with pytest.raises(ValueError, match="has not been read"):
        rnn.backward_sweep(tapes[0], inputs, grad_final=w_fin)
    with LaunchCounter() as read_forward:
        settle(*tapes)
    assert alone.host_reads == read_forward.host_reads == 1 and not any(tape.checks for tape in tapes)
    with LaunchCounter() as backward:
        for tape in tapes:
            rnn.backward_sweep(tape, inputs, grad_final=w_fin, output_grads=lambda s, out: w_out[s],
                               slice_grad=w_slice, defer_checks=True)
    with LaunchCounter() as read_backward:
        settle(*tapes)
    assert backward.host_reads == 0 and read_backward.host_reads == 1
    assert rnn.stack_room.reruns == 0


@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_a_deferred_sweep_that_outgrew_its_room_runs_again_when_its_check_is_read(cell):
    # The rerun waits for the read: until then the tape's states and slices are right and its buffer incomplete;
    # after it, the tape reverses to the gradients of a sweep that had room from the start, bit for bit.
    rnn, x, mask, w_out, w_fin, w_slice = _problem(cell, 2, 12, buffer_backend="numba", buffer_tile=2,
                                                   buffer_lanes=1, max_forget_bits=5)
    rnn.stack_room = StackRoom(levels_per_push=1.0)  # room no sweep outgrows
    want, want_x, want_init, _ = _reversal_grads(rnn, x, mask, w_out, w_fin, w_slice)
    rnn.stack_room = StackRoom(spare=0)
    rnn.zero_grad()
    inputs = TensorInput(x)
    tape = rnn.forward_sweep(inputs, mask, defer_checks=True)
    assert rnn.stack_room.sweeps == 0  # nothing learned before the read
    settle(tape)
    assert rnn.stack_room.reruns == 1 and tape.buffer.words.capacity >= max(tape.buffer.words.heights())
    init = rnn.backward_sweep(tape, inputs, grad_final=w_fin, output_grads=lambda s, out: w_out[s],
                              slice_grad=w_slice)
    assert all(torch.equal(p.grad, want[name]) for name, p in rnn.named_parameters())
    assert torch.equal(inputs.grad, want_x) and all(torch.equal(a, b) for a, b in zip(init, want_init))


def test_a_deferred_guard_raises_when_read():
    rnn, x, mask, *_ = _problem("revgru", 1, 20)
    inputs = TensorInput(x)
    tape = rnn.forward_sweep(inputs, mask)
    with torch.no_grad():
        rnn.cells[0].zr[0].weight.add_(1e-3)
    rnn.backward_sweep(tape, inputs, defer_checks=True)  # nothing read yet
    with pytest.raises(ReversalError, match="gradients would be wrong"):
        settle(tape)


def test_forward_matches_autograd_forward_values():
    rnn, x, mask, *_ = _problem("revlstm", 2, 15)
    tape = rnn.forward_sweep(TensorInput(x), mask)
    out, final, slices, _ = rnn.forward_autograd(x, mask)
    for got, want in zip(final, tape.states):
        assert torch.equal(got.detach(), want.float() * 2.0 ** -23)
    assert torch.equal(slices.detach(), tape.slices.float() * 2.0 ** -23)


def test_weights_changed_between_forward_and_backward_raise():
    rnn, x, mask, *_ = _problem("revgru", 1, 20)
    inputs = TensorInput(x)
    tape = rnn.forward_sweep(inputs, mask)
    with torch.no_grad():
        rnn.cells[0].zr[0].weight.add_(1e-3)  # what a Hogwild worker writing mid-batch would do
    with pytest.raises(ReversalError, match="gradients would be wrong"):
        rnn.backward_sweep(tape, inputs)


def test_corrupted_buffer_raises():
    rnn, x, mask, *_ = _problem("revlstm", 1, 20)
    inputs = TensorInput(x)
    tape = rnn.forward_sweep(inputs, mask)
    tape.buffer.words.curr[0, 0] += 1
    with pytest.raises(ReversalError):
        rnn.backward_sweep(tape, inputs)


def test_state_leaving_fixed_point_range_raises():
    rnn, x, mask, *_ = _problem("revlstm", 1, 5)
    big = [torch.full((4, rnn.state_size), (1 << 31) - 1, dtype=torch.int32)]
    with pytest.raises(FixedPointOverflowError):
        rnn.forward_sweep(TensorInput(x), mask, initial=big)


@pytest.mark.parametrize("kwargs,match", [
    (dict(cell="rnn"), "unknown reversible cell"),
    (dict(hidden_size=11), "even"),
    (dict(slice_dim=11), "slice_dim"),
    (dict(dropout=1.0), "dropout"),
    (dict(max_forget_bits=0), "max forgotten bits"),
    (dict(buffer_lanes=0), "buffer_lanes"),
    (dict(buffer_backend="cudnn"), "unknown buffer backend"),
])
def test_bad_options(kwargs, match):
    args = dict(cell="revgru", input_size=4, hidden_size=10) | kwargs
    with pytest.raises(ValueError, match=match):
        ReversibleRNN(**args)


def test_lanes_default_to_few_on_cpu_and_evenly_loaded():
    rnn = ReversibleRNN("revgru", 4, 300)
    assert rnn.lanes_on(torch.device("cpu")) == 3 and rnn.lanes_on(torch.device("cuda")) == 16
    assert ReversibleRNN("revgru", 4, 300, buffer_backend="torch").lanes_on(torch.device("cpu")) == 16
    assert rnn.new_buffer(2, torch.device("cpu")).units == 3
    # 150 columns asked onto 16 lanes: 10 chunks, so 15 lanes, each taking one column per chunk
    assert ReversibleRNN("revgru", 4, 300, buffer_lanes=16).new_buffer(2, torch.device("cpu")).units == 15


def test_the_backend_is_resolved_once_per_device_not_per_batch(monkeypatch):
    # Every sweep makes a buffer; each takes the layer's backend object as it is, resolved when the layer first
    # ran on the device: no name is looked up per batch.
    resolve, calls = buffers.backends.resolve, []
    monkeypatch.setattr(buffers.backends, "resolve", lambda name, device: calls.append(name) or resolve(name, device))
    rnn, x, mask, w_out, w_fin, w_slice = _problem("revgru", 2, 5)
    backend = rnn.backend_on(torch.device("cpu"))
    for _ in range(3):
        tape = rnn.forward_sweep(TensorInput(x), mask)
        rnn.backward_sweep(tape, TensorInput(x), grad_final=w_fin, output_grads=lambda s, out: w_out[s],
                           slice_grad=w_slice)
        assert tape.backend is backend and tape.buffer.backend is backend.buffer
        rnn.forward_autograd(x, mask)
    assert calls == ["auto"]


@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_a_sweep_sizes_its_push_log_once(cell):
    # The forward sweep knows its length: the buffer's flag log (a bit per push, 8 to a byte) is sized for all its
    # pushes at the start, not doubled as it fills (on a GPU each doubling is an allocation and a copy).
    torch.manual_seed(0)
    rnn = ReversibleRNN(cell, 4, 12, num_layers=2, buffer_lanes=2)
    steps, batch = 7, 3
    tape = rnn.forward_sweep(TensorInput(torch.randn(steps, batch, 4)), torch.ones(steps, batch, dtype=torch.bool))
    assert tape.buffer.words.flags.shape[0] == (tape.buffer.pushes + 7) // 8 > 8  # exactly, and past the initial log


def test_stored_slice_columns_skip_the_buffer():
    torch.manual_seed(0)
    x, mask = torch.randn(12, 4, IN), _mask(12, [12, 9, 5, 1])
    whole = ReversibleRNN("revgru", IN, HID, slice_dim=HID)  # the full top state is stored
    tape = whole.forward_sweep(TensorInput(x), mask)
    assert tape.buffer.pushes == 0 and tape.buffer.optimal_bits() == 0
    whole.backward_sweep(tape, TensorInput(x), slice_grad=torch.ones(12, 4, HID))
    sliced, plain = (ReversibleRNN("revgru", IN, HID, slice_dim=k) for k in (SLICE, 0))
    sliced.load_state_dict(plain.state_dict())
    bits = [rnn.forward_sweep(TensorInput(x), mask).buffer.optimal_bits() for rnn in (sliced, plain)]
    assert 0 < bits[0] < bits[1]


def _sweep_host_reads(cell, steps, device, watch=contextlib.nullcontext, warm_up=0, **buffer_options):
    """Host reads of a forward and of a backward sweep (each run inside ``watch()``), after a sweep of ``warm_up``
    steps (0: none) that taught the stack's room. The buffer keeps bad input on the device, as it does on CUDA (a
    CPU buffer checks eagerly, since a read costs nothing there)."""
    rnn, x, mask, w_out, w_fin, w_slice = _problem(cell, 1, max(steps, warm_up), device=device, **buffer_options)
    check_lazily(rnn)
    if warm_up:
        rnn.forward_sweep(TensorInput(x[:warm_up]), mask[:warm_up])
    x, mask, w_out, w_slice = (t[:steps] for t in (x, mask, w_out, w_slice))
    inputs = TensorInput(x)
    with watch(), LaunchCounter() as forward:
        tape = rnn.forward_sweep(inputs, mask)
    with watch(), LaunchCounter() as backward:
        rnn.backward_sweep(tape, inputs, grad_final=w_fin, output_grads=lambda s, out: w_out[s], slice_grad=w_slice)
    return forward.host_reads, backward.host_reads, tape.buffer.syncs


@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
@pytest.mark.parametrize("impl", FAST_BACKENDS + [INTERPRETED_TRITON])
def test_a_sweep_reads_the_host_once_at_its_end_whatever_its_length(cell, impl):
    # As CUDA runs (bad input kept on the device), counted on any device and backend: a forward sweep's stack gets
    # its room before it starts, so its steps read nothing, and its end reads once (the error code and the highest
    # stack together); the backward sweep's exactness guard reads once at its end.
    device, backend = impl
    short, long = (6, 24) if impl == ("cpu", "triton") else (16, 128)  # the interpreter is slow
    reads = [_sweep_host_reads(cell, t, torch.device(device), warm_up=long, buffer_backend=backend)
             for t in (short, long)]
    assert reads[0] == reads[1] == (1, 1, 0)


def test_the_first_sweep_reads_twice_as_it_runs_again_with_the_room_it_needed():
    # A stack of layers that has not swept yet gives its buffer no room beyond the spare levels; a sweep that
    # outgrows them runs again (one more read), and the next sweep of that length fits.
    fwd, _, _ = _sweep_host_reads("revlstm", 40, torch.device("cpu"))
    assert fwd == 2
    assert _sweep_host_reads("revlstm", 40, torch.device("cpu"), warm_up=40)[0] == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_sync_debug_mode_agrees_with_the_host_read_count():
    # torch.cuda.set_sync_debug_mode warns at every synchronizing call: as many as the reads counted.
    caught = []

    @contextlib.contextmanager
    def sync_warnings():
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(0)
        # (the mode's own notice that it is a prototype is not a synchronization)
        caught.extend(w for w in seen if "called a synchronizing CUDA operation" in str(w.message))

    fwd, bwd, _ = _sweep_host_reads("revlstm", 100, torch.device("cuda"), sync_warnings, warm_up=100)
    assert len(caught) == fwd + bwd == 2, [f"{w.filename}:{w.lineno}: {w.message}" for w in caught]


def test_sweeps_run_without_autocast_and_tf32_whatever_the_caller_set():
    # A caller's mixed precision would round the gates differently in the two sweeps (or only in one):
    # the sweeps switch both off, and leave the caller's setting as it was.
    rnn, x, mask, w_out, w_fin, w_slice = _problem("revgru", 1, 8)
    want, want_x, _, _ = _reversal_grads(rnn, x, mask, w_out, w_fin, w_slice)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, got_x, _, _ = _reversal_grads(rnn, x, mask, w_out, w_fin, w_slice)
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)
    assert torch.equal(got_x, want_x) and all(torch.equal(got[name], want[name]) for name in want)
