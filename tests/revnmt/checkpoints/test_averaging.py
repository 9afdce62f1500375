from dataclasses import replace

import pytest
import torch

from revnmt.checkpoints import AveragedFrom, Checkpoint, Numerics, TrainerState, TrainingState, average_checkpoints
from revnmt.data import DataOptions
from revnmt.data.subword import train_subword_model
from revnmt.model import ModelConfig, build_model

WORDS = ["a", "man", "dog", "runs"]
DATA = DataOptions("en", "de", lowercase=True, max_len=50)
SUBWORDS = train_subword_model(["A man rides a red bike.", "Two dogs play in the snow."] * 20, "bpe", 300, "test")


def _checkpoint(seed: int, step: int, vocab: list[str] = WORDS, data: DataOptions = DATA, **options) -> Checkpoint:
    """A checkpoint as training writes it, of a tiny randomly initialised model."""
    torch.manual_seed(seed)
    cfg = ModelConfig(**{"rnn": "revgru", "emb_dim": 8, "hidden_size": 8, "slice_dim": 2,
                         "src_vocab": len(vocab) + 4, "tgt_vocab": len(vocab) + 4, **options})
    model = build_model(cfg)
    specials = ["<pad>", "<unk>", "<s>", "</s>"]
    return Checkpoint(cfg, model.state_dict(), [*specials, *vocab], [*specials, *vocab], data, args={"seed": seed},
                      training=TrainingState({"state": {}}, {}, TrainerState(step=step), {}),
                      numerics=Numerics.of("cpu"))


def _save(tmp_path, name: str, checkpoint: Checkpoint):
    checkpoint.save(tmp_path / name)
    return tmp_path / name


def test_the_average_of_copies_of_a_checkpoint_is_that_checkpoint(tmp_path):
    checkpoint = _checkpoint(0, 100)
    for copies in (2, 3, 7):  # sums in float64: a third of three copies is the copy, bit for bit
        averaged = average_checkpoints([_save(tmp_path, "a.pt", checkpoint)] * copies)
        assert averaged.weights.keys() == checkpoint.weights.keys()
        assert all(torch.equal(averaged.weights[key], checkpoint.weights[key]) for key in checkpoint.weights)


def test_the_average_of_two_checkpoints_is_their_mean_with_the_last_ones_options(tmp_path):
    first, last = _checkpoint(0, 100), _checkpoint(1, 200, dropout=0.2)
    averaged = average_checkpoints([_save(tmp_path, "a.pt", first), _save(tmp_path, "b.pt", last)])
    for key, value in averaged.weights.items():
        assert value.dtype == torch.float32
        assert torch.allclose(value, (first.weights[key] + last.weights[key]) / 2, rtol=0, atol=1e-7)
    assert not torch.equal(averaged.weights["generator.weight"], last.weights["generator.weight"])
    assert averaged.model_config == last.model_config and averaged.args == {"seed": 1}
    assert averaged.averaged_from == AveragedFrom([str(tmp_path / "a.pt"), str(tmp_path / "b.pt")], [100, 200])
    assert averaged.training is None and averaged.numerics is None  # for translating, not resuming
    averaged.trained_model()  # loads


def test_integer_tensors_are_taken_from_the_last_checkpoint(tmp_path):
    first, last = _checkpoint(0, 100), _checkpoint(1, 200)
    first.weights["counter"], last.weights["counter"] = torch.tensor(3), torch.tensor(8)
    first.weights["mask"], last.weights["mask"] = torch.tensor([True, False]), torch.tensor([False, False])
    averaged = average_checkpoints([_save(tmp_path, "a.pt", first), _save(tmp_path, "b.pt", last)])
    assert torch.equal(averaged.weights["counter"], torch.tensor(8))
    assert torch.equal(averaged.weights["mask"], torch.tensor([False, False]))


@pytest.mark.parametrize("other, message", [
    ({"hidden_size": 12}, "--hidden-size 8 and 12"),
    ({"rnn": "revlstm"}, "--rnn revgru and revlstm"),
    ({"attention": "emb"}, "--attention emb[+]slice and emb"),
    ({"vocab": ["a", "man", "cat", "runs"]}, r"their source vocabularies differ \(entry 6 is 'dog' and 'cat'\)"),
    ({"data": replace(DATA, lowercase=False)}, "--lowercase True and False"),
    ({"data": replace(DATA, src_spm=SUBWORDS, tgt_spm=SUBWORDS)},
     r"their source tokenization differs \(Moses words and SentencePiece\)"),
])
def test_checkpoints_of_other_models_are_refused(tmp_path, other, message):
    a = _save(tmp_path, "a.pt", _checkpoint(0, 100))
    b = _save(tmp_path, "b.pt", _checkpoint(1, 200, **other))
    with pytest.raises(ValueError, match=f"^cannot average {a} and {b}: {message}"):
        average_checkpoints([a, b])


def test_weights_of_other_shapes_are_refused_even_where_the_options_agree(tmp_path):
    other = _checkpoint(1, 200)
    other.weights["generator.bias"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"generator.bias is \(8,\) torch.float32 and \(3,\) torch.float32"):
        average_checkpoints([_save(tmp_path, "a.pt", _checkpoint(0, 100)), _save(tmp_path, "b.pt", other)])


def test_a_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint file at .*missing.pt"):
        average_checkpoints([_save(tmp_path, "a.pt", _checkpoint(0, 100)), tmp_path / "missing.pt"])
