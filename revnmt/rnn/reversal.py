"""The backward sweep of a reversible stack: undo the forward sweep step by step and backpropagate.

It walks t = T−1 … 0, top layer first. At each step it takes the gradient that arrives from outside
(the stored slice's, and the outputs': the decoder's attention and loss), reverses the layer one step
to recover the exact previous state and backpropagates that step through the very gates that decoded
the buffer. Two algorithms, by what the caller asks for:

- :meth:`BackwardSweep.by_steps`: each step is undone and backpropagated at once (``reverse_diff``).
- :meth:`BackwardSweep.by_chunks`, for a stack whose outputs get gradients (a decoder): it undoes a
  chunk's steps but its first, holding their states, gets the gradients of all the chunk's outputs in
  one call, then backpropagates the steps (``backward_step``) and undoes and backpropagates the first
  (``reverse_diff``). The decoder's attention and loss thus run once per chunk, not once per step.

Only a chunk's states, one step's temporaries and one chunk of input projections are alive at any
time, and autograd saves nothing: memory does not grow with T. Whether the result is exact is checked
by the caller (:meth:`revnmt.rnn.ReversibleRNN.backward_sweep`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, Protocol

import torch

from .cells import HalfGates, RecurrentGrads, RevCell, Sweep, SweepWeights
from .inputs import InputProjection, SequenceInput
from .tape import Tape

#: d loss / d the top layer's outputs at a slice of steps, given those outputs [len, B, H] (or None).
OutputGrads = Callable[[slice, torch.Tensor], "torch.Tensor | None"]


class Stack(Protocol):
    """What a backward sweep needs of the stack it reverses (:class:`~revnmt.rnn.ReversibleRNN` has it)."""

    cells: Sequence[RevCell]
    num_layers: int
    hidden_size: int
    slice_dim: int
    chunk_steps: int

    @property
    def state_size(self) -> int: ...

    def stored_columns(self, layer: int) -> int: ...

    def layer_projection(self, layer: int, t: int, projection: InputProjection, weights: list[SweepWeights],
                         below: torch.Tensor, dropout: list[torch.Tensor | None]
                         ) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def drop(self, layer: int, x: torch.Tensor, dropout: list[torch.Tensor | None]) -> torch.Tensor: ...


class BackwardSweep:
    """One backward sweep of ``rnn`` over ``tape``: parameter gradients accumulate in ``.grad``; :meth:`run`
    returns d loss / d each layer's initial state."""

    def __init__(self, rnn: Stack, tape: Tape, inputs: SequenceInput,
                 grad_final: list[torch.Tensor | None] | None, output_grads: OutputGrads | None,
                 slice_grad: torch.Tensor | None) -> None:
        self.rnn, self.tape, self.output_grads, self.slice_grad = rnn, tape, output_grads, slice_grad
        steps, batch = tape.mask.shape
        device = tape.mask.device
        self.grads = [torch.zeros(batch, rnn.state_size, device=device) if g is None else g.clone()
                      for g in (grad_final or [None] * rnn.num_layers)]
        self.weights = [SweepWeights(cell, grads=True) for cell in rnn.cells]
        self.projection = InputProjection(self.weights[0], inputs, rnn.chunk_steps)
        chunk = min(tape.backend.weight_grad_steps, steps)
        self.recurrent = RecurrentGrads.for_layers(list(rnn.cells), batch, chunk, device)
        self.sweeps = [Sweep(tape.buffer, tape.backend.steps, self.weights[layer], rnn.stored_columns(layer),
                             grads=self.recurrent[layer]) for layer in range(rnn.num_layers)]

    def run(self) -> list[torch.Tensor]:
        if self.output_grads is None or self.rnn.chunk_steps == 1:
            self.by_steps()
        else:
            self.by_chunks()
        for collected in self.recurrent + self.weights:
            collected.flush()
        return self.grads

    def by_steps(self) -> None:
        """Undo and backpropagate each step at once."""
        rnn, tape, grads = self.rnn, self.tape, self.grads
        for t in reversed(range(tape.mask.shape[0])):
            g_out = None
            if self.output_grads is not None:
                g_out = self.output_grads(slice(t, t + 1), rnn.cells[-1].output(tape.states[-1])[None])
            self._add_slice_grad(t)
            for layer in reversed(range(rnn.num_layers)):
                p, x = rnn.layer_projection(layer, t, self.projection, self.weights, tape.states[layer - 1],
                                            tape.dropout)
                tape.states[layer], grads[layer], p_grad = rnn.cells[layer].reverse_diff(
                    p, tape.states[layer], tape.mask[t], grads[layer], self.sweeps[layer], self._restore(layer, t),
                    self._top_grad(layer, g_out, 0))
                self._backward_input(layer, t, x, p_grad)

    def by_chunks(self) -> None:
        """The backward sweep a chunk of ``chunk_steps`` steps at a time (see the module docstring)."""
        rnn, tape, grads = self.rnn, self.tape, self.grads
        steps = tape.mask.shape[0]
        for start in reversed(range(0, steps, rnn.chunk_steps)):
            chunk = range(start, min(start + rnn.chunk_steps, steps))
            # 1. Undo the chunk's steps but its first, holding every layer's state after each step, after[t - start],
            # and the gates that undid it, gates[t - start] (fused kernels keep them for the backward step).
            after: list[list[torch.Tensor]] = []
            gates: list[list[HalfGates]] = []
            for t in reversed(chunk[1:]):
                after.append(list(tape.states))
                gates.append([{} for _ in rnn.cells])
                for layer in reversed(range(rnn.num_layers)):
                    p, _ = rnn.layer_projection(layer, t, self.projection, self.weights, tape.states[layer - 1],
                                                tape.dropout)
                    tape.states[layer] = rnn.cells[layer].reverse_int(
                        p, tape.states[layer], tape.mask[t], self.sweeps[layer], self._restore(layer, t),
                        gates[-1][layer])
            after.append(list(tape.states))
            after.reverse()
            gates.reverse()  # gates[t - start - 1]: step t's
            # 2. The gradients of the chunk's outputs, in one call.
            outs = rnn.cells[-1].output(torch.stack([state[-1] for state in after]))
            g_out = self.output_grads(slice(chunk.start, chunk.stop), outs)
            del outs
            # 3. Backpropagate the steps through the held states; undo and backpropagate the first at once.
            for t in reversed(chunk):
                self._add_slice_grad(t)
                now = after[t - start]
                for layer in reversed(range(rnn.num_layers)):
                    p, x = rnn.layer_projection(layer, t, self.projection, self.weights, now[layer - 1],
                                                tape.dropout)
                    cell, top_grad = rnn.cells[layer], self._top_grad(layer, g_out, t - start)
                    if t > start:
                        grads[layer], p_grad = cell.backward_step(
                            p, after[t - start - 1][layer], now[layer], tape.mask[t], grads[layer], self.sweeps[layer],
                            gates[t - start - 1][layer], top_grad)
                    else:
                        tape.states[layer], grads[layer], p_grad = cell.reverse_diff(
                            p, now[layer], tape.mask[t], grads[layer], self.sweeps[layer], self._restore(layer, t),
                            top_grad)
                    self._backward_input(layer, t, x, p_grad)

    def _restore(self, layer: int, t: int) -> torch.Tensor | None:
        """The exact previous values of ``layer``'s stored output columns at step t (None if it stores none)."""
        stored = self.rnn.stored_columns(layer)
        if not stored:
            return None
        return self.tape.slices[t - 1] if t > 0 else self.tape.initial[layer][:, :stored]

    def _top_grad(self, layer: int, g_out: torch.Tensor | None, k: int) -> torch.Tensor | None:
        """The output gradient ``g_out[k]`` for the top layer's reverse step (its kernels add it), else None."""
        return g_out[k] if g_out is not None and layer == self.rnn.num_layers - 1 else None

    def _add_slice_grad(self, t: int) -> None:
        if self.slice_grad is not None:
            self.grads[-1][:, : self.rnn.slice_dim].add_(self.slice_grad[t])

    def _backward_input(self, layer: int, t: int, x: torch.Tensor | None, p_grad: torch.Tensor) -> None:
        """Backpropagate d loss / d ``layer``'s projected input at step t: layer 0's a chunk at a time
        (its projection's), a higher layer's into the gradient of the layer below's state."""
        if layer == 0:
            self.projection.backward(t, p_grad)
        else:
            below = self.weights[layer].backward(x, p_grad)
            self.grads[layer - 1][:, : self.rnn.hidden_size].add_(self.rnn.drop(layer, below, self.tape.dropout))
