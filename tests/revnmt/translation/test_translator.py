import itertools
import logging
import math
import threading
from dataclasses import replace

import pytest
import torch
from torch import nn

import revnmt.translation.translator
from revnmt.checkpoints import Checkpoint, TrainerState, TrainingState
from revnmt.data import EOS, PAD, DataOptions, SubwordTokenizer, Vocabulary, train_subword_model
from revnmt.model import Encoded, ModelConfig, build_model
from revnmt.translation import Translation, Translator, evaluate
from revnmt.translation.length_penalty import LengthPenalty

WORDS = "a man rides a red bike . two dogs play in the snow".split()
VOCAB = Vocabulary(sorted(set(WORDS)))


class CopyModel(nn.Module):
    """Translates by copying the source ids (source and target vocabularies are the same)."""

    def __init__(self, vocab_size: int = len(VOCAB)) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.unused = nn.Parameter(torch.zeros(1))  # the translator finds the device from a parameter

    def encode(self, src, src_len):
        # The state carries the position of each row and its source ids.
        state = torch.cat([torch.zeros(len(src), 1, dtype=torch.long), src], dim=1)
        return Encoded(torch.zeros(len(src), src.shape[1], 1), src == PAD, state)

    def decode_step(self, enc, state, prev):
        position, src = state[:, 0], state[:, 1:]
        nxt = src.gather(1, position.clamp(max=src.shape[1] - 1).unsqueeze(1)).squeeze(1)
        nxt = torch.where((position < src.shape[1]) & (nxt != PAD), nxt, EOS)
        log_probs = torch.full((len(prev), self.vocab_size), -20.0)
        log_probs[:, EOS] = -1000.0  # beam search must not finish early on an unlikely EOS: outputs stay copies
        log_probs[torch.arange(len(prev)), nxt] = 0.0
        return log_probs, torch.cat([state[:, :1] + 1, src], dim=1)

    def reorder_state(self, state, index):
        return state.index_select(0, index)

    def align(self, src, src_len, tgt):
        # the i-th output copies the i-th source word
        return torch.arange(tgt.shape[1]).expand_as(tgt)


def _copier(max_input_len=None) -> Translator:
    return Translator(CopyModel(), VOCAB, VOCAB, DataOptions("en", "en", lowercase=True, max_len=None),
                      max_input_len=max_input_len)


@pytest.mark.parametrize("beam", [1, 3])
def test_one_output_per_line_in_input_order(beam):
    lines = ["A man rides a red bike.", "", "Two dogs.", "   ", "\x01", "Two dogs play in the snow.", "a"]
    expected = ["a man rides a red bike.", "", "two dogs.", "", "", "two dogs play in the snow.", "a"]
    assert _copier().translate(lines, beam=beam, batch_size=2) == expected


def test_unknown_words_come_out_as_unk():
    assert _copier().translate(["A cat rides."]) == ["a <unk> rides."]


@pytest.mark.parametrize("beam", [1, 2])
def test_replace_unk_puts_the_aligned_source_word(beam):
    lines = ["A cat rides.", "two dogs", "Zebras and cats."]
    assert _copier().translate(lines, beam=beam, replace_unk=True) == ["a cat rides.", "two dogs", "zebras and cats."]


def test_overlong_lines_are_truncated_with_a_warning(caplog):
    lines = ["a man rides", "two dogs play in the snow .", "a red bike"]
    with caplog.at_level(logging.WARNING):
        outputs = _copier(max_input_len=4).translate(lines, beam=1)
    assert outputs == ["a man rides", "two dogs play in", "a red bike"]
    assert "truncated 1 input line(s) longer than 4 tokens: line 2" in caplog.text


def test_input_length_limit_defaults_to_the_training_limit_then_100():
    options = DataOptions("en", "de", lowercase=False, max_len=50)
    assert Translator(CopyModel(), VOCAB, VOCAB, options).max_input_len == 50
    assert Translator(CopyModel(), VOCAB, VOCAB, options, max_input_len=7).max_input_len == 7
    no_limit = DataOptions("en", "de", lowercase=False, max_len=None)
    assert Translator(CopyModel(), VOCAB, VOCAB, no_limit).max_input_len == 100


