"""The ordinary family (``gru``/``lstm``): the baseline encoder-decoder, trained by autograd.

The recurrent layers are ``nn.GRU``/``nn.LSTM`` (cuDNN on GPU), which keep every hidden state for
backpropagation: that is the memory the reversible family avoids. A training step runs the forward
pass with its graph and backpropagates the loss a few decoder steps at a time on detached decoder
outputs (:meth:`~revnmt.model.seq2seq.Seq2Seq.chunked_loss_backward`), so the logits never exist
for the whole batch at once either.

A variant that trains otherwise (e.g. recomputing its recurrent layers from checkpoints) would
subclass :class:`OrdinarySeq2Seq` and override :meth:`~OrdinarySeq2Seq.train_step`, keeping
``train_step_autograd`` as its reference.
"""

from __future__ import annotations

import torch

from revnmt.data.vocab import PAD
from revnmt.rnn.bidirectional import BidirectionalRNN
from revnmt.rnn.ordinary import OrdinaryRNN

from .config import ModelConfig
from .seq2seq import DropoutMasks, Seq2Seq, StepResult

#: A decoder state: h [layers, N, H] (GRU) or (h, c) (LSTM), as nn.GRU / nn.LSTM take it.
OrdinaryState = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def _layer_states(state: OrdinaryState) -> list[torch.Tensor]:
    """Each layer's [B, state] state of an nn.GRU / nn.LSTM state: h, or ``[h | c]``."""
    if isinstance(state, tuple):
        return [torch.cat(layer, dim=-1) for layer in zip(*state)]
    return list(state)


class OrdinarySeq2Seq(Seq2Seq):
    """The attention encoder-decoder over :class:`~revnmt.rnn.ordinary.OrdinaryRNN` stacks, trained by autograd."""

    encoder: OrdinaryRNN | BidirectionalRNN
    decoder: OrdinaryRNN

    def make_rnns(self, cfg: ModelConfig) -> tuple[OrdinaryRNN | BidirectionalRNN, OrdinaryRNN]:
        encoder = BidirectionalRNN(self.make_rnn(cfg), self.make_rnn(cfg)) if cfg.bidirectional else self.make_rnn(cfg)
        return encoder, self.make_rnn(cfg)

    def make_rnn(self, cfg: ModelConfig) -> OrdinaryRNN:
        """One stack of the family's recurrent layers."""
        return OrdinaryRNN(cfg.rnn, cfg.emb_dim, cfg.hidden_size, cfg.layers, cfg.dropout)

    def train_step(self, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                   normalizer: float) -> StepResult:
        """Ordinary backpropagation (:meth:`train_step_autograd`): the leaves' gradients are what the
        step holds outside autograd."""
        return self.train_step_autograd(src, src_len, tgt_in, tgt_out, normalizer)

    def forward_graph(self, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                      masks: DropoutMasks) -> tuple[torch.Tensor, torch.Tensor]:
        x_src, x_tgt = self.embed(src, tgt_in, masks)
        enc_out, enc_final = self.encoder(x_src, src_len)
        dec_out, _ = self.decoder(x_tgt, (tgt_out != PAD).sum(0), self._decoder_start(enc_final))
        return dec_out, self.build_memory(src, masks, self._stored(enc_out))

    def _stored(self, enc_out: torch.Tensor) -> torch.Tensor | None:
        """The units of the encoder's outputs [S, B, H] (or [S, B, 2H], both directions') that the attention
        memory takes: the first ``stored_per_direction`` of each direction."""
        k, hidden = self.cfg.stored_per_direction, self.cfg.hidden_size
        if not k:
            return None
        return torch.cat([enc_out[..., d * hidden: d * hidden + k] for d in range(self.cfg.directions)], dim=-1)

    def _decoder_start(self, enc_final) -> OrdinaryState:
        """The decoder's initial state: the encoder's final one, or the bridge's of both directions' (each layer's
        state as ``[h | c]``, as the reversible family's)."""
        if self.bridge is None:
            return enc_final
        start = torch.stack(self.bridge(*map(_layer_states, enc_final)))  # [layers, B, state]
        if self.cfg.rnn == "lstm":
            return tuple(s.contiguous() for s in start.split(self.cfg.hidden_size, dim=-1))
        return start

    # ------------------------------------------------------------------ inference

    def encoder_outputs(self, src: torch.Tensor, src_len: torch.Tensor) -> tuple[torch.Tensor | None, OrdinaryState]:
        enc_out, state = self.encoder(self.src_emb(src), src_len)
        return self._stored(enc_out), self._decoder_start(state)

    def decoder_step(self, state: OrdinaryState, prev: torch.Tensor) -> tuple[torch.Tensor, OrdinaryState]:
        out, state = self.decoder(self.tgt_emb(prev).unsqueeze(0), None, state)
        return out[0], state

    def reorder_state(self, state: OrdinaryState, index: torch.Tensor) -> OrdinaryState:
        if isinstance(state, tuple):
            return tuple(s.index_select(1, index) for s in state)
        return state.index_select(1, index)
