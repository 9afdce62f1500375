"""The reversible family (``revgru``/``revlstm``): an encoder-decoder trained by reversal end to end.

A training step keeps no per-step activations of either RNN:

1. encoder and decoder forward sweeps without autograd (the decoder starts from the encoder's
   final state; there is no input feeding, so attention never enters the recurrence);
2. the attention memory (source embeddings and/or the encoder's stored slices) is built once per
   batch and used as a detached leaf whose gradient accumulates over decoder steps;
3. the decoder's reverse sweep goes a chunk of ``execution.decoder_chunk_steps`` steps at a time: it undoes
   the chunk's steps, computes attention, logits and loss of their outputs in one batched call
   (logits never exist for the whole batch at once) and backpropagates them;
4. the memory's gradient flows once into the embeddings and the stored slices, and the encoder is
   reversed with the gradient of its final state and of its slices.

The embeddings are looked up again, a chunk of steps at a time, in every sweep (:class:`EmbeddedTokens`)
rather than kept. :meth:`ReversibleSeq2Seq.train_step_autograd` backpropagates through the same
fixed-point, buffered model with every graph kept: the reference reversal's gradients are tested
against. How one stack of layers is reversed is in :mod:`revnmt.rnn.reversible`.
"""

from __future__ import annotations

import torch

from buffers import OverflowGuard, straight_through, to_fixed, to_float
from revnmt.data.vocab import PAD
from revnmt.rnn import BidirectionalReversibleRNN, BidirectionalTape, ReversibleRNN, Tape
from revnmt.rnn.tape import Check, settle

from .bridge import Bridge
from .config import ModelConfig
from .embeddings import EmbeddedTokens
from .seq2seq import DropoutMasks, Seq2Seq, StepResult, nbytes

EncoderTape = Tape | BidirectionalTape


class DecoderStart:
    """The decoder's initial int states from the encoder's final ones, and the way back for their gradient.

    Without a bridge (a unidirectional encoder) they are the encoder's final states themselves. With one,
    the bridge runs on float leaves of both directions' final states, its output is rounded to fixed point
    for the decoder, and :meth:`backward` takes the gradient of the decoder's initial states (what its
    backward sweep returns) through the bridge, straight through the rounding, to the encoder's final states.
    """

    def __init__(self, bridge: Bridge | None, tape: EncoderTape, deferred: bool = False) -> None:
        self.check: Check | None = None
        if bridge is None:
            self.states, self._leaves, self._start = tape.states, None, None
            return
        # with its graph where grad mode is on (training), for backward
        self._leaves = [[to_float(s).requires_grad_() for s in direction.states] for direction in tape.directions]
        self._start = bridge(*self._leaves)
        # A state out of the fixed-point range raises at once, or with ``deferred`` when :attr:`check` is read with
        # the sweeps' checks: a training step reads nothing on the host between its sweeps.
        guard = OverflowGuard(self._start[0].device) if deferred else None
        self.states = [to_fixed(s.detach(), guard=guard) for s in self._start]
        if guard is not None:
            self.check = Check([guard.flag()], guard.conclude)

    def backward(self, grad: list[torch.Tensor]) -> list | tuple[list, list]:
        """The gradient of the encoder's final states from that of the decoder's initial states."""
        if self._start is None:
            return grad
        torch.autograd.backward(self._start, grad)
        forward, backward = ([leaf.grad for leaf in leaves] for leaves in self._leaves)
        return forward, backward


