"""revnmt-average on a toy run trained with --keep-checkpoints, and what translates with its output: the
averaged checkpoint, and the run's checkpoints as an ensemble. Mistakes are one line and status 2."""

import errno
import io
import json
import logging
import os
import re
import signal
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import tomllib
import torch
from conftest import TINY_MODEL, write_toy_corpus

from revnmt.checkpoints import Checkpoint, numbered_checkpoints
from revnmt.cli import average, translate

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A toy run of two epochs that keeps the checkpoints of its two validations (steps 7 and 14)."""
    from revnmt.cli.train import main  # imported late: TRITON_INTERPRET is set by conftest first

    folder = tmp_path_factory.mktemp("average")
    corpus = write_toy_corpus(folder, {"train": 200, "valid": 20, "test": 10})
    assert main(["--train", corpus["train"], "--valid", corpus["valid"], "--save-dir", str(folder / "run"),
                 *TINY_MODEL, "--batch-size", "32", "--epochs", "2", "--keep-checkpoints", "2"]) == 0
    return folder / "run"


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("revnmt-average: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_the_average_of_a_runs_last_checkpoints_translates(run, tmp_path, capsys, caplog):
    kept = numbered_checkpoints(run)
    assert [path.name for path in kept] == ["step-00000007.pt", "step-00000014.pt"]
    output = tmp_path / "average.pt"
    assert average.main([str(run), "--last", "2", "-o", str(output)]) == 0
    assert f"averaged 2 checkpoints (steps 7, 14) into {output}" in capsys.readouterr().err
    averaged, first, last = (Checkpoint.load(path) for path in (output, *kept))
    for key, value in averaged.weights.items():
        assert torch.allclose(value, (first.weights[key] + last.weights[key]) / 2, rtol=0, atol=1e-7)
    assert averaged.src_vocab == last.src_vocab and averaged.args == last.args

    (tmp_path / "in.en").write_text("A man runs in the park .\nThe small dog sleeps .\n")
    with caplog.at_level(logging.INFO):
        assert translate.main(["--checkpoint", str(output), "-i", str(tmp_path / "in.en"), "-o",
                               str(tmp_path / "out"), "--device", "cpu"]) == 0
    assert len((tmp_path / "out").read_text().splitlines()) == 2
    assert f"loaded {output} (average of 2 checkpoints, steps 7, 14)" in caplog.text

    # without --last: every numbered checkpoint the run keeps; given as files: the same average
    for inputs in ([str(run)], [str(path) for path in kept]):
        again = tmp_path / "again.pt"
        assert average.main([*inputs, "-o", str(again)]) == 0
        assert all(torch.equal(value, Checkpoint.load(again).weights[key]) for key, value in averaged.weights.items())


def test_a_runs_checkpoints_translate_as_an_ensemble(run, tmp_path, caplog):
    (tmp_path / "in.en").write_text("A man runs in the park .\n\nThe small dog sleeps .\n")
    (tmp_path / "ref.de").write_text("Ein mann läuft im park .\n\nDer kleiner hund schläft .\n")
    checkpoints = [str(path) for path in numbered_checkpoints(run)]
    for beam in ("1", "3"):
        with caplog.at_level(logging.INFO):
            assert translate.main(["--checkpoint", *checkpoints, "-i", str(tmp_path / "in.en"), "-o",
                                   str(tmp_path / "out"), "--beam", beam, "--replace-unk", "--length-penalty", "0.6",
                                   "--length-penalty-type", "gnmt", "--reference", str(tmp_path / "ref.de"), "--json",
                                   str(tmp_path / "scores.json"), "--device", "cpu"]) == 0
        assert len((tmp_path / "out").read_text().split("\n")) == 4
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert (scores["beam"], scores["length_penalty"], scores["length_penalty_type"]) == (3, 0.6, "gnmt")
    assert all(f"loaded {path} (step {step})" in caplog.text for path, step in zip(checkpoints, (7, 14)))


def test_averaging_mistakes_are_one_line_and_leave_the_inputs_alone(run, tmp_path, capsys):
    kept = numbered_checkpoints(run)
    before = [path.read_bytes() for path in kept]
    assert average.main([str(run), "--last", "3", "-o", str(tmp_path / "a.pt")]) == 2
    assert "--last 3: " in _one_line_error(capsys) and not (tmp_path / "a.pt").exists()
    assert average.main([str(kept[0]), str(kept[1]), "-o", str(kept[1])]) == 2
    assert "is one of the checkpoints to average" in _one_line_error(capsys)
    assert average.main([str(tmp_path), "-o", str(tmp_path / "a.pt")]) == 2
    assert "holds no numbered checkpoints" in _one_line_error(capsys)

    other = Checkpoint.load(kept[0])
    replace(other, src_vocab=other.src_vocab[:-1]).save(tmp_path / "other.pt")
    assert average.main([str(kept[0]), str(tmp_path / "other.pt"), "-o", str(tmp_path / "a.pt")]) == 2
    assert f"cannot average {kept[0]} and {tmp_path / 'other.pt'}: their source vocabularies" in _one_line_error(capsys)
    assert [path.read_bytes() for path in kept] == before

    for argv in ([str(kept[0]), "--last", "2", "-o", "x.pt"], [str(run), str(kept[0]), "-o", "x.pt"]):
        with pytest.raises(SystemExit) as stop:
            average.main(argv)
        assert stop.value.code == 2


def test_revnmt_average_is_a_console_script():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["revnmt-average"] == "revnmt.cli.average:main"


def _damaged(path: Path) -> bytes:
    """``path``'s bytes with 4 KiB inverted in the middle of its largest tensor record."""
    with zipfile.ZipFile(path) as archive:
        record = max(archive.infolist(), key=lambda info: info.file_size)
    data = bytearray(path.read_bytes())
    start = record.header_offset + 30 + len(record.filename.encode()) + len(record.extra) + record.file_size // 2
    data[start:start + 4096] = bytes(255 - byte for byte in data[start:start + 4096])
    return bytes(data)