def test_from_checkpoint_rebuilds_model_vocabularies_and_options(tmp_path):
    torch.manual_seed(0)
    cfg = ModelConfig(rnn="revgru", emb_dim=8, hidden_size=8, slice_dim=2, src_vocab=len(VOCAB),
                      tgt_vocab=len(VOCAB))
    model = build_model(cfg).eval()
    data = DataOptions("en", "de", lowercase=True, max_len=5)
    Checkpoint(cfg, model.state_dict(), VOCAB.itos, VOCAB.itos, data,
               training=TrainingState({}, {}, TrainerState(step=3), {})).save(tmp_path / "best.pt")
    loaded = Translator.from_checkpoint(tmp_path, "cpu")
    assert loaded.data == data and loaded.max_input_len == 5 and not loaded.model.training
    assert loaded.src_vocab == VOCAB and loaded.tokenizer.lowercase
    lines = ["Two dogs play.", "", "A man rides a red bike in the snow."]
    assert loaded.translate(lines, beam=2) == Translator(model, VOCAB, VOCAB, data).translate(lines, beam=2)


def test_translate_restores_training_mode():
    translator = _copier()
    translator.model.train()
    translator.translate(["a man"])
    assert translator.model.training


def test_stream_yields_a_translation_before_more_input_arrives():
    typed_more = threading.Event()
    consumed = []

    def typing():  # a user who types one line, then waits for its translation
        for line in ["A man.", "two dogs", "", "a red bike"]:
            consumed.append(line)
            yield line
            if len(consumed) == 1:
                typed_more.wait(timeout=30)

    outputs = _copier().translate_stream(typing(), beam=2, batch_size=8)
    assert next(outputs) == "a man."
    assert len(consumed) == 1 and not typed_more.is_set()  # did not wait for the timeout either
    typed_more.set()
    assert list(outputs) == ["two dogs", "", "a red bike"]


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("batch_size", [1, 2, 32])
def test_stream_gives_what_translate_gives(beam, batch_size):
    lines = ["A man rides a red bike.", "", "Two dogs.", "   ", "A cat rides.", "Two dogs play in the snow.", "a"]
    for replace_unk in (False, True):
        expected = _copier().translate(lines, beam=beam, batch_size=batch_size, replace_unk=replace_unk)
        streamed = _copier().translate_stream(iter(lines), beam=beam, batch_size=batch_size, replace_unk=replace_unk)
        assert list(streamed) == expected


def test_stream_numbers_truncated_lines_across_batches(caplog):
    lines = ["a man", "two dogs play in the snow", "a", "two dogs play in the snow"]
    with caplog.at_level(logging.WARNING):
        outputs = list(_copier(max_input_len=4).translate_stream(lines, beam=1, batch_size=1))
    assert outputs == ["a man", "two dogs play in", "a", "two dogs play in"]
    assert "longer than 4 tokens: line 2" in caplog.text and "longer than 4 tokens: line 4" in caplog.text


def test_stream_raises_what_reading_raised():
    def broken():
        yield "a man"
        raise OSError("input lost")

    with pytest.raises(OSError, match="input lost"):
        list(_copier().translate_stream(broken(), beam=1))


def test_stream_stopped_early_ends_its_reader_thread():
    outputs = _copier().translate_stream(itertools.repeat("a man"), beam=1, batch_size=2)
    assert [next(outputs) for _ in range(3)] == ["a man"] * 3
    outputs.close()
    for thread in threading.enumerate():
        if thread.name == "revnmt-input":
            thread.join(timeout=30)
            assert not thread.is_alive()