class Reversal:
    """One training step by reversal as two stretches of device work with no host read inside either: the forward
    sweeps (run when it is made, :meth:`ReversibleSeq2Seq.reversal`) and :meth:`backward` (the decoder's reverse
    by chunks with their attention and loss, then the encoder's). Each stretch leaves its checks on :attr:`tapes`
    unread, the forward sweeps' (a stack that outgrew its room, bad input) and then the reverses' exactness guards;
    the caller reads them after each stretch (:func:`~revnmt.rnn.tape.settle`), as ``train_step`` does. A CUDA
    graph can capture each stretch whole (:mod:`revnmt.training.graphs`). Time-major ids; ``normalizer`` a
    device scalar."""

    def __init__(self, model: ReversibleSeq2Seq, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                 normalizer: torch.Tensor, masks: DropoutMasks) -> None:
        self.model, self.src, self.tgt_out, self.normalizer, self.masks = model, src, tgt_out, normalizer, masks
        self.enc_in, self.dec_in, self.enc_tape, self.dec_tape, self.start = model.forward_sweeps(
            src, tgt_in, tgt_out, masks, defer_checks=True)
        self.result: StepResult | None = None  # set by backward

    @property
    def tapes(self) -> tuple[EncoderTape, Tape] | tuple[Tape, EncoderTape]:
        """The encoder's and the decoder's tapes, whose checks the caller reads after each stretch, in the order
        their latest sweeps ran: the encoder's first after the forward stretch, the decoder's after the backward."""
        return (self.enc_tape, self.dec_tape) if self.result is None else (self.dec_tape, self.enc_tape)

    def backward(self) -> None:
        """The backward stretch: accumulate the gradients of loss / normalizer into ``.grad`` and set
        :attr:`result`; the forward sweeps' checks must have been read."""
        model, src, tgt_out, masks = self.model, self.src, self.tgt_out, self.masks
        enc_tape, dec_tape = self.enc_tape, self.dec_tape
        stored = None if enc_tape.slices is None else to_float(enc_tape.slices).requires_grad_()
        memory = model.build_memory(src, masks, stored)
        memory_grad = torch.zeros_like(memory)  # the chunks' attention adds into it (GeneralAttention.forward)
        pad_mask = (src == PAD).t()
        total = torch.zeros((), device=src.device)
        held = model._held_bytes(src.shape[1], enc_tape, dec_tape, stored, memory_grad)  # while the buffers are full

        def output_grads(steps: slice, outs: torch.Tensor) -> torch.Tensor:
            nonlocal total
            with torch.enable_grad():
                query = outs.detach().requires_grad_()
                loss = model.step_loss(query.transpose(0, 1), memory, pad_mask, masks, tgt_out[steps].t(), memory_grad)
                (loss.objective / self.normalizer).backward()
            total = total + loss.nll  # stays on the device: no sync per chunk
            return query.grad

        enc_final_grad = self.start.backward(model.decoder.backward_sweep(dec_tape, self.dec_in,
                                                                          output_grads=output_grads,
                                                                          defer_checks=True))
        memory.backward(memory_grad)
        model.encoder.backward_sweep(enc_tape, self.enc_in, grad_final=enc_final_grad,
                                     slice_grad=None if stored is None else stored.grad, defer_checks=True)
        self.result = StepResult(total, held)


