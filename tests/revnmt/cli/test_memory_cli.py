"""revnmt-memory from the command line: the report of a tiny model on the toy corpus, and its mistakes."""

import json

import pytest

from revnmt.cli.memory import main

TINY = ["--emb-dim", "16", "--hidden-size", "16", "--slice-dim", "4", "--min-freq", "1", "--device", "cpu"]


def test_the_report_measures_the_model_and_what_a_user_would_pick_instead(toy, tmp_path, capsys):
    report = tmp_path / "memory.json"
    assert main(["--train", toy["train"], "--valid", toy["valid"], *TINY, "--batches", "3", "--batch-size", "8",
                 "--json", str(report)]) == 0
    saved = json.loads(report.read_text())
    assert saved["config"]["rnn"] == "revgru" and saved["batches"] == 3
    assert saved["decoder"]["actual_ratio"] > 1  # the buffer holds fewer bits than the states it replaces
    names = {"reversible", "ordinary", "ordinary_same_attention", "checkpointed"}
    assert set(saved["model"]["saved_bytes_per_token"]) == names
    assert set(saved["tokens_per_s"]) == names and min(saved["tokens_per_s"].values()) > 0
    out = capsys.readouterr().out
    assert "autograd saves" in out and "training tokens/s, side by side" in out


@pytest.mark.parametrize("options, message", [
    (["--rnn", "gru"], "--rnn must be revgru or revlstm"),
    (["--checkpoint", "no/such/run"], "no/such/run"),
])
def test_mistakes_are_one_line_and_status_2(toy, options, message, capsys):
    assert main(["--train", toy["train"], "--valid", toy["valid"], *TINY, "--batches", "1", *options]) == 2
    err = capsys.readouterr().err
    assert "error: " in err and message in err and "Traceback" not in err
