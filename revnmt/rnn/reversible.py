"""A stack of reversible RNN layers, trained by reversal.

Training by reversal (MacKay et al., NeurIPS 2018; why it is exact: docs/design.md):

1. :meth:`ReversibleRNN.forward_sweep` runs every step under ``no_grad``, pushing forgotten bits onto one
   information buffer shared by all layers and halves (time-major, so the reverse pops in mirror order).
   It keeps only the final integer states, the buffer, the dropout masks and, if asked, an exact int32
   slice of the top layer per step (attention memory). No per-step activations. The buffer's stack gets its
   room before the sweep (:class:`~buffers.StackRoom`), so nothing is read on the host while it runs.
2. :meth:`ReversibleRNN.backward_sweep` undoes the steps and backpropagates them (:mod:`.reversal`).
3. At the end the reconstructed initial state must equal the true one and the buffer must be
   empty; otherwise :class:`ReversalError` — gradients are never silently wrong.

:meth:`ReversibleRNN.forward_autograd` runs the same fixed-point model with ordinary backpropagation (all
steps' graphs kept): the reference that reversal's gradients are tested against. The memory a sweep
holds outside autograd is :meth:`ReversibleRNN.work_bytes`; where it runs, a :class:`~.backends.Backend`
resolved once per device.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import nn

from buffers import (
    TILE_ROWS,
    BufferError,
    FixedPointOverflowError,
    ForgetLimit,
    InformationBuffer,
    OverflowGuard,
    StackRoom,
    to_float,
)
from buffers.words import proven_height

from . import backends
from .backends import Backend
from .cells import REV_CELLS, RecurrentGrads, Sweep, SweepWeights
from .inputs import InputProjection, SequenceInput, project_steps
from .reversal import BackwardSweep, OutputGrads
from .tape import Check, Tape, settle

#: Steps per chunk when a stack is given none (``chunk_steps``): layer 0's input projections are computed this many
#: steps per matrix product (see InputProjection). Longer chunks are faster, but a chunk is held memory, steps x batch
#: x gate columns floats, a cost per sentence that short sentences feel most under a memory budget
#: (docs/performance.md#input-projection-chunks).
PROJECTION_STEPS = 2


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


class ReversibleRNN(nn.Module):
    """Stacked RevGRU / RevLSTM layers.

    Args:
        cell: ``"revgru"`` or ``"revlstm"``.
        input_size, hidden_size, num_layers: sizes (hidden size even: the state is split in halves).
        dropout: locked dropout between layers (one mask per batch, reused when reversing).
        max_forget_bits: at most this many bits forgotten per unit per step (1, 2, 3, 5 or None): the
            :class:`~buffers.ForgetLimit` (``limit``) that the cells, the buffers and the kernels share.
        slice_dim: store the first ``slice_dim`` units of the top layer's output at every step,
            exactly, as attention memory (0: none).
        buffer_lanes: lanes per batch row of the information buffer. A half's columns are pushed onto them in
            chunks; fewer lanes fill their 64-bit words better. ``None``: the default of the backend
            (:attr:`Backend.lanes <revnmt.rnn.backends.Backend.lanes>`). The words feed the lowest bits of each
            product, so the lane count is part of what a run computes.
        buffer_backend: where the buffer's arithmetic and the fused steps run (:mod:`revnmt.rnn.backends`):
            ``"auto"`` or a backend's name, resolved once per device (:meth:`backend_on`).
        chunk_steps: steps per chunk of layer 0's input projections (one matrix product each, on a
            fixed grid both sweeps share) and, when the backward sweep takes output gradients, steps
            reversed before their outputs are backpropagated in one call (see :meth:`backward_sweep`).
            Part of what a run computes, like the lanes: the chunk's product rounds each gate.
        buffer_tile: sentences per tile of the information buffer (:mod:`buffers.words`): a tile's lanes
            overflow together onto a stack of the tile's own, so a sentence's states depend on its tile's
            sentences only. Part of what a run computes, like the lanes.
        sweep_kernels: what runs the trained sweeps (:data:`~revnmt.rnn.backends.SWEEP_KERNELS`): ``"steps"``,
            the backend's fused half-steps, or ``"persistent"``, one launch a sweep where the backend has such
            kernels (:meth:`Backend.persistent <revnmt.rnn.backends.Backend.persistent>`). Part of what a run
            computes: the persistent kernels compute their own products.
    """

    def __init__(self, cell: str, input_size: int, hidden_size: int, num_layers: int = 1, dropout: float = 0.0,
                 max_forget_bits: int | None = 3, slice_dim: int = 0, buffer_lanes: int | None = None,
                 buffer_backend: str = "auto", chunk_steps: int = PROJECTION_STEPS,
                 buffer_tile: int = TILE_ROWS, sweep_kernels: str = "steps") -> None:
        super().__init__()
        if cell not in REV_CELLS:
            raise ValueError(f"unknown reversible cell {cell!r}; choose one of {sorted(REV_CELLS)}")
        if not 0 <= slice_dim <= hidden_size:
            raise ValueError(f"slice_dim must be in [0, hidden_size={hidden_size}], got {slice_dim}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if buffer_lanes is not None and buffer_lanes < 1:
            raise ValueError(f"buffer_lanes must be positive, got {buffer_lanes}")
        if buffer_tile < 1:
            raise ValueError(f"buffer_tile must be positive, got {buffer_tile}")
        if chunk_steps < 1:
            raise ValueError(f"chunk_steps must be positive, got {chunk_steps}")
        backends.check_name(buffer_backend)
        if sweep_kernels not in backends.SWEEP_KERNELS:
            raise ValueError(f"unknown sweep kernels {sweep_kernels!r}; choose one of "
                             f"{', '.join(backends.SWEEP_KERNELS)}")
        self.limit = ForgetLimit(max_forget_bits)
        self.cells: nn.ModuleList = nn.ModuleList(
            REV_CELLS[cell](input_size if layer == 0 else hidden_size, hidden_size, self.limit)
            for layer in range(num_layers)
        )
        self.hidden_size, self.num_layers, self.dropout = hidden_size, num_layers, dropout
        self.slice_dim, self.buffer_lanes, self.buffer_tile = slice_dim, buffer_lanes, buffer_tile
        self.buffer_backend, self.chunk_steps, self.sweep_kernels = buffer_backend, chunk_steps, sweep_kernels
        self._backends: dict[torch.device, Backend] = {}
        #: The stack levels a forward sweep's buffer gets, learned from the sweeps before (not a parameter: a run
        #: computes the same bits whatever it learns, see buffers.room).
        self.stack_room = StackRoom()

    @property
    def state_size(self) -> int:
        """Width of one layer's integer state (H for GRU, 2H for LSTM: h and c)."""
        return self.cells[0].state_size

    def backend_on(self, device: torch.device) -> Backend:
        """The backend this stack runs with on ``device``: ``buffer_backend`` resolved there, once."""
        device = torch.device(device)
        if device not in self._backends:
            self._backends[device] = backends.on_device(self.buffer_backend, device)
        return self._backends[device]

    def lanes_on(self, device: torch.device) -> int:
        """Buffer lanes per batch row on ``device``: those asked for, or the backend's default."""
        return self.backend_on(device).lanes if self.buffer_lanes is None else self.buffer_lanes

    def work_bytes(self, batch: int, device: torch.device, outputs: bool = False) -> int:
        """Bytes a sweep over ``batch`` rows holds besides its tape, none of it seen by autograd:
        one chunk of layer 0's input projections, every layer's copied weights (SweepWeights) and their
        gradients, the layers' chunks of recurrent weight gradients and one reverse step's temporaries;
        with ``outputs`` (a backward sweep taking output gradients), also a chunk's states of every
        layer, their gates where fused kernels keep them (``HalfGates``) and its top-layer outputs. Where the
        persistent kernels run the sweeps, what they hold instead (:meth:`.kernels.triton_sweeps.TritonSweeps.
        work_bytes`)."""
        backend = self.backend_on(device)
        persistent = backend.persistent(self, self._lanes(device), self.buffer_tile)
        if persistent is not None:
            return persistent.work_bytes(self, batch, outputs, backend.weight_grad_steps)
        held = (InputProjection.held_bytes(self.cells[0], batch, self.chunk_steps)
                + sum(SweepWeights.held_bytes(cell, grads=True) for cell in self.cells)
                + RecurrentGrads.held_bytes(self.cells[0], batch, backend.weight_grad_steps, self.num_layers)
                + max(cell.reverse_work_bytes(batch) for cell in self.cells))
        if outputs:  # the states after each step of a chunk but its first (that is the sweep's own), every output
            per_step = self.num_layers * self.state_size
            if backend.steps is not None:
                per_step += sum(cell.project_width for cell in self.cells)
            held += batch * ((self.chunk_steps - 1) * per_step + self.chunk_steps * self.hidden_size) * 4
        return held

    def initial_state(self, batch: int, device: torch.device) -> list[torch.Tensor]:
        """Integer zeros for every layer."""
        return [torch.zeros(batch, self.state_size, dtype=torch.int32, device=device) for _ in self.cells]

    def new_buffer(self, batch: int, device: torch.device, steps: int = 0, levels: int | None = None
                   ) -> InformationBuffer:
        """The information buffer a forward sweep over ``batch`` rows (and ``steps`` steps, if known: its push
        log is then sized once) pushes onto, with a fixed room of ``levels`` stack levels (None: growing as it
        fills, see :mod:`buffers.words`).

        Each row has ``buffer_lanes`` lanes, evened out so that a half's chunks are alike (150 columns on
        "16" lanes are 10 chunks of 15), and the rows form tiles of ``buffer_tile`` sentences. A tile's
        lanes get a new word together when its fullest one overflows, so its rows should fill at like
        rates: batches of like lengths (the bucketing sampler's) waste few words on padding.
        """
        buffer = self.backend_on(device).new_buffer(batch, self._lanes(device), device, self.limit, self.buffer_tile,
                                                    levels)
        buffer.reserve_pushes(self.sweep_pushes(steps, device))
        return buffer

    def sweep_pushes(self, steps: int, device: torch.device) -> int:
        """The pushes a forward sweep of ``steps`` steps makes onto its buffer, at most (a push per chunk of lanes;
        fewer where the attention slice's columns skip the buffer)."""
        half = self.cells[0].half
        groups = sum(2 * cell.groups_per_half for cell in self.cells)  # buffered updates per step
        return steps * groups * math.ceil(half / self._lanes(device))

    def _lanes(self, device: torch.device) -> int:
        """Lanes per row, evened out over a half's chunks (see :meth:`new_buffer`)."""
        half = self.cells[0].half
        return math.ceil(half / math.ceil(half / min(self.lanes_on(device), half)))

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

    def stored_columns(self, layer: int) -> int:
        """Output columns of ``layer`` kept exactly as the attention slice (top layer only)."""
        return self.slice_dim if layer == self.num_layers - 1 else 0

    def _layer_input(self, layer: int, below: torch.Tensor, dropout: list[torch.Tensor | None]) -> torch.Tensor:
        """The input of layer l > 0: the output of the int state ``below`` of layer l − 1."""
        return self.drop(layer, self.cells[layer - 1].output(below), dropout)

    @torch.no_grad()
    def layer_projection(self, layer: int, t: int, projection: InputProjection, weights: list[SweepWeights],
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
    def drop(layer: int, x: torch.Tensor, dropout: list[torch.Tensor | None]) -> torch.Tensor:
        """The locked dropout on the input of ``layer``."""
        return x if dropout[layer] is None else x * dropout[layer]

    # ------------------------------------------------------------------ training by reversal

    @torch.no_grad()
    def forward_sweep(self, inputs: SequenceInput, mask: torch.Tensor, initial: list[torch.Tensor] | None = None,
                      dropout: list[torch.Tensor | None] | None = None, reversible: bool = True,
                      defer_checks: bool = False) -> Tape:
        """Run all steps without autograd; keep only what reversal needs (see module docstring).

        The buffer's stack gets the room :attr:`stack_room` gives a sweep of this length, and nothing is read
        on the host until the sweep has run; then one read (:meth:`~buffers.InformationBuffer.settle`) raises
        bad input or finds that the room was too small. Then the sweep runs again, with the room that the sweeps
        after it will get, which holds it: its pushes computed the same states whatever the stack could hold, so
        the rerun is the same sweep, and only its buffer replaces the first one's. With ``defer_checks`` that read
        is left on the tape (:class:`~.tape.Check`) for the caller, who reads it with those of other sweeps
        (:func:`~.tape.settle`) before the tape is reversed: the tape's states and slices are already right, and
        only its buffer may be incomplete until then.

        ``reversible=False`` (inference, e.g. encoding for translation) uses no buffer: the forgotten
        bits are dropped, as in :meth:`step`, and the tape cannot be reversed. This also makes each
        row's states depend on its own input only: a buffer's words feed the lowest bits of every
        product, and a tile's rows overflow together, so a sentence would translate slightly differently
        with other tile mates.
        """
        mask = _by_steps(mask)
        steps, batch = mask.shape
        device = mask.device
        # Drawn once: a rerun must see the same masks.
        dropout = dropout if dropout is not None else self.draw_dropout(batch, device)
        with exact_float32(device):
            if not reversible:
                tape = self._forward_steps(inputs, mask, initial, dropout, None)
                tape.guard.check()  # range errors recorded on the device during the sweep (one host read)
                return tape
            pushes = self.sweep_pushes(steps, device)
            proven = proven_height(self.limit, pushes)

            def sweep() -> Tape:
                buffer = self.new_buffer(batch, device, steps, self.stack_room.levels(pushes, proven))
                return self._forward_steps(inputs, mask, initial, dropout, buffer)

            tape = sweep()

            def conclude(values: list[int]) -> None:
                height, = tape.buffer.conclude(values)
                rerun = height > tape.buffer.capacity
                self.stack_room.record(height, pushes, rerun)
                if rerun:  # with the room the next sweeps get, which holds this one: a step's memory is the next's
                    tape.buffer = None  # its words are incomplete: let them go before the rerun holds its own
                    with exact_float32(device):  # a deferred check is read after this context has closed
                        tape.buffer = sweep().buffer
                    if tape.buffer.settle() != [height]:
                        raise ReversalError("a forward sweep run again with the same inputs reached another stack "
                                            "height: its kernels are not deterministic, and reversal could not be "
                                            "exact")

            def outgrown(values: list[int]) -> bool:
                return tape.buffer.conclude(values)[0] > tape.buffer.capacity

            tape.checks.append(Check(tape.buffer.to_settle(), conclude, outgrown))  # the sweep's one host read
            if not defer_checks:
                settle(tape)
        return tape

    def _forward_steps(self, inputs: SequenceInput, mask: torch.Tensor, initial: list[torch.Tensor] | None,
                       dropout: list[torch.Tensor | None], buffer: InformationBuffer | None) -> Tape:
        """The steps of a forward sweep onto ``buffer`` (None: inference), with nothing read on the host."""
        steps, batch = mask.shape
        if len(inputs) != steps:
            raise ValueError(f"inputs have {len(inputs)} steps but the mask has {steps}")
        device = mask.device
        # A step makes a layer's new state as a new tensor and never writes into the old one, so the tape keeps
        # the initial states themselves (the caller's, or zeros) for the reverse's check, not copies of them.
        states = list(initial) if initial is not None else self.initial_state(batch, device)
        backend = self.backend_on(device)
        tape = Tape(states=states, initial=list(states), buffer=buffer, backend=backend, mask=mask, dropout=dropout,
                    slices=None, guard=None if buffer is not None else OverflowGuard(device))
        if self.slice_dim:
            tape.slices = torch.empty(steps, batch, self.slice_dim, dtype=torch.int32, device=device)
        persistent = None if buffer is None else backend.persistent(self, buffer.words.lanes, buffer.words.tile_rows)
        if persistent is not None:
            tape.states, tape.slices = persistent.forward(self, inputs.steps(0, steps), mask, states, tape.dropout,
                                                          buffer)
            return tape
        weights = [SweepWeights(cell) for cell in self.cells]
        sweeps = [Sweep(buffer, backend.steps, weights[layer], self.stored_columns(layer), tape.guard)
                  for layer in range(self.num_layers)]
        projection = InputProjection(weights[0], inputs, self.chunk_steps)
        for t in range(steps):
            for layer, cell in enumerate(self.cells):
                p, _ = self.layer_projection(layer, t, projection, weights, states[layer - 1], tape.dropout)
                states[layer] = cell.forward_int(p, states[layer], mask[t], sweeps[layer])
            if tape.slices is not None:
                tape.slices[t] = states[-1][:, : self.slice_dim]
        return tape

    def backward_sweep(self, tape: Tape, inputs: SequenceInput, grad_final: list[torch.Tensor | None] | None = None,
                       output_grads: OutputGrads | None = None, slice_grad: torch.Tensor | None = None,
                       defer_checks: bool = False) -> list[torch.Tensor]:
        """Reverse the sweep step by step, accumulating parameter gradients into ``.grad``.

        Without ``output_grads`` (or with chunks of one step) each step is undone and backpropagated
        at once (:meth:`.reversal.BackwardSweep.by_steps`); with it, a chunk of ``chunk_steps`` steps at a
        time (:meth:`.reversal.BackwardSweep.by_chunks`): the decoder's attention and loss then run once
        per chunk, not once per step. Memory stays O(chunk), not O(T).

        Args:
            grad_final: gradient of the loss w.r.t. each layer's final state (real values), or None.
            output_grads: called as ``output_grads(steps, outs)`` with a slice of steps and the top
                layer's float outputs at those steps [len, B, H]; returns d loss / d outs (or None).
                The decoder computes attention and the loss of a chunk here, so logits never exist
                for all steps at once.
            slice_grad: [T, B, k] gradient w.r.t. the stored slices.
            defer_checks: leave the exactness guard's read on the tape (:class:`~.tape.Check`) for the caller,
                who reads it with other sweeps' (:func:`~.tape.settle`) before the gradients are used.
        Returns:
            The gradient w.r.t. each layer's initial state (real values).
        Raises:
            ReversalError: the reconstructed initial state or the emptied buffer is not exact.
            ValueError: the tape was recorded with ``reversible=False``, or its forward sweep's check is unread.
        """
        if tape.checks:
            raise ValueError("the forward sweep's check has not been read (settle(tape)): its buffer may be "
                             "incomplete")
        if tape.buffer is None:
            raise ValueError("this tape was recorded without a buffer (forward_sweep(reversible=False), for "
                             "inference) and cannot be reversed")
        try:
            with exact_float32(tape.mask.device):
                words = tape.buffer.words
                persistent = tape.backend.persistent(self, words.lanes, words.tile_rows)
                if persistent is not None:
                    grads = persistent.backward(self, tape, inputs, grad_final, output_grads, slice_grad,
                                                tape.backend.weight_grad_steps)
                else:
                    grads = BackwardSweep(self, tape, inputs, grad_final, output_grads, slice_grad).run()
        except (BufferError, FixedPointOverflowError) as err:
            # A wrong reconstruction drives the state or the buffer out of range before the end.
            raise ReversalError(f"reversal went off the exact path ({err}); gradients would be wrong") from err
        tape.checks.append(self._exactness_check(tape))
        if not defer_checks:
            settle(tape)
        return grads

    @staticmethod
    def _exactness_check(tape: Tape) -> Check:
        """The guard after a reverse: the rebuilt initial states equal the true ones and the buffer is empty. Read
        in one host read (on a GPU every read waits for the device): the error code, the highest stack, the live
        words left and each layer's wrong values."""
        buffer = tape.buffer
        wrong = [(got != want).sum() for got, want in zip(tape.states, tape.initial)]
        return Check(buffer.to_settle(buffer.live_words(), *wrong),
                     lambda values: ReversibleRNN._conclude_exact(tape, values))

    @staticmethod
    def _conclude_exact(tape: Tape, values: list[int]) -> None:
        """Raise ReversalError unless the guard's values (:meth:`_exactness_check`) say the reverse was exact."""
        buffer = tape.buffer
        height, live_words, *wrong = buffer.conclude(values)
        for layer, (n, want) in enumerate(zip(wrong, tape.initial)):
            if n:
                raise ReversalError(
                    f"reversal did not reconstruct the initial state of layer {layer}: {n} of {want.numel()} "
                    "values differ. Forward and reverse computed a gate differently (weights changed between "
                    "them, nondeterministic kernels, TF32/autocast in one pass only); gradients would be wrong"
                )
        if height or live_words or buffer.pushes:
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
            return self._autograd_steps(x, _by_steps(mask), initial, dropout, initial_float)

    def _autograd_steps(self, x, mask, initial, dropout, initial_float):
        steps, batch = mask.shape
        device = mask.device
        ints = [s.clone() for s in initial] if initial is not None else self.initial_state(batch, device)
        floats = list(initial_float) if initial_float is not None else [to_float(s) for s in ints]
        dropout = dropout if dropout is not None else self.draw_dropout(batch, device)
        buf = self.new_buffer(batch, device)
        outputs, slices = [], []
        projected = project_steps(self.cells[0], x, self.chunk_steps)  # as the sweeps compute them
        backend = self.backend_on(device)
        # The weights once, as a sweep copies them, not per step.
        sweeps = [Sweep(buf, backend.steps, SweepWeights(cell), self.stored_columns(layer))
                  for layer, cell in enumerate(self.cells)]
        for t in range(steps):
            for layer, cell in enumerate(self.cells):
                if layer == 0:
                    p = projected[t]
                else:
                    p = cell.project(self.drop(layer, floats[layer - 1][:, : self.hidden_size], dropout))
                with torch.no_grad():
                    ints[layer] = cell.forward_int(p.detach(), ints[layer], mask[t], sweeps[layer])
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
            new.append(cell.forward_int(cell.project(inp), states[layer], mask, Sweep()))
        return new


def _by_steps(mask: torch.Tensor) -> torch.Tensor:
    """The [T, B] mask with each step's row of B booleans adjacent, as the fused kernels read a step's mask.
    A mask made from batch-major ids (``src.t() != PAD``) is a transposed view: copied once here."""
    return mask.contiguous()
