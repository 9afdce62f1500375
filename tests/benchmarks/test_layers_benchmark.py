"""benchmarks/layers.py on tiny layers: the JSON of benchmarks/README.md's step-time tables, and the breakdown."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from buffers.backends import triton_available
from revnmt.profiling.launches import count_kernels

REPO = Path(__file__).resolve().parents[2]


def test_small_run_writes_every_case(tmp_path):
    out = tmp_path / "layers.json"
    command = [sys.executable, str(REPO / "benchmarks/layers.py"), "--device", "cpu", "--batch", "3", "--hidden", "8",
               "--steps", "2", "5", "--repeats", "1", "--breakdown", "--json", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]

    report = json.loads(out.read_text())
    assert report["device"].startswith("cpu")
    assert [(c["cell"], c["T"]) for c in report["cases"]] == [("revgru", 2), ("revgru", 5), ("revlstm", 2),
                                                              ("revlstm", 5)]
    for case in report["cases"]:
        assert case["reversible_ms"] > 0 and case["ordinary_ms"] > 0
        assert abs(case["ratio"] - case["reversible_ms"] / case["ordinary_ms"]) < 1e-9
        parts = case["breakdown_ms"]
        assert parts["matrix_products"] > 0 and parts["buffer_loops"] > 0 and parts["other"] > 0
        assert abs(parts["matrix_products"] + parts["buffer_loops"] + parts["other"] - parts["profiled_step"]) < 1e-6


def test_batch_scaling_reports_tokens_per_second_at_every_size(tmp_path):
    out = tmp_path / "scaling.json"
    command = [sys.executable, str(REPO / "benchmarks/layers.py"), "--device", "cpu", "--batch-sizes", "1", "3",
               "--hidden", "8", "--steps", "4", "--repeats", "1", "--json", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    cases = json.loads(out.read_text())["cases"]
    assert [(c["cell"], c["batch"]) for c in cases] == [("revgru", 1), ("revgru", 3), ("revlstm", 1), ("revlstm", 3)]
    for case in cases:
        assert case["reversible_tokens_per_s"] == 1000 * case["batch"] * 4 / case["reversible_ms"]
    assert cases[0]["reversible_scaling"] == 1.0 and cases[1]["reversible_scaling"] > 0


@pytest.mark.slow
@pytest.mark.skipif(not triton_available(), reason="triton is not installed (pip install -e .[dev])")
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_fused_steps_launch_at_most_8_kernels_forward_and_16_in_reverse(cell):
    # The launches a time step adds (T = 12 against T = 6, so that what a sweep launches once cancels out), counted
    # as --count-kernels counts them, the Triton kernels in the interpreter: the fused steps' budget per layer step.
    runs = [count_kernels(cell, "triton", torch.device("cpu"), batch=2, hidden=4, steps=steps) for steps in (6, 12)]

    def per_step(key: str) -> float:
        return (runs[1][key] * 12 - runs[0][key] * 6) / 6

    assert per_step("forward_per_step") <= 8
    assert per_step("reverse_per_step") <= 16
    assert per_step("reverse_encoder_per_step") <= 16
