"""A stack of reversible RNN layers, trained by reversal.

Training by reversal (MacKay et al., NeurIPS 2018; why it is exact: docs/design.md):

1. ``forward_sweep`` runs every step under ``no_grad``, pushing forgotten bits onto one information
   buffer shared by all layers and halves (time-major, so the reverse pops in mirror order). It
   keeps only the final integer states, the buffer, the dropout masks and, if asked, an exact
   int32 slice of the top layer per step (attention memory). No per-step activations.
2. ``backward_sweep`` walks t = T−1 … 0, top layer first. At each step it takes the gradient that
   arrives from outside (the gradient of the stored slice, and of the outputs: the decoder's
   attention and loss), reverses the layer one step to recover the exact previous state and
   backpropagates that step, through the very gates that decoded the buffer (``reverse_diff``,
   differentiated by hand). A stack whose outputs get gradients goes by chunks of steps instead:
   it undoes a chunk's steps but its first (holding their states), gets the gradients of all the
   chunk's outputs in one call, then backpropagates the steps. Only a chunk's states, one step's
   temporaries and one chunk of input projections are alive at any time, and autograd saves
   nothing: memory does not grow with T.
3. At the end the reconstructed initial state must equal the true one and the buffer must be
   empty; otherwise :class:`ReversalError` — gradients are never silently wrong.

``forward_autograd`` runs the same fixed-point model with ordinary backpropagation (all steps'
graphs kept): the reference that reversal's gradients are tested against.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import nn

from buffers import BufferError, FixedPointOverflowError, InformationBuffer, OverflowGuard, backends, to_float

from .cells import REV_CELLS, HalfGates, RecurrentGrads, RevCell, SweepWeights
from .kernels import step_kernels

#: Steps per chunk when a stack is given none (``chunk_steps``): layer 0's input projections are computed this many
#: steps per matrix product (see InputProjection). Longer chunks are faster, but a chunk is held memory, steps x batch
#: x gate columns floats, a cost per sentence that short sentences feel most under a memory budget
#: (docs/performance.md#input-projection-chunks).
PROJECTION_STEPS = 2


#: Buffer lanes per batch row when none are asked for (``buffer_lanes=None``), by the buffer's backend.
#: The numba loops walk any lane count in one call, and few lanes fill their 64-bit words best
#: (docs/performance.md#buffer-lanes-per-sentence, docs/memory.md#buffer-lanes). The torch backend loops over
#: a half's ⌈(H/2) / lanes⌉ chunks, each a few kernel launches, and the Triton kernel over the same chunks
#: inside one program, so there more lanes are faster.
DEFAULT_LANES = {"numba": 3, "torch": 16, "triton": 16}

#: Reverse steps whose recurrent weight gradients are collected per product (see RecurrentGrads), by the buffer's
#: backend. A chunk is held memory, steps x batch x (gate columns + inputs) floats per layer, a cost per sentence.
#: On a CPU (numba) a per-step product is already compute-bound and longer chunks gain little, so it takes
#: one step; where small products are launch-bound (triton and torch, for CUDA) the chunk is 4, not yet measured
#: on a GPU (docs/performance.md#recurrent-weight-gradients-by-chunks; benchmarks/weight_grad_chunks.py times it).
WEIGHT_GRAD_STEPS = {"numba": 1, "torch": 4, "triton": 4}


@contextlib.contextmanager
def exact_float32(device: torch.device) -> Iterator[None]:
    """Full float32 products and no autocast while a sweep runs.

    The reverse sweep decodes the buffer with gates it recomputes, so every gate must come out of
    the same arithmetic as in the forward sweep, bit for bit; and the gradients are those of the
    float32 model. A caller's autocast or TF32 setting (``torch.set_float32_matmul_precision``)
    could differ between the two sweeps or round the gates: both are switched off here and restored after.
    """
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        with torch.autocast(device.type, enabled=False):
            yield
    finally:
        torch.set_float32_matmul_precision(precision)


class ReversalError(RuntimeError):
    """Reversal did not reconstruct the initial state exactly: the gradients would be wrong."""


class SequenceInput(Protocol):
    """Per-step layer inputs that can be recomputed during the backward sweep (e.g. embeddings
    from token ids), so that the inputs need not be stored either. The sweeps read them, and pass
    their gradients back, a chunk of steps at a time (:class:`InputProjection`)."""

    def __len__(self) -> int: ...

    def steps(self, start: int, stop: int) -> torch.Tensor:
        """The inputs [stop − start, B, input_size] at steps start … stop − 1 (no graph)."""

    def backward(self, start: int, grad: torch.Tensor) -> None:
        """Receive the gradient of the loss with respect to the inputs at steps start … start + len(grad) − 1."""


class TensorInput:
    """A :class:`SequenceInput` over a stored [T, B, I] tensor; gradients collect in ``.grad``."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x, self.grad = x, None

    def __len__(self) -> int:
        return self.x.shape[0]

    def steps(self, start: int, stop: int) -> torch.Tensor:
        return self.x[start:stop].detach()

    def backward(self, start: int, grad: torch.Tensor) -> None:
        if self.grad is None:
            self.grad = torch.zeros_like(self.x)
        self.grad[start: start + len(grad)].add_(grad)


