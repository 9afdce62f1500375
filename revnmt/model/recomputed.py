"""The ordinary family with gradient checkpointing (``--rnn gru|lstm --checkpoint-steps K``): what a user
with a memory problem tries first, and the comparison reversal has to win.

The encoder and the decoder are :class:`~revnmt.rnn.recomputed.RecomputedRNN` stacks: in a training
step each keeps the state at every K-th step and the input of each segment, and recomputes a segment at a
time in backward. Everything else, the decoder's outputs that feed attention and the loss included, is the
ordinary family's, so the gradients are the ordinary model's (up to float rounding: the recomputed segments
run their input products in smaller blocks). Validation and translation run without gradients and are the
ordinary model's exactly; the parameters are the same, so checkpoints move freely between the two.
"""

from __future__ import annotations

import torch

from revnmt.rnn.bidirectional import BidirectionalRNN
from revnmt.rnn.recomputed import RecomputedRNN

from .config import ModelConfig
from .ordinary import OrdinarySeq2Seq
from .seq2seq import StepResult


class RecomputedSeq2Seq(OrdinarySeq2Seq):
    """An :class:`OrdinarySeq2Seq` whose recurrent layers are checkpointed every ``execution.checkpoint_steps``."""

    encoder: RecomputedRNN | BidirectionalRNN
    decoder: RecomputedRNN

    def make_rnn(self, cfg: ModelConfig) -> RecomputedRNN:
        return RecomputedRNN(cfg.rnn, cfg.emb_dim, cfg.hidden_size, cfg.layers, cfg.dropout,
                             self.execution.checkpoint_steps)

    def train_step(self, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                   normalizer: float) -> StepResult:
        """Ordinary backpropagation with recomputed segments; what the step holds outside autograd adds
        the checkpoints (each segment's input and starting state) to the ordinary family's."""
        result = super().train_step(src, src_len, tgt_in, tgt_out, normalizer)
        batch = src.shape[0]
        checkpoints = self.encoder.held_bytes(src.shape[1], batch) + self.decoder.held_bytes(tgt_in.shape[1], batch)
        return StepResult(result.loss, result.held_bytes + checkpoints)
