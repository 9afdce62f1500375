"""The reversible cell contract: what RevGRU, RevLSTM or a new family provides, and what they share.

The hidden state is split into halves h = [h1 | h2] with separate weights: h1 is updated from the
*old* h2, then h2 from the *new* h1. Each half update is "forget, then add", done on int32 fixed
point: h ← z·h + u, where z·h goes through the information buffer (exact, invertible) and u is
rounded to fixed point first (integer addition is exact). Given h at time t, the gates of half 2
depend only on h1(t), so h2(t−1) can be recovered; then half 1 likewise (docs/design.md).

A cell takes the layer input as its projection ``p = cell.project(x)`` and runs in these modes, every
one computing its gates with the same code on the same float values (a gate one ulp off would decode
the buffer with the wrong divisor):

- :meth:`RevCell.forward_int`: no grad, pushes onto the buffer (training), or without one drops the
  forgotten bits (inference, range errors to the sweep's guard).
- :meth:`RevCell.reverse_diff`: pops to the exact previous state and backpropagates the step by hand.
  It is two operations in one pass, each also available alone: :meth:`RevCell.reverse_int` (pop only)
  and :meth:`RevCell.backward_step` (the derivative given both exact states), for a caller that pops a
  chunk of steps before differentiating them.
- :meth:`RevCell.forward_diff`: with grad, from float leaves of the previous state; its value is the
  exact next state and its gradient the real-valued derivative of z·h + u (dz* taken as dz), what
  the reverse computes by hand. Ordinary backprop through it is the reference the reverse is tested
  against.

A family implements each half-step twice: as torch ops (``_forward_reference``,
``_reverse_half_reference``: the readable reference, run by the torch backend and by inference) and
through a backend's fused kernels (``_forward_fused``, ``_reverse_half_fused``: :mod:`revnmt.rnn.kernels`).
What a sweep fixes for all its steps is a :class:`Sweep`; the working state of one reverse step that
its two halves share is a :class:`Reversal`.

States are int32 tensors [B, state_size]: GRU [h1 | h2], LSTM [h1 | h2 | c1 | c2].
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

from buffers import (
    FORGET_ONE,
    ForgetLimit,
    InformationBuffer,
    OverflowGuard,
    lossy_update,
    quantize_forget,
    straight_through,
    to_float,
)

from .. import products
from ..kernels import StepKernels
from .weights import RecurrentGrads, SweepWeights

#: The gate values a fused reverse half computed before its kernel, by half: RevGRU's σ of [z | r] and g's
#: product, RevLSTM's gates' product (``project_width`` floats per row for both halves). ``reverse_int`` fills
#: it and ``backward_step`` of the same step takes it: the same values, so the same bits, without the
#: products again. The torch reference recomputes and ignores it.
HalfGates = dict[int, tuple[torch.Tensor, ...]]


@dataclass
class Sweep:
    """What every step of one layer's sweep shares, fixed when the sweep starts.

    The defaults are an inference step: no buffer, the torch reference, nothing stored.
    """

    #: The information buffer the steps push onto and pop from; None: inference (nothing is reversed).
    buffer: InformationBuffer | None = None
    #: The backend's fused half-steps (``Backend.steps``), or None: the cells' torch reference.
    kernels: StepKernels | None = None
    #: The weights laid out for the sweep's products (needed by fused kernels; made per step if None).
    weights: SweepWeights | None = None
    #: Leading output columns kept exactly elsewhere (the attention slice): they skip the buffer.
    stored: int = 0
    #: Where an inference sweep records range errors (a buffer keeps its own).
    guard: OverflowGuard | None = None
    #: Collects a backward sweep's recurrent weight gradients (a chunk of steps per product); None: at once.
    grads: RecurrentGrads | None = None


@dataclass
class Reversal:
    """One reverse step's working state, shared by its two halves (half 2 is undone first)."""

    p: torch.Tensor  # the step's input projection
    mask: torch.Tensor  # [B] bool: live rows
    sweep: Sweep
    pop: bool  # pop the previous state from the buffer (else ``prevs`` holds it: a derivative-only step)
    ints: list[torch.Tensor]  # the state's groups; each half replaces its own with the previous value
    prevs: list[torch.Tensor]  # the previous groups: views of one new state, popped into, or given
    grads: list[torch.Tensor] | None  # d loss / d each group, turned in place into d loss / d its previous value
    slot: tuple[torch.Tensor, torch.Tensor] | None  # the step's weight-gradient slots (RecurrentGrads.next_step)
    gates: HalfGates | None  # fused gate values to reuse (a backward step) or to keep (a reverse step)