def project_steps(cell: RevCell, x: torch.Tensor, steps: int) -> torch.Tensor:
    """``cell.project`` of a whole [T, B, I] input, one product per chunk of the fixed grid
    (steps [c·steps, (c+1)·steps)), as :class:`InputProjection` computes it."""
    return torch.cat([cell.project(x[start: start + steps]) for start in range(0, len(x), steps)])


class InputProjection:
    """Layer 0's input projections (``weights.project``) for the sweeps, a chunk of steps at a time.

    Per step, a cell needs only its recurrent product; the input's share of the gates is one
    [steps·B, I] x [I, gates] product per chunk, far faster than one small product per step.
    The chunks lie on a fixed grid, so the forward and the reverse sweep compute each step's
    projection with the same call on the same data: bit-identical gates, which exact reversal
    needs. One chunk is alive at a time, so memory stays O(chunk), not O(T).

    In the backward sweep the steps' gradients are collected and backpropagated through the
    chunk at once (``weights.backward``) when its first step is reached. They are written
    over the chunk's projections, which the reverse steps no longer need once they are done, and
    the inputs are fetched again then rather than held: the chunk holds one tensor.
    """

    def __init__(self, weights: SweepWeights, inputs: SequenceInput, steps: int) -> None:
        self.weights, self.inputs, self.steps = weights, inputs, steps
        self._start, self._stop = 0, 0
        self._values: torch.Tensor | None = None

    @staticmethod
    def held_bytes(cell: RevCell, batch: int, steps: int) -> int:
        """Bytes of the one chunk of ``steps`` steps held outside autograd (memory accounting)."""
        return steps * batch * cell.project_width * 4

    def _inputs(self) -> torch.Tensor:
        return self.inputs.steps(self._start, self._stop)

    @torch.no_grad()
    def at(self, t: int) -> torch.Tensor:
        """The projection of the input at step t."""
        if not self._start <= t < self._stop:
            self._start = t - t % self.steps
            self._stop = min(self._start + self.steps, len(self.inputs))
            self._values = self.weights.project(self._inputs())
        return self._values[t - self._start]

    def backward(self, t: int, grad: torch.Tensor) -> None:
        """Receive d loss / d projection at step t, after step t's reverse step used the projection;
        steps come in decreasing order, and the chunk's gradient goes to the weights and inputs
        when its first step is reached."""
        self._values[t - self._start] = grad
        if t == self._start:
            self.inputs.backward(self._start, self.weights.backward(self._inputs(), self._values))
            self._values = None
            self._stop = self._start  # released: a later at() computes afresh


