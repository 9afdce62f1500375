"""Parallel training on the CPU: Hogwild! worker processes, and torch.distributed ranks started by torchrun."""

import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import TINY_MODEL, curve_steps, read_curves

from revnmt.checkpoints import Checkpoint
from revnmt.cli.train import main
from revnmt.data import load_data
from revnmt.model import ReversibleSeq2Seq, build_model
from revnmt.training import HogwildTrainer, RunConfig, Trainer, WorkerError
from revnmt.training.distributed import state_digest
from revnmt.training.hogwild import EpochEnd
from revnmt.training.trainer import Diverged
from revnmt.translation.translator import Translator

REPO = Path(__file__).resolve().parents[3]
FAST = ["--lr", "0.02"]  # large enough steps for the dev loss to fall clearly within two epochs


def _untrained_dev_loss(checkpoint: Checkpoint, tmp_path: Path) -> tuple[float, dict]:
    """Dev loss and weights of the model the run started from (same options, same seed)."""
    config = RunConfig.from_checkpoint(checkpoint)
    config = replace(config, training=replace(config.training, save_dir=str(tmp_path)))
    data = load_data(config.data, vocab_tokens=(checkpoint.src_vocab, checkpoint.tgt_vocab))
    torch.manual_seed(config.training.seed)
    model = build_model(config.model)
    return Trainer(config, data, model).evaluate().loss, model.state_dict()


def _translates(run: Path) -> None:
    hyps = Translator.from_checkpoint(run).translate(["A man runs .", "The dog sleeps in the park ."], beam=2)
    assert len(hyps) == 2 and all(isinstance(h, str) for h in hyps)


def test_hogwild_workers_share_the_updates_and_the_loss_falls(train, tmp_path):
    run = tmp_path / "hogwild"
    assert train(run, "--hogwild", "2", "--epochs", "2", *FAST) == 0

    checkpoint = Checkpoint.load(run / "last.pt")
    assert checkpoint.step == 14 and checkpoint.training.trainer.epoch == 3  # 7 batches per epoch
    log = (run / "train.log").read_text()
    # worker w trains batches w, w + 2, ...: 4 and 3 of the 7, and each reported update was applied
    assert log.count("updates by Hogwild worker 0: 4, 1: 3") == 2

    untrained_loss, untrained = _untrained_dev_loss(checkpoint, tmp_path)
    dev_losses = [float(row.split("\t")[2]) for row in (run / "valid.tsv").read_text().splitlines()[1:]]
    assert dev_losses[-1] < untrained_loss - 0.3, (untrained_loss, dev_losses)
    changed = [name for name, weights in checkpoint.weights.items() if not torch.equal(weights, untrained[name])]
    assert changed == list(untrained)  # every shared tensor got updates
    _translates(run)


def test_hogwild_workers_accumulate_their_own_batches(train, tmp_path):
    run = tmp_path / "hogwild"
    assert train(run, "--hogwild", "2", "--epochs", "1", "--update-freq", "2", *FAST) == 0
    # worker 0 trains batches 0, 2, 4, 6 of the 7 in two updates, worker 1 batches 1, 3 and then 5 alone
    assert Checkpoint.load(run / "last.pt").step == 4
    assert "updates by Hogwild worker 0: 2, 1: 2" in (run / "train.log").read_text()
    _translates(run)


def test_hogwild_workers_pause_for_validations_every_n_updates(train, tmp_path):
    run = tmp_path / "hogwild"
    assert train(run, "--hogwild", "2", "--epochs", "1", "--valid-every", "3", *FAST) == 0
    rows = (run / "valid.tsv").read_text().splitlines()[1:]
    assert [int(row.split("\t")[1]) for row in rows] == [3, 6, 7]  # every 3 updates, and at the epoch's end


class RaisingInWorker1(ReversibleSeq2Seq):
    """Trains as its family does, except in Hogwild worker 1 (whose private model is of the shared model's
    class), where every step raises."""

    def train_step(self, *args, **kwargs):
        if mp.current_process().name == "hogwild-1":
            raise RuntimeError("injected failure")
        return super().train_step(*args, **kwargs)


class KilledInWorker1(ReversibleSeq2Seq):
    """Trains as its family does, except that Hogwild worker 1 is killed (SIGKILL) at its first step."""

    def train_step(self, *args, **kwargs):
        if mp.current_process().name == "hogwild-1":
            os.kill(os.getpid(), signal.SIGKILL)
        return super().train_step(*args, **kwargs)


