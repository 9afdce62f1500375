"""The console commands as a user runs them when things go wrong (docs/reliability.md lists what each test
proves).

revnmt-train: Ctrl-C and SIGTERM save the step reached and resume exactly, a second Ctrl-C aborts, one run
per save directory, a changed corpus or a fixed option refused on resume and a changeable one applied, a
damaged corpus, an unwritable save directory, a full disk while saving, a reversal that fails its
exactness check (injected), Hogwild! and torchrun runs interrupted.

revnmt-translate: outputs that are no regular files, places that cannot be written, damaged input, stdin or
stdout closed or full.

A failure is one line of error and status 2, found before any work where it can be, and leaves the files it
touched as they were.
"""

import dataclasses
import gzip
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import device_node, write_toy_corpus

from revnmt.checkpoints import Checkpoint

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent  # the environment's console scripts
SENTENCES = 10


# ---------------------------------------------------------------------- revnmt-train

# 400 pairs in batches of 8: 50 batches an epoch, a few dozen steps a second.
TINY = ["--emb-dim", "16", "--hidden-size", "16", "--slice-dim", "4", "--buffer-lanes", "4", "--min-freq", "1",
        "--log-every", "1", "--device", "cpu"]
STEPS = 60  # across the end of epoch 1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, str]:
    prefixes = write_toy_corpus(tmp_path_factory.mktemp("corpus"), {"train": 400, "valid": 10})
    small = write_toy_corpus(tmp_path_factory.mktemp("small"), {"train": 40}, seed=1)
    return {**prefixes, "small": small["train"]}


def _command(corpus: dict[str, str], run: Path, *options: str) -> list[str]:
    batch = [] if "--memory-budget" in options or "--batch-size" in options else ["--batch-size", "8"]
    return [str(BIN / "revnmt-train"), "--train", corpus["train"], "--valid", corpus["valid"], "--save-dir", str(run),
            *TINY, *batch, *options]


def _train(corpus: dict[str, str], run: Path, *options: str, shell: str = 'exec "$0" "$@"'
           ) -> subprocess.CompletedProcess:
    """revnmt-train on the toy corpus into ``run``, started by bash's ``shell`` command line; its output
    as text."""
    return subprocess.run(["bash", "-c", shell, *_command(corpus, run, *options)], capture_output=True, text=True,
                          timeout=300)


