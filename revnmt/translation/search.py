"""Greedy and beam search over a ``Seq2Seq`` model (or an ensemble), batched over sentences.

Both return, for every source row, the output ids without BOS and EOS; :func:`beam_search_nbest` returns
the best few of beam search's finished hypotheses with their scores instead. A sentence may produce at
most ``output_limits`` tokens: 2 × its source length + 10 (capped at ``MAX_OUTPUT_LEN``) unless a
fixed ``max_len`` is given. Limits are per sentence, so an output never depends on which other
sentences share its batch. Sentences that are finished leave the batch, so long outliers do not
keep the whole batch decoding.

Beam search ranks finished hypotheses by ``score / lp(length)``, ``score`` being the summed
log-probability and ``length`` the number of predicted tokens (EOS included), with a
:class:`~revnmt.translation.length_penalty.LengthPenalty` (default: the mean log-probability per token). During
the search the live hypotheses are ranked by their raw scores, as in fairseq.

The model is anything with the decoding interface of :class:`Decoder`: a :class:`~revnmt.model.Seq2Seq`
or an :class:`~revnmt.translation.ensemble.Ensemble` of them.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from revnmt.data.vocab import BOS, EOS, PAD
from revnmt.model import Encoded
from revnmt.translation.length_penalty import AVERAGE, LengthPenalty

MAX_OUTPUT_LEN = 250  # the cap of the default per-sentence limit


class Decoder(Protocol):
    """What search needs of a model (see :class:`~revnmt.model.Seq2Seq` for each method)."""

    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> Encoded: ...

    def decode_step(self, enc: Encoded, state, prev: torch.Tensor) -> tuple[torch.Tensor, object]: ...

    def reorder_state(self, state, index: torch.Tensor) -> object: ...


class Hypothesis(NamedTuple):
    """A translation beam search finished."""

    score: float  # what beam search ranks it by: its log-probability / lp(length)
    ids: list[int]  # without BOS and EOS


def check_nbest(nbest: int, beam: int) -> None:
    """ValueError unless 1 <= ``nbest`` <= ``beam``: a beam finishes ``beam`` hypotheses, not more."""
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest must be between 1 and the beam size {beam}, got {nbest}")


def output_limits(src_len: torch.Tensor, max_len: int | None = None) -> list[int]:
    """The most tokens each sentence may produce: ``max_len`` if given, else 2·len + 10 capped."""
    if max_len is not None:
        if max_len < 1:
            raise ValueError(f"max_len must be positive, got {max_len}")
        return [max_len] * len(src_len)
    return [min(2 * n + 10, MAX_OUTPUT_LEN) for n in src_len.tolist()]


def _select(model: Decoder, enc: Encoded, state, rows: torch.Tensor) -> tuple[Encoded, object]:
    """Rows ``rows`` of the attention memory and of the decoder state."""
    selected = Encoded(enc.memory.index_select(0, rows), enc.pad_mask.index_select(0, rows), None)
    return selected, model.reorder_state(state, rows)


def _next_log_probs(model: Decoder, enc: Encoded, state, prev: torch.Tensor):
    """One decoder step; PAD and BOS are never predicted (training never targets them)."""
    log_probs, state = model.decode_step(enc, state, prev)
    log_probs[:, PAD] = log_probs[:, BOS] = float("-inf")
    return log_probs, state


@torch.no_grad()
def greedy(model: Decoder, src: torch.Tensor, src_len: torch.Tensor, max_len: int | None = None) -> list[list[int]]:
    """Most probable next token at every step, for batch-major source ids ``src`` [B, S]."""
    limits = output_limits(src_len, max_len)
    enc = model.encode(src, src_len)
    state = enc.state
    outputs: list[list[int]] = [[] for _ in limits]
    alive = list(range(len(limits)))  # the sentence of each row still decoding
    prev = torch.full((len(limits),), BOS, dtype=torch.long, device=src.device)
    for t in range(1, max(limits) + 1):
        log_probs, state = _next_log_probs(model, enc, state, prev)
        prev = log_probs.argmax(dim=-1)
        keep = []
        for row, (sentence, token) in enumerate(zip(alive, prev.tolist())):
            if token != EOS:
                outputs[sentence].append(token)
                if t < limits[sentence]:
                    keep.append(row)
        if not keep:
            break
        if len(keep) < len(alive):
            rows = torch.tensor(keep, device=src.device)
            enc, state = _select(model, enc, state, rows)
            prev, alive = prev[rows], [alive[row] for row in keep]
    return outputs


def beam_search(model: Decoder, src: torch.Tensor, src_len: torch.Tensor, beam: int, max_len: int | None = None,
                length_penalty: LengthPenalty = AVERAGE) -> list[list[int]]:
    """The best of ``beam`` hypotheses per sentence, by score normalized with ``length_penalty``
    (:func:`beam_search_nbest`); the empty translation for a sentence that finished none."""
    found = beam_search_nbest(model, src, src_len, beam, 1, max_len, length_penalty)
    return [hyps[0].ids if hyps else [] for hyps in found]


@torch.no_grad()
def beam_search_nbest(model: Decoder, src: torch.Tensor, src_len: torch.Tensor, beam: int, nbest: int,
                      max_len: int | None = None, length_penalty: LengthPenalty = AVERAGE) -> list[list[Hypothesis]]:
    """The ``nbest`` (at most ``beam``) best finished hypotheses of each sentence, best first, by score
    normalized with ``length_penalty``; the first is :func:`beam_search`'s translation.

    Each step takes the 2·beam best extensions of a sentence's live hypotheses: those ending in EOS
    among the first ``beam`` are finished, the first ``beam`` others stay live. A sentence is done
    when it has ``beam`` finished hypotheses or reaches its length limit (its live ones are then
    finished as they are). With ``beam = 1`` and finite scores this is exactly greedy search. A hypothesis
    scored NaN or -inf (a diverged model's) never finishes. A sentence thus ends with ``beam`` finished
    hypotheses or more, unless at its length limit fewer than ``beam`` live ones had a finite score (a diverged
    model; a vocabulary of a few words with a short limit): only then may it have fewer than ``nbest``, none
    if every score was NaN or -inf. ``nbest`` does not change the search: a shorter list starts a longer one.
    """
    if beam < 1:
        raise ValueError(f"beam must be positive, got {beam}")
    check_nbest(nbest, beam)
    limits = output_limits(src_len, max_len)
    device = src.device
    enc = model.encode(src, src_len)
    n = len(limits)
    enc, state = _select(model, enc, enc.state, torch.arange(n, device=device).repeat_interleave(beam))
    # Every live hypothesis starts as BOS; only the first of each sentence counts at step 1.
    scores = torch.full((n, beam), float("-inf"), device=device)
    scores[:, 0] = 0.0
    history: list[list[int]] = [[] for _ in range(n * beam)]  # tokens of each live hypothesis
    prev = torch.full((n * beam,), BOS, dtype=torch.long, device=device)
    finished: list[list[Hypothesis]] = [[] for _ in limits]
    alive = list(range(n))

    for t in range(1, max(limits) + 1):
        log_probs, state = _next_log_probs(model, enc, state, prev)
        vocab = log_probs.shape[-1]
        candidates = (scores.unsqueeze(-1) + log_probs.view(len(alive), beam, vocab)).view(len(alive), -1)
        top_scores, top_ids = candidates.topk(min(2 * beam, beam * vocab), dim=1)
        top_rows = top_ids // vocab + torch.arange(len(alive), device=device).unsqueeze(1) * beam
        top_tokens = top_ids % vocab
        # The first `beam` candidates that do not end the sentence, in rank order (there are at
        # least that many: each live hypothesis contributes at most one EOS).
        live = torch.argsort((top_tokens == EOS).int(), dim=1, stable=True)[:, :beam]
        scores, prev = top_scores.gather(1, live), top_tokens.gather(1, live).flatten()
        live_rows = top_rows.gather(1, live).flatten()
        state = model.reorder_state(state, live_rows)  # the memory rows of a sentence are all equal

        ranked = zip(*(x[:, :beam].tolist() for x in (top_scores, top_rows, top_tokens)))
        live_hyps = zip(scores.tolist(), live_rows.view(-1, beam).tolist(), prev.view(-1, beam).tolist())
        new_history, keep = [], []
        for i, (sentence, ranked_i, (live_scores, rows, tokens)) in enumerate(zip(alive, ranked, live_hyps)):
            for score, row, token in zip(*ranked_i):
                if token == EOS and score > float("-inf"):
                    finished[sentence].append(Hypothesis(length_penalty.normalize(score, t), history[row]))
            extended = [history[row] + [token] for row, token in zip(rows, tokens)]
            new_history += extended
            if t == limits[sentence]:
                finished[sentence] += [Hypothesis(length_penalty.normalize(score, t), ids)
                                       for score, ids in zip(live_scores, extended) if score > float("-inf")]
            elif len(finished[sentence]) < beam:
                keep.append(i)
        history = new_history
        if not keep:
            break
        if len(keep) < len(alive):
            index = torch.tensor(keep, device=device)
            rows = (index.unsqueeze(1) * beam + torch.arange(beam, device=device)).flatten()
            enc, state = _select(model, enc, state, rows)
            scores, prev = scores[index], prev[rows]
            history = [history[row] for row in rows.tolist()]
            alive = [alive[i] for i in keep]

    # The sort is stable (reverse=True too): of equal scores the earliest finished comes first, for a
    # deterministic result.
    return [sorted(hyps, key=lambda hyp: hyp.score, reverse=True)[:nbest] for hyps in finished]