class Update:
    """One integer update h ← z·h + u of a slice of the state, in the three modes (torch reference)."""

    def __init__(self, limit: ForgetLimit, buf: InformationBuffer | None, mask: torch.Tensor,
                 guard: OverflowGuard | None) -> None:
        self.limit, self.buf, self.mask, self.guard = limit, buf, mask, guard

    def push(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, stored: int = 0) -> torch.Tensor:
        """h ← z·h + u. The first ``stored`` columns are kept exactly elsewhere (the attention
        slice), so they skip the buffer; without a buffer (inference) every column does."""
        if self.buf is None:
            return lossy_update(h, z, u, self.mask, self.limit, self.guard)
        return self.buf.push_update(h, z, u, self.mask, stored)

    def pop(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, restore: torch.Tensor | None = None):
        """The inverse of :meth:`push`; ``restore`` gives the stored columns' previous values."""
        h = self.buf.pop_update(h, z, u, self.mask, 0 if restore is None else restore.shape[1])
        if restore is not None:
            h[:, : restore.shape[1]] = restore
        return h

    def _factor(self, z: torch.Tensor) -> torch.Tensor:
        """The factor z*/2^R_Z the update really multiplies by, as a float."""
        return quantize_forget(z, self.limit) / FORGET_ONE

    def surrogate(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """where(mask, z*·h + u, h) on floats: what the update's gradient is taken from."""
        zq = straight_through(self._factor(z), z)
        return torch.where(self.mask[:, None], zq * h + u, h)

    def backward(self, h: torch.Tensor, z: torch.Tensor, grad: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The gradients of :meth:`surrogate` w.r.t. h, z and u, from the gradient ``grad`` of its output."""
        zq = self._factor(z)
        live = self.mask[:, None]
        grad_u = grad * live  # a padded row passed h through: its z and u got no gradient
        return torch.where(live, grad * zq, grad), grad_u * h, grad_u

    def diff(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
        """Float h(t) with value ``exact`` (int) and the gradient of :meth:`surrogate`."""
        return straight_through(to_float(exact), self.surrogate(h, z, u))


class RevCell(nn.Module, ABC):
    """A reversible cell: sizes, the forgetting limit, the halves of the state, and the modes (module
    docstring) built on the half-steps each family implements."""

    #: Buffered updates per half and step: RevGRU's h; RevLSTM's c and h.
    groups_per_half = 1
    #: [B, half]-sized float32 temporaries alive at once in :meth:`reverse_diff`: the step's working
    #: set, which autograd never sees since the step is differentiated by hand. The bound covers the
    #: torch reference's peak and the fused kernels' (their numpy scratch included);
    #: tests/revnmt/rnn/test_saved_memory.py checks it for both.
    reverse_temporaries = 30

    def __init__(self, input_size: int, hidden_size: int, limit: ForgetLimit) -> None:
        super().__init__()
        if hidden_size % 2:
            raise ValueError(f"reversible cells split the state in halves: hidden size must be even, got {hidden_size}")
        self.input_size, self.hidden_size, self.half = input_size, hidden_size, hidden_size // 2
        self.limit = limit  # the forget gates' limit; its slope is d restrict_forget(σ) / dσ
        self.state_size = hidden_size * self.groups_per_half

    # ------------------------------------------------------------------ what a family implements

    @abstractmethod
    def linears(self) -> list[nn.Linear]:
        """Every Linear on [x; h_other], half 1's before half 2's."""

    @abstractmethod
    def _forward_reference(self, p: torch.Tensor, state: torch.Tensor, mask: torch.Tensor, sweep: Sweep
                           ) -> torch.Tensor:
        """:meth:`forward_int` as torch ops: the new int state."""

    @abstractmethod
    def _forward_fused(self, p: torch.Tensor, state: torch.Tensor, mask: torch.Tensor, sweep: Sweep,
                       weights: SweepWeights) -> torch.Tensor:
        """:meth:`forward_int` by ``sweep.kernels``: the new int state."""

    @abstractmethod
    def _reverse_half_reference(self, i: int, step: Reversal, restore: torch.Tensor | None) -> None:
        """Undo half i of ``step`` as torch ops: pop it (``step.pop``) into ``step.prevs``, replace its groups in
        ``step.ints`` by the previous values and, with ``step.grads``, turn half i's gradients into those of
        the previous values, add d loss / d h_j into the other half's and fill ``step.slot`` with half i's
        gate gradients and recurrent inputs. ``restore``: the stored columns' previous values."""

    @abstractmethod
    def _reverse_half_fused(self, i: int, step: Reversal, restore: torch.Tensor | None, weights: SweepWeights,
                            read: torch.Tensor | None, grad_out: torch.Tensor | None) -> torch.Tensor | None:
        """:meth:`_reverse_half_reference` by ``step.sweep.kernels``, from ``read`` (the float h_j, or None: the
        int state, which the kernels convert), adding ``grad_out`` (d loss / d half i's output from outside,
        or None) to its gradient. Returns the float copy of the previous h_i for half 1 (which half 0 reads)."""

    @abstractmethod
    def forward_diff(self, p: torch.Tensor, prev_f: torch.Tensor, new_state: torch.Tensor, mask: torch.Tensor
                     ) -> torch.Tensor:
        """The step as a differentiable function of ``p`` and the float previous state ``prev_f``, whose value
        is the exact ``new_state`` (the autograd reference)."""

    # ------------------------------------------------------------------ sizes and layout

    def output(self, state: torch.Tensor) -> torch.Tensor:
        """The float output [h1 | h2] of an int state [..., state_size] (what the next layer and attention see)."""
        return to_float(state[..., : self.hidden_size])

    def reverse_work_bytes(self, batch: int) -> int:
        """Bytes of one :meth:`reverse_diff`'s temporaries over ``batch`` rows (memory accounting)."""
        return self.reverse_temporaries * batch * self.half * 4

    @property
    def project_width(self) -> int:
        """Columns of :meth:`project`'s output."""
        return sum(lin.out_features for lin in self.linears())

    def input_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every Linear's input columns and bias, concatenated in :meth:`linears` order: the weight
        [gate columns, input] and bias [gate columns] of :meth:`project` (differentiable copies)."""
        linears = self.linears()
        return (torch.cat([lin.weight[:, : self.input_size] for lin in linears]),
                torch.cat([lin.bias for lin in linears]))

    def recurrent_weight(self, lin: nn.Linear) -> torch.Tensor:
        """The recurrent columns of ``lin``'s weight, [out, half] (a view)."""
        return lin.weight[:, self.input_size:]

    def project(self, x: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The input's part of every gate pre-activation of both halves, biases included:
        [..., input] -> [..., gate columns of half 1 | of half 2], one product with
        :meth:`input_weights` (or ``weights``, the same concatenated once for a sweep: :class:`SweepWeights`).

        The step functions take this instead of x: the recurrent part is all that must be
        computed step by step, and ``ReversibleRNN`` projects known inputs for several steps in
        one matrix product. Forward and reverse must use the same projection values (the same
        call on the same data), or a gate could differ by an ulp and the reverse go wrong.
        """
        return products.linear(x, *(self.input_weights() if weights is None else weights))

    def _recurrent(self, lin: nn.Linear, p: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The pre-activation of ``lin`` on [x; h], from x's projection ``p``."""
        # mm, then add: addmm would first copy ``p``, a column slice of the projection.
        return torch.mm(h, self.recurrent_weight(lin).t()) + p

    def _half_projection(self, p: torch.Tensor, i: int) -> torch.Tensor:
        return p.chunk(2, 1)[i]

    def _half_start(self, i: int) -> int:
        """The first column of half i's gates in a projection (:meth:`_half_projection`)."""
        return i * self.project_width // 2

    def _update(self, buf: InformationBuffer | None, mask: torch.Tensor, guard: OverflowGuard | None) -> Update:
        return Update(self.limit, buf, mask, guard)

    def _split(self, state: torch.Tensor) -> list[torch.Tensor]:
        return list(state.split(self.half, dim=1))

    def _stored(self, i: int, stored: int) -> int:
        """How many leading columns of h_i fall into the first ``stored`` output columns."""
        return min(max(stored - i * self.half, 0), self.half)

    def _restore(self, i: int, restore: torch.Tensor | None) -> torch.Tensor | None:
        n = 0 if restore is None else self._stored(i, restore.shape[1])
        return restore[:, i * self.half: i * self.half + n] if n else None

    # ------------------------------------------------------------------ the modes

    def forward_int(self, p: torch.Tensor, state: torch.Tensor, mask: torch.Tensor, sweep: Sweep) -> torch.Tensor:
        """One step on the int ``state`` from the projection ``p``: with ``sweep.buffer``, pushing what it
        forgets (training); without, dropping it (inference, range errors to ``sweep.guard``). The first
        ``sweep.stored`` output columns skip the buffer."""
        if sweep.buffer is None or sweep.kernels is None:
            return self._forward_reference(p, state, mask, sweep)
        with torch.no_grad():
            return self._forward_fused(p, state, mask, sweep, self._weights(sweep))

    @torch.no_grad()
    def reverse_diff(self, p: torch.Tensor, state: torch.Tensor, mask: torch.Tensor, grad: torch.Tensor,
                     sweep: Sweep, restore: torch.Tensor | None = None, grad_out: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of training by reversal: undo the step that produced ``state`` and backpropagate it.

        ``grad`` is d loss / d ``state`` (real values), updated in place into d loss / d previous state (a
        copy per step would be one more launch on a GPU); ``grad_out``, d loss / d the step's output
        (:meth:`output`) from outside the layer, is added to it (by the fused kernels as they read it).
        ``restore``: the previous values of the ``sweep.stored`` columns, kept exactly elsewhere.
        Returns the exact previous int state, d loss / d previous state (``grad``) and d loss / d ``p``;
        recurrent weight gradients accumulate in ``.grad`` (through ``sweep.grads``, a chunk of steps per
        product, else at once; d loss / d ``p`` is then a view into the chunk, overwritten a chunk of steps
        later). The gates that decode the buffer are computed once and differentiated by hand (the
        derivative of :meth:`Update.surrogate` through the gates, what :meth:`forward_diff` gives autograd):
        a per-step autograd graph cost more than the step's arithmetic.
        """
        return self._reverse(p, state, mask, sweep, None, grad, restore, None, grad_out)

    @torch.no_grad()
    def reverse_int(self, p: torch.Tensor, state: torch.Tensor, mask: torch.Tensor, sweep: Sweep,
                    restore: torch.Tensor | None = None, gates: HalfGates | None = None) -> torch.Tensor:
        """Undo the step that produced ``state``: pop the buffer to the exact previous int state, no gradients.
        ``gates``: filled with the fused kernels' gate values, for :meth:`backward_step` of the same step."""
        return self._reverse(p, state, mask, sweep, None, None, restore, gates, None)[0]

    @torch.no_grad()
    def backward_step(self, p: torch.Tensor, prev: torch.Tensor, state: torch.Tensor, mask: torch.Tensor,
                      grad: torch.Tensor, sweep: Sweep, gates: HalfGates | None = None,
                      grad_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Backpropagate the step ``prev`` → ``state`` (both exact int states; nothing is popped): returns
        d loss / d ``prev`` (``grad``, updated in place as in :meth:`reverse_diff`) and d loss / d ``p``.
        ``sweep`` must be the one the step was undone with (its kernels compute the gates, so the gradients
        are those of :meth:`reverse_diff`); ``gates``, those :meth:`reverse_int` kept of this step, spare
        recomputing them."""
        _, grad_prev, grad_p = self._reverse(p, state, mask, sweep, prev, grad, None, gates, grad_out)
        return grad_prev, grad_p

    def _reverse(self, p: torch.Tensor, state: torch.Tensor, mask: torch.Tensor, sweep: Sweep,
                 prev: torch.Tensor | None, grad: torch.Tensor | None, restore: torch.Tensor | None,
                 gates: HalfGates | None, grad_out: torch.Tensor | None):
        """The reverse step: pop (``prev`` None) or take ``prev``, and backpropagate (``grad`` given).

        The halves are popped into the views of one new state and their gradients updated in place in
        views of ``grad`` (on a GPU every concatenation would be a launch). With fused kernels, the second
        half's kernel (undone first) also writes the float copy of its previous h, which the first reads."""
        popped = torch.empty_like(state) if prev is None else None
        collect = sweep.grads
        if grad is not None and collect is None:
            collect = RecurrentGrads(self, p.shape[0], 1, p.device)
        step = Reversal(p, mask, sweep, pop=prev is None, ints=self._split(state),
                        prevs=self._split(prev if popped is None else popped),
                        grads=None if grad is None else self._split(grad),
                        slot=None if grad is None else collect.next_step(), gates=gates)
        if sweep.kernels is None:
            if grad_out is not None:
                grad[:, : self.hidden_size].add_(grad_out)
            for i in (1, 0):
                self._reverse_half_reference(i, step, self._restore(i, restore))
        else:
            weights, read = self._weights(sweep), None
            for i in (1, 0):
                out = None if grad_out is None else grad_out[:, i * self.half: (i + 1) * self.half]
                read = self._reverse_half_fused(i, step, self._restore(i, restore), weights, read, out)
        if grad is not None:
            collect.step_done()
        return popped, grad, None if step.slot is None else step.slot[0]

    def _weights(self, sweep: Sweep) -> SweepWeights:
        return SweepWeights(self) if sweep.weights is None else sweep.weights
