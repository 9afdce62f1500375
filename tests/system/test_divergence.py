"""Divergence is a fault, not a result (docs/reliability.md lists what each test proves).

revnmt-train at ``--lr 1e30`` stops with one line naming the step, exit status 1, and saves no NaN; a few
updates made non-finite (injected) are skipped and logged, and the run goes on, in one process and across
torchrun ranks, which all skip the same updates; the diverged model still translates, one line per input.
"""

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import write_toy_corpus

from revnmt.checkpoints import Checkpoint

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent  # the environment's console scripts
# 400 pairs in batches of 8: 50 batches an epoch.
TINY = ["--emb-dim", "16", "--hidden-size", "16", "--slice-dim", "4", "--buffer-lanes", "4", "--min-freq", "1",
        "--log-every", "1", "--device", "cpu", "--batch-size", "8"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, str]:
    return write_toy_corpus(tmp_path_factory.mktemp("corpus"), {"train": 400, "valid": 10})


def _train_options(corpus: dict[str, str], run: Path, *options: str) -> list[str]:
    return ["--train", corpus["train"], "--valid", corpus["valid"], "--save-dir", str(run), *TINY, *options]


def _finite(path: Path) -> bool:
    return all(torch.isfinite(weights).all() for weights in Checkpoint.load(path).weights.values())


@pytest.mark.parametrize("rnn", ["gru", "revgru"])
def test_a_diverging_run_stops_with_one_line_and_saves_no_nan(corpus, tmp_path, rnn):
    run = tmp_path / "run"
    done = subprocess.run([str(BIN / "revnmt-train"), *_train_options(corpus, run, "--rnn", rnn, "--lr", "1e30",
                                                                      "--max-steps", "40", "--save-every", "5")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    last = done.stderr.splitlines()[-1]
    stop = re.search(r"ERROR training diverged at step (\d+): 10 updates in a row had a non-finite loss or gradients "
                     r"\(--max-nonfinite 10\); the checkpoint of step (\d+) is kept", last)
    assert stop and "Traceback" not in done.stderr, done.stderr
    assert int(stop.group(2)) == Checkpoint.load(run / "last.pt").step < int(stop.group(1))
    assert _finite(run / "last.pt") and (not (run / "best.pt").exists() or _finite(run / "best.pt"))

    # The diverged (finite, useless) model translates: a line per input line, with the beam as with greedy search.
    source = Path(f"{corpus['valid']}.en")
    for beam in ("1", "5"):
        translated = subprocess.run([str(BIN / "revnmt-translate"), "--checkpoint", str(run / "last.pt"), "--beam",
                                     beam, "-i", str(source)], capture_output=True, text=True, timeout=120)
        assert translated.returncode == 0, translated.stderr
        assert translated.stdout.count("\n") == len(source.read_text().splitlines())


# Runs revnmt-train (argv[4:]) with ReversibleSeq2Seq.train_step making the loss NaN (argv[1] "loss") or a gradient
# infinite ("gradient") at its calls listed in argv[3], in the process of torchrun rank argv[2] (0 without
# torchrun): a stand-in for divergence, outside the production code.
INJECT = """
import math, os, sys
from dataclasses import replace
from revnmt.cli.train import main
from revnmt.model import ReversibleSeq2Seq
kind, rank, failing = sys.argv[1], sys.argv[2], {int(n) for n in sys.argv[3].split(",")}
original, calls = ReversibleSeq2Seq.train_step, []
def train_step(self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    calls.append(1)
    if len(calls) in failing and os.environ.get("RANK", "0") == rank:
        if kind == "loss":
            return replace(result, loss=result.loss * math.nan)
        next(self.parameters()).grad.view(-1)[0] = math.inf
    return result
ReversibleSeq2Seq.train_step = train_step
sys.exit(main(sys.argv[4:]))
"""


def _inject(tmp_path: Path) -> str:
    script = tmp_path / "inject.py"
    script.write_text(INJECT)
    return str(script)


def _adam_steps(path: Path) -> set[int]:
    return {int(state["step"]) for state in Checkpoint.load(path).training.optimizer["state"].values()}


def test_a_few_non_finite_updates_are_skipped_and_the_run_finishes(corpus, tmp_path):
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, _inject(tmp_path), "gradient", "0", "3,4,7",
                           *_train_options(corpus, run, "--max-steps", "10")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    for batch, step, in_a_row in ((2, 3, 1), (3, 4, 2), (6, 7, 1)):
        assert (f"WARNING batch {batch} of epoch 1 (step {step}): non-finite loss or gradients; the update was "
                f"skipped ({in_a_row} in a row)") in done.stderr
    assert "training stopped: reached --max-steps 10" in done.stderr and "Traceback" not in done.stderr
    assert _adam_steps(run / "last.pt") == {7} and _finite(run / "best.pt")


def test_torchrun_ranks_skip_the_updates_one_rank_found_non_finite(corpus, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    # rank 1's loss is NaN at its steps 2 and 3, its gradients finite: rank 0 sees nothing wrong in its own
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                           "127.0.0.1", "--master-port", str(port), _inject(tmp_path), "loss", "1", "2,3",
                           *_train_options(corpus, run, "--max-steps", "6")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        for step in (2, 3):
            assert re.search(rf"\[rank {rank}\] .* WARNING batch \d+ of epoch 1 \(step {step}\): non-finite loss or "
                             r"gradients; the update was skipped", done.stderr), done.stderr
    # Every rank skipped them (else the weights would differ, which ends the run with an error).
    assert "weights identical on all 2 ranks" in (run / "train.log").read_text()
    assert _adam_steps(run / "last.pt") == {4}
