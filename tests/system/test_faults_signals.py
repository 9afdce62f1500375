"""SIGINT and SIGTERM in every phase of revnmt-train and revnmt-prepare (docs/reliability.md, "Interrupts"):
preparing data, the dev translation of a validation, the test translation. Each ends within seconds with one
line, 128 + the signal's number and no staging files, and the same command then finishes the run.

A phase is made long enough to be signalled by a stand-in from the test (not the production code): the
function it runs first writes a flag file, then waits."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import write_toy_corpus

from revnmt.checkpoints import Checkpoint

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
TINY = ["--emb-dim", "16", "--hidden-size", "16", "--slice-dim", "4", "--buffer-lanes", "4", "--min-freq", "1",
        "--batch-size", "8", "--device", "cpu"]

# Runs a console command's main (argv[1]: its module) with the function named by argv[2] ("module:attribute")
# waiting, after its call number argv[3], for a signal, and touching argv[4] first.
SLOW = """
import importlib, pathlib, sys, time
command, target, call, flag = sys.argv[1:5]
module_name, attribute = target.split(":")
module = importlib.import_module(module_name)
owner, name = (module, attribute) if "." not in attribute else (getattr(module, attribute.split(".")[0]),
                                                                  attribute.split(".")[1])
original, calls = getattr(owner, name), []
def slow(*args, **kwargs):
    result = original(*args, **kwargs)
    calls.append(1)
    if len(calls) == int(call):
        pathlib.Path(flag).touch()
        time.sleep(120)
    return result
setattr(owner, name, slow)
sys.exit(importlib.import_module(command).main(sys.argv[5:]))
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, str]:
    return write_toy_corpus(tmp_path_factory.mktemp("corpus"), {"train": 80, "valid": 6, "test": 6})


def _interrupt(tmp_path: Path, signum: int, command: str, target: str, call: int, *args: str
               ) -> subprocess.CompletedProcess:
    """Run ``command`` slowed down at ``target``'s ``call``-th return, send ``signum`` once it waits there, and
    return what it did; it must end within 20 s of the signal."""
    flag = tmp_path / "waiting"
    process = subprocess.Popen([sys.executable, "-c", SLOW, command, target, str(call), str(flag), *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not flag.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1]
        time.sleep(0.05)
    process.send_signal(signum)
    out, err = process.communicate(timeout=20)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _train(corpus: dict[str, str], run: Path, *options: str) -> list[str]:
    return ["--train", corpus["train"], "--valid", corpus["valid"], "--save-dir", str(run), *TINY, *options]


def _one_line(done: subprocess.CompletedProcess, signum: int, message: str) -> None:
    assert done.returncode == 128 + signum, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert message in done.stderr.strip().splitlines()[-1], done.stderr


def _no_staging(folder: Path) -> None:
    assert not [p for p in folder.rglob(".*.tmp")], list(folder.rglob(".*"))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_preparing_data_stops_and_leaves_no_staging(corpus, tmp_path, signum):
    run = tmp_path / "run"
    done = _interrupt(tmp_path, signum, "revnmt.cli.train", "revnmt.data.loading:encode_corpus", 1,
                      *_train(corpus, run, "--max-steps", "2"))
    _one_line(done, signum, f"interrupted by {signal.Signals(signum).name}")
    assert not (run / "data").exists()
    _no_staging(tmp_path)
    again = subprocess.run([str(BIN / "revnmt-train"), *_train(corpus, run, "--max-steps", "2")],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_the_dev_translation_saves_and_the_resume_validates_again(corpus, tmp_path, signum):
    run = tmp_path / "run"
    done = _interrupt(tmp_path, signum, "revnmt.cli.train", "revnmt.translation.translator:Translator.translate", 1,
                      *_train(corpus, run, "--max-steps", "3"))
    _one_line(done, signum, "interrupted at step 3; resume with the same command")
    assert Checkpoint.load(run / "last.pt").step == 3
    assert len((run / "valid.tsv").read_text().splitlines()) == 1  # the header: no validation was recorded
    again = subprocess.run([str(BIN / "revnmt-train"), *_train(corpus, run, "--max-steps", "3")],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert len((run / "valid.tsv").read_text().splitlines()) == 2 and (run / "best.pt").is_file()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_the_test_translation_stops_and_the_same_command_tests(corpus, tmp_path, signum):
    run = tmp_path / "run"
    options = _train(corpus, run, "--max-steps", "2", "--test", corpus["test"])
    # the first translation is the validation's, the second the test set's
    done = _interrupt(tmp_path, signum, "revnmt.cli.train", "revnmt.translation.translator:Translator.translate", 2,
                      *options)
    _one_line(done, signum, f"interrupted by {signal.Signals(signum).name}")
    assert not (run / "test.json").exists()
    _no_staging(run)
    again = subprocess.run([str(BIN / "revnmt-train"), *options], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and (run / "test.json").is_file(), again.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_revnmt_prepare_with_one_line(corpus, tmp_path, signum):
    folder = tmp_path / "prepared"
    done = _interrupt(tmp_path, signum, "revnmt.cli.prepare", "revnmt.data.loading:encode_corpus", 1,
                      "--prepared", str(folder), "--train", corpus["train"], "--valid", corpus["valid"],
                      "--min-freq", "1")
    _one_line(done, signum, f"revnmt-prepare: interrupted by {signal.Signals(signum).name}")
    assert not folder.exists()
    _no_staging(tmp_path)
