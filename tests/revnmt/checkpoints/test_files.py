import errno
import io
import os
import pickle
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from revnmt.checkpoints import (
    RESUMING,
    Checkpoint,
    CheckpointError,
    numbered_checkpoint_name,
    numbered_checkpoints,
    prune_numbered_checkpoints,
    resolve_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from revnmt.checkpoints.files import read_checkpoint_file
from revnmt.data import DataOptions, Vocabulary
from revnmt.model import ModelConfig, build_model


def _draw() -> tuple:
    return random.random(), np.random.rand(3).tolist(), np.random.randn(), torch.rand(3).tolist()


def test_save_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    state = {"step": 7, "model": {"w": torch.arange(6.0).reshape(2, 3)}, "name": "run"}
    save_checkpoint(path, state)
    loaded = read_checkpoint_file(path)
    assert loaded["step"] == 7 and loaded["name"] == "run"
    assert torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_failed_save_keeps_old_file_and_leaves_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"step": 1})

    def save_half_then_crash(obj, f) -> None:
        f.write(b"partial checkpoint bytes")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", save_half_then_crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"step": 2})
    monkeypatch.undo()
    assert read_checkpoint_file(path) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_missing_checkpoint_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nothing.pt"):
        Checkpoint.load(tmp_path / "nothing.pt")


def test_truncated_checkpoint_gives_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"w": torch.zeros(1000)})
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CheckpointError, match=r"cannot load checkpoint .*last\.pt: truncated"):
        Checkpoint.load(path)


def test_rng_state_restores_every_generator() -> None:
    np.random.randn()  # leave a cached Gaussian in numpy's state, which must survive too
    state = rng_state()
    first = _draw()
    set_rng_state(state)
    assert _draw() == first


def test_rng_state_survives_a_checkpoint(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "last.pt", {"rng": rng_state()})
    first = _draw()
    set_rng_state(read_checkpoint_file(tmp_path / "last.pt")["rng"])
    assert _draw() == first


def test_resolve_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"best\.pt and last\.pt"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="missing"):
        resolve_checkpoint(tmp_path / "missing")
    (tmp_path / "last.pt").write_bytes(b"")
    assert resolve_checkpoint(tmp_path) == tmp_path / "last.pt"
    (tmp_path / "best.pt").write_bytes(b"")
    assert resolve_checkpoint(tmp_path) == tmp_path / "best.pt"
    (tmp_path / "step100.pt").write_bytes(b"")
    assert resolve_checkpoint(tmp_path / "step100.pt") == tmp_path / "step100.pt"


def test_numbered_checkpoints_sort_by_step_and_the_oldest_are_pruned(tmp_path: Path) -> None:
    assert numbered_checkpoint_name(1200) == "step-00001200.pt"
    steps = [7, 1200, 70, 123_456_789, 700]
    for step in steps:
        (tmp_path / numbered_checkpoint_name(step)).write_bytes(b"")
    for other in ("best.pt", "last.pt", ".step-00000007.pt.x1.tmp", "step-7.pt.bak", "average.pt"):
        (tmp_path / other).write_bytes(b"")
    (tmp_path / "step-00000001.pt").mkdir()
    names = [numbered_checkpoint_name(step) for step in sorted(steps)]
    assert [path.name for path in numbered_checkpoints(tmp_path)] == names == sorted(names)
    prune_numbered_checkpoints(tmp_path, keep=2)
    assert [path.name for path in numbered_checkpoints(tmp_path)] == names[-2:]
    others = {"best.pt", "last.pt", ".step-00000007.pt.x1.tmp", "step-7.pt.bak", "average.pt", "step-00000001.pt"}
    assert {path.name for path in tmp_path.iterdir()} == others | set(names[-2:])
    prune_numbered_checkpoints(tmp_path, keep=5)
    assert [path.name for path in numbered_checkpoints(tmp_path)] == names[-2:]


def _translatable(**changes) -> dict:
    """What a checkpoint file to translate with holds, of a tiny model, in format 1 (no version);
    ``changes`` replace its entries."""
    torch.manual_seed(0)
    vocab = Vocabulary(["a", "man", "dog"])
    config = ModelConfig(rnn="revgru", emb_dim=8, hidden_size=8, slice_dim=2, src_vocab=len(vocab),
                         tgt_vocab=len(vocab))
    state = {"model_config": config.to_dict(), "model": build_model(config).state_dict(), "src_vocab": vocab.itos,
             "tgt_vocab": vocab.itos, "data": DataOptions("en", "de", lowercase=True, max_len=5).to_dict()}
    return {**state, **changes}


