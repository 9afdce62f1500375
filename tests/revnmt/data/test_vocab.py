import pytest
import torch

from revnmt.data import BOS, EOS, PAD, SPECIALS, UNK, Vocabulary

SENTENCES = [["b", "a", "c", "a"], ["c", "a", "d"], ["b", "e", "<unk>"]]
# counts: a=3, b=2, c=2, d=1, e=1


def test_specials_come_first():
    vocab = Vocabulary(["x"])
    assert (PAD, UNK, BOS, EOS) == (0, 1, 2, 3)
    assert vocab.itos[:4] == list(SPECIALS) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert len(vocab) == 5


def test_build_orders_by_frequency_then_token():
    vocab = Vocabulary.build(SENTENCES)
    assert vocab.itos[4:] == ["a", "b", "c", "d", "e"]
    assert Vocabulary.build(reversed(SENTENCES)) == vocab  # independent of corpus order


def test_build_min_freq_and_max_size():
    assert Vocabulary.build(SENTENCES, min_freq=2).itos[4:] == ["a", "b", "c"]
    assert Vocabulary.build(SENTENCES, max_size=2).itos[4:] == ["a", "b"]
    assert len(Vocabulary.build(SENTENCES, min_freq=2, max_size=10)) == 4 + 3


def test_literal_special_in_text_is_not_duplicated():
    vocab = Vocabulary.build(SENTENCES)
    assert vocab.itos.count("<unk>") == 1
    assert vocab.encode(["<unk>"]) == [UNK]


def test_encode_maps_unknown_tokens_to_unk():
    vocab = Vocabulary.build(SENTENCES)
    assert vocab.encode(["a", "zzz", "e"]) == [4, UNK, 8]
    assert "a" in vocab and "zzz" not in vocab


def test_decode_stops_at_eos_and_strips_specials():
    vocab = Vocabulary.build(SENTENCES)
    ids = [BOS, 4, UNK, 5, EOS, 6, PAD]
    assert vocab.decode(ids) == ["a", "<unk>", "b"]
    assert vocab.decode(ids, strip_specials=False) == ["<s>", "a", "<unk>", "b", "</s>", "c", "<pad>"]
    assert vocab.decode(torch.tensor(ids)) == ["a", "<unk>", "b"]


def test_save_load_round_trip(tmp_path):
    vocab = Vocabulary.build([["Männer", "ü", "a\u2028b", "café", "ü"]])
    path = tmp_path / "vocab.de"
    vocab.save(path)
    assert path.read_text(encoding="utf-8").startswith("<pad>\n<unk>\n<s>\n</s>\nü\n")
    assert Vocabulary.load(path) == vocab
    assert list(tmp_path.iterdir()) == [path]  # the temporary file was renamed, not left behind


def test_load_rejects_other_files(tmp_path):
    path = tmp_path / "words.txt"
    path.write_text("hello\nworld\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not a vocabulary file"):
        Vocabulary.load(path)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        Vocabulary.load(tmp_path / "missing.txt")


@pytest.mark.parametrize("tokens", [["a", "a"], ["<s>"], ["a\nb"], [""]])
def test_invalid_token_lists_are_rejected(tokens):
    with pytest.raises(ValueError):
        Vocabulary(tokens)
