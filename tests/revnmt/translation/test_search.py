import math

import pytest
import torch

from revnmt.data.vocab import BOS, EOS, PAD
from revnmt.model import Encoded, ModelConfig, Seq2Seq, build_model
from revnmt.translation.ensemble import Ensemble
from revnmt.translation.length_penalty import LengthPenalty
from revnmt.translation.search import MAX_OUTPUT_LEN, Hypothesis, beam_search, beam_search_nbest, greedy, output_limits

VOCAB = 12


def _copy_batch(gen: torch.Generator, batch: int = 16):
    """Reverse-copy task: target = source reversed, lengths 2-6."""
    lengths = torch.randint(2, 7, (batch,), generator=gen).sort(descending=True).values
    src = torch.full((batch, int(lengths[0])), PAD)
    tgt_in = torch.full((batch, int(lengths[0]) + 1), PAD)
    tgt_out = torch.full_like(tgt_in, PAD)
    for i, n in enumerate(lengths.tolist()):
        ids = torch.randint(4, VOCAB, (n,), generator=gen)
        src[i, :n] = ids
        tgt_in[i, 0], tgt_in[i, 1 : n + 1] = BOS, ids.flip(0)
        tgt_out[i, :n], tgt_out[i, n] = ids.flip(0), EOS
    return src, lengths, tgt_in, tgt_out


@pytest.fixture(scope="module", params=["revgru", "lstm"])
def trained(request) -> tuple[Seq2Seq, torch.Tensor, torch.Tensor]:
    """A tiny model trained for a few steps, so that outputs differ and some stop early."""
    torch.manual_seed(0)
    cfg = ModelConfig(rnn=request.param, emb_dim=16, hidden_size=16, dropout=0.0, attention="emb+slice",
                      slice_dim=4, src_vocab=VOCAB, tgt_vocab=VOCAB)
    model = build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        src, src_len, tgt_in, tgt_out = _copy_batch(gen)
        opt.zero_grad()
        model.train_step(src, src_len, tgt_in, tgt_out, normalizer=float((tgt_out != PAD).sum()))
        opt.step()
    src, src_len, _, _ = _copy_batch(gen, batch=12)
    return model.eval(), src, src_len


def test_beam_one_is_greedy(trained):
    model, src, src_len = trained
    expected = greedy(model, src, src_len)
    assert beam_search(model, src, src_len, beam=1) == expected
    assert beam_search(model, src, src_len, beam=1, max_len=3) == greedy(model, src, src_len, max_len=3)
    assert len({len(ids) for ids in expected}) > 1  # a real test: outputs stop at different steps


@pytest.mark.parametrize("beam", [1, 4])
def test_outputs_hold_no_specials_and_respect_limits(trained, beam):
    model, src, src_len = trained
    for max_len in (None, 2):
        outputs = beam_search(model, src, src_len, beam=beam, max_len=max_len)
        for ids, limit in zip(outputs, output_limits(src_len, max_len)):
            assert len(ids) <= limit
            assert not {PAD, BOS, EOS} & set(ids)


@pytest.mark.parametrize("beam", [1, 3])
def test_batch_order_and_composition_do_not_matter(trained, beam):
    model, src, src_len = trained
    search = (lambda s, n: greedy(model, s, n)) if beam == 1 else (lambda s, n: beam_search(model, s, n, beam))
    together = search(src, src_len)
    perm = torch.randperm(len(src), generator=torch.Generator().manual_seed(1))
    assert search(src[perm], src_len[perm]) == [together[i] for i in perm.tolist()]
    alone = [search(src[i : i + 1, : int(src_len[i])], src_len[i : i + 1])[0] for i in range(len(src))]
    assert alone == together


def test_default_limit_grows_with_the_source_and_is_capped():
    assert output_limits(torch.tensor([1, 7, 1000])) == [12, 24, MAX_OUTPUT_LEN]
    assert output_limits(torch.tensor([1, 7]), max_len=5) == [5, 5]
    with pytest.raises(ValueError, match="positive"):
        output_limits(torch.tensor([3]), max_len=0)


