import pytest
import torch

from revnmt.checkpoints import average_checkpoints, save_checkpoint
from revnmt.model import ModelConfig, build_model, model_from_checkpoint_state

WORDS = ["a", "man", "dog", "runs"]
DATA = {"src": "en", "tgt": "de", "lowercase": True, "max_len": 50, "src_spm": None, "tgt_spm": None}


def _checkpoint(seed: int, step: int, vocab: list[str] = WORDS, data: dict = DATA, **options) -> dict:
    """A checkpoint as training writes it, of a tiny randomly initialised model."""
    torch.manual_seed(seed)
    cfg = ModelConfig(**{"rnn": "revgru", "emb_dim": 8, "hidden_size": 8, "slice_dim": 2, "buffer_lanes": 2,
                         "src_vocab": len(vocab) + 4, "tgt_vocab": len(vocab) + 4, **options})
    model = build_model(cfg)
    return {"model_config": cfg.to_dict(), "model": model.state_dict(), "src_vocab": ["<pad>", "<unk>", "<s>", "</s>",
            *vocab], "tgt_vocab": ["<pad>", "<unk>", "<s>", "</s>", *vocab], "data": data, "args": {"seed": seed},
            "optimizer": {"state": {}}, "scheduler": {}, "rng": {}, "trainer": {"step": step}}


def _save(tmp_path, name: str, state: dict):
    save_checkpoint(tmp_path / name, state)
    return tmp_path / name


def test_the_average_of_copies_of_a_checkpoint_is_that_checkpoint(tmp_path):
    state = _checkpoint(0, 100)
    for copies in (2, 3, 7):  # sums in float64: a third of three copies is the copy, bit for bit
        averaged = average_checkpoints([_save(tmp_path, "a.pt", state)] * copies)
        assert averaged["model"].keys() == state["model"].keys()
        assert all(torch.equal(averaged["model"][key], state["model"][key]) for key in state["model"])


def test_the_average_of_two_checkpoints_is_their_mean_with_the_last_ones_options(tmp_path):
    first, last = _checkpoint(0, 100), _checkpoint(1, 200, dropout=0.2, buffer_backend="torch")
    averaged = average_checkpoints([_save(tmp_path, "a.pt", first), _save(tmp_path, "b.pt", last)])
    for key, value in averaged["model"].items():
        assert value.dtype == torch.float32
        assert torch.allclose(value, (first["model"][key] + last["model"][key]) / 2, rtol=0, atol=1e-7)
    assert not torch.equal(averaged["model"]["generator.weight"], last["model"]["generator.weight"])
    assert averaged["model_config"] == last["model_config"] and averaged["args"] == {"seed": 1}
    assert averaged["averaged_from"] == {"checkpoints": [str(tmp_path / "a.pt"), str(tmp_path / "b.pt")],
                                         "steps": [100, 200]}
    assert not {"optimizer", "scheduler", "rng", "trainer"} & averaged.keys()  # for translating, not resuming
    model_from_checkpoint_state(averaged)  # loads


def test_integer_tensors_are_taken_from_the_last_checkpoint(tmp_path):
    first, last = _checkpoint(0, 100), _checkpoint(1, 200)
    first["model"]["counter"], last["model"]["counter"] = torch.tensor(3), torch.tensor(8)
    first["model"]["mask"], last["model"]["mask"] = torch.tensor([True, False]), torch.tensor([False, False])
    averaged = average_checkpoints([_save(tmp_path, "a.pt", first), _save(tmp_path, "b.pt", last)])
    assert torch.equal(averaged["model"]["counter"], torch.tensor(8))
    assert torch.equal(averaged["model"]["mask"], torch.tensor([False, False]))


@pytest.mark.parametrize("other, message", [
    ({"hidden_size": 12}, "--hidden-size 8 and 12"),
    ({"rnn": "revlstm"}, "--rnn revgru and revlstm"),
    ({"attention": "emb"}, "--attention emb[+]slice and emb"),
    ({"vocab": ["a", "man", "cat", "runs"]}, r"their source vocabularies differ \(entry 6 is 'dog' and 'cat'\)"),
    ({"data": {**DATA, "lowercase": False}}, "--lowercase True and False"),
    ({"data": {**DATA, "src_spm": b"model", "tgt_spm": b"model"}},
     r"their source tokenization differs \(Moses words and SentencePiece\)"),
])
def test_checkpoints_of_other_models_are_refused(tmp_path, other, message):
    a = _save(tmp_path, "a.pt", _checkpoint(0, 100))
    b = _save(tmp_path, "b.pt", _checkpoint(1, 200, **other))
    with pytest.raises(ValueError, match=f"^cannot average {a} and {b}: {message}"):
        average_checkpoints([a, b])


def test_weights_of_other_shapes_are_refused_even_where_the_options_agree(tmp_path):
    other = _checkpoint(1, 200)
    other["model"]["generator.bias"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"generator.bias is \(8,\) torch.float32 and \(3,\) torch.float32"):
        average_checkpoints([_save(tmp_path, "a.pt", _checkpoint(0, 100)), _save(tmp_path, "b.pt", other)])


def test_a_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint file at .*missing.pt"):
        average_checkpoints([_save(tmp_path, "a.pt", _checkpoint(0, 100)), tmp_path / "missing.pt"])
