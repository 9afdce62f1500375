"""Bidirectional encoders: two stacks over the source, one reading it forward, one from its last token back.

Each direction is a whole stack of its own (its layer l reads its layer l − 1), in both families, so a
reversible encoder and its ordinary twin have the same structure:

- :class:`BidirectionalReversibleRNN`: two :class:`~.reversible.ReversibleRNN` stacks, each trained by
  reversal with its own information buffer and its own exactness check. The backward stack runs over the
  time-reversed batch (:class:`~.inputs.ReversedInput`, the mask flipped): a sentence's padding then comes
  first, and masked steps leave the zero state alone, so the stack starts at each sentence's last token.
- :class:`BidirectionalRNN`: two ordinary (or checkpointed) stacks; the backward one reads each sentence
  reversed within its length (:func:`reverse_padded`), as packed sequences need.

Outputs and stored slices are aligned per source position, the forward direction's units first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .inputs import ReversedInput, SequenceInput
from .ordinary import OrdinaryRNN
from .reversible import ReversibleRNN
from .tape import Tape, pop_checks, settle


@dataclass
class BidirectionalTape:
    """The tapes of both directions' forward sweeps (the backward direction's in its own, reversed, time)."""

    forward: Tape
    backward: Tape

    @property
    def directions(self) -> tuple[Tape, Tape]:
        return self.forward, self.backward

    @property
    def slices(self) -> torch.Tensor | None:
        """[T, B, 2k] int32: at each source position the forward direction's slice, then the backward one's."""
        if self.forward.slices is None:
            return None
        return torch.cat([self.forward.slices, self.backward.slices.flip(0)], dim=-1)

    def held_bytes(self) -> int:
        return sum(tape.held_bytes() for tape in self.directions)

    def pop_checks(self) -> list:
        """Both directions' checks (:meth:`Tape.pop_checks`), the forward direction's first."""
        return pop_checks(*self.directions)

    def stored_bits(self) -> dict[str, float]:
        bits = [tape.stored_bits() for tape in self.directions]
        return {key: sum(b[key] for b in bits) for key in bits[0]}


class BidirectionalReversibleRNN(nn.Module):
    """A forward and a backward :class:`ReversibleRNN`, with the sweeps' interface of one stack.

    Final states, their gradients and dropout masks come as pairs (forward, backward) of per-layer lists;
    slices and their gradient as [T, B, 2k], aligned per source position.
    """

    def __init__(self, forward_rnn: ReversibleRNN, backward_rnn: ReversibleRNN) -> None:
        super().__init__()
        self.directions = nn.ModuleList([forward_rnn, backward_rnn])

    @property
    def slice_dim(self) -> int:
        """Units stored per direction (the slices hold twice as many)."""
        return self.directions[0].slice_dim

    def draw_dropout(self, batch: int, device: torch.device) -> list[list[torch.Tensor | None]]:
        return [rnn.draw_dropout(batch, device) for rnn in self.directions]

    def work_bytes(self, batch: int, device: torch.device) -> int:
        """Bytes a sweep holds besides its tape: one direction's, as the directions sweep one after the other."""
        return max(rnn.work_bytes(batch, device) for rnn in self.directions)

    def forward_sweep(self, inputs: SequenceInput, mask: torch.Tensor,
                      dropout: list[list[torch.Tensor | None]] | None = None,
                      reversible: bool = True, defer_checks: bool = False) -> BidirectionalTape:
        """Both directions' forward sweeps (:meth:`ReversibleRNN.forward_sweep`) over time-major ``inputs``, their
        checks read once at the end (with ``defer_checks``, left on the tape for the caller's
        :func:`~revnmt.rnn.tape.settle`)."""
        forward_drop, backward_drop = dropout if dropout is not None else (None, None)
        forward = self.directions[0].forward_sweep(inputs, mask, dropout=forward_drop, reversible=reversible,
                                                   defer_checks=True)
        backward = self.directions[1].forward_sweep(ReversedInput(inputs), mask.flip(0), dropout=backward_drop,
                                                    reversible=reversible, defer_checks=True)
        tape = BidirectionalTape(forward, backward)
        if not defer_checks:
            settle(tape)
        return tape

    def backward_sweep(self, tape: BidirectionalTape, inputs: SequenceInput,
                       grad_final: tuple[list[torch.Tensor | None], list[torch.Tensor | None]] | None = None,
                       slice_grad: torch.Tensor | None = None, defer_checks: bool = False) -> list[list[torch.Tensor]]:
        """Reverse both directions, accumulating gradients; returns the gradients of both directions' initial
        states. Both are checked exact in one read at the end (with ``defer_checks``, by the caller's
        :func:`~revnmt.rnn.tape.settle`)."""
        grad_final = grad_final if grad_final is not None else (None, None)
        k = self.slice_dim
        forward_slices = backward_slices = None
        if slice_grad is not None:
            forward_slices = slice_grad[..., :k].contiguous()
            backward_slices = slice_grad[..., k:].flip(0)  # into the backward direction's time
        grads = [self.directions[0].backward_sweep(tape.forward, inputs, grad_final=grad_final[0],
                                                   slice_grad=forward_slices, defer_checks=True),
                 self.directions[1].backward_sweep(tape.backward, ReversedInput(inputs), grad_final=grad_final[1],
                                                   slice_grad=backward_slices, defer_checks=True)]
        if not defer_checks:
            settle(tape)
        return grads

    def forward_autograd(self, x: torch.Tensor, mask: torch.Tensor,
                         dropout: list[list[torch.Tensor | None]] | None = None):
        """The same fixed-point model with every step's graph kept (the reference): outputs [T, B, 2H], final
        float states (forward, backward), slices [T, B, 2k] float or None, final int states (forward, backward)."""
        forward_drop, backward_drop = dropout if dropout is not None else (None, None)
        out_f, final_f, slices_f, ints_f = self.directions[0].forward_autograd(x, mask, dropout=forward_drop)
        out_b, final_b, slices_b, ints_b = self.directions[1].forward_autograd(x.flip(0), mask.flip(0),
                                                                               dropout=backward_drop)
        outputs = torch.cat([out_f, out_b.flip(0)], dim=-1)
        slices = None if slices_f is None else torch.cat([slices_f, slices_b.flip(0)], dim=-1)
        return outputs, (final_f, final_b), slices, (ints_f, ints_b)


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each row of time-major ``x`` [T, B, ...] reversed within its length, its padding left in place.
    Its own inverse."""
    steps = torch.arange(x.shape[0], device=x.device)[:, None]
    lengths = lengths.to(x.device)[None, :]
    index = torch.where(steps < lengths, lengths - 1 - steps, steps)  # [T, B]
    return x.gather(0, index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x))


class BidirectionalRNN(nn.Module):
    """A forward and a backward ordinary stack (:class:`OrdinaryRNN` or its checkpointed subclass)."""

    def __init__(self, forward_rnn: OrdinaryRNN, backward_rnn: OrdinaryRNN) -> None:
        super().__init__()
        self.directions = nn.ModuleList([forward_rnn, backward_rnn])

    def forward(self, x: torch.Tensor, lengths: torch.Tensor):
        """Outputs [T, B, 2H] (zeros past each row's length) and the final states (forward, backward)."""
        out_f, final_f = self.directions[0](x, lengths)
        out_b, final_b = self.directions[1](reverse_padded(x, lengths), lengths)
        return torch.cat([out_f, reverse_padded(out_b, lengths)], dim=-1), (final_f, final_b)

    def held_bytes(self, steps: int, batch: int) -> int:
        """Both checkpointed stacks' checkpoints (:meth:`RecomputedRNN.held_bytes`)."""
        return sum(rnn.held_bytes(steps, batch) for rnn in self.directions)
