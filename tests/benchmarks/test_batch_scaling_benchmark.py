"""benchmarks/batch_scaling.py on a tiny model: one row per model (a reversible one per sweep kernels, decoder chunk
and CUDA graphs' setting), length and batch size, in the order run."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_small_run_writes_every_step(tmp_path):
    out = tmp_path / "scale.json"
    command = [sys.executable, str(REPO / "benchmarks/batch_scaling.py"), "--device", "cpu", "--rnn", "gru", "revlstm",
               "--emb-dim", "8", "--hidden-size", "8", "--slice-dim", "2", "--sentences", "2", "5", "--lengths", "4",
               "--decoder-chunk-steps", "2", "4", "--json", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]

    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["config"]["deadline"] is None
    assert [(r["rnn"], r["sweep_kernels"], r["decoder_chunk_steps"], r["cuda_graphs"], r["sentences"], r["length"])
            for r in report["steps"]] == [
        ("gru", None, None, None, 2, 4), ("gru", None, None, None, 5, 4),
        ("revlstm", "steps", 2, "off", 2, 4), ("revlstm", "steps", 2, "off", 5, 4),
        ("revlstm", "steps", 4, "off", 2, 4), ("revlstm", "steps", 4, "off", 5, 4)]
    for row in report["steps"]:
        assert row["step_s"] > 0 and row["peak_allocated_bytes"] is None
        assert abs(row["tokens_per_s"] - row["sentences"] * 4 / row["step_s"]) < 1e-6
