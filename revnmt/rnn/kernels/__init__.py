"""Fused half-steps of the reversible cells: the seam where a compiled implementation replaces the
torch reference.

A half-step of a cell is a few matrix products and, between and after them, elementwise work: the
gate activations, the forget restriction and quantization, the rounded additive term, the buffer
push (or pop), the integer add, range checks, the float copy of the new half and, in the reverse,
the hand-written derivative. Written as torch ops (``revnmt.rnn.cells``, the readable reference)
that is some thirty small ops per half; a :class:`StepKernels` does each elementwise stretch in one
call, with the products around it where that saves launches on a GPU (RevGRU's z, r product and the
products of its backward to h_j: the Triton kernels compute them with ``tl.dot``, the numba kernels call
:mod:`revnmt.rnn.products`). Each backend of :mod:`revnmt.rnn.backends` names its kernels (numba on CPU,
Triton on CUDA; none for torch, whose steps are the cells' reference), and a sweep passes them down.

Exactness: the reverse recomputes the forward's gates to decode the buffer, so both sweeps must
compute every gate with the same code on the same device. An implementation therefore computes
the gates of its forward and reverse kernels with one shared function; it may differ from the
torch reference in the last ulp (then its states differ too, but it reverses itself exactly).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from buffers import ForgetLimit, InformationBuffer


class StepKernels(ABC):
    """Elementwise kernels of one half-step, on tensors of one device (``B`` rows, ``H`` = half units).

    Conventions: ``pre*`` are recurrent products (float [B, k·H]) and ``p[:, col:]`` the matching
    columns of the step's input projection ``p``, which the kernels add (``p`` whole rather than a
    column slice: a contiguous array lets a compiled loop vectorize); ``limit`` is the cell's forget limit,
    the buffer's too (its slope and smallest numerator, as in ``buffers.restrict_forget`` and
    ``quantize_forget``); ``mask`` bool [B] marks live rows. Pushes and pops go through
    ``buf`` as :meth:`InformationBuffer.push_update` would, in the same order (RevLSTM: c then h).
    In the reverse kernels a ``buf`` pops the previous half into ``prev`` (and writes ``restore``,
    the stored columns' previous values, over its first columns), while without one (``buf=None``)
    ``prev`` holds the exact previous half and nothing is popped; ``grad=None`` skips the derivative, otherwise
    ``grad`` (d loss / d new half, updated in place into d loss / d previous half) is backpropagated
    into the pre-activation gradients; ``grad_out`` (d loss / d the half's output h, from outside the layer: a
    decoder's loss) is added to d loss / d new h first. A reverse kernel given ``prev_float`` also writes the
    float copy of the previous h there: the next half's recurrent input, which then needs no conversion of its own.
    """

    name: str

    @abstractmethod
    def gru_gates(self, read: torch.Tensor, weight: torch.Tensor, p: torch.Tensor, col: int,
                  rh: torch.Tensor) -> torch.Tensor:
        """σ(read · weightᵀ + p[:, col: col + 2H]), [z | r] (z before its limit), returned [B, 2H], and r·h_j
        written into ``rh``. ``read`` is h_j, float32 or the int32 state (then converted as ``to_float`` does,
        inside the kernel where it can); ``weight``: the z and r rows' recurrent columns [2H, H]."""

    @abstractmethod
    def gru_push(self, buf: InformationBuffer, h: torch.Tensor, pre_g: torch.Tensor, p: torch.Tensor, col: int,
                 s: torch.Tensor, mask: torch.Tensor, stored: int, limit: ForgetLimit,
                 out: torch.Tensor) -> torch.Tensor:
        """h ← z·h + (1 − z)·tanh(pre_g + p[:, col:]) into ``out`` (int32), its first ``stored`` columns
        unbuffered; returns the float copy of the new half."""

    @abstractmethod
    def gru_reverse(self, buf: InformationBuffer | None, h: torch.Tensor, pre_g: torch.Tensor, p: torch.Tensor,
                    col: int,
                    s: torch.Tensor, mask: torch.Tensor, limit: ForgetLimit, restore: torch.Tensor | None,
                    prev: torch.Tensor, grad: torch.Tensor | None, grad_z: torch.Tensor | None,
                    grad_g: torch.Tensor | None, prev_float: torch.Tensor | None = None,
                    grad_out: torch.Tensor | None = None) -> None:
        """Undo :meth:`gru_push` into ``prev`` (int32; see the class docstring); with ``grad``, write
        d loss / d pre-activation of z and of g into ``grad_z``, ``grad_g``."""

    @abstractmethod
    def gru_read_grad(self, grad_pre: torch.Tensor, weight_zr: torch.Tensor, weight_g: torch.Tensor,
                      read: torch.Tensor, s: torch.Tensor, grad_read: torch.Tensor, inputs: torch.Tensor) -> None:
        """Backpropagate a half into d loss / d h_j (``grad_read``, added to) from its pre-activation gradients
        ``grad_pre`` [B, 3H] = [z | r | g] (z's and g's written by :meth:`gru_reverse`): through
        d loss / d (r·h_j) = grad_g · ``weight_g`` write r's into the r columns, then add r·grad_rh and
        [grad_z | grad_r] · ``weight_zr`` (the recurrent columns, [2H, H] and [H, H]); copy the half's recurrent
        inputs, h_j (``read``, float32 or int32 as in :meth:`gru_gates`) and r·h_j, into ``inputs`` [2, B, H] (the
        step's weight-gradient slots)."""

    @abstractmethod
    def lstm_push(self, buf: InformationBuffer, h: torch.Tensor, c: torch.Tensor, pre: torch.Tensor,
                  p: torch.Tensor, col: int, mask: torch.Tensor, stored: int, limit: ForgetLimit, out_h: torch.Tensor,
                  out_c: torch.Tensor) -> torch.Tensor:
        """c ← f·c + i·g, then h ← p·h + o·tanh(new c), into ``out_c``, ``out_h``; returns the float new h."""

    @abstractmethod
    def lstm_reverse(self, buf: InformationBuffer | None, h: torch.Tensor, c: torch.Tensor, pre: torch.Tensor,
                     p: torch.Tensor, col: int, mask: torch.Tensor, limit: ForgetLimit, restore: torch.Tensor | None,
                     prev: tuple[torch.Tensor, torch.Tensor],
                     grad: tuple[torch.Tensor, torch.Tensor] | None,
                     grad_pre: torch.Tensor | None, read: torch.Tensor | None = None,
                     inputs: torch.Tensor | None = None, prev_float: torch.Tensor | None = None,
                     grad_out: torch.Tensor | None = None) -> None:
        """Undo :meth:`lstm_push` (h popped, then c) into ``prev`` = (h, c); with ``grad`` (d loss / d
        new h, c), write the gates' pre-activation gradients [B, 5H] into ``grad_pre`` and copy the half's
        recurrent input h_j (``read``) into ``inputs`` (its weight-gradient slot)."""