class ReversibleSeq2Seq(Seq2Seq):
    """The attention encoder-decoder over :class:`~revnmt.rnn.ReversibleRNN` stacks, trained by reversal.

    Decoder states are lists of int32 states, one per layer, [N, state size] each.
    """

    encoder: ReversibleRNN | BidirectionalReversibleRNN
    decoder: ReversibleRNN

    def make_rnns(self, cfg: ModelConfig) -> tuple[ReversibleRNN | BidirectionalReversibleRNN, ReversibleRNN]:
        run = self.execution

        def make(slice_dim: int, **chunk) -> ReversibleRNN:
            return ReversibleRNN(cfg.rnn, cfg.emb_dim, cfg.hidden_size, cfg.layers, cfg.dropout,
                                 cfg.max_forget_bits, slice_dim, run.buffer_lanes, run.buffer_backend,
                                 buffer_tile=run.buffer_tile, sweep_kernels=run.sweep_kernels, **chunk)
        # only the encoder stores units of its top layer for attention
        k = cfg.stored_per_direction
        encoder = BidirectionalReversibleRNN(make(k), make(k)) if cfg.bidirectional else make(k)
        return encoder, make(0, chunk_steps=run.decoder_chunk_steps)

    def draw_rnn_dropout(self, batch: int, device: torch.device) -> tuple[list, list]:
        return self.encoder.draw_dropout(batch, device), self.decoder.draw_dropout(batch, device)

    # ------------------------------------------------------------------ training by reversal

    def train_step(self, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                   normalizer: float | torch.Tensor, masks: DropoutMasks | None = None) -> StepResult:
        """Train by reversal (see the module docstring): accumulate the gradients of loss /
        ``normalizer`` into ``.grad``; return the summed loss and the bytes held outside autograd. ``masks``:
        the batch's dropout masks, drawn here unless given. Two host reads: the forward sweeps' checks, then the
        reverses' exactness guards (:class:`Reversal`)."""
        step = self.reversal(src, tgt_in, tgt_out, normalizer, masks)
        settle(*step.tapes)
        step.backward()
        settle(*step.tapes)
        return step.result

    def reversal(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                 normalizer: float | torch.Tensor, masks: DropoutMasks | None = None) -> Reversal:
        """A training step's forward stretch (batch-major ids), its checks left unread: see :class:`Reversal`."""
        masks = masks if masks is not None else self.draw_masks(src.shape[0], src.device)
        if not isinstance(normalizer, torch.Tensor):
            # a device scalar, not a Python float: a CUDA graph replays it with each batch's value, and a GPU divides
            # by a device scalar as it would in the graph (by a host float it multiplies by its reciprocal); on a CPU
            # both give the same bits
            normalizer = torch.full((), float(normalizer), device=src.device)
        return Reversal(self, src.t(), tgt_in.t(), tgt_out.t(), normalizer, masks)

    def forward_sweeps(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor, masks: DropoutMasks,
                       defer_checks: bool = False
                       ) -> tuple[EmbeddedTokens, EmbeddedTokens, EncoderTape, Tape, DecoderStart]:
        """Encoder and decoder forward sweeps (time-major ids): returns the recomputable inputs, the
        tapes and the decoder's start, i.e. everything kept for the backward sweeps. The sweeps' checks are read
        together at the end, one host read for the step's forward (the decoder's sweep reads only the encoder's
        states, which are right before the encoder's buffer is known to be complete); with ``defer_checks`` they
        are left on the tapes for the caller (:func:`~revnmt.rnn.tape.settle`)."""
        enc_in = EmbeddedTokens(self.src_emb, src, masks.src)
        dec_in = EmbeddedTokens(self.tgt_emb, tgt_in, masks.tgt)
        enc_tape = self.encoder.forward_sweep(enc_in, src != PAD, dropout=masks.encoder, defer_checks=True)
        start = DecoderStart(self.bridge, enc_tape, deferred=True)
        dec_tape = self.decoder.forward_sweep(dec_in, tgt_out != PAD, initial=start.states, dropout=masks.decoder,
                                              defer_checks=True)
        if start.check is not None:  # the bridge's rounding, read before the decoder's own checks
            dec_tape.checks.insert(0, start.check)
        if not defer_checks:
            settle(enc_tape, dec_tape)
        return enc_in, dec_in, enc_tape, dec_tape, start

    def _held_bytes(self, batch: int, enc_tape: EncoderTape, dec_tape: Tape, stored: torch.Tensor | None,
                    memory_grad: torch.Tensor) -> int:
        """Held outside autograd's saved tensors during the backward sweeps: the tapes (buffers and int
        slices), the float slices, the gradient of the attention memory and one sweep's working set (a
        chunk of input projections and of the decoder's states and outputs with their gradients, one
        reverse step's temporaries, the logit block of a chunk's loss). The memory itself, and what
        the chunk's attention saves, are autograd's and counted there."""
        rows, device = batch * self.decoder.chunk_steps, memory_grad.device
        decoder = self.decoder.work_bytes(batch, device, outputs=True) + rows * self.cfg.hidden_size * 4  # + grads
        return (enc_tape.held_bytes() + dec_tape.held_bytes() + nbytes(stored) + nbytes(memory_grad)
                + max(self.encoder.work_bytes(batch, device), decoder + self.logit_work_bytes(rows)))

    def forward_graph(self, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                      masks: DropoutMasks) -> tuple[torch.Tensor, torch.Tensor]:
        """The same fixed-point model as reversal, every graph kept (the reference and validation)."""
        x_src, x_tgt = self.embed(src, tgt_in, masks)
        _, enc_f, slices, enc_i = self.encoder.forward_autograd(x_src, src != PAD, dropout=masks.encoder)
        if self.bridge is not None:  # rounded to fixed point, differentiated straight through the rounding
            start = self.bridge(*enc_f)
            enc_i = [to_fixed(s.detach()) for s in start]
            enc_f = [straight_through(to_float(i), s) for i, s in zip(enc_i, start)]
        dec_out, *_ = self.decoder.forward_autograd(x_tgt, tgt_out != PAD, initial=enc_i,
                                                    initial_float=enc_f, dropout=masks.decoder)
        return dec_out, self.build_memory(src, masks, slices)

    # ------------------------------------------------------------------ inference

    def encoder_outputs(self, src: torch.Tensor, src_len: torch.Tensor) -> tuple[torch.Tensor | None, list]:
        # Without the buffer (nothing will be reversed): a sentence's encoding then does not
        # depend on its batch mates, which share a buffer tile in training.
        tape = self.encoder.forward_sweep(EmbeddedTokens(self.src_emb, src, None), src != PAD, reversible=False)
        return None if tape.slices is None else to_float(tape.slices), DecoderStart(self.bridge, tape).states

    def decoder_step(self, state: list[torch.Tensor], prev: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        state = self.decoder.step(self.tgt_emb(prev), state)
        return self.decoder.cells[-1].output(state[-1]), state

    def reorder_state(self, state: list[torch.Tensor], index: torch.Tensor) -> list[torch.Tensor]:
        return [s.index_select(0, index) for s in state]
