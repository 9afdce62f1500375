import copy
from dataclasses import replace

import pytest
import torch

from revnmt.checkpoints import Checkpoint, TrainerState, TrainingState
from revnmt.data import DataOptions, Vocabulary
from revnmt.data.vocab import BOS, EOS, PAD
from revnmt.model import ModelConfig, Seq2Seq, build_model
from revnmt.translation import Translator
from revnmt.translation.ensemble import Ensemble
from revnmt.translation.search import beam_search, beam_search_nbest, greedy, output_limits

VOCAB = 12


def _copy_batch(gen: torch.Generator, batch: int = 16):
    """Reverse-copy task: target = source reversed, lengths 2-6."""
    lengths = torch.randint(2, 7, (batch,), generator=gen).sort(descending=True).values
    src, tgt_in, tgt_out = (torch.full((batch, int(lengths[0]) + extra), PAD) for extra in (0, 1, 1))
    for i, n in enumerate(lengths.tolist()):
        ids = torch.randint(4, VOCAB, (n,), generator=gen)
        src[i, :n], tgt_in[i, 0], tgt_in[i, 1: n + 1] = ids, BOS, ids.flip(0)
        tgt_out[i, :n], tgt_out[i, n] = ids.flip(0), EOS
    return src, lengths, tgt_in, tgt_out


def _trained(rnn: str, attention: str, seed: int) -> Seq2Seq:
    """A tiny model trained for a few steps, so that its outputs differ and some stop early."""
    torch.manual_seed(seed)
    model = build_model(ModelConfig(rnn=rnn, emb_dim=16, hidden_size=16, dropout=0.0, attention=attention,
                                    slice_dim=4, src_vocab=VOCAB, tgt_vocab=VOCAB))
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(30):
        src, src_len, tgt_in, tgt_out = _copy_batch(gen)
        opt.zero_grad()
        model.train_step(src, src_len, tgt_in, tgt_out, normalizer=float((tgt_out != PAD).sum()))
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def models() -> tuple[Seq2Seq, Seq2Seq]:
    """Two models of different families and attention memories."""
    return _trained("revgru", "emb+slice", 0), _trained("lstm", "hidden", 1)


@pytest.fixture(scope="module")
def sources() -> tuple[torch.Tensor, torch.Tensor]:
    src, src_len, _, _ = _copy_batch(torch.Generator().manual_seed(5), batch=12)
    return src, src_len


def _search(model, src, src_len, beam: int) -> list[list[int]]:
    return greedy(model, src, src_len) if beam == 1 else beam_search(model, src, src_len, beam)