def _flip(path: Path, record: str, count: int) -> None:
    """Invert ``count`` bytes in the middle of the zip record ``record`` of ``path``, as a failing disk might."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(record)
    data = bytearray(path.read_bytes())
    # The record's bytes follow its local header: 30 bytes, then its name and an extra field (torch's padding to
    # align the data), whose lengths the header ends with.
    header = info.header_offset
    name_length, extra_length = (int.from_bytes(data[at:at + 2], "little") for at in (header + 26, header + 28))
    start = header + 30 + name_length + extra_length + (info.file_size - count) // 2
    data[start:start + count] = bytes(255 - byte for byte in data[start:start + count])
    path.write_bytes(bytes(data))


def test_damaged_tensor_bytes_are_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"w": torch.randn(4096)})  # 16 KiB in one record, data/0
    record = next(name for name in zipfile.ZipFile(path).namelist() if name.endswith("/data/0"))
    _flip(path, record, 4096)
    with pytest.raises(CheckpointError, match=rf"^cannot load checkpoint {path}: damaged: its record {record} does "
                       "not match its CRC-32$"):
        Checkpoint.load(path)


# Unpickled, this makes a folder: code a checkpoint runs when loaded without weights_only.
class _Payload:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __reduce__(self):
        return os.mkdir, (str(self.folder),)


def test_a_checkpoint_that_would_run_code_is_refused_whatever_the_environment_says(tmp_path: Path) -> None:
    path, ran = tmp_path / "last.pt", tmp_path / "ran"
    save_checkpoint(path, {**_translatable(), "trainer": _Payload(ran)})
    # In a new process's environment, as a user sets it: torch.load without weights_only=True would then
    # unpickle anything.
    loading = f"from revnmt.checkpoints import Checkpoint; Checkpoint.load({str(path)!r})"
    done = subprocess.run([sys.executable, "-c", loading], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    assert done.returncode == 1 and not ran.exists()
    assert done.stderr.splitlines()[-1] == (f"revnmt.checkpoints.files.CheckpointError: cannot load checkpoint {path}: "
                                            "it holds more than tensors and plain data, and loading it could run "
                                            "code: refused")


def _state_dict() -> dict:
    return _translatable()["model"]


def _missing(*keys: str) -> dict:
    return {key: value for key, value in _translatable().items() if key not in keys}


def _resized(name: str) -> dict:
    state = _translatable()
    state["model"] = {**state["model"], name: torch.zeros(3, 3)}
    return state


@pytest.mark.parametrize("state, message", [
    (_state_dict(), "not a revnmt checkpoint (it has no model_config, model, src_vocab, tgt_vocab, data)"),
    ([1, 2, 3], "not a revnmt checkpoint (it holds a list, not a dict)"),
    (_missing("src_vocab", "data"), "not a revnmt checkpoint (it has no src_vocab, data)"),
    (_translatable(model=[1, 2]), "its model is a list, not a dict"),
    (_translatable(model={"w": [1.0]}), "its model holds more than tensors"),
    (_translatable(tgt_vocab=["a", "b"]), "its tgt_vocab is not a vocabulary: strings that begin with <pad>"),
    (_translatable(src_vocab=[*_translatable()["src_vocab"], "a"]), "its src_vocab is not a vocabulary "
     "(duplicate vocabulary entries"),
    (_translatable(data={"src": "en"}), "its data options have no tgt, lowercase, max_len"),
    (_translatable(model_config={"rnn": "transformer"}), "its model_config is not valid (--rnn must be one of"),
    (_translatable(model_config={"layers": 2, "colour": "red"}), "its model_config is not valid ("
     "ModelConfig.__init__() got an unexpected keyword argument 'colour')"),
    (_translatable(src_vocab=[*_translatable()["src_vocab"], "cat"]), "its src_vocab has 8 entries, its "
     "model_config 7"),
    (_resized("generator.bias"), "its weight generator.bias is (3, 3) torch.float32, its model_config makes (7,) "
     "torch.float32"),
    (_missing("model") | {"model": {"bias": torch.zeros(1)}}, "its weights are not those of its model_config ("),
], ids=["state_dict", "list", "missing-keys", "model-list", "model-lists", "vocab-specials", "vocab-duplicate",
        "data-options", "unknown-rnn", "unknown-option", "vocab-size", "weight-shape", "weight-names"])
def test_a_file_that_is_no_revnmt_checkpoint_is_refused_naming_it(tmp_path: Path, state, message: str) -> None:
    path = tmp_path / "foreign.pt"
    torch.save(state, path)
    with pytest.raises(CheckpointError) as refused:
        Checkpoint.load(path)
    assert str(refused.value).startswith(f"cannot load checkpoint {path}: {message}")


def test_a_pickle_that_torch_did_not_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "list.pt"
    path.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(CheckpointError, match="truncated, or not a checkpoint \\(not a zip archive"):
        Checkpoint.load(path)


def test_resuming_needs_the_training_state_and_translating_does_not(tmp_path: Path) -> None:
    path = tmp_path / "average.pt"
    save_checkpoint(path, {**_translatable(), "args": {}})
    assert Checkpoint.load(path).args == {}
    with pytest.raises(CheckpointError, match="it has no optimizer, scheduler, trainer, rng\\)$"):
        Checkpoint.load(path, needs=RESUMING)


class _FailingWrites(io.BufferedWriter):
    """A file whose writes raise ``error`` once ``limit`` bytes were written."""

    limit, error = 0, BaseException()

    def write(self, data) -> int:
        if self.tell() + len(data) > self.limit:
            raise self.error
        return super().write(data)


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), KeyboardInterrupt()],
                         ids=["full-disk", "ctrl-c"])
def test_a_save_failing_halfway_raises_why_and_keeps_the_old_file(tmp_path: Path, monkeypatch, error) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(path, _translatable())
    old = path.read_bytes()
    monkeypatch.setattr(_FailingWrites, "limit", len(old) // 4)
    monkeypatch.setattr(_FailingWrites, "error", error)
    monkeypatch.setattr(os, "fdopen", lambda fd, mode: _FailingWrites(io.FileIO(fd, "w")))
    # as it was raised, not torch's RuntimeError ("unexpected pos") that says nothing of the disk
    with pytest.raises(type(error)) as raised:
        save_checkpoint(path, _translatable(data={"src": "en", "tgt": "de", "lowercase": False, "max_len": 9}))
    assert raised.value is error
    monkeypatch.undo()
    assert path.read_bytes() == old and os.listdir(tmp_path) == ["last.pt"]
