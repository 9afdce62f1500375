"""Training by reversal keeps no graph across steps: saved activations do not grow with T, and one
reverse step's working set stays within what the memory accounting charges for it."""

import math

import pytest
import torch

from revnmt.memory import SavedTensorMeter
from revnmt.profiling.live_bytes import LiveBytesBySite
from revnmt.rnn import ReversibleRNN, TensorInput
from revnmt.rnn.backends import BACKENDS
from revnmt.rnn.cells import RecurrentGrads, Sweep, SweepWeights
from revnmt.rnn.inputs import InputProjection
from revnmt.rnn.reversible import PROJECTION_STEPS


def _peak_saved(rnn, steps, reversal):
    torch.manual_seed(0)
    x = torch.randn(steps, 3, 8, requires_grad=True)
    w = torch.randn(steps, 3, rnn.hidden_size)
    mask = torch.ones(steps, 3, dtype=torch.bool)
    # the mask and inputs belong to the caller (token-level data, kept either way), not activations
    with SavedTensorMeter(exclude=[*rnn.parameters(), mask, x]) as meter:
        if reversal:
            inputs = TensorInput(x)
            rnn.backward_sweep(rnn.forward_sweep(inputs, mask), inputs, output_grads=lambda s, out: w[s])
        else:
            out, *_ = rnn.forward_autograd(x, mask)
            (out * w).sum().backward()
    return meter.peak_bytes


@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_saved_bytes_do_not_grow_with_sequence_length(cell):
    rnn = ReversibleRNN(cell, 8, 12, num_layers=2)
    # The reverse steps and the projection chunks are differentiated by hand: nothing is saved at any T.
    short, long = _peak_saved(rnn, PROJECTION_STEPS, True), _peak_saved(rnn, 4 * PROJECTION_STEPS + 3, True)
    assert long == short
    # the same model backpropagated ordinarily keeps every step's graph
    ordinary_short, ordinary_long = _peak_saved(rnn, 10, False), _peak_saved(rnn, 40, False)
    assert ordinary_long > 3.5 * ordinary_short and ordinary_long > 20 * long


# Bytes per [batch, half] element of the numpy scratch the numba backend's fused reverse kernels allocate,
# which the meter does not see: their gates, numerators and terms (RevGRU: g, z*, u; RevLSTM: five gates,
# tanh of c, z* and u of both updates), and the buffer pop's copies (h − u, folded h and z*, the active
# lanes, the popped values).
_KERNEL_SCRATCH = {("numba", "revgru"): 4 + 8 + 8 + 21, ("numba", "revlstm"): 6 * 4 + 4 * 8 + 21,
                   ("torch", "revgru"): 0, ("torch", "revlstm"): 0}


@pytest.mark.parametrize("method", ["reverse_diff", "reverse_int", "backward_step"])
@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_reverse_step_working_set_is_within_its_accounting(cell, backend, method):
    batch, rnn = 16, ReversibleRNN(cell, 24, 40, slice_dim=6, buffer_backend=backend)
    steps = 5
    x, mask = torch.randn(steps, batch, 24), torch.ones(steps, batch, dtype=torch.bool)
    tape = rnn.forward_sweep(TensorInput(x), mask)
    layer, peaks = rnn.cells[0], []
    step = getattr(layer, method)

    def metered(*args, **kwargs):
        with LiveBytesBySite() as meter:
            result = step(*args, **kwargs)
        peaks.append(meter.peak)
        return result

    setattr(layer, method, metered)
    for param in rnn.parameters():  # parameter gradients are not the step's working set
        param.grad = torch.zeros_like(param)
    if method == "reverse_diff":  # a sweep without output gradients reverses and backpropagates in one step
        rnn.backward_sweep(tape, TensorInput(x), grad_final=[torch.ones(batch, rnn.state_size)])
        assert len(peaks) == steps
    else:  # with them, it reverses a chunk but its first step, then backpropagates it
        rnn.backward_sweep(tape, TensorInput(x), output_grads=lambda s, out: torch.ones_like(out))
        assert len(peaks) == steps - math.ceil(steps / rnn.chunk_steps) > 0
    assert 0 < max(peaks) + batch * layer.half * _KERNEL_SCRATCH[backend, cell] <= layer.reverse_work_bytes(batch)


