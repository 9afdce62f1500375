"""Tests of revnmt.training.curves and revnmt-train --tensorboard: the curves are read back from the event files
as TensorBoard reads them, across an interrupt (Ctrl-C) and an abort after which the last points are newer than the
checkpoint the run resumes from."""

import math
import os
import signal
import sys
import types

import pytest
from conftest import curve_steps, read_curves

from revnmt.checkpoints import Checkpoint
from revnmt.training import trainer as trainer_module
from revnmt.training.curves import MIB, TENSORBOARD_DIR, Curves, TensorBoardMissing, require_tensorboard
from revnmt.training.progress import Window

TRAIN_TAGS = {f"train/{tag}" for tag in ("loss", "ppl", "lr", "tokens_per_s", "peak_memory_MiB",
                                         "reversal_fallbacks")}
DEV_TAGS = {"dev/loss", "dev/ppl", "dev/bleu"}


def test_the_points_read_back_at_their_steps(tmp_path):
    with Curves(tmp_path / "tb", step=0, peak_bytes=lambda: 300 * MIB) as curves:
        curves.train(Window(step=2, loss=1.5, lr=1e-3, tokens_per_s=1200.0), reversal_fallbacks=1)
        curves.dev(2, loss=1.25, ppl=math.exp(1.25), bleu=12.5)
    read = read_curves(tmp_path / "tb")
    assert set(read) == TRAIN_TAGS | DEV_TAGS
    expected = {"train/loss": 1.5, "train/ppl": math.exp(1.5), "train/lr": 1e-3, "train/tokens_per_s": 1200.0,
                "train/peak_memory_MiB": 300.0, "train/reversal_fallbacks": 1.0, "dev/loss": 1.25,
                "dev/ppl": math.exp(1.25), "dev/bleu": 12.5}
    for tag, value in expected.items():
        assert read[tag] == [(2, pytest.approx(value, rel=1e-6))], tag  # stored as float32


def test_a_resumed_writer_drops_the_points_after_its_checkpoint(tmp_path):
    # The first writer went on to step 8 after a checkpoint at step 4; the resumed run trains steps 5-8 again.
    with Curves(tmp_path / "tb", step=0, peak_bytes=lambda: 0) as curves:
        for step in (2, 4, 6, 8):
            curves.train(Window(step, loss=10.0 + step, lr=1.0, tokens_per_s=1.0), 0)
        curves.dev(7, 1.0, 1.0, 1.0)
    with Curves(tmp_path / "tb", step=4, peak_bytes=lambda: 0) as curves:
        for step in (6, 8):
            curves.train(Window(step, loss=float(step), lr=1.0, tokens_per_s=1.0), 0)
    read = read_curves(tmp_path / "tb")
    assert read["train/loss"] == [(2, 12.0), (4, 14.0), (6, 6.0), (8, 8.0)]  # the checkpoint's own point kept
    assert not read.get("dev/loss")  # purged: the tag may stay, without points


def test_a_symlink_or_file_in_the_curves_place_is_refused_and_nothing_written_through_it(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(elsewhere)
    with pytest.raises(OSError, match="symbolic link, which revnmt does not write through"):
        Curves(tmp_path / "link", step=0, peak_bytes=lambda: 0)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(OSError, match="symbolic link"):
        Curves(tmp_path / "dangling", step=0, peak_bytes=lambda: 0)
    (tmp_path / "file").write_text("mine\n")
    with pytest.raises(OSError, match="not a folder"):
        Curves(tmp_path / "file", step=0, peak_bytes=lambda: 0)
    assert list(elsewhere.iterdir()) == [] and not (tmp_path / "nowhere").exists()
    assert (tmp_path / "file").read_text() == "mine\n"


@pytest.fixture
def without_tensorboard(monkeypatch):
    """An environment without the tensorboard package: importing it (or torch's writer of it) fails."""
    for name in ("tensorboard", "torch.utils.tensorboard"):
        monkeypatch.setitem(sys.modules, name, None)


def test_a_missing_package_says_what_to_install(without_tensorboard):
    with pytest.raises(TensorBoardMissing, match=r"^--tensorboard needs the tensorboard package: "
                                                 r"pip install 'revnmt\[tensorboard\]'$"):
        require_tensorboard()


def test_a_package_that_cannot_be_imported_is_quoted(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.ModuleType("torch.utils.tensorboard"))
    with pytest.raises(TensorBoardMissing, match=r"'revnmt\[tensorboard\]' \(cannot import name 'SummaryWriter'"):
        require_tensorboard()


def test_a_run_without_the_package_stops_before_any_work_with_one_line(train, tmp_path, capsys, without_tensorboard):
    run = tmp_path / "run"
    assert train(run, "--tensorboard", "--max-steps", "2") == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].endswith(
        "--tensorboard needs the tensorboard package: pip install 'revnmt[tensorboard]'") and "Traceback" not in err
    assert not (run / "data").exists() and not (run / "config.json").exists()  # nothing prepared
    assert train(run, "--max-steps", "2") == 0  # the base install trains


