"""Decoding with several models at once (``revnmt-translate --checkpoint A B C``).

At every step the ensemble's log-probabilities of the next token are the mean of its members' (the mean
of their log-softmax outputs: a log-linear combination with equal weights, as OpenNMT-py combines an
ensemble; fairseq averages the probabilities instead). An ensemble of one model, or of copies of one
model, gives exactly that model's log-probabilities.

:class:`Ensemble` has the decoding interface :mod:`revnmt.translation.search` uses (``encode``, ``decode_step``,
``reorder_state``), so greedy and beam search run on it unchanged, batched on the device, and ``align``
for ``--replace-unk``, which follows the first member's attention. The members may differ in
architecture but must read and write text alike: the same vocabularies and tokenization
(:func:`revnmt.checkpoints.compatibility.text_differences`, checked where checkpoints are loaded).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from revnmt.model import Encoded, Seq2Seq


class Ensemble(nn.Module):
    """Models decoding together; their log-probabilities are averaged at every step."""

    def __init__(self, models: Sequence[Seq2Seq]) -> None:
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        sizes = {model.cfg.tgt_vocab for model in models}
        if len(sizes) > 1:
            raise ValueError(f"an ensemble's models must share a target vocabulary: they have {sorted(sizes)} words")
        self.members = nn.ModuleList(models)
        self._memory_dims = [model.cfg.memory_dim for model in models]
        self.eval()  # made for decoding: no dropout, whatever mode the members were in

    @torch.no_grad()
    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> Encoded:
        """Every member's encoding of batch-major source ids, as one :class:`Encoded`: the members'
        attention memories side by side in one tensor, and the tuple of their decoder states.

        One tensor, so that search selects its rows (beams, sentences that leave the batch) as it does
        for a single model; each step splits it into the members' memories again."""
        encoded = [member.encode(src, src_len) for member in self.members]
        return Encoded(torch.cat([enc.memory for enc in encoded], dim=-1), encoded[0].pad_mask,
                       tuple(enc.state for enc in encoded))

    @torch.no_grad()
    def decode_step(self, enc: Encoded, state: tuple, prev: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """The mean of the members' log-probabilities [N, V] of the next token after ``prev`` [N], and
        their new states."""
        log_probs, states = [], []
        for member, memory, member_state in zip(self.members, enc.memory.split(self._memory_dims, dim=-1), state):
            # Contiguous, as the member's own memory would be: its attention then computes exactly what
            # it computes alone (a strided view may take other matrix kernels, with other rounding).
            member_log_probs, member_state = member.decode_step(Encoded(memory.contiguous(), enc.pad_mask, None),
                                                                member_state, prev)
            log_probs.append(member_log_probs)
            states.append(member_state)
        return torch.stack(log_probs).mean(dim=0), tuple(states)

    def reorder_state(self, state: tuple, index: torch.Tensor) -> tuple:
        """Rows ``index`` of every member's decoder state."""
        return tuple(member.reorder_state(s, index) for member, s in zip(self.members, state))

    @torch.no_grad()
    def align(self, src: torch.Tensor, src_len: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """The first member's alignment of outputs to source positions (:meth:`Seq2Seq.align`): the
        attention of one model, as ``--replace-unk`` needs one source word per output token."""
        return self.members[0].align(src, src_len, tgt)