def test_evaluate_reports_both_bleus_case_insensitive_for_lowercasing_models():
    hyps, refs = ["ein mann fährt rad."], ["Ein Mann fährt Rad."]
    cased = evaluate(hyps, refs, DataOptions("en", "de", lowercase=False, max_len=None))
    lowered = evaluate(hyps, refs, DataOptions("en", "de", lowercase=True, max_len=None))
    assert lowered.sacrebleu.score == pytest.approx(100.0)
    assert cased.sacrebleu.score < 50
    assert lowered.tokenized_bleu == cased.tokenized_bleu == pytest.approx(100.0)
    assert "case:lc" in lowered.lines()[0] and "signature" in lowered.lines()[0]
    assert "case:mixed" in cased.lines()[0]


# A SentencePiece model of the words above (and their characters), joint for both sides.
SUBWORDS = train_subword_model(["A man rides a red bike.", "Two dogs play in the snow."] * 20, "bpe", 300, "test")
SUBWORD_VOCAB = SubwordTokenizer(SUBWORDS).vocabulary()


def _subword_copier(lowercase: bool = False, max_input_len: int | None = None) -> Translator:
    options = DataOptions("en", "en", lowercase=lowercase, max_len=None, src_spm=SUBWORDS, tgt_spm=SUBWORDS)
    return Translator(CopyModel(len(SUBWORD_VOCAB)), SUBWORD_VOCAB, SUBWORD_VOCAB, options, max_input_len)


@pytest.mark.parametrize("beam", [1, 3])
def test_a_subword_model_reads_raw_text_and_writes_raw_text_in_its_case(beam):
    lines = ["A man rides a red Bike.", "", "Zoë and 😀 ride TWO dogs!", "  two   dogs ", "Élan vital"]
    expected = ["A man rides a red Bike.", "", "Zoë and 😀 ride TWO dogs!", "two dogs", "Élan vital"]
    assert _subword_copier().translate(lines, beam=beam, batch_size=2) == expected
    assert _subword_copier(lowercase=True).translate(lines, beam=beam) == [line.lower() for line in expected]
    assert list(_subword_copier().translate_stream(iter(lines), beam=beam)) == expected


def test_a_subword_model_truncates_inputs_by_pieces(caplog):
    translator = _subword_copier(max_input_len=3)
    with caplog.at_level(logging.WARNING):
        outputs = translator.translate(["A man rides", "Two"], beam=1)
    pieces = translator.tokenizer.tokenize("A man rides")
    assert len(pieces) > 3 and outputs == [translator.detokenizer.detokenize(pieces[:3]), "Two"]
    assert "truncated 1 input line(s) longer than 3 tokens: line 1" in caplog.text


def test_replace_unk_is_refused_for_a_subword_model():
    for translate in (lambda t: t.translate(["a man"], replace_unk=True),
                      lambda t: list(t.translate_stream(["a man"], replace_unk=True))):
        with pytest.raises(ValueError, match="--replace-unk is for word vocabularies"):
            translate(_subword_copier())


def test_from_checkpoint_rebuilds_a_subword_model_and_refuses_a_corrupt_one(tmp_path):
    torch.manual_seed(0)
    cfg = ModelConfig(rnn="revgru", emb_dim=8, hidden_size=8, slice_dim=2,
                      src_vocab=len(SUBWORD_VOCAB), tgt_vocab=len(SUBWORD_VOCAB))
    model = build_model(cfg).eval()
    data = DataOptions("en", "de", lowercase=False, max_len=5, src_spm=SUBWORDS, tgt_spm=SUBWORDS)
    checkpoint = Checkpoint(cfg, model.state_dict(), SUBWORD_VOCAB.itos, SUBWORD_VOCAB.itos, data,
                            training=TrainingState({}, {}, TrainerState(step=3), {}))
    checkpoint.save(tmp_path / "best.pt")
    loaded = Translator.from_checkpoint(tmp_path / "best.pt", "cpu")
    assert loaded.data == data and loaded.data.subwords
    lines = ["Two dogs play.", "", "A man rides a red Bike in the snow."]
    assert loaded.translate(lines, beam=2) == Translator(model, SUBWORD_VOCAB, SUBWORD_VOCAB, data).translate(lines)

    replace(checkpoint, data=replace(data, tgt_spm=SUBWORDS[:100])).save(tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=f"^{tmp_path / 'bad.pt'}: the de SentencePiece model: not a SentencePiece"):
        Translator.from_checkpoint(tmp_path / "bad.pt", "cpu")


