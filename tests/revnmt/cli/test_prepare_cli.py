"""revnmt-prepare from the command line: a folder prepared once, then read by the runs given the same data options."""

import json

import pytest

from revnmt.cli.memory import main as memory
from revnmt.cli.prepare import main as prepare
from revnmt.data.prepared import MANIFEST


def test_runs_read_the_folder_prepare_filled(toy, tmp_path, train, caplog):
    caplog.set_level("INFO")
    folder = tmp_path / "prepared"
    data = ["--train", toy["train"], "--valid", toy["valid"], "--min-freq", "1"]
    assert prepare(["--prepared", str(folder), *data]) == 0
    manifest = (folder / MANIFEST).read_text()
    assert "ids prepared in" in caplog.text
    caplog.clear()
    assert prepare(["--prepared", str(folder), *data]) == 0  # nothing to do: the folder serves these options
    assert "prepared with these options already" in caplog.text
    caplog.clear()

    run = tmp_path / "run"
    assert train(run, "--prepared", str(folder), "--max-steps", "1") == 0
    assert not (run / "data").exists() and (folder / MANIFEST).read_text() == manifest
    assert "reading the ids prepared in" in caplog.text
    caplog.clear()

    report = tmp_path / "memory.json"
    assert memory([*data, "--prepared", str(folder), "--emb-dim", "16", "--hidden-size", "16", "--slice-dim", "4",
                   "--device", "cpu", "--batches", "1", "--batch-size", "8", "--json", str(report)]) == 0
    assert "reading the ids prepared in" in caplog.text and json.loads(report.read_text())["batches"] == 1


def test_without_a_folder_prepare_is_a_usage_error(toy, capsys):
    with pytest.raises(SystemExit) as exit_info:
        prepare(["--train", toy["train"], "--valid", toy["valid"]])
    assert exit_info.value.code == 2 and "--prepared DIR is required" in capsys.readouterr().err
