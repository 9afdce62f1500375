"""The inputs of a reversible stack's sweeps: recomputable sequences and layer 0's input projections.

Nothing per step is stored for the backward sweep, the inputs included: a :class:`SequenceInput`
gives them again (the decoder looks its embeddings up again), and :class:`InputProjection` turns them
into layer 0's gate pre-activations a chunk of steps per product, on a grid both sweeps share.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .cells import RevCell, SweepWeights


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


class ReversedInput:
    """The steps of a :class:`SequenceInput` in reverse order: what the backward direction of a bidirectional
    encoder reads (its step t is the input's step T − 1 − t). Nothing is copied but the chunks asked for."""

    def __init__(self, inputs: SequenceInput) -> None:
        self.inputs = inputs

    def __len__(self) -> int:
        return len(self.inputs)

    def steps(self, start: int, stop: int) -> torch.Tensor:
        steps = len(self.inputs)
        return self.inputs.steps(steps - stop, steps - start).flip(0)

    def backward(self, start: int, grad: torch.Tensor) -> None:
        self.inputs.backward(len(self.inputs) - start - len(grad), grad.flip(0))


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
