"""revnmt-memory from the command line: the report of a tiny model on the toy corpus, and its mistakes."""

import json
import os
import sys

import pytest

from revnmt.cli.memory import main, parse_args
from revnmt.memory.peak import PeakMeter
from revnmt.memory.report import LABELS

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


@pytest.mark.parametrize("options, message", [
    (["--effective-batch-tokens", "4096"], "--effective-batch-tokens needs --memory-budget"),
    (["--effective-batch-tokens", "0", "--memory-budget", "2GiB"], "--effective-batch-tokens must be positive"),
    (["--timed-updates", "0"], "--timed-updates must be positive"),
])
def test_effective_batch_options_are_checked_before_anything_runs(options, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_args(["--data", "multi30k", *options])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_plot_without_matplotlib_stops_before_measuring_with_how_to_install_it(toy, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    picture = tmp_path / "memory.png"
    assert main(["--train", toy["train"], "--valid", toy["valid"], *TINY, "--plot", str(picture)]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == "revnmt-memory: error: --plot needs matplotlib: pip install 'revnmt[plot]'"
    assert captured.out == "" and not picture.exists()


@pytest.mark.slow
def test_accumulation_under_a_budget_is_timed_for_each_model_and_the_report_is_drawn(toy, tmp_path, capfd):
    image = pytest.importorskip("matplotlib.image")
    # The budget bounds this (pytest) process's peak RSS: give it room above what it holds already.
    budget = (PeakMeter("cpu").current() + 768 * 2 ** 20) // 2 ** 20
    report, picture = tmp_path / "memory.json", tmp_path / "memory.png"
    target = 3000  # more than the toy corpus's batches hold: every model accumulates
    assert main(["--train", toy["train"], "--valid", toy["valid"], *TINY, "--batches", "3", "--batch-size", "8",
                 "--memory-budget", f"{budget}MiB", "--effective-batch-tokens", str(target), "--timed-updates", "1",
                 "--json", str(report), "--plot", str(picture)]) == 0
    saved = json.loads(report.read_text())
    effective = saved["effective_batch"]
    assert effective["tokens"] == target and effective["timed_updates"] == 1 and effective["device"] == "cpu"
    assert set(effective["models"]) == {"reversible", "ordinary", "checkpointed"}
    for name, row in effective["models"].items():
        assert row["fitted_batch_tokens"] == saved["budget"]["batch_tokens"][name]
        assert row["update_freq"] * row["batch_tokens"] >= target
        assert row["fitted_batch_tokens"] >= row["batch_tokens"]
        assert 0 < row["padded_tokens_per_update"] <= row["update_freq"] * row["batch_tokens"]
        assert 0 < row["target_tokens_per_update"] <= row["padded_tokens_per_update"]
        assert len(row["seconds"]) == 1 and row["seconds_per_update"] == row["seconds"][0] > 0
        assert row["tokens_per_s"] == pytest.approx(target / row["seconds_per_update"])
    out, err = capfd.readouterr()  # capfd: the planning processes' lines too
    assert "updates of N = 3,000 padded tokens by gradient accumulation" in out
    for label in LABELS.values():  # each plan, in a process of its own, shows its probes as they are measured
        assert f"{label}: memory budget: a step on 2 pairs" in err
    data = picture.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
    assert image.imread(picture).shape[:2] == (460, 1200)  # two panels, 12 x 4.6 inches at 100 dpi