def _start(corpus: dict[str, str], run: Path, *options: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    """revnmt-train in the background, stderr to ``run``'s sibling file ``stderr`` (a pipe could fill up)."""
    err = (run.parent / "stderr").open("w")
    return subprocess.Popen([*prefix, *_command(corpus, run, *options)], stdout=subprocess.DEVNULL, stderr=err,
                            text=True, start_new_session=True)


def _stderr(run: Path) -> str:
    return (run.parent / "stderr").read_text()


def _wait_for_step(run: Path, step: int, process: subprocess.Popen, timeout: float = 180) -> None:
    """Wait until ``run``'s log shows ``step`` (or a later one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = (run / "train.log").read_text() if (run / "train.log").exists() else ""
        if any(int(n) >= step for n in re.findall(r"\| step (\d+) \|", log)):
            return
        assert process.poll() is None, _stderr(run)
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def _one_line_error(done: subprocess.CompletedProcess, message: str, status: int = 2) -> None:
    assert done.returncode == status, done.stderr
    assert message in done.stderr.splitlines()[-1] and "Traceback" not in done.stderr, done.stderr


def _same_run(a: Path, b: Path) -> bool:
    """Whether two run directories' last.pt hold bit-identical weights and optimizer state at the same step."""
    x, y = Checkpoint.load(a / "last.pt"), Checkpoint.load(b / "last.pt")
    tensors = [(x.weights[k], y.weights[k]) for k in x.weights]
    for s, t in zip(x.training.optimizer["state"].values(), y.training.optimizer["state"].values()):
        tensors += [(s[k], t[k]) for k in s]
    return x.step == y.step and all(torch.equal(u, v) for u, v in tensors)


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    done = _train(corpus, run, "--max-steps", str(STEPS))
    assert done.returncode == 0, done.stderr
    return run


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_saves_the_step_reached_and_the_run_resumes_exactly(corpus, uninterrupted, tmp_path, signum):
    run = tmp_path / "run"
    process = _start(corpus, run, "--max-steps", str(STEPS))
    _wait_for_step(run, 10, process)
    process.send_signal(signum)
    assert process.wait(timeout=60) == 128 + signum, _stderr(run)
    step = Checkpoint.load(run / "last.pt").step
    assert 10 <= step < STEPS
    assert _stderr(run).splitlines()[-1].endswith(f"interrupted at step {step}; resume with the same command")
    assert "Traceback" not in _stderr(run)

    resumed = _train(corpus, run, "--max-steps", str(STEPS))
    assert resumed.returncode == 0, resumed.stderr
    assert _same_run(run, uninterrupted)


def test_a_second_ctrl_c_aborts_without_saving(corpus, tmp_path):
    run = tmp_path / "run"
    # steps of a large enough model that the second Ctrl-C comes while the first one's step still runs
    process = _start(corpus, run, "--hidden-size", "512", "--emb-dim", "512", "--batch-size", "64")
    _wait_for_step(run, 1, process)
    process.send_signal(signal.SIGINT)
    time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130
    assert "aborted: nothing was saved since the last checkpoint" in _stderr(run).splitlines()[-1]
    assert not (run / "last.pt").exists()


def test_one_run_owns_a_save_directory(corpus, tmp_path):
    run = tmp_path / "run"
    # Only the kill below may end the first run: on the toy corpus patience or the LR's decay would end it within
    # a few epochs, while the translation below runs, and leave the resumed run nothing to train.
    endless = ("--patience", "1000", "--min-lr", "0")
    first = _start(corpus, run, "--save-every", "2", *endless)
    _wait_for_step(run, 3, first)
    second = _train(corpus, run)
    _one_line_error(second, f"{run} is in use by another revnmt-train run (PID {first.pid})")
    assert first.poll() is None
    # Reading the run's checkpoints stays allowed.
    (tmp_path / "in.en").write_text("a man runs .\n")
    translated = subprocess.run([str(BIN / "revnmt-translate"), "--checkpoint", str(run), "-i",
                                 str(tmp_path / "in.en")], capture_output=True, timeout=120)
    assert translated.returncode == 0 and translated.stdout.count(b"\n") == 1, translated.stderr
    # A killed run leaves no stale lock.
    first.kill()
    first.wait()
    saved = Checkpoint.load(run / "last.pt").step
    resumed = _train(corpus, run, *endless, "--max-steps", str(saved + 2))
    assert resumed.returncode == 0 and "resumed" in resumed.stderr, resumed.stderr
    assert Checkpoint.load(run / "last.pt").step == saved + 2


def test_a_changed_corpus_is_refused_on_resume_unless_the_epoch_restarts(corpus, tmp_path):
    run = tmp_path / "run"
    assert _train(corpus, run, "--max-steps", "12").returncode == 0
    small = ["--train", corpus["small"]]  # 5 batches: the saved position (batch 12) lies past its end
    refused = _train(corpus, run, *small, "--max-steps", "20")
    _one_line_error(refused, "train.en")
    assert "changed since it was saved" in refused.stderr and "--restart-epoch" in refused.stderr
    resumed = _train(corpus, run, *small, "--max-steps", "20", "--restart-epoch")
    assert resumed.returncode == 0, resumed.stderr
    assert Checkpoint.load(run / "last.pt").step == 20
    # on unchanged corpora the option changes nothing: the run goes on from its saved position
    position = Checkpoint.load(run / "last.pt").training.trainer
    again = _train(corpus, run, *small, "--max-steps", "21", "--restart-epoch")
    assert again.returncode == 0 and "from its first batch" not in again.stderr, again.stderr
    after = Checkpoint.load(run / "last.pt").training.trainer
    assert (after.epoch, after.batch_in_epoch) in ((position.epoch, position.batch_in_epoch + 1),
                                                   (position.epoch + 1, 0))


def test_options_changed_on_resume_are_applied_or_refused(corpus, tmp_path):
    run = tmp_path / "run"
    assert _train(corpus, run, "--max-steps", "4").returncode == 0
    changed = _train(corpus, run, "--max-steps", "6", "--lr", "0.5")
    assert changed.returncode == 0, changed.stderr
    assert "changed on resume: --lr 0.001 -> 0.5" in changed.stderr
    assert "changed on resume: --max-steps 4 -> 6" in changed.stderr
    assert Checkpoint.load(run / "last.pt").training.optimizer["param_groups"][0]["lr"] == 0.5
    config = (run / "config.json").read_text()
    assert '"lr": 0.5' in config

    refused = _train(corpus, run, "--max-steps", "8", "--lr", "0.5", "--optimizer", "sgd")
    _one_line_error(refused, "--optimizer adam -> sgd")
    assert (run / "config.json").read_text() == config  # still what the run uses


def test_a_run_saved_before_buffer_tiles_resumes_with_them(corpus, tmp_path):
    run = tmp_path / "run"
    assert _train(corpus, run, "--max-steps", "4", "--rnn", "revgru").returncode == 0
    saved = Checkpoint.load(run / "last.pt")
    options = {key: value for key, value in saved.args.items() if key != "buffer_tile"}  # as runs before tiles
    dataclasses.replace(saved, args=options).save(run / "last.pt")
    resumed = _train(corpus, run, "--max-steps", "6", "--rnn", "revgru")
    assert resumed.returncode == 0, resumed.stderr
    warnings = [line for line in resumed.stderr.splitlines() if "earlier layout" in line]
    assert len(warnings) == 1 and "resumes with tiles of 8 sentences" in warnings[0]
    after = Checkpoint.load(run / "last.pt")
    assert after.training.trainer.step == 6 and after.args["buffer_tile"] == 8
    again = _train(corpus, run, "--max-steps", "8", "--rnn", "revgru")  # saved with the tile: nothing to say
    assert again.returncode == 0 and "earlier layout" not in again.stderr


def test_a_run_resumed_with_other_threads_says_so(corpus, tmp_path):
    run = tmp_path / "run"
    threads = {n: f'OMP_NUM_THREADS={n} exec "$0" "$@"' for n in (1, 2)}
    started = _train(corpus, run, "--max-steps", "2", shell=threads[1])
    assert started.returncode == 0 and "on cpu, 1 thread" in started.stderr
    assert Checkpoint.load(run / "last.pt").numerics.threads == 1
    resumed = _train(corpus, run, "--max-steps", "4", shell=threads[2])
    assert resumed.returncode == 0, resumed.stderr
    warnings = [line for line in resumed.stderr.splitlines() if "other numerics" in line]
    assert len(warnings) == 1 and "(threads 1 -> 2)" in warnings[0]
    assert Checkpoint.load(run / "last.pt").numerics.threads == 2  # what it computes with now
    again = _train(corpus, run, "--max-steps", "6", shell=threads[2])
    assert again.returncode == 0 and "other numerics" not in again.stderr


def test_a_truncated_gzip_corpus_is_one_line(corpus, tmp_path):
    data = gzip.compress(Path(f"{corpus['train']}.en").read_bytes())
    (tmp_path / "train.en.gz").write_bytes(data[: len(data) // 2])
    shutil.copy(f"{corpus['train']}.de", tmp_path / "train.de")
    done = _train(corpus, tmp_path / "run", "--train", str(tmp_path / "train"))
    _one_line_error(done, "train.en.gz: truncated or corrupt gzip file")


def test_files_that_part_past_the_train_limit_are_one_line(corpus, tmp_path):
    # --train-limit reads only the first pairs' text, but counts both files to their end: a line missing far past
    # the limit is refused before any training, as it is without a limit.
    shutil.copy(f"{corpus['train']}.en", tmp_path / "train.en")
    lines = Path(f"{corpus['train']}.de").read_text().splitlines(keepends=True)
    (tmp_path / "train.de").write_text("".join(lines[:-1]))
    done = _train(corpus, tmp_path / "run", "--train", str(tmp_path / "train"), "--train-limit", "5")
    _one_line_error(done, f"train.en has {len(lines)} lines, {tmp_path / 'train.de'} has {len(lines) - 1} lines")
    assert not (tmp_path / "run" / "last.pt").exists()


@pytest.mark.parametrize("where", ["/proc/x", "train.en/x"])
def test_an_unwritable_save_dir_is_one_line(corpus, where):
    save_dir = where if where.startswith("/") else str(Path(corpus["train"]).parent / where)
    done = _train(corpus, Path(save_dir))
    _one_line_error(done, f"cannot create or write --save-dir {save_dir}")
    assert len(done.stderr.splitlines()) == 1


def test_a_full_disk_while_saving_keeps_the_last_checkpoint(corpus, tmp_path):
    run = tmp_path / "run"
    assert _train(corpus, run, "--max-steps", "4").returncode == 0
    size = (run / "last.pt").stat().st_size
    # ulimit -f: no file may grow past the checkpoint's size less 1 KiB (EFBIG, as ENOSPC on a full disk).
    done = _train(corpus, run, "--max-steps", "6", shell=f'ulimit -f {size // 1024 - 1}; exec "$0" "$@"')
    _one_line_error(done, "File too large; the checkpoint of step 4 is kept")
    assert Checkpoint.load(run / "last.pt").step == 4
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


def test_closed_standard_streams_do_not_stop_training(corpus, tmp_path):
    run = tmp_path / "run"
    done = _train(corpus, run, "--max-steps", "2", shell='exec "$0" "$@" <&- >&- 2>&-')
    assert done.returncode == 0
    assert "training stopped: reached --max-steps 2" in (run / "train.log").read_text()


def test_a_memory_budget_above_the_machines_memory_is_warned_of(corpus, tmp_path):
    done = _train(corpus, tmp_path / "run", "--memory-budget", "1PiB", "--max-steps", "1")
    assert done.returncode == 0, done.stderr
    assert re.search(r"WARNING --memory-budget 1.00 PiB is more than this machine has \(.*\)", done.stderr)


# Runs revnmt-train with ReversibleRNN.backward_sweep failing (after finishing) at the calls listed in argv[1]
# ("all": every one): a stand-in for a reversal fault, outside the production code.
INJECT = """
import sys
from revnmt.cli.train import main
from revnmt.rnn import ReversalError, ReversibleRNN
failing, original, calls = sys.argv[1], ReversibleRNN.backward_sweep, []
def backward_sweep(self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    calls.append(1)
    if failing == "all" or len(calls) in {int(n) for n in failing.split(",")}:
        raise ReversalError("injected fault")
    return result
ReversibleRNN.backward_sweep = backward_sweep
sys.exit(main(sys.argv[2:]))
"""


def _train_with_faults(corpus: dict[str, str], run: Path, failing: str, *options: str) -> subprocess.CompletedProcess:
    command = _command(corpus, run, *options)[1:]
    return subprocess.run([sys.executable, "-c", INJECT, failing, *command], capture_output=True, text=True,
                          timeout=300)


def test_a_reversal_fault_costs_one_batch_not_the_run(corpus, tmp_path):
    run = tmp_path / "run"
    # Two sweeps a step (the decoder's, then the encoder's): call 6 is step 3's encoder.
    done = _train_with_faults(corpus, run, "6", "--max-steps", "4")
    assert done.returncode == 0, done.stderr
    assert ("batch 2 of epoch 1 (step 3): reversal failed (injected fault); its gradients were computed by "
            "backpropagation instead (1 such batches so far)") in done.stderr
    assert "| step 3 | batch 3/50 |" in done.stderr and "| 1 reversal fallbacks" in done.stderr
    assert Checkpoint.load(run / "last.pt").training.trainer.reversal_fallbacks == 1


def test_reversal_faults_on_many_batches_stop_the_run(corpus, tmp_path):
    done = _train_with_faults(corpus, tmp_path / "run", "all", "--max-steps", "10")
    _one_line_error(done, "reversal failed on 2 of 2 updates, more than --max-reversal-fallbacks 0.01 allows",
                    status=1)


def test_an_interrupted_hogwild_run_saves_a_prefix_of_the_epoch_and_resumes(corpus, tmp_path):
    run = tmp_path / "run"
    process = _start(corpus, run, "--hogwild", "2", "--max-steps", "40")
    _wait_for_step(run, 6, process)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == 130, _stderr(run)
    state = Checkpoint.load(run / "last.pt").training.trainer
    # the updates so far are exactly the epoch's first batches, one each
    assert state.epoch == 1 and 6 <= state.step == state.batch_in_epoch < 40
    resumed = _train(corpus, run, "--hogwild", "2", "--max-steps", "40")
    assert resumed.returncode == 0, resumed.stderr
    assert Checkpoint.load(run / "last.pt").step == 40


def _torchrun() -> tuple[str, ...]:
    """torchrun with two ranks on a free local port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return (sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(port))


def test_an_interrupted_torchrun_job_stops_every_rank_at_one_step_and_resumes(corpus, tmp_path):
    run = tmp_path / "run"
    process = _start(corpus, run, "--max-steps", "40", prefix=_torchrun())
    _wait_for_step(run, 4, process)
    process.send_signal(signal.SIGINT)  # torchrun passes it on to both ranks
    process.wait(timeout=120)  # torchrun's own status and traceback for a signal are its own, not revnmt's
    state = Checkpoint.load(run / "last.pt").training.trainer
    step = state.step
    assert 4 <= step < 40 and state.batch_in_epoch == 2 * step  # a batch per rank and update
    assert _stderr(run).count(f"interrupted at step {step}; resume with the same command") == 2  # both ranks

    resumed = subprocess.run([*_torchrun(), *_command(corpus, run, "--max-steps", "40")],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert Checkpoint.load(run / "last.pt").step == 40


# ---------------------------------------------------------------------- revnmt-translate


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder with ``run/last.pt``, a tiny model trained for one step, and ``test.en`` to translate."""
    folder = tmp_path_factory.mktemp("faults")
    prefixes = write_toy_corpus(folder, {"train": 100, "valid": 10, "test": SENTENCES})
    trained = subprocess.run([str(BIN / "revnmt-train"), "--train", prefixes["train"], "--valid", prefixes["valid"],
                              "--save-dir", str(folder / "run"), "--emb-dim", "16", "--hidden-size", "16",
                              "--slice-dim", "4", "--max-steps", "1", "--device", "cpu"],
                             capture_output=True, timeout=600)
    assert trained.returncode == 0, trained.stderr.decode()
    return folder


def _translate(work: Path, *args: str, shell: str = 'exec "$0" "$@"', **options) -> subprocess.CompletedProcess:
    """``revnmt-translate --checkpoint run/last.pt ARGS`` started by bash's ``shell`` command line (where
    ``<&-``, ``>&-`` or ``ulimit`` go), from ``work``; stdout and stderr captured unless ``options`` say
    otherwise."""
    options.setdefault("stdout", subprocess.PIPE)
    return subprocess.run(["bash", "-c", shell, str(BIN / "revnmt-translate"), "--checkpoint", "run/last.pt",
                           "--beam", "1", *args], cwd=work, stderr=subprocess.PIPE, timeout=120, **options)


def _fails(done: subprocess.CompletedProcess, message: str, *, at_once: bool = False) -> None:
    """Status 2 and one line of error saying ``message``, last; with ``at_once``, the only line: nothing
    (not even the checkpoint) was loaded before."""
    err = done.stderr.decode()
    assert done.returncode == 2, err
    lines = err.splitlines()
    assert lines[-1].startswith("revnmt-translate: error: ") and message in lines[-1], err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert len(lines) == 1 or not at_once, err



def test_output_onto_a_full_device_fails_and_keeps_the_device(work, tmp_path):
    full = device_node(tmp_path, "full")
    _fails(_translate(work, "-i", "test.en", "-o", full), f"cannot write {full}: No space left on device")
    assert stat.S_ISCHR(os.lstat(full).st_mode)


def test_output_through_a_symlink_keeps_the_link(work, tmp_path):
    (tmp_path / "target.de").write_text("old\n")
    (tmp_path / "link.de").symlink_to("target.de")
    done = _translate(work, "-i", "test.en", "-o", str(tmp_path / "link.de"))
    assert done.returncode == 0, done.stderr.decode()
    assert (tmp_path / "link.de").is_symlink()
    assert len((tmp_path / "target.de").read_text().splitlines()) == SENTENCES


def test_output_onto_a_fifo_goes_to_its_reader(work, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    done = _translate(work, "-i", "test.en", "-o", str(fifo))
    reader.join(timeout=10)
    assert done.returncode == 0, done.stderr.decode()
    assert received[0].count(b"\n") == SENTENCES and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_output_onto_dev_stdout_goes_to_stdout_and_appends_to_a_file_there(work, tmp_path):
    piped = _translate(work, "-i", "test.en", "-o", "/dev/stdout")
    assert piped.returncode == 0, piped.stderr.decode()
    assert piped.stdout.count(b"\n") == SENTENCES

    log = tmp_path / "log"
    log.write_bytes(b"earlier\n")
    with log.open("ab") as appended:  # revnmt-translate -o /dev/stdout >> log
        done = _translate(work, "-i", "test.en", "-o", "/dev/stdout", stdout=appended)
    assert done.returncode == 0, done.stderr.decode()
    assert log.read_bytes() == b"earlier\n" + piped.stdout


@pytest.mark.parametrize("where, message", [
    ("/proc/x", "cannot write /proc/x"),  # read-only, even for root
    ("missing/x", "the folder"),
    ("test.en/x", "is not a folder"),
    ("run", "run is a directory"),
])
def test_output_that_cannot_be_written_fails_before_translating(work, where, message):
    _fails(_translate(work, "-i", "test.en", "-o", where), message, at_once=True)
    assert not (work / "missing").exists() and (work / "test.en").is_file()


def test_a_full_disk_while_writing_the_output_keeps_the_old_file(work, tmp_path):
    many = tmp_path / "many.en"
    many.write_text((work / "test.en").read_text() * 200)  # at least a newline each: over 1 KiB of output
    out = tmp_path / "out.de"
    out.write_text("old\n")
    # ulimit -f 1: a file cannot grow past 1 KiB, its writing failing (EFBIG) as on a full disk (ENOSPC).
    _fails(_translate(work, "-i", str(many), "-o", str(out), shell='ulimit -f 1; exec "$0" "$@"'),
           f"cannot write {out}: File too large")
    assert out.read_text() == "old\n" and sorted(os.listdir(tmp_path)) == ["many.en", "out.de"]


def test_a_truncated_gzip_input_is_said_so(work, tmp_path):
    subprocess.run(["gzip", "-k", str(work / "test.en")], check=True)
    truncated = (work / "test.en.gz").read_bytes()[:40]
    (tmp_path / "test.en.gz").write_bytes(truncated)
    _fails(_translate(work, "-i", str(tmp_path / "test.en.gz")), "test.en.gz: truncated or corrupt gzip file")
    assert (tmp_path / "test.en.gz").read_bytes() == truncated


def test_a_directory_as_input_is_said_so(work):
    _fails(_translate(work, "-i", "run"), "run is a directory", at_once=True)


def test_closed_stdin_is_said_so(work):
    _fails(_translate(work, shell='exec "$0" "$@" <&-'), "stdin is closed: give -i FILE or pipe sentences in",
           at_once=True)


def test_full_stdout_is_said_so(work):
    with open("/dev/full", "wb") as full:  # as stdout, which is never replaced
        _fails(_translate(work, "-i", "test.en", stdout=full), "cannot write to stdout: No space left on device")


def test_closed_stdout_is_said_so(work):
    _fails(_translate(work, "-i", "test.en", shell='exec "$0" "$@" >&-'),
           "stdout is closed: give -o FILE or redirect the output", at_once=True)
