"""benchmarks/train_speed.py on a tiny model and the toy corpus: revnmt-train's logged tokens/s, per thread count."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_MODEL

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_each_thread_count_compares_the_pair_from_revnmt_trains_own_log(toy, tmp_path):
    out = tmp_path / "speed.json"
    model = [option for option in TINY_MODEL if option not in ("--log-every", "2", "--device", "cpu")]
    command = [sys.executable, str(REPO / "benchmarks/train_speed.py"), "--threads", "1", "2", "--steps", "4",
               "--skip", "2", "--log-every", "1", "--runs", str(tmp_path / "runs"), "--json", str(out), "--",
               "--train", toy["train"], "--valid", toy["valid"], "--batch-size", "16", *model]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    cases = json.loads(out.read_text())["cases"]
    assert [(c["threads"], c["reversible"], c["ordinary"]) for c in cases] == [(1, "revgru", "gru"),
                                                                               (2, "revgru", "gru")]
    for case in cases:
        assert len(case["reversible_tokens_per_s"]) == len(case["ordinary_tokens_per_s"]) == 2  # steps 3 and 4
        mean = sum(case["reversible_tokens_per_s"]) / 2 / (sum(case["ordinary_tokens_per_s"]) / 2)
        assert abs(case["ratio"] - mean) < 1e-9
    assert "2 thread(s): revgru" in done.stdout