def test_failing_or_killed_hogwild_worker_stops_the_run_and_keeps_last_checkpoint(train, tmp_path):
    run = tmp_path / "crash"
    assert train(run, "--max-steps", "1") == 0  # a good last.pt, from one process (Hogwild resumes it)
    saved = (run / "last.pt").read_bytes()
    checkpoint = Checkpoint.load(run / "last.pt")
    config = RunConfig.from_checkpoint(checkpoint)
    config = replace(config, training=replace(config.training, hogwild=2, max_steps=5))
    data = load_data(config.data, vocab_tokens=(checkpoint.src_vocab, checkpoint.tgt_vocab))
    for model_class, message in ((RaisingInWorker1, r"(?s)Hogwild worker 1 failed:\nTraceback .*RuntimeError: "
                                                    r"injected failure"),
                                 (KilledInWorker1, r"Hogwild worker 1 \(pid \d+\) was killed by SIGKILL")):
        trainer = HogwildTrainer(config, data, model_class(config.model))
        trainer.restore(checkpoint)
        with pytest.raises(WorkerError, match=message):
            trainer.train()
        assert (run / "last.pt").read_bytes() == saved


class NonFiniteInWorker1(ReversibleSeq2Seq):
    """Trains as its family does, except that in Hogwild worker 1 every step's gradients are not finite."""

    def train_step(self, *args, **kwargs):
        result = super().train_step(*args, **kwargs)
        if mp.current_process().name == "hogwild-1":
            next(self.parameters()).grad.view(-1)[0] = math.inf
        return result


class NonFiniteInEveryWorker(ReversibleSeq2Seq):
    """Trains as its family does, except that in every Hogwild worker every step's gradients are not finite."""

    def train_step(self, *args, **kwargs):
        result = super().train_step(*args, **kwargs)
        if mp.current_process().name.startswith("hogwild-"):
            next(self.parameters()).grad.view(-1)[0] = math.inf
        return result


def test_hogwild_workers_skip_their_own_non_finite_updates(train, tmp_path, caplog):
    run = tmp_path / "nonfinite"
    assert train(run, "--max-steps", "1") == 0  # a good last.pt, from one process (Hogwild resumes it)
    saved = (run / "last.pt").read_bytes()
    checkpoint = Checkpoint.load(run / "last.pt")
    config = RunConfig.from_checkpoint(checkpoint)
    config = replace(config, training=replace(config.training, hogwild=2, max_steps=7))
    data = load_data(config.data, vocab_tokens=(checkpoint.src_vocab, checkpoint.tgt_vocab))

    trainer = HogwildTrainer(config, data, NonFiniteInWorker1(config.model))
    trainer.restore(checkpoint)
    with caplog.at_level(logging.INFO):
        assert trainer.train() == "reached --max-steps 7"
    # worker 1 trains batches 1, 3 and 5 and skips each; worker 0's updates go on
    skips = re.findall(r"Hogwild worker (\d) \(step \d+\): non-finite loss or gradients; the update was skipped",
                       caplog.text)
    assert skips == ["1"] * 3 and "updates by Hogwild worker 0: 3, 1: 3" in caplog.text
    weights = Checkpoint.load(run / "last.pt").weights
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert any(not torch.equal(w, checkpoint.weights[name]) for name, w in weights.items())

    (run / "last.pt").write_bytes(saved)
    config = replace(config, training=replace(config.training, max_nonfinite=3))
    trainer = HogwildTrainer(config, data, NonFiniteInEveryWorker(config.model))
    trainer.restore(checkpoint)
    with pytest.raises(Diverged, match=r"training diverged at step \d: 3 updates in a row"):
        trainer.train()
    assert (run / "last.pt").read_bytes() == saved


def test_a_worker_failure_is_logged_and_exits_with_status_1(train, tmp_path, monkeypatch, caplog):
    def fail(self):
        raise WorkerError("Hogwild worker 1 failed: injected")

    monkeypatch.setattr(HogwildTrainer, "train", fail)
    with caplog.at_level(logging.ERROR):
        assert train(tmp_path / "run", "--hogwild", "2") == 1
    assert "Hogwild worker 1 failed: injected" in caplog.text


