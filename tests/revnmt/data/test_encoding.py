"""Tests of revnmt.data.encoding: a corpus streamed, tokenized in parallel and encoded in two passes gives
the arrays of encoding it in memory."""

import gzip
import logging

import numpy as np
import pytest

from revnmt.data import Tokenizer, Vocabulary, load_parallel
from revnmt.data.batching import EncodedDataset
from revnmt.data.corpus import read_pairs
from revnmt.data.encoding import WordRule, encode_corpus
from revnmt.data.subword import SubwordTokenizer, train_subword_model


def _encoded(prefix, tokenizers, **options):
    arrays = {}

    def write(part, dtype, length, blocks):
        arrays[part] = np.concatenate([np.zeros(0, dtype), *blocks])
        assert len(arrays[part]) == length and arrays[part].dtype == dtype

    return encode_corpus(str(prefix), "en", "de", tokenizers, write, **options), arrays


def _assert_same(arrays, dataset):
    for part, want in dataset.arrays().items():
        assert np.array_equal(arrays[part].astype(np.int64), want.astype(np.int64)), part


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("max_len", [None, 6])
def test_words_are_the_in_memory_encoding_whatever_the_workers(toy, workers, max_len):
    tokenizers = (Tokenizer("en", lowercase=True), Tokenizer("de", lowercase=True))
    # chunks of 16 pairs, so that the provisional ids of later chunks meet tokens of earlier ones
    result, arrays = _encoded(toy["train"], tokenizers, rule=WordRule(min_freq=2), max_len=max_len, workers=workers,
                              chunk=16)
    corpus = load_parallel(toy["train"], "en", "de")
    vocabs = [Vocabulary.build((tok.tokenize(line) for line in lines), min_freq=2)
              for tok, lines in zip(tokenizers, (corpus.src, corpus.tgt))]
    assert (result.src_vocab, result.tgt_vocab) == tuple(vocabs)
    reference = EncodedDataset.from_corpus(corpus, *tokenizers, *vocabs, max_len=max_len)
    _assert_same(arrays, reference)
    assert result.pairs == len(reference) and result.filtered == reference.n_filtered
    assert arrays["src"].dtype == np.int16  # a small vocabulary: two bytes an id


def test_pieces_and_given_vocabularies_are_the_in_memory_encoding(toy):
    corpus = load_parallel(toy["train"], "en", "de")
    model = train_subword_model(corpus.src + corpus.tgt, "bpe", 340, "toy")
    tokenizers = (SubwordTokenizer(model), SubwordTokenizer(model))
    result, arrays = _encoded(toy["train"], tokenizers, max_len=8)
    vocab = tokenizers[0].vocabulary()
    assert result.src_vocab == vocab == result.tgt_vocab
    _assert_same(arrays, EncodedDataset.from_corpus(corpus, *tokenizers, vocab, vocab, max_len=8))
    # a resumed run's vocabularies (here: words of the first 20 pairs only): unknown tokens become <unk>
    words = (Tokenizer("en"), Tokenizer("de"))
    given = tuple(Vocabulary.build(tok.tokenize(line) for line in lines[:20])
                  for tok, lines in zip(words, (corpus.src, corpus.tgt)))
    result, arrays = _encoded(toy["train"], words, vocabs=given)
    assert (result.src_vocab, result.tgt_vocab) == given
    _assert_same(arrays, EncodedDataset.from_corpus(corpus, *words, *given))


def test_read_pairs_streams_gzip_drops_empty_sides_and_stops_at_the_limit(tmp_path, caplog):
    src = ["a b", "", "c", "d e f", "g"]
    tgt = ["x", "y", " ", "z", "w"]
    with gzip.open(tmp_path / "c.en.gz", "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in src))
    (tmp_path / "c.de").write_text("".join(line + "\n" for line in tgt), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        chunks = list(read_pairs(str(tmp_path / "c"), "en", "de", chunk=2))
    assert chunks == [[("a b", "x"), ("d e f", "z")], [("g", "w")]]
    assert "dropped 2 of 5 pairs with an empty side" in caplog.text
    assert [pair for chunk in read_pairs(str(tmp_path / "c"), "en", "de", limit=2) for pair in chunk] == \
        [("a b", "x"), ("d e f", "z")]


def test_read_pairs_reports_sides_of_different_lengths(tmp_path):
    (tmp_path / "c.en").write_text("a\nb\nc\n", encoding="utf-8")
    (tmp_path / "c.de").write_text("x\ny\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"c\.en has 3 lines, .*c\.de has 2 lines"):
        list(read_pairs(str(tmp_path / "c"), "en", "de"))


def test_read_pairs_names_the_damaged_gzip_file(tmp_path):
    data = gzip.compress(b"".join(b"sentence %d\n" % i for i in range(2000)))
    (tmp_path / "c.en.gz").write_bytes(data[: len(data) // 2])
    (tmp_path / "c.de").write_text("".join(f"satz {i}\n" for i in range(2000)), encoding="utf-8")
    with pytest.raises(ValueError, match=r"c\.en\.gz: truncated or corrupt gzip file") as error:
        list(read_pairs(str(tmp_path / "c"), "en", "de"))
    assert "c.de" not in str(error.value)
