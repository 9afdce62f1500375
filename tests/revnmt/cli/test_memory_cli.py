"""revnmt-memory from the command line: the report of a tiny model on the toy corpus, and its mistakes."""

import json
import os

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


def test_a_run_on_its_own_corpus_is_measured_on_its_prepared_ids_from_any_folder(train, toy, tmp_path, monkeypatch,
                                                                                 caplog):
    # A user's corpus, given by relative prefixes, a text option off its default, and the command run elsewhere:
    # the run's checkpoint names its corpora (by the fingerprint's absolute paths) and its text options, so the ids
    # it prepared serve as they are.
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    relative = os.path.relpath(toy["train"], tmp_path)
    assert train(run, "--max-len", "30", "--max-steps", "2", "--rnn", "revgru", train_prefix=relative) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    report = tmp_path / "memory.json"
    with caplog.at_level("INFO", logger="revnmt"):
        assert main(["--checkpoint", str(run), "--batches", "2", "--batch-size", "8", "--json", str(report)]) == 0
    assert f"reading the ids prepared in {run / 'data'}" in caplog.text
    assert json.loads(report.read_text())["batches"] == 2
