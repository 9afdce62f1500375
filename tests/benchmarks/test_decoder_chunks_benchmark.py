"""benchmarks/decoder_chunks.py on tiny batches: speed and memory per token for every chunk size asked."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_each_chunk_size_is_timed_and_measured(tmp_path):
    out = tmp_path / "chunks.json"
    command = [sys.executable, str(REPO / "benchmarks/decoder_chunks.py"), "--chunks", "1", "4", "--lengths", "9",
               "--batch", "4", "--batches", "1", "--json", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [row["chunk_steps"] for row in rows] == [1, 4]
    assert all(row["tokens_per_s"] > 0 for row in rows)
    # a chunk of 4 holds 4 steps' states, outputs and attention where one step at a time holds one
    one, four = (row["saved_bytes_per_token"] + row["held_bytes_per_token"] for row in rows)
    assert four > one
    assert "| 4 |" in done.stdout
