import io
import subprocess
import sys
from dataclasses import replace

import pytest
import sentencepiece as spm
from conftest import write_toy_corpus

from revnmt.data import (
    SPECIALS,
    UNK,
    DataConfig,
    SubwordTokenizer,
    load_data,
    load_parallel,
    read_subword_model,
    text_options,
    train_subword_model,
)

PIECES = 400  # the toy corpus's characters and the 256 byte pieces need about 300


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, str]:
    return write_toy_corpus(tmp_path_factory.mktemp("toy"), {"train": 200, "valid": 20})


@pytest.fixture(scope="module")
def model(corpus) -> bytes:
    train = load_parallel(corpus["train"], "en", "de")
    return train_subword_model(train.src + train.tgt, "bpe", PIECES, "toy")


@pytest.mark.parametrize("text", [
    "A man runs in the Park .",
    "The DOG sleeps, and the Cat runs today!",
    "Zoë Ærøskøbing from 東京 😀 rides 🚀 — twice",  # characters the corpus never showed: bytes, not <unk>
])
def test_raw_text_round_trips_with_its_case_and_every_character(model, text):
    tokenizer = SubwordTokenizer(model)
    pieces = tokenizer.tokenize(text)
    assert UNK not in tokenizer.vocabulary().encode(pieces)
    assert tokenizer.detokenize(pieces) == text


def test_lowercasing_applies_before_the_split(model):
    tokenizer = SubwordTokenizer(model, lowercase=True)
    assert tokenizer.tokenize("The DOG") == SubwordTokenizer(model).tokenize("the dog")
    assert tokenizer.detokenize(tokenizer.tokenize("The DOG")) == "the dog"


def test_a_trained_models_ids_are_the_vocabularys(model):
    vocab = SubwordTokenizer(model).vocabulary()
    assert len(vocab) == PIECES and tuple(vocab.itos[: len(SPECIALS)]) == SPECIALS
    sp = spm.SentencePieceProcessor(model_proto=model)
    assert vocab.itos == [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    text = "A big dog runs in the street today ."
    assert vocab.encode(SubwordTokenizer(model).tokenize(text)) == sp.encode(text)


def test_a_model_trained_elsewhere_has_its_specials_mapped_by_piece(corpus):
    # SentencePiece's defaults: <unk> 0, <s> 1, </s> 2, no padding piece, no byte fallback.
    writer = io.BytesIO()
    train = load_parallel(corpus["train"], "en", "de")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(train.src), model_writer=writer, vocab_size=40,
                                   minloglevel=2)
    tokenizer = SubwordTokenizer(writer.getvalue())
    vocab = tokenizer.vocabulary()
    assert tuple(vocab.itos[: len(SPECIALS)]) == SPECIALS and len(vocab) == 40 - 3 + len(SPECIALS)
    pieces = tokenizer.tokenize("A man runs 😀")
    assert vocab.encode(pieces)[-1] == UNK and UNK not in vocab.encode(pieces)[:-1]  # an unseen character


def test_training_is_reproducible_from_process_to_process_when_it_samples_the_corpus(corpus, model):
    script = (f"import sys; from revnmt.data import load_parallel, subword; subword.SAMPLE_SENTENCES = 150; "
              f"train = load_parallel({corpus['train']!r}, 'en', 'de'); "
              f"sys.stdout.buffer.write(subword.train_subword_model(train.src + train.tgt, 'bpe', {PIECES}, 'toy'))")
    sampled = [subprocess.run([sys.executable, "-c", script], capture_output=True, check=True).stdout
               for _ in range(2)]
    assert sampled[0] == sampled[1] != model  # 150 of the 400 sentences, the same 150 each time


@pytest.mark.parametrize("vocab_size, message", [
    (5000, "--vocab-size 5000 is more pieces than this training data can give: it allows at most "),
    (100, "--vocab-size 100 is too small: the characters of the training data, the 256 byte pieces and the "
          "specials need at least "),
])
def test_a_vocabulary_size_the_data_cannot_give_is_reported_with_the_possible_size(corpus, vocab_size, message):
    train = load_parallel(corpus["train"], "en", "de")
    with pytest.raises(ValueError, match="^toy corpus: ") as error:
        train_subword_model(train.src, "bpe", vocab_size, "toy corpus")
    assert message in str(error.value) and str(error.value).split()[-1].isdigit()
    with pytest.raises(ValueError, match="no text to train"):
        train_subword_model([], "bpe", vocab_size, "toy corpus")


def test_missing_and_corrupt_model_files_are_refused(model, tmp_path):
    with pytest.raises(FileNotFoundError, match="SentencePiece model not found: "):
        read_subword_model(tmp_path / "missing.model")
    for name, data in (("empty", b""), ("text", b"a man runs\n"), ("truncated", model[:100]),
                       ("zeros", bytes(1000))):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=f"^{tmp_path / name}: .*SentencePiece model"):
            read_subword_model(tmp_path / name)
    (tmp_path / "good.model").write_bytes(model)
    assert read_subword_model(tmp_path / "good.model") == model


def test_text_options_train_one_model_or_one_per_language_or_read_them(corpus, model, tmp_path):
    config = DataConfig(train=corpus["train"], valid=corpus["valid"], subword="bpe", vocab_size=PIECES)
    joint = text_options(config)
    assert joint.subwords and joint.src_spm == joint.tgt_spm == model
    per_side = text_options(replace(config, joint_vocab=False, vocab_size=300))
    assert per_side.src_spm != per_side.tgt_spm
    assert "ä" in SubwordTokenizer(per_side.tgt_spm).vocabulary()
    assert "ä" not in SubwordTokenizer(per_side.src_spm).vocabulary()
    (tmp_path / "src.model").write_bytes(per_side.src_spm)
    (tmp_path / "tgt.model").write_bytes(per_side.tgt_spm)
    given = text_options(replace(config, subword="none", spm_model=(str(tmp_path / "src.model"),
                                                                    str(tmp_path / "tgt.model"))))
    assert (given.src_spm, given.tgt_spm) == (per_side.src_spm, per_side.tgt_spm)
    assert not text_options(replace(config, subword="none")).subwords


def test_load_data_counts_pieces_and_the_length_limit_counts_them_too(corpus):
    config = DataConfig(train=corpus["train"], valid=corpus["valid"], subword="bpe", vocab_size=PIECES)
    data = load_data(config)
    assert data.src_vocab == data.tgt_vocab and len(data.src_vocab) == PIECES
    tokenizer = data.options.source_tokenizer()
    src = load_parallel(corpus["train"], "en", "de").src
    assert list(data.train.src_lengths) == [len(tokenizer.tokenize(line)) for line in src]
    limit = int(max(data.train.src_lengths.max(), data.train.tgt_lengths.max())) - 1
    # The same models, not trained again: the options decide how text becomes tokens, and their max_len.
    shorter = load_data(config, replace(data.options, max_len=limit))
    assert shorter.src_vocab == data.src_vocab and shorter.train.n_filtered > 0
    assert max(shorter.train.src_lengths.max(), shorter.train.tgt_lengths.max()) <= limit


@pytest.mark.parametrize("options, message", [
    ({"subword": "wordpiece"}, "--subword must be one of none, bpe, unigram, got 'wordpiece'"),
    ({"spm_model": ("a", "b", "c")}, r"--spm-model takes one model for both languages, or two \(source, target\)"),
    ({"subword": "bpe", "spm_model": ("a",)}, "not both"),
])
def test_the_data_config_refuses_impossible_subword_options(options, message):
    with pytest.raises(ValueError, match=message):
        DataConfig(**options)