def test_a_symlink_in_a_runs_curves_place_stops_the_run_with_one_line(train, tmp_path, capsys):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    assert train(run, "--max-steps", "1") == 0
    elsewhere.mkdir()
    (run / TENSORBOARD_DIR).symlink_to(elsewhere)
    capsys.readouterr()
    assert train(run, "--tensorboard", "--max-steps", "2") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        f"cannot write {run / TENSORBOARD_DIR}: it is a symbolic link, which revnmt does not write through: remove it")
    assert list(elsewhere.iterdir()) == [] and Checkpoint.load(run / "last.pt").step == 1


def _ctrl_c_at_update(monkeypatch, update: int, times: int = 1) -> None:
    """Ctrl-C (SIGINT to this process) ``times`` times during update number ``update`` of the next run: once
    stops it with a checkpoint, twice aborts it without one."""
    original, calls = trainer_module.clip_and_step, []

    def clip_and_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == update:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "clip_and_step", clip_and_step)


def test_interrupted_and_resumed_runs_continue_the_same_curves(train, tmp_path, monkeypatch):
    # 7 batches an epoch and a window every 2 steps: points at 2, 4, 6, the epoch's end (7), 8 and 10; dev points
    # at the end of epoch 1 and at --max-steps.
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    options = ["--tensorboard", "--max-steps", "10"]
    assert train(whole, *options) == 0

    with monkeypatch.context() as patch:
        _ctrl_c_at_update(patch, 5)
        assert train(cut, *options) == 128 + signal.SIGINT
    assert Checkpoint.load(cut / "last.pt").step == 5
    read = read_curves(cut / TENSORBOARD_DIR)  # closed on the interrupt: the window it cut short is there
    assert all(curve_steps(read[tag]) == [2, 4, 5] for tag in TRAIN_TAGS)
    with monkeypatch.context() as patch:  # resumed, and aborted in step 7 without a checkpoint
        _ctrl_c_at_update(patch, 2, times=2)
        assert train(cut, *options) == 128 + signal.SIGINT
    assert Checkpoint.load(cut / "last.pt").step == 5
    read = read_curves(cut / TENSORBOARD_DIR)  # a point past the checkpoint, whose step the next resume trains again
    assert all(curve_steps(read[tag]) == [2, 4, 5, 6] for tag in TRAIN_TAGS)
    assert train(cut, *options) == 0

    uninterrupted, resumed = read_curves(whole / TENSORBOARD_DIR), read_curves(cut / TENSORBOARD_DIR)
    assert set(uninterrupted) == set(resumed) == TRAIN_TAGS | DEV_TAGS
    for tag in TRAIN_TAGS:
        assert curve_steps(uninterrupted[tag]) == [2, 4, 6, 7, 8, 10]
        assert curve_steps(resumed[tag]) == [2, 4, 5, 6, 7, 8, 10], tag  # the interrupt's point, and none twice
    for tag in DEV_TAGS:
        assert curve_steps(uninterrupted[tag]) == curve_steps(resumed[tag]) == [7, 10], tag
    # The resumed run trains exactly as the uninterrupted one: the same points where their windows agree.
    for tag in ("train/loss", "train/ppl", "train/lr"):
        assert resumed[tag][-3:] == uninterrupted[tag][-3:], tag  # steps 7, 8 and 10
    for tag in DEV_TAGS:
        assert resumed[tag] == uninterrupted[tag], tag
    assert all(value > 0 for _, value in resumed["train/tokens_per_s"] + resumed["train/peak_memory_MiB"])
    assert all(value == 0 for _, value in resumed["train/reversal_fallbacks"])
