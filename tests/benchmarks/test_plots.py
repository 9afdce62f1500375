"""benchmarks/plots.py on the committed Multi30K and budget results: every PNG is written."""

import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_scripts import load_script

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

pytest.importorskip("matplotlib")


def test_plots_of_the_committed_results(tmp_path):
    command = [sys.executable, str(REPO / "benchmarks/plots.py"), "--results",
               str(REPO / "benchmarks/results/multi30k"), "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]

    for name in ("bleu-per-epoch.png", "memory-per-token.png", "memory-budget.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000, name


def test_missing_results_are_reported(tmp_path, capsys):
    plots = load_script("plots")
    assert plots.main(["--results", str(tmp_path), "--out", str(tmp_path / "img")]) == 2
    assert "results.json" in capsys.readouterr().err
    assert not (tmp_path / "img").exists()