@pytest.mark.parametrize("make, message", [
    (lambda state, path: path.write_bytes(_damaged(path)), "damaged: its record .* does not match its CRC-32"),
    (lambda state, path: torch.save(state["model"], path), r"not a revnmt checkpoint \(it has no model_config"),
    (lambda state, path: torch.save(list(state), path), r"not a revnmt checkpoint \(it holds a list, not a dict\)"),
    (lambda state, path: torch.save({**state, "tgt_vocab": None}, path), "its tgt_vocab is a NoneType, not a list"),
    (lambda state, path: torch.save({**state, "model": {**state["model"], "generator.bias": torch.zeros(3)}}, path),
     r"its weight generator.bias is \(3,\) torch.float32, its model_config makes \(\d+,\) torch.float32"),
], ids=["damaged", "state_dict", "list", "vocab", "weight-shape"])
def test_a_damaged_or_foreign_checkpoint_is_one_line_naming_it(run, tmp_path, capsys, make, message):
    kept = numbered_checkpoints(run)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(kept[0].read_bytes())
    make(Checkpoint.load(kept[0]).to_dict(), bad)
    assert average.main([str(bad), "-o", str(tmp_path / "a.pt")]) == 2
    assert re.search(f"error: cannot load checkpoint {bad}: {message}", _one_line_error(capsys))
    assert sorted(os.listdir(tmp_path)) == ["bad.pt"]


class _FullDisk(io.BufferedWriter):
    """A file on a disk with room for 4 KiB."""

    def write(self, data) -> int:
        if self.tell() + len(data) > 4096:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


def test_a_full_disk_while_writing_the_average_keeps_the_old_file(run, tmp_path, monkeypatch, capsys):
    output = tmp_path / "average.pt"
    output.write_bytes(b"an older average")
    monkeypatch.setattr(os, "fdopen", lambda fd, mode: _FullDisk(io.FileIO(fd, "w")))
    assert average.main([str(run), "-o", str(output)]) == 2
    assert f"error: cannot write {output}: No space left on device" in _one_line_error(capsys)
    assert output.read_bytes() == b"an older average" and os.listdir(tmp_path) == ["average.pt"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_averaging_with_one_line_and_its_status(run, tmp_path, monkeypatch, capsys, signum):
    def interrupted(paths):
        os.kill(os.getpid(), signum)
        time.sleep(10)
        pytest.fail(f"{signal.Signals(signum).name} did not interrupt")

    before = {number: signal.signal(number, signal.default_int_handler) for number in (signal.SIGINT, signal.SIGTERM)}
    try:  # SIGTERM fails the test (a KeyboardInterrupt), rather than killing it, unless revnmt-average handles it
        monkeypatch.setattr(average, "average_checkpoints", interrupted)
        assert average.main([str(run), "-o", str(tmp_path / "a.pt")]) == 128 + signum
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
    assert capsys.readouterr().err == f"revnmt-average: interrupted by {signal.Signals(signum).name}\n"
    assert os.listdir(tmp_path) == []