class ScriptedModel:
    """Next-token probabilities that depend only on the previous token:

    BOS -> a 0.6, b 0.4;  a -> a 0.4, b 0.3, EOS 0.3;  b -> EOS 0.9, a 0.1.
    Greedy follows a, a, a, ... to the length limit; the best sequence is "b EOS".
    """

    A, B = 4, 5
    TABLE = {BOS: {A: 0.6, B: 0.4}, A: {A: 0.4, B: 0.3, EOS: 0.3}, B: {EOS: 0.9, A: 0.1}}

    def encode(self, src, src_len):
        return Encoded(torch.zeros(len(src), src.shape[1], 1), src == PAD, torch.zeros(len(src)))

    def decode_step(self, enc, state, prev):
        log_probs = torch.full((len(prev), 6), -math.inf)
        for row, token in enumerate(prev.tolist()):
            for nxt, p in self.TABLE[token].items():
                log_probs[row, nxt] = math.log(p)
        return log_probs, state

    def reorder_state(self, state, index):
        return state.index_select(0, index)


def test_beam_search_finds_what_greedy_misses():
    model, src, src_len = ScriptedModel(), torch.tensor([[4, 4, 4]]), torch.tensor([3])
    assert greedy(model, src, src_len) == [[ScriptedModel.A] * 16]  # 2 * 3 + 10 tokens: the limit
    assert beam_search(model, src, src_len, beam=1) == greedy(model, src, src_len)
    assert beam_search(model, src, src_len, beam=2) == [[ScriptedModel.B]]


class ShortOrLong(ScriptedModel):
    """Two translations: the empty one (just EOS: log 0.55 = -0.598) and "a" (a EOS: log 0.45 + log 0.7 = -1.155).
    Raw scores prefer the empty one, the mean per token "a" (-0.578), GNMT's milder penalty at alpha 1 the empty
    one (-1.155 / (7/6) = -0.990), and at alpha 5 "a" (-1.155 / (7/6)**5 = -0.535)."""

    TABLE = {BOS: {EOS: 0.55, ScriptedModel.A: 0.45}, ScriptedModel.A: {EOS: 0.7, ScriptedModel.A: 0.3}}


@pytest.mark.parametrize("alpha, kind, expected", [
    (0.0, "average", []), (0.0, "gnmt", []),
    (1.0, "average", [ShortOrLong.A]),
    (1.0, "gnmt", []), (5.0, "gnmt", [ShortOrLong.A]),
])
def test_the_length_penalty_decides_between_a_short_and_a_long_translation(alpha, kind, expected):
    model, src, src_len = ShortOrLong(), torch.tensor([[4, 4, 4]]), torch.tensor([3])
    assert beam_search(model, src, src_len, beam=2, length_penalty=LengthPenalty(alpha, kind)) == [expected]
    if (alpha, kind) == (1.0, "average"):  # the default
        assert beam_search(model, src, src_len, beam=2) == [expected]


class NonFinite(ScriptedModel):
    """Every next-token log-probability is ``value`` (NaN, inf: a diverged model's), except for PAD and BOS."""

    def __init__(self, value: float) -> None:
        self.value = value

    def decode_step(self, enc, state, prev):
        return torch.full((len(prev), 6), self.value), state


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("beam", [1, 5])
def test_non_finite_scores_end_the_search_with_one_output_per_sentence(value, beam):
    src, src_len = torch.tensor([[4, 4, 4], [5, 5, 0]]), torch.tensor([3, 2])
    outputs = beam_search(NonFinite(value), src, src_len, beam=beam)
    assert len(outputs) == 2
    lists = beam_search_nbest(NonFinite(value), src, src_len, beam, beam)
    assert [hyps[0].ids if hyps else [] for hyps in lists] == outputs
    assert all(len(hyps) <= beam for hyps in lists)
    if value != math.inf:  # every score NaN or -inf: nothing finishes
        assert lists == [[], []]
    for ids, limit in zip(outputs, output_limits(src_len)):
        assert len(ids) <= limit and not {PAD, BOS, EOS} & set(ids)
    assert len(greedy(NonFinite(value), src, src_len)) == 2


@pytest.mark.parametrize("fill", [math.nan, math.inf, 1e30])
@pytest.mark.parametrize("beam", [1, 5])
def test_models_with_non_finite_weights_translate_alone_and_in_an_ensemble(fill, beam):
    torch.manual_seed(0)
    cfg = ModelConfig(rnn="gru", emb_dim=16, hidden_size=16, dropout=0.0, attention="hidden", src_vocab=VOCAB,
                      tgt_vocab=VOCAB)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(fill)
    src, src_len, _, _ = _copy_batch(torch.Generator().manual_seed(0), batch=4)
    for decoder in (model, Ensemble([model, build_model(cfg).eval()])):
        assert len(beam_search(decoder, src, src_len, beam=beam)) == 4