def test_the_length_penalty_goes_to_beam_search(monkeypatch):
    used = []
    search = revnmt.translation.translator.beam_search_nbest
    monkeypatch.setattr(revnmt.translation.translator, "beam_search_nbest",
                        lambda *args, length_penalty: used.append(length_penalty) or search(*args))
    gnmt = LengthPenalty(0.6, "gnmt")
    assert _copier().translate(["a man"], beam=2, length_penalty=gnmt) == ["a man"]
    assert list(_copier().translate_stream(["two dogs"], beam=2, length_penalty=gnmt)) == ["two dogs"]
    assert _copier().translate(["a man"], beam=2) == ["a man"]
    assert _copier().translate_nbest(["a man"], 2, beam=2, length_penalty=gnmt)[0][0].text == "a man"
    assert used == [gnmt, gnmt, LengthPenalty(1.0, "average"), gnmt]


NBEST_LINES = ["A man rides a red bike.", "", "Two dogs.", "A cat rides.", "a"]


@pytest.mark.parametrize("beam, nbest", [(1, 1), (3, 2), (4, 4)])
def test_nbest_lists_start_with_the_translation_and_are_ranked(beam, nbest):
    lists = _copier().translate_nbest(NBEST_LINES, nbest, beam=beam, batch_size=2)
    assert [translations[0].text for translations in lists] == _copier().translate(NBEST_LINES, beam=beam)
    assert [len(translations) for translations in lists] == [nbest, 1, nbest, nbest, nbest]
    assert lists[1] == [Translation("", pytest.approx(math.nan, nan_ok=True))]  # no tokens: not searched
    for translations in lists[:1] + lists[2:]:
        scores = [translation.score for translation in translations]
        assert scores == sorted(scores, reverse=True) and all(math.isfinite(score) for score in scores)
        assert len({translation.text for translation in translations}) == nbest
    # the copy's every token has log-probability 0, its EOS too: the best translation scores 0
    assert {translations[0].score for translations in lists[:1] + lists[2:]} == {0.0}
    streamed = _copier().translate_stream_nbest(iter(NBEST_LINES), nbest, beam=beam, batch_size=2)
    assert list(streamed) == lists


def test_without_nbest_lists_hold_the_translation_unscored_only_for_greedy_search():
    for beam in (1, 3):
        lists = _copier().translate_nbest(NBEST_LINES, None, beam=beam)
        assert [translation.text for translation, in lists] == _copier().translate(NBEST_LINES, beam=beam)
        unscored = [beam == 1 or not line for line in NBEST_LINES]  # greedy search, or no tokens
        assert [math.isnan(translation.score) for translation, in lists] == unscored


@pytest.mark.parametrize("beam", [2, 4])
def test_replace_unk_applies_to_every_translation_of_a_list(beam):
    lists = _copier().translate_nbest(["A cat rides.", "Zebras and cats."], beam, beam=beam, replace_unk=True)
    assert [translations[0].text for translations in lists] == ["a cat rides.", "zebras and cats."]
    assert not any("<unk>" in translation.text for translations in lists for translation in translations)
    assert _copier().translate_nbest(["A cat rides."], beam, beam=beam)[0][0].text == "a <unk> rides."


@pytest.mark.parametrize("beam, nbest", [(2, 3), (1, 2), (3, 0)])
def test_nbest_beyond_the_beam_is_refused_before_translating(beam, nbest):
    for translate in (lambda t: t.translate_nbest([""], nbest, beam=beam),
                      lambda t: list(t.translate_stream_nbest([""], nbest, beam=beam))):
        with pytest.raises(ValueError, match=f"nbest must be between 1 and the beam size {beam}, got {nbest}"):
            translate(_copier())
