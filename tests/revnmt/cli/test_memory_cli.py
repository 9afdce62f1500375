"""revnmt-memory from the command line: the report of a tiny model on the toy corpus, and its mistakes."""

import json

import pytest

from revnmt.cli.memory import main

TINY = ["--emb-dim", "16", "--hidden-size", "16", "--slice-dim", "4", "--min-freq", "1", "--device", "cpu"]


def test_the_report_measures_the_model_and_its_ordinary_counterpart(toy, tmp_path, capsys):
    report = tmp_path / "memory.json"
    assert main(["--train", toy["train"], "--valid", toy["valid"], *TINY, "--batches", "2", "--batch-size", "8",
                 "--json", str(report)]) == 0
    saved = json.loads(report.read_text())
    assert saved["config"]["rnn"] == "revgru" and saved["batches"] == 2
    assert saved["decoder"]["actual_ratio"] > 1  # the buffer holds fewer bits than the states it replaces
    assert "bytes autograd saves per target token" in capsys.readouterr().out


@pytest.mark.parametrize("options, message", [
    (["--rnn", "gru"], "--rnn must be revgru or revlstm"),
    (["--checkpoint", "no/such/run"], "no/such/run"),
])
def test_mistakes_are_one_line_and_status_2(toy, options, message, capsys):
    assert main(["--train", toy["train"], "--valid", toy["valid"], *TINY, "--batches", "1", *options]) == 2
    err = capsys.readouterr().err
    assert "error: " in err and message in err and "Traceback" not in err