@dataclass
class Tape:
    """What a forward sweep keeps for the backward sweep (and nothing per step but ``slices``)."""

    states: list[torch.Tensor]  # final int32 state of every layer
    initial: list[torch.Tensor]  # the true initial states, for the exactness check
    buffer: InformationBuffer | None  # None: recorded for inference, not reversible
    mask: torch.Tensor  # [T, B] bool, True on real tokens
    dropout: list[torch.Tensor | None]  # per layer: mask on its input (layer 0's is the caller's)
    slices: torch.Tensor | None  # [T, B, k] int32: top layer output[:, :k] after each step
    guard: OverflowGuard | None  # range errors of an inference sweep (a buffer keeps its own)

    def check(self) -> None:
        """Raise a range error recorded on the device during the sweep (one host read)."""
        if self.buffer is not None:
            self.buffer.check()
        else:
            self.guard.check()

    def stored_bits(self) -> dict[str, float]:
        """Analytic bits this tape holds for backward: buffer words and stored slices."""
        slice_bits = 0 if self.slices is None else 32 * self.slices.numel()
        return {"buffer_bits": self.buffer.allocated_bits(), "optimal_buffer_bits": self.buffer.optimal_bits(),
                "slice_bits": slice_bits}


class ReversibleRNN(nn.Module):
    """Stacked RevGRU / RevLSTM layers.

    Args:
        cell: ``"revgru"`` or ``"revlstm"``.
        input_size, hidden_size, num_layers: sizes (hidden size even: the state is split in halves).
        dropout: locked dropout between layers (one mask per batch, reused when reversing).
        max_forget_bits: at most this many bits forgotten per unit per step (1, 2, 3, 5 or None).
        slice_dim: store the first ``slice_dim`` units of the top layer's output at every step,
            exactly, as attention memory (0: none).
        buffer_lanes: lanes per batch row of the information buffer, shared by all rows. The
            state groups are folded onto them; fewer lanes fill their 64-bit words better. ``None``: the
            default for the device (:data:`DEFAULT_LANES`). The words feed the lowest bits of each
            product, so the lane count is part of what a run computes.
        chunk_steps: steps per chunk of layer 0's input projections (one matrix product each, on a
            fixed grid both sweeps share) and, when the backward sweep takes output gradients, steps
            reversed before their outputs are backpropagated in one call (see :meth:`backward_sweep`).
            Part of what a run computes, like the lanes: the chunk's product rounds each gate.
    """

    def __init__(self, cell: str, input_size: int, hidden_size: int, num_layers: int = 1, dropout: float = 0.0,
                 max_forget_bits: int | None = 3, slice_dim: int = 0, buffer_lanes: int | None = None,
                 buffer_backend: str = "auto", eager_checks: bool | None = None,
                 chunk_steps: int = PROJECTION_STEPS) -> None:
        super().__init__()
        if cell not in REV_CELLS:
            raise ValueError(f"unknown reversible cell {cell!r}; choose one of {sorted(REV_CELLS)}")
        if not 0 <= slice_dim <= hidden_size:
            raise ValueError(f"slice_dim must be in [0, hidden_size={hidden_size}], got {slice_dim}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if buffer_lanes is not None and buffer_lanes < 1:
            raise ValueError(f"buffer_lanes must be positive, got {buffer_lanes}")
        if chunk_steps < 1:
            raise ValueError(f"chunk_steps must be positive, got {chunk_steps}")
        if buffer_backend not in backends.BACKENDS:
            raise ValueError(f"unknown buffer backend {buffer_backend!r}; choose one of {', '.join(backends.BACKENDS)}")
        self.cells: nn.ModuleList = nn.ModuleList(
            REV_CELLS[cell](input_size if layer == 0 else hidden_size, hidden_size, max_forget_bits)
            for layer in range(num_layers)
        )
        self.hidden_size, self.num_layers, self.dropout = hidden_size, num_layers, dropout
        self.max_forget_bits, self.slice_dim, self.buffer_lanes = max_forget_bits, slice_dim, buffer_lanes
        self.buffer_backend, self.eager_checks, self.chunk_steps = buffer_backend, eager_checks, chunk_steps

    @property
    def state_size(self) -> int:
        """Width of one layer's integer state (H for GRU, 2H for LSTM: h and c)."""
        return self.cells[0].state_size

    def weight_grad_steps(self, device: torch.device) -> int:
        """Reverse steps per product of the recurrent weight gradients with the buffer backend used on ``device``."""
        return WEIGHT_GRAD_STEPS[backends.resolve(self.buffer_backend, device)]

    def work_bytes(self, batch: int, device: torch.device, outputs: bool = False) -> int:
        """Bytes a sweep over ``batch`` rows holds besides its tape, none of it seen by autograd:
        one chunk of layer 0's input projections, every layer's copied weights (SweepWeights) and their
        gradients, every layer's chunk of recurrent weight gradients and one reverse step's temporaries;
        with ``outputs`` (a backward sweep taking output gradients), also a chunk's states of every
        layer, their gates where fused kernels keep them (``HalfGates``) and its top-layer outputs."""
        held = (InputProjection.held_bytes(self.cells[0], batch, self.chunk_steps)
                + sum(SweepWeights.held_bytes(cell, grads=True) for cell in self.cells)
                + sum(RecurrentGrads.held_bytes(cell, batch, self.weight_grad_steps(device)) for cell in self.cells)
                + max(cell.reverse_work_bytes(batch) for cell in self.cells))
        if outputs:  # the states after each step of a chunk but its first (that is the sweep's own), every output
            per_step = self.num_layers * self.state_size
            if step_kernels(backends.resolve(self.buffer_backend, device)) is not None:
                per_step += sum(cell.project_width for cell in self.cells)
            held += batch * ((self.chunk_steps - 1) * per_step + self.chunk_steps * self.hidden_size) * 4
        return held

    def initial_state(self, batch: int, device: torch.device) -> list[torch.Tensor]:
        """Integer zeros for every layer."""
        return [torch.zeros(batch, self.state_size, dtype=torch.int32, device=device) for _ in self.cells]

    def new_buffer(self, batch: int, device: torch.device, steps: int = 0) -> InformationBuffer:
        """The information buffer a forward sweep over ``batch`` rows (and ``steps`` steps, if known: its push
        log is then sized once) pushes onto.

        The buffer has ``buffer_lanes`` lanes per batch row, and the rows share them: a half's
        columns of all rows are folded onto all the lanes in ⌈(H/2) / buffer_lanes⌉ chunks (the
        lane count evened out: 150 columns on "16" lanes are 10 chunks of 15). Words are added for
        all lanes when the fullest one overflows, so every lane should fill at the same rate: with
        lanes of its own, a row that forgets more than the others, or the longest sentence of the
        batch, would set the size of all of them. Shared, each lane takes columns of many rows.
        """
        half = self.cells[0].half
        lanes = math.ceil(half / math.ceil(half / min(self.lanes_on(device), half)))
        buffer = InformationBuffer(batch, lanes, device, self.max_forget_bits, backend=self.buffer_backend,
                                   share_rows=True, eager_checks=self.eager_checks)
        groups = sum(2 * cell.groups_per_half for cell in self.cells)  # buffered updates per step
        buffer.reserve_pushes(steps * groups * len(buffer.words.update_widths(half, 0)))
        return buffer

    def lanes_on(self, device: torch.device) -> int:
        """The lanes asked for, or the default of the backend the buffer uses on ``device``."""
        if self.buffer_lanes is not None:
            return self.buffer_lanes
        return DEFAULT_LANES[backends.resolve(self.buffer_backend, device)]

    def draw_dropout(self, batch: int, device: torch.device) -> list[torch.Tensor | None]:
        """Inverted-dropout masks for the inputs of layers 1…L−1, one per batch (locked over time)."""
        masks: list[torch.Tensor | None] = [None]
        for _ in range(1, self.num_layers):
            if self.training and self.dropout > 0:
                keep = torch.full((batch, self.hidden_size), 1 - self.dropout, device=device)
                masks.append(torch.bernoulli(keep) / (1 - self.dropout))
            else:
                masks.append(None)
        return masks

    def _stored(self, layer: int) -> int:
        """Output columns of ``layer`` kept exactly as the attention slice (top layer only)."""
        return self.slice_dim if layer == self.num_layers - 1 else 0

    def _layer_input(self, layer: int, below: torch.Tensor, dropout: list[torch.Tensor | None]) -> torch.Tensor:
        """The input of layer l > 0: the output of the int state ``below`` of layer l − 1."""
        return self._drop(layer, self.cells[layer - 1].output(below), dropout)

    @torch.no_grad()
    def _projection(self, layer: int, t: int, projection: InputProjection, weights: list[SweepWeights],
                    below: torch.Tensor, dropout: list[torch.Tensor | None]
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The projected input of ``layer`` at step t, and the input itself for a layer above 0
        (None for layer 0, whose chunk keeps its own). Layer 0's inputs are known for all steps
        and projected by chunks; a higher layer's exist only once the layer below has made its step."""
        if layer == 0:
            return projection.at(t), None
        x = self._layer_input(layer, below, dropout)
        return weights[layer].project(x), x

    @staticmethod
    def _drop(layer: int, x: torch.Tensor, dropout: list[torch.Tensor | None]) -> torch.Tensor:
        """The locked dropout on the input of ``layer``."""
        return x if dropout[layer] is None else x * dropout[layer]

    # ------------------------------------------------------------------ training by reversal

    @torch.no_grad()
    def forward_sweep(self, inputs: SequenceInput, mask: torch.Tensor, initial: list[torch.Tensor] | None = None,
                      dropout: list[torch.Tensor | None] | None = None, reversible: bool = True) -> Tape:
        """Run all steps without autograd; keep only what reversal needs (see module docstring).

        ``reversible=False`` (inference, e.g. encoding for translation) uses no buffer: the forgotten
        bits are dropped, as in :meth:`step`, and the tape cannot be reversed. This also makes each
        row's states depend on its own input only: a buffer's words are shared by the batch's rows
        and feed the lowest bits of every product, so a sentence would translate slightly differently
        with other batch mates.
        """
        with exact_float32(mask.device):
            return self._forward_steps(inputs, mask, initial, dropout, reversible)

    def _forward_steps(self, inputs, mask, initial, dropout, reversible) -> Tape:
        steps, batch = mask.shape
        if len(inputs) != steps:
            raise ValueError(f"inputs have {len(inputs)} steps but the mask has {steps}")
        device = mask.device
        states = [s.clone() for s in initial] if initial is not None else self.initial_state(batch, device)
        buffer = self.new_buffer(batch, device, steps) if reversible else None
        tape = Tape(states=states, initial=[s.clone() for s in states], buffer=buffer,
                    mask=mask, dropout=dropout if dropout is not None else self.draw_dropout(batch, device),
                    slices=None, guard=None if reversible else OverflowGuard(device))
        if self.slice_dim:
            tape.slices = torch.empty(steps, batch, self.slice_dim, dtype=torch.int32, device=device)
        weights = [SweepWeights(cell) for cell in self.cells]
        projection = InputProjection(weights[0], inputs, self.chunk_steps)
        for t in range(steps):
            for layer, cell in enumerate(self.cells):
                p, _ = self._projection(layer, t, projection, weights, states[layer - 1], tape.dropout)
                states[layer] = cell.forward_int(p, states[layer], tape.buffer, mask[t], tape.guard,
                                                 self._stored(layer), weights[layer])
            if tape.slices is not None:
                tape.slices[t] = states[-1][:, : self.slice_dim]
        tape.check()  # one host sync per sweep, not per step
        return tape

    def backward_sweep(self, tape: Tape, inputs: SequenceInput, grad_final: list[torch.Tensor | None] | None = None,
                       output_grads: Callable[[slice, torch.Tensor], torch.Tensor | None] | None = None,
                       slice_grad: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Reverse the sweep step by step, accumulating parameter gradients into ``.grad``.

        Without ``output_grads`` (or with chunks of one step) each step is undone and backpropagated
        at once, through the gates that decoded the buffer (``cell.reverse_diff``). With it, the sweep
        goes a chunk of ``chunk_steps`` steps at a time: it undoes the chunk's steps but its first
        (``cell.reverse_int``, holding their states and, with fused kernels, the gates that undid them;
        the first step's output is the state then reached), asks for the gradients of all their outputs in
        one call, then backpropagates the steps (``cell.backward_step``, from the held states and gates) and,
        last, undoes and backpropagates the first step at once (``cell.reverse_diff``). The outputs'
        gradients go to the top layer's reverse steps, which add them as they read the state's. The
        decoder's attention and loss thus run once per chunk, not once per step, and memory stays
        O(chunk), not O(T).

        Args:
            grad_final: gradient of the loss w.r.t. each layer's final state (real values), or None.
            output_grads: called as ``output_grads(steps, outs)`` with a slice of steps and the top
                layer's float outputs at those steps [len, B, H]; returns d loss / d outs (or None).
                The decoder computes attention and the loss of a chunk here, so logits never exist
                for all steps at once.
            slice_grad: [T, B, k] gradient w.r.t. the stored slices.
        Returns:
            The gradient w.r.t. each layer's initial state (real values).
        Raises:
            ReversalError: the reconstructed initial state or the emptied buffer is not exact.
            ValueError: the tape was recorded with ``reversible=False``.
        """
        if tape.buffer is None:
            raise ValueError("this tape was recorded without a buffer (forward_sweep(reversible=False), for "
                             "inference) and cannot be reversed")
        try:
            with exact_float32(tape.mask.device):
                grads = self._reverse_steps(tape, inputs, grad_final, output_grads, slice_grad)
        except (BufferError, FixedPointOverflowError) as err:
            # A wrong reconstruction drives the state or the buffer out of range before the end.
            raise ReversalError(f"reversal went off the exact path ({err}); gradients would be wrong") from err
        self._check_exact(tape)
        return grads

    def _reverse_steps(self, tape, inputs, grad_final, output_grads, slice_grad) -> list[torch.Tensor]:
        steps, batch = tape.mask.shape
        grads = [torch.zeros(batch, self.state_size, device=tape.mask.device) if g is None else g.clone()
                 for g in (grad_final or [None] * self.num_layers)]
        device = tape.mask.device
        weights = [SweepWeights(cell, grads=True) for cell in self.cells]
        projection = InputProjection(weights[0], inputs, self.chunk_steps)
        chunk = min(self.weight_grad_steps(device), steps)
        recurrent = [RecurrentGrads(cell, batch, chunk, device) for cell in self.cells]
        if output_grads is None or self.chunk_steps == 1:  # undo and backpropagate each step at once
            for t in reversed(range(steps)):
                g_out = None
                if output_grads is not None:
                    g_out = output_grads(slice(t, t + 1), self.cells[-1].output(tape.states[-1])[None])
                self._add_slice_grad(grads, slice_grad, t)
                for layer in reversed(range(self.num_layers)):
                    p, x = self._projection(layer, t, projection, weights, tape.states[layer - 1], tape.dropout)
                    tape.states[layer], grads[layer], p_grad = self.cells[layer].reverse_diff(
                        p, tape.states[layer], grads[layer], tape.buffer, tape.mask[t], self._restore(layer, t, tape),
                        weights[layer], recurrent[layer], self._top_grad(layer, g_out, 0))
                    self._backward_input(layer, t, projection, weights, x, p_grad, grads, tape.dropout)
        else:
            self._reverse_chunks(tape, projection, weights, recurrent, grads, output_grads, slice_grad)
        for collected in recurrent + weights:
            collected.flush()
        return grads

    def _reverse_chunks(self, tape: Tape, projection: InputProjection, weights: list[SweepWeights],
                        recurrent: list[RecurrentGrads], grads: list[torch.Tensor],
                        output_grads: Callable[[slice, torch.Tensor], torch.Tensor | None],
                        slice_grad: torch.Tensor | None) -> None:
        """The backward sweep a chunk of steps at a time (see :meth:`backward_sweep`)."""
        steps = tape.mask.shape[0]
        backend = tape.buffer.backend.name  # the gates of backward_step must be those reverse_int decoded with
        for start in reversed(range(0, steps, self.chunk_steps)):
            chunk = range(start, min(start + self.chunk_steps, steps))
            # 1. Undo the chunk's steps but its first, holding every layer's state after each step, after[t - start],
            # and the gates that undid it, gates[t - start] (fused kernels keep them for the backward step).
            after: list[list[torch.Tensor]] = []
            gates: list[list[HalfGates]] = []
            for t in reversed(chunk[1:]):
                after.append(list(tape.states))
                gates.append([{} for _ in self.cells])
                for layer in reversed(range(self.num_layers)):
                    p, _ = self._projection(layer, t, projection, weights, tape.states[layer - 1], tape.dropout)
                    tape.states[layer] = self.cells[layer].reverse_int(
                        p, tape.states[layer], tape.buffer, tape.mask[t], self._restore(layer, t, tape), weights[layer],
                        gates[-1][layer])
            after.append(list(tape.states))
            after.reverse()
            gates.reverse()  # gates[t - start - 1]: step t's
            # 2. The gradients of the chunk's outputs, in one call.
            outs = self.cells[-1].output(torch.stack([state[-1] for state in after]))
            g_out = output_grads(slice(chunk.start, chunk.stop), outs)
            del outs
            # 3. Backpropagate the steps through the held states; undo and backpropagate the first at once.
            for t in reversed(chunk):
                self._add_slice_grad(grads, slice_grad, t)
                now = after[t - start]
                for layer in reversed(range(self.num_layers)):
                    p, x = self._projection(layer, t, projection, weights, now[layer - 1], tape.dropout)
                    cell = self.cells[layer]
                    if t > start:
                        grads[layer], p_grad = cell.backward_step(
                            p, after[t - start - 1][layer], now[layer], grads[layer], tape.mask[t], backend,
                            weights[layer], recurrent[layer], gates[t - start - 1][layer],
                            self._top_grad(layer, g_out, t - start))
                    else:
                        tape.states[layer], grads[layer], p_grad = cell.reverse_diff(
                            p, now[layer], grads[layer], tape.buffer, tape.mask[t], self._restore(layer, t, tape),
                            weights[layer], recurrent[layer], self._top_grad(layer, g_out, t - start))
                    self._backward_input(layer, t, projection, weights, x, p_grad, grads, tape.dropout)

    def _restore(self, layer: int, t: int, tape: Tape) -> torch.Tensor | None:
        """The exact previous values of ``layer``'s stored output columns at step t (None if it stores none)."""
        if not self._stored(layer):
            return None
        return tape.slices[t - 1] if t > 0 else tape.initial[layer][:, : self.slice_dim]

    def _top_grad(self, layer: int, g_out: torch.Tensor | None, k: int) -> torch.Tensor | None:
        """The output gradient ``g_out[k]`` for the top layer's reverse step (its kernels add it), else None."""
        return g_out[k] if g_out is not None and layer == self.num_layers - 1 else None

    def _add_slice_grad(self, grads: list[torch.Tensor], slice_grad: torch.Tensor | None, t: int) -> None:
        if slice_grad is not None:
            grads[-1][:, : self.slice_dim].add_(slice_grad[t])

    def _backward_input(self, layer: int, t: int, projection: InputProjection, weights: list[SweepWeights],
                        x: torch.Tensor | None, p_grad: torch.Tensor, grads: list[torch.Tensor],
                        dropout: list[torch.Tensor | None]) -> None:
        """Backpropagate d loss / d ``layer``'s projected input at step t: layer 0's a chunk at a time
        (its projection's), a higher layer's into the gradient of the layer below's state."""
        if layer == 0:
            projection.backward(t, p_grad)
        else:
            below = weights[layer].backward(x, p_grad)
            grads[layer - 1][:, : self.hidden_size].add_(self._drop(layer, below, dropout))

    def _check_exact(self, tape: Tape) -> None:
        tape.check()
        for layer, (got, want) in enumerate(zip(tape.states, tape.initial)):
            if not torch.equal(got, want):
                wrong = (got != want).sum().item()
                raise ReversalError(
                    f"reversal did not reconstruct the initial state of layer {layer}: {wrong} of {want.numel()} "
                    "values differ. Forward and reverse computed a gate differently (weights changed between "
                    "them, nondeterministic kernels, TF32/autocast in one pass only); gradients would be wrong"
                )
        if not tape.buffer.is_empty():
            raise ReversalError("reversal finished but the information buffer is not empty: pushes and pops did "
                                "not mirror each other; gradients would be wrong")

    # ------------------------------------------------------------------ ordinary backprop (reference)

    def forward_autograd(self, x: torch.Tensor, mask: torch.Tensor, initial: list[torch.Tensor] | None = None,
                         dropout: list[torch.Tensor | None] | None = None,
                         initial_float: list[torch.Tensor] | None = None):
        """The same fixed-point, buffered model with every step's graph kept (ordinary backprop).

        ``initial_float`` (optional) carries the graph into the initial states, whose exact values
        are ``initial``. Returns (outputs [T, B, H] float, final float states per layer, slices
        [T, B, k] float or None, final int states). Values are the exact fixed-point values;
        gradients are the ones reversal computes.
        """
        with exact_float32(mask.device):
            return self._autograd_steps(x, mask, initial, dropout, initial_float)

    def _autograd_steps(self, x, mask, initial, dropout, initial_float):
        steps, batch = mask.shape
        device = mask.device
        ints = [s.clone() for s in initial] if initial is not None else self.initial_state(batch, device)
        floats = list(initial_float) if initial_float is not None else [to_float(s) for s in ints]
        dropout = dropout if dropout is not None else self.draw_dropout(batch, device)
        buf = self.new_buffer(batch, device)
        outputs, slices = [], []
        projected = project_steps(self.cells[0], x, self.chunk_steps)  # as the sweeps compute them
        weights = [SweepWeights(cell) for cell in self.cells]  # once, as a sweep copies them, not per step
        for t in range(steps):
            for layer, cell in enumerate(self.cells):
                if layer == 0:
                    p = projected[t]
                else:
                    p = cell.project(self._drop(layer, floats[layer - 1][:, : self.hidden_size], dropout))
                with torch.no_grad():
                    ints[layer] = cell.forward_int(p.detach(), ints[layer], buf, mask[t], None, self._stored(layer),
                                                   weights[layer])
                floats[layer] = cell.forward_diff(p, floats[layer], ints[layer], mask[t])
            outputs.append(floats[-1][:, : self.hidden_size])
            slices.append(floats[-1][:, : self.slice_dim])
        buf.check()
        return torch.stack(outputs), floats, torch.stack(slices) if self.slice_dim else None, ints

    # ------------------------------------------------------------------ inference

    @torch.no_grad()
    def step(self, x: torch.Tensor, states: list[torch.Tensor]) -> list[torch.Tensor]:
        """One step for every row without a buffer (inference: nothing will be reversed)."""
        mask = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        new = []
        for layer, cell in enumerate(self.cells):
            inp = x if layer == 0 else self.cells[layer - 1].output(new[-1])
            new.append(cell.forward_int(cell.project(inp), states[layer], None, mask))
        return new
