"""benchmarks/checkpointing.py on short sentences: every compared model measured at every length."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_each_length_compares_reversal_with_checkpointing_and_ordinary_models(tmp_path):
    out = tmp_path / "lengths.json"
    command = [sys.executable, str(REPO / "benchmarks/checkpointing.py"), "--lengths", "4", "9", "--batch", "2",
               "--hidden-size", "16", "--emb-dim", "16",
               "--json", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [row["length"] for row in rows] == [4, 9]
    for row in rows:
        saved = row["saved_bytes_per_token"]
        assert set(saved) == {"reversible", "ordinary", "ordinary_same_attention", "checkpointed"}
        assert saved["ordinary_same_attention"] > saved["checkpointed"] and saved["ordinary"] > saved["reversible"]
    assert "| 9 |" in done.stdout
