import random
from pathlib import Path

import numpy as np
import pytest
import torch

from revnmt.checkpoint import (
    load_checkpoint,
    numbered_checkpoint_name,
    numbered_checkpoints,
    prune_numbered_checkpoints,
    resolve_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def _draw() -> tuple:
    return random.random(), np.random.rand(3).tolist(), np.random.randn(), torch.rand(3).tolist()


def test_save_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    state = {"step": 7, "model": {"w": torch.arange(6.0).reshape(2, 3)}, "name": "run"}
    save_checkpoint(path, state)
    loaded = load_checkpoint(path)
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
    assert load_checkpoint(path) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_missing_checkpoint_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nothing.pt"):
        load_checkpoint(tmp_path / "nothing.pt")


def test_truncated_checkpoint_gives_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"w": torch.zeros(1000)})
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(RuntimeError, match=r"cannot load checkpoint .*last\.pt"):
        load_checkpoint(path)


def test_rng_state_restores_every_generator() -> None:
    np.random.randn()  # leave a cached Gaussian in numpy's state, which must survive too
    state = rng_state()
    first = _draw()
    set_rng_state(state)
    assert _draw() == first


def test_rng_state_survives_a_checkpoint(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "last.pt", {"rng": rng_state()})
    first = _draw()
    set_rng_state(load_checkpoint(tmp_path / "last.pt")["rng"])
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