@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_weight_gradient_chunks_are_charged_to_the_sweep(cell):
    # The reverse sweep holds a chunk of steps' gate gradients and recurrent inputs (one product per weight
    # per chunk); the memory accounting charges them.
    batch, rnn = 16, ReversibleRNN(cell, 24, 40, num_layers=2)
    cpu = torch.device("cpu")
    steps = rnn.backend_on(cpu).weight_grad_steps
    assert steps == BACKENDS["numba"].weight_grad_steps
    held = RecurrentGrads.held_bytes(rnn.cells[1], batch, steps, rnn.num_layers)
    assert _chunk_tensor_bytes(RecurrentGrads.for_layers(list(rnn.cells), batch, steps, cpu)) == held
    # So are every layer's weights, copied for the sweep, their transposes and the input gradients: every
    # tensor a SweepWeights holds but the bias gradient's vector of ones (one float per row).
    weights = [SweepWeights(c, grads=True) for c in rnn.cells]
    assert [_held_tensor_bytes(w) for w in weights] == [SweepWeights.held_bytes(c, grads=True) for c in rnn.cells]
    without = (InputProjection.held_bytes(rnn.cells[0], batch, rnn.chunk_steps)
               + sum(SweepWeights.held_bytes(c, grads=True) for c in rnn.cells)
               + max(c.reverse_work_bytes(batch) for c in rnn.cells))
    assert rnn.work_bytes(batch, cpu) == without + held


def _chunk_tensor_bytes(collectors: list[RecurrentGrads]) -> int:
    """Bytes of the distinct chunk tensors of a stack's collectors."""
    storages = {t.untyped_storage().data_ptr(): t.nbytes for c in collectors for t in (c.grad_pre, c.inputs)}
    return sum(storages.values())


@pytest.mark.parametrize("steps", [1, 4])
def test_layers_share_weight_gradient_chunks_of_one_step(steps):
    # Chunks of one step go to the weights after every layer's step: the layers then share one chunk, and a sweep
    # holds one layer's bytes per sentence; longer chunks hold every layer's steps at once.
    batch, rnn = 16, ReversibleRNN("revgru", 24, 40, num_layers=3)
    collectors = RecurrentGrads.for_layers(list(rnn.cells), batch, steps, torch.device("cpu"))
    one = RecurrentGrads.held_bytes(rnn.cells[0], batch, steps)
    assert _chunk_tensor_bytes(collectors) == (one if steps == 1 else 3 * one)
    assert [c.cell for c in collectors] == list(rnn.cells)


@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_gates_held_for_a_chunks_backward_steps_are_charged(cell):
    # A decoder's chunk holds, for each step but its first, the gates its fused reverse steps computed
    # (``HalfGates``), which its backward steps take instead of recomputing: project_width floats per row
    # and layer, charged with the chunk's states where the backend has fused kernels (the torch reference
    # recomputes them and holds none).
    batch, chunk_steps = 5, 3
    fused, reference = (ReversibleRNN(cell, 8, 12, num_layers=2, chunk_steps=chunk_steps, buffer_backend=b)
                        for b in ("numba", "torch"))
    cpu = torch.device("cpu")
    layer = fused.cells[0]
    p = layer.project(torch.randn(batch, 8))
    buf, mask = fused.new_buffer(batch, cpu), torch.ones(batch, dtype=torch.bool)
    sweep = Sweep(buf, fused.backend_on(cpu).steps)
    state = layer.forward_int(p, torch.zeros(batch, layer.state_size, dtype=torch.int32), mask, sweep)
    gates = {}
    layer.reverse_int(p, state, mask, sweep, gates=gates)
    held = sum(t.nbytes for kept in gates.values() for t in kept)
    assert held == batch * layer.project_width * 4
    extra = fused.work_bytes(batch, cpu, outputs=True) - fused.work_bytes(batch, cpu)
    extra_reference = reference.work_bytes(batch, cpu, outputs=True) - reference.work_bytes(batch, cpu)
    assert extra - extra_reference == (chunk_steps - 1) * fused.num_layers * held


def _held_tensor_bytes(weights: SweepWeights) -> int:
    held = [v for name, v in vars(weights).items() if name != "_ones"]
    tensors = [t for v in held for t in (v if isinstance(v, list) else [v]) if isinstance(t, torch.Tensor)]
    return sum(t.nbytes for t in tensors)