def _step_log_probs(model, src, src_len, outputs: list[list[int]]) -> torch.Tensor:
    """The log-probabilities [B, T, V] the model gives at each step of ``outputs`` fed back (teacher forcing)."""
    tgt = torch.full((len(outputs), max(map(len, outputs)) + 1), EOS)
    for i, ids in enumerate(outputs):
        tgt[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    enc = model.encode(src, src_len)
    state, prev, steps = enc.state, torch.full((len(src),), BOS), []
    for t in range(tgt.shape[1]):
        log_probs, state = model.decode_step(enc, state, prev)
        steps.append(log_probs)
        prev = tgt[:, t]
    return torch.stack(steps, 1)


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("copies", [1, 2])
def test_an_ensemble_of_one_model_or_its_copies_is_that_model(models, sources, beam, copies):
    model, (src, src_len) = models[0], sources
    ensemble = Ensemble([model] + [copy.deepcopy(model) for _ in range(copies - 1)])
    expected = _search(model, src, src_len, beam)
    assert _search(ensemble, src, src_len, beam) == expected
    assert len({len(ids) for ids in expected}) > 1  # a real test: outputs stop at different steps
    # every step's log-probabilities, and so every score, bit for bit
    log_probs = [_step_log_probs(m, src, src_len, expected) for m in (ensemble, model)]
    assert torch.equal(*log_probs)
    assert beam_search_nbest(ensemble, src, src_len, beam, beam) == beam_search_nbest(model, src, src_len, beam, beam)
    tgt = torch.tensor([[4, 5, 6]] * len(src))
    assert torch.equal(ensemble.align(src, src_len, tgt), model.align(src, src_len, tgt))


@pytest.mark.parametrize("beam", [1, 3])
def test_an_ensemble_of_different_models_averages_their_log_probabilities(models, sources, beam):
    (src, src_len), ensemble = sources, Ensemble(models)
    outputs = _search(ensemble, src, src_len, beam)
    for ids, limit in zip(outputs, output_limits(src_len)):
        assert len(ids) <= limit and not {PAD, BOS, EOS} & set(ids)
    members = [_step_log_probs(model, src, src_len, outputs) for model in models]
    assert torch.allclose(_step_log_probs(ensemble, src, src_len, outputs), (members[0] + members[1]) / 2)
    # as for one model, a sentence's output does not depend on its batch mates
    alone = [_search(ensemble, src[i: i + 1, : int(src_len[i])], src_len[i: i + 1], beam)[0] for i in range(len(src))]
    assert alone == outputs
    # n-best lists: the beam's finished translations, best first, the first being the translation
    lists = beam_search_nbest(ensemble, src, src_len, 3, 3)
    assert [hyps[0].ids for hyps in lists] == beam_search(ensemble, src, src_len, 3)
    for hyps in lists:
        assert len(hyps) == 3 and [hyp.score for hyp in hyps] == sorted((hyp.score for hyp in hyps), reverse=True)


def test_an_ensemble_needs_one_target_vocabulary():
    small = build_model(ModelConfig(rnn="gru", emb_dim=8, hidden_size=8, attention="hidden", src_vocab=10,
                                    tgt_vocab=10))
    large = build_model(ModelConfig(rnn="gru", emb_dim=8, hidden_size=8, attention="hidden", src_vocab=10,
                                    tgt_vocab=11))
    with pytest.raises(ValueError, match="must share a target vocabulary"):
        Ensemble([small, large])
    with pytest.raises(ValueError, match="at least one model"):
        Ensemble([])


WORDS = Vocabulary(sorted(set("a man rides a red bike . two dogs play in the snow".split())))


def _save(path, model: Seq2Seq, vocab: Vocabulary = WORDS, **data) -> None:
    options = replace(DataOptions("en", "de", lowercase=True, max_len=5), **data)
    Checkpoint(model.cfg, model.state_dict(), vocab.itos, vocab.itos, options,
               training=TrainingState({}, {}, TrainerState(step=3), {})).save(path)


def _word_model(rnn: str, seed: int, vocab: Vocabulary = WORDS) -> Seq2Seq:
    torch.manual_seed(seed)
    return build_model(ModelConfig(rnn=rnn, emb_dim=8, hidden_size=8, slice_dim=2,
                                   src_vocab=len(vocab), tgt_vocab=len(vocab))).eval()


def test_translating_with_several_checkpoints_decodes_with_their_ensemble(tmp_path):
    models = [_word_model("revgru", 0), _word_model("gru", 1)]
    for i, model in enumerate(models):
        _save(tmp_path / f"{i}.pt", model)
    loaded = Translator.from_checkpoints([tmp_path / "0.pt", tmp_path / "1.pt"], "cpu")
    assert isinstance(loaded.model, Ensemble) and not loaded.model.training and loaded.max_input_len == 5
    lines = ["Two dogs play.", "", "A man rides a red bike in the snow."]
    expected = Translator(Ensemble(models), WORDS, WORDS, loaded.data).translate(lines, beam=2, replace_unk=True)
    assert loaded.translate(lines, beam=2, replace_unk=True) == expected
    assert not isinstance(Translator.from_checkpoints([tmp_path / "0.pt"]).model, Ensemble)


@pytest.mark.parametrize("vocab, data, message", [
    (Vocabulary("a man rides".split()), {}, r"their source vocabularies differ \(16 and 7 entries\); their target"),
    (WORDS, {"lowercase": False}, "--lowercase True and False"),
    (WORDS, {"tgt": "fr"}, "--tgt de and fr"),
    (WORDS, {"max_len": 50}, None),  # only the default truncation of inputs: the first one's applies
])
def test_an_ensemble_of_checkpoints_that_read_or_write_text_differently_is_refused(tmp_path, vocab, data, message):
    _save(tmp_path / "a.pt", _word_model("revgru", 0))
    _save(tmp_path / "b.pt", _word_model("revgru", 1, vocab), vocab, **data)
    if message is None:
        assert Translator.from_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"]).max_input_len == 5
        return
    with pytest.raises(ValueError, match=f"^cannot ensemble {tmp_path / 'a.pt'} and {tmp_path / 'b.pt'}: {message}"):
        Translator.from_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"])