def _score(model, src, src_len, ids: list[int], limit: int, length_penalty: LengthPenalty) -> float:
    """The score beam search gives ``ids`` for one sentence, computed by feeding them back: EOS ends them
    unless they reach the length limit."""
    enc = model.encode(src, src_len)
    state, prev, total = enc.state, torch.tensor([BOS]), 0.0
    tokens = ids if len(ids) == limit else ids + [EOS]
    for token in tokens:
        log_probs, state = model.decode_step(enc, state, prev)
        total += float(log_probs[0, token])
        prev = torch.tensor([token])
    return length_penalty.normalize(total, len(tokens))


@pytest.mark.parametrize("beam, nbest", [(1, 1), (4, 3)])
def test_nbest_lists_are_ranked_and_start_with_the_translation(trained, beam, nbest):
    model, src, src_len = trained
    gnmt = LengthPenalty(0.6, "gnmt")
    for length_penalty in (LengthPenalty(), gnmt):
        lists = beam_search_nbest(model, src, src_len, beam, nbest, length_penalty=length_penalty)
        assert [hyps[0].ids for hyps in lists] == beam_search(model, src, src_len, beam, length_penalty=length_penalty)
        for i, (hyps, limit) in enumerate(zip(lists, output_limits(src_len))):
            assert len(hyps) == nbest and len({tuple(hyp.ids) for hyp in hyps}) == nbest  # distinct
            scores = [hyp.score for hyp in hyps]
            assert scores == sorted(scores, reverse=True)
            n = int(src_len[i])
            for hyp in hyps:
                assert len(hyp.ids) <= limit and not {PAD, BOS, EOS} & set(hyp.ids)
                expected = _score(model, src[i : i + 1, :n], src_len[i : i + 1], hyp.ids, limit, length_penalty)
                assert hyp.score == pytest.approx(expected, rel=1e-5, abs=1e-5)
    # nbest does not change the search: a shorter list starts a longer one
    widest = beam_search_nbest(model, src, src_len, beam, beam)
    assert [hyps[:nbest] for hyps in widest] == beam_search_nbest(model, src, src_len, beam, nbest)


def test_nbest_lists_do_not_depend_on_batch_mates(trained):
    model, src, src_len = trained
    together = beam_search_nbest(model, src, src_len, 3, 3)
    alone = [beam_search_nbest(model, src[i : i + 1, : int(src_len[i])], src_len[i : i + 1], 3, 3)[0]
             for i in range(len(src))]
    assert [[hyp.ids for hyp in hyps] for hyps in alone] == [[hyp.ids for hyp in hyps] for hyps in together]
    for hyps_alone, hyps_together in zip(alone, together):
        assert [hyp.score for hyp in hyps_alone] == pytest.approx([hyp.score for hyp in hyps_together])


@pytest.mark.parametrize("alpha, expected", [
    (1.0, [Hypothesis(pytest.approx((math.log(0.45) + math.log(0.7)) / 2), [ShortOrLong.A]),
           Hypothesis(pytest.approx(math.log(0.55)), [])]),
    (0.0, [Hypothesis(pytest.approx(math.log(0.55)), []),
           Hypothesis(pytest.approx(math.log(0.45) + math.log(0.7)), [ShortOrLong.A])]),
])
def test_nbest_scores_are_what_the_length_penalty_ranks_by(alpha, expected):
    src, src_len = torch.tensor([[4, 4, 4]]), torch.tensor([3])
    assert beam_search_nbest(ShortOrLong(), src, src_len, 2, 2, length_penalty=LengthPenalty(alpha)) == [expected]


def test_a_beam_that_runs_out_of_finite_hypotheses_lists_fewer():
    # After BOS only "a" and "b" have a probability: with one token allowed, a beam of 3 finishes two.
    src, src_len = torch.tensor([[4, 4, 4]]), torch.tensor([3])
    assert beam_search_nbest(ScriptedModel(), src, src_len, 3, 3, max_len=1) == [[
        Hypothesis(pytest.approx(math.log(0.6)), [ScriptedModel.A]),
        Hypothesis(pytest.approx(math.log(0.4)), [ScriptedModel.B])]]


@pytest.mark.parametrize("beam, nbest", [(2, 3), (1, 2), (3, 0)])
def test_nbest_must_be_between_one_and_the_beam(beam, nbest):
    src, src_len = torch.tensor([[4, 4, 4]]), torch.tensor([3])
    with pytest.raises(ValueError, match=f"nbest must be between 1 and the beam size {beam}, got {nbest}"):
        beam_search_nbest(ScriptedModel(), src, src_len, beam, nbest)
