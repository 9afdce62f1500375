"""benchmarks/onednn_caches.py on a tiny model: each cache size's held memory, step time and recompiled kernels."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from revnmt.rnn.products import uses_onednn

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(not uses_onednn(torch.device("cpu")), reason="this torch has no oneDNN")
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the RSS from Linux's /proc")
def test_each_cache_size_is_measured_in_processes_of_its_own(tmp_path):
    out = tmp_path / "caches.json"
    command = [sys.executable, str(REPO / "benchmarks/onednn_caches.py"), "--entries", "1024", "1", "--steps", "4",
               "--hidden-size", "16", "--tokens", "200", "--json", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    settings = json.loads(out.read_text())["settings"]
    assert set(settings) == {"1024", "1"}
    for measured in settings.values():
        assert len(measured["rss_trimmed"]) == len(measured["seconds"]) == 4
        assert all(0 < trimmed <= raw for trimmed, raw in zip(measured["rss_trimmed"], measured["rss"], strict=True))
    # a step on a shape met before compiles nothing with the libraries' default, and everything with one entry
    assert settings["1024"]["compiled_in_repeated_step"] == 0 < settings["1"]["compiled_in_repeated_step"]
    assert done.stdout.count(" ms ") == 2