def test_hogwild_options_are_checked(tmp_path, monkeypatch, capsys):
    base = ["--train", "x", "--valid", "y", "--save-dir", str(tmp_path)]
    for options, message in ((["--devices", "0"], "--devices chooses the GPUs of --hogwild workers"),
                             (["--hogwild", "2", "--save-every", "5"], "--save-every cannot be used with --hogwild"),
                             (["--hogwild", "2", "--devices", "0,x"], "must be GPU numbers separated by commas")):
        with pytest.raises(SystemExit):
            main([*base, *options])
        assert message in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit):
        main([*base, "--hogwild", "2"])
    assert "run it with python, not torchrun" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("update_freq", [1, 2])
def test_torchrun_ranks_train_identical_weights(toy, tmp_path, update_freq):
    run = tmp_path / "ranks"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(_free_port()), "train.py", "--train", toy["train"], "--valid", toy["valid"],
               "--save-dir", str(run), *TINY_MODEL, "--batch-size", "32", "--epochs", "2",
               "--update-freq", str(update_freq), *FAST]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr

    checkpoint = Checkpoint.load(run / "last.pt")
    # 2 epochs of 7 batches, the 7th left out so both ranks take part: 3 updates of 2 batches each, or with
    # --update-freq 2 updates of 4 batches (2 per rank) and 2 (1 per rank)
    assert checkpoint.step == {1: 6, 2: 4}[update_freq]
    digest = re.search(r"weights identical on all 2 ranks: SHA-256 (\w+)", (run / "train.log").read_text())
    assert digest and digest.group(1) == state_digest(checkpoint.weights)  # rank 1's weights = rank 0's checkpoint
    assert "[rank 0]" in result.stderr and "[rank 1]" not in result.stderr  # rank 1 logs warnings only
    _translates(run)


def test_checkpointed_ordinary_models_train_with_hogwild_workers_and_torchrun_ranks(train, toy, tmp_path):
    checkpointed = ["--rnn", "gru", "--attention", "emb+slice", "--checkpoint-steps", "auto"]
    assert train(tmp_path / "hogwild", *checkpointed, "--hogwild", "2", "--max-steps", "3") == 0
    assert Checkpoint.load(tmp_path / "hogwild" / "last.pt", needs=("args",)).args["checkpoint_steps"] == "auto"
    run = tmp_path / "ranks"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(_free_port()), "train.py", "--train", toy["train"], "--valid", toy["valid"],
               "--save-dir", str(run), *TINY_MODEL, *checkpointed, "--batch-size", "32", "--max-steps", "2"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "weights identical on all 2 ranks" in (run / "train.log").read_text()



def test_hogwild_and_torchrun_runs_draw_their_curves_in_the_process_that_logs(train, toy, tmp_path):
    assert train(tmp_path / "hogwild", "--hogwild", "2", "--max-steps", "3", "--tensorboard") == 0
    curves = read_curves(tmp_path / "hogwild" / "tensorboard")  # the main process's: every worker's updates
    assert curve_steps(curves["train/loss"]) == [2, 3] and curve_steps(curves["dev/bleu"]) == [3]
    run = tmp_path / "ranks"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(_free_port()), "train.py", "--train", toy["train"], "--valid", toy["valid"],
               "--save-dir", str(run), *TINY_MODEL, "--batch-size", "32", "--max-steps", "2", "--tensorboard"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert len(list((run / "tensorboard").iterdir())) == 1  # rank 0's event file, no other rank's
    curves = read_curves(run / "tensorboard")
    assert curve_steps(curves["train/loss"]) == [2] and curve_steps(curves["dev/bleu"]) == [2]


def test_an_epoch_stopped_early_ends_after_the_batches_already_claimed():
    end = EpochEnd(mp.get_context("spawn"))
    end.reset(10)
    assert end.stop_early(start=3) == 3  # nothing claimed yet: the epoch ends where it started
    end.reset(10)
    assert end.claim(0) and end.claim(1) and end.claim(3)  # worker 0 of 2 is one batch behind
    assert end.stop_early(start=0) == 4
    assert end.claim(2) and not end.claim(4) and not end.claim(5)  # it catches up; nobody goes on


def test_a_memory_budget_with_hogwild_says_it_bounds_each_worker(train, tmp_path):
    # The plan is one process's step; the workers each train on it, so the run as a whole may hold more.
    run = tmp_path / "budget"
    assert train(run, "--hogwild", "2", "--max-steps", "2", "--memory-budget", "4GiB") == 0
    log = (run / "train.log").read_text()
    assert "bounds each training process's steps: with --hogwild 2 the workers together may hold about 2 × 4" in log
    assert re.search(r"main process peak RSS [\d.]+ [KMG]iB; the 4\.00 GiB budget bounds each of the 2 workers' steps",
                     log), log
