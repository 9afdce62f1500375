"""A tiny model of every family and a batch of ragged sentences, for the model tests.

(Not a conftest.py: tests elsewhere import the top-level one as ``conftest``.)
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from revnmt.data.vocab import BOS, EOS, PAD
from revnmt.model import ExecutionConfig, ModelConfig, Seq2Seq, build_model

EXECUTION = {f.name for f in fields(ExecutionConfig)}


@dataclass(frozen=True)
class Toy:
    src_vocab: int = 30
    tgt_vocab: int = 25

    def config(self, rnn: str = "revgru", attention: str = "emb+slice", layers: int = 1, dropout: float = 0.3,
               **options) -> ModelConfig:
        options = dict(slice_dim=3, hidden_size=12) | options
        return ModelConfig(rnn=rnn, emb_dim=8, layers=layers, dropout=dropout, attention=attention,
                           src_vocab=self.src_vocab, tgt_vocab=self.tgt_vocab, **options)

    @staticmethod
    def execution(**options) -> ExecutionConfig:
        """How the toy models compute: 4 buffer lanes unless ``options`` say otherwise."""
        return ExecutionConfig(**(dict(buffer_lanes=4) | options))

    def model(self, *args, **kwargs) -> Seq2Seq:
        """A model of :meth:`config` and :meth:`execution` (the options of either, in ``kwargs``) with seeded
        weights, in training mode."""
        torch.manual_seed(0)
        execution = {key: kwargs.pop(key) for key in list(kwargs) if key in EXECUTION}
        return build_model(self.config(*args, **kwargs), self.execution(**execution)).train()

    def batch(self, batch: int = 4, src_lens=(7, 5, 3, 2), tgt_lens=(6, 4, 5, 1), seed: int = 0):
        """(src, src_len, tgt_in, tgt_out), batch-major, padded to the longest sentence."""
        gen = torch.Generator().manual_seed(seed)
        src = torch.randint(4, self.src_vocab, (batch, max(src_lens)), generator=gen)
        tgt = torch.randint(4, self.tgt_vocab, (batch, max(tgt_lens)), generator=gen)
        for i, (ls, lt) in enumerate(zip(src_lens, tgt_lens)):
            src[i, ls:] = PAD
            tgt[i, lt:] = PAD
        tgt_in = torch.cat([torch.full((batch, 1), BOS), tgt], 1)
        tgt_out = torch.cat([tgt, torch.full((batch, 1), PAD)], 1)
        tgt_out[torch.arange(batch), torch.tensor(tgt_lens)] = EOS
        return src, torch.tensor(src_lens), tgt_in, tgt_out

    @staticmethod
    def grads(model: Seq2Seq, train_step, batch, seed: int = 1) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss and the gradients of one training step (``train_step`` is one of the model's)."""
        model.zero_grad()
        torch.manual_seed(seed)  # the same dropout masks for every training path
        loss = train_step(*batch, normalizer=10.0).loss
        return loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
