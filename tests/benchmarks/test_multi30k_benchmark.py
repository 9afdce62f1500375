"""benchmarks/multi30k.py --quick as a user runs it: train, score, measure and tabulate three models, one of
them a quality model on subwords, which is also averaged and decoded with a length penalty tuned on the dev set."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from revnmt.data import find_multi30k

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_mode_fills_the_table(tmp_path):
    try:
        data = find_multi30k(download=False)
    except FileNotFoundError:
        pytest.skip("Multi30K is not on this machine")
    runs, kept = tmp_path / "runs", tmp_path / "kept"
    command = [sys.executable, str(REPO / "benchmarks/multi30k.py"), "--quick", "--data-dir", str(data),
               "--models", "gru-hidden,revgru-emb+slice-3bit,revgru-emb+slice-bi-bpe8k", "--runs", str(runs),
               "--jobs", "2", "--threads", "1", "--speed", "2", "--results", str(kept)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]

    report = json.loads((runs / "results.json").read_text())
    assert report["quick"] and report["hardware"]["torch"]
    gru, revgru, pieces = report["results"]
    assert gru["finished"] and revgru["finished"] and pieces["finished"] and gru["epochs_trained"] == 2
    for row in (gru, revgru, pieces):
        assert 0 <= row["test_tokenized_bleu"] <= 100 and "case:lc" in row["sacrebleu_signature"]
        assert row["tokens_per_s"] > 0 and row["run_tokens_per_s"] > 0
    for row in (gru, revgru):
        assert 0 <= row["test_replace_unk_tokenized_bleu"] <= 100 and 0 <= row["test_replace_unk_sacrebleu"] <= 100
    assert (pieces["text"], gru["text"]) == ("BPE 8k", "words") and "test_replace_unk_sacrebleu" not in pieces
    assert pieces["memory"]["decoder"]["actual_ratio"] > 1
    assert "memory" not in gru  # ordinary models have no buffer to measure
    assert revgru["memory"]["decoder"]["actual_ratio"] > 1
    tokens = revgru["budget"]["batch_tokens"]
    # Each model is planned in a process of its own: under the quick setup's budget both can fit every pair the quick
    # corpus has, so only "not fewer" holds here (more, at real sizes: tests/revnmt/memory/test_budget.py)
    assert tokens["reversible"] >= tokens["ordinary"] > 0
    table = (runs / "results.md").read_text()
    assert f"{tokens['ordinary']:,}" in table and f"{tokens['reversible']:,}" in table  # GRU's row: same-size model
    assert sorted(p.name for p in (kept / "revgru-emb+slice-3bit").iterdir()) == [
        "config.json", "memory.json", "test-replace-unk.hyp", "test-replace-unk.json", "test.hyp", "test.json",
        "train.log", "valid.tsv"]
    assert json.loads((kept / "revgru-emb+slice-bi-bpe8k" / "config.json").read_text())["subword"] == "bpe"
    assert "| revgru (BPE 8k) | emb+slice |" in table

    # The quality model: averaged, its length penalty chosen among the quick grid's two, test2016 decoded with it;
    # the ensemble waits for the reversible quality models not run here.
    tuning = pieces["length_penalty_tuning"]
    assert len(tuning["grid"]) == 2 and tuning["chosen_by"] == "dev sacreBLEU"
    assert [d["checkpoint"] for d in pieces["decodings"]] == ["best", "averaged"]
    for decoding in pieces["decodings"]:
        assert 0 <= decoding["test_sacrebleu"] <= 100 and decoding["length_penalty"] == tuning["length_penalty"]
    assert "| revgru (BPE 8k): averaged, length penalty " in table
    assert "[ensemble-reversible] waits for revlstm-emb+slice-bi-bpe8k" in done.stdout and "ensemble" not in report
    assert {"length-penalty.json", "test-best-lp.json", "test-average.json"} <= {
        p.name for p in (kept / "revgru-emb+slice-bi-bpe8k").iterdir()}

    # A second run finds every step done and runs nothing.
    again = subprocess.run(command[:-4], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "revnmt.cli" not in again.stdout
