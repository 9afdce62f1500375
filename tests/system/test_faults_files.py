"""The console commands against the files they read and write, as a hostile environment or a careless user
makes them (docs/reliability.md lists what each test proves).

Checkpoints: one that would run code (even with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 in the environment), one
with damaged bytes, and files that are no revnmt checkpoints, given to revnmt-translate, revnmt-average,
revnmt-memory and a revnmt-train resume. Writing: a full disk (a file size limit well below a checkpoint's)
while saving a checkpoint or an average, the user's umask and a replaced file's mode, outputs that are the
inputs. Signals: SIGINT and SIGTERM in revnmt-translate, revnmt-average and revnmt-memory.

A failure is one line of error naming the file and status 2; a signal is one line and 128 + its number; both
leave the files as they were and no temporary file behind.
"""

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import write_toy_corpus

from revnmt.checkpoints import Checkpoint, save_checkpoint

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent  # the environment's console scripts
# Tensor records of a few KiB and more (the embeddings, the GRUs'), so that 4 KiB can be damaged in one.
MODEL = ["--emb-dim", "64", "--hidden-size", "64", "--slice-dim", "16", "--buffer-lanes", "4", "--min-freq", "1",
         "--batch-size", "8", "--device", "cpu"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder with a corpus and ``run``, trained for 2 steps: ``run/last.pt``, ``run/best.pt``."""
    folder = tmp_path_factory.mktemp("files")
    write_toy_corpus(folder, {"train": 2000, "valid": 10, "test": 10})
    done = subprocess.run(_train_command(folder, folder / "run"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return folder


def _train_command(work: Path, run: Path, *options: str) -> list[str]:
    return [str(BIN / "revnmt-train"), "--train", str(work / "train"), "--valid", str(work / "valid"),
            "--save-dir", str(run), *MODEL, "--max-steps", "2", *options]


def _command(name: str, work: Path, checkpoint: Path, run: Path, out: Path) -> list[str]:
    """The command ``name`` reading ``checkpoint``: revnmt-translate and revnmt-memory given it, revnmt-average
    averaging it, or revnmt-train resuming ``run`` (whose last.pt it is), writing ``out`` where they write."""
    if name == "translate":
        return [str(BIN / "revnmt-translate"), "--checkpoint", str(checkpoint), "-i", str(work / "test.en"),
                "-o", str(out), "--beam", "1", "--device", "cpu"]
    if name == "average":
        return [str(BIN / "revnmt-average"), str(checkpoint), "-o", str(out)]
    if name == "memory":
        return [str(BIN / "revnmt-memory"), "--checkpoint", str(checkpoint), "--batches", "1", "--device", "cpu"]
    return _train_command(work, run, "--max-steps", "4")


COMMANDS = ["translate", "average", "memory", "train"]


def _fails(done: subprocess.CompletedProcess, message: str) -> None:
    """Status 2 and ``message`` in the last line, an error's, and no traceback."""
    assert done.returncode == 2, done.stderr
    assert "error" in done.stderr.splitlines()[-1].lower() and message in done.stderr.splitlines()[-1], done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def _refused(work: Path, tmp_path: Path, name: str, spoil: Callable[[Path], None], message: str,
             env: dict[str, str] | None = None) -> None:
    """``name`` reading a copy of the run whose last.pt ``spoil`` made: refused with ``message`` after the
    file's name, and nothing written."""
    run = tmp_path / "run"
    shutil.copytree(work / "run", run)
    checkpoint = run / "last.pt"
    spoil(checkpoint)
    before = _contents(run)
    done = subprocess.run(_command(name, work, checkpoint, run, tmp_path / "out"), capture_output=True, text=True,
                          timeout=300, env=env)
    _fails(done, f"cannot load checkpoint {checkpoint}: {message}")
    assert _contents(run) == before
    assert not (tmp_path / "out").exists()


def _contents(run: Path) -> dict[Path, bytes]:
    """The files of a run directory but those a run writes as it starts: its log and its lock."""
    started = ("train.log", ".lock")
    return {path: path.read_bytes() for path in run.rglob("*") if path.is_file() and path.name not in started}


# ---------------------------------------------------------------------- checkpoints that are not to be trusted


class _Payload:
    """Unpickled, makes the folder ``made``: code a checkpoint runs if it is loaded without weights_only."""

    def __init__(self, made: Path) -> None:
        self.made = made

    def __reduce__(self):
        return os.mkdir, (str(self.made),)


@pytest.mark.parametrize("name", COMMANDS)
def test_a_checkpoint_that_would_run_code_is_refused_whatever_the_environment_says(work, tmp_path, name):
    made = tmp_path / "made-by-the-checkpoint"

    def add_payload(path: Path) -> None:
        save_checkpoint(path, {**Checkpoint.load(path).to_dict(), "scheduler": _Payload(made)})

    _refused(work, tmp_path, name, add_payload, "it holds more than tensors and plain data, and loading it could "
             "run code: refused", env={**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    assert not made.exists()


def _damage(path: Path) -> None:
    """Invert 4 KiB in the middle of the largest tensor record of ``path``, as a failing disk might."""
    with zipfile.ZipFile(path) as archive:
        record = max(archive.infolist(), key=lambda info: info.file_size)
    assert record.file_size > 3 * 4096
    data = bytearray(path.read_bytes())
    # The record's bytes follow its local header: 30 bytes, then its name and an extra field (torch's padding to
    # align the data), whose lengths the header ends with.
    header = record.header_offset
    name_length, extra_length = (int.from_bytes(data[at:at + 2], "little") for at in (header + 26, header + 28))
    start = header + 30 + name_length + extra_length + record.file_size // 2
    data[start:start + 4096] = bytes(255 - byte for byte in data[start:start + 4096])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", COMMANDS)
def test_a_damaged_checkpoint_is_refused(work, tmp_path, name):
    _refused(work, tmp_path, name, _damage, "damaged: its record ")


def _state_dict(path: Path) -> None:
    torch.save(Checkpoint.load(path).weights, path)


def _list(path: Path) -> None:
    torch.save([1, 2, 3], path)


def _without_model(path: Path) -> None:
    state = Checkpoint.load(path).to_dict()
    del state["model"]
    torch.save(state, path)


def _wrong_shape(path: Path) -> None:
    state = Checkpoint.load(path).to_dict()
    state["model"]["generator.bias"] = torch.zeros(3)
    torch.save(state, path)


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("spoil, message", [
    (_state_dict, "not a revnmt checkpoint (it has no model_config"),
    (_list, "not a revnmt checkpoint (it holds a list, not a dict)"),
    (_without_model, "not a revnmt checkpoint (it has no model)"),
    (_wrong_shape, "its weight generator.bias is (3,) torch.float32, its model_config makes"),
], ids=["state_dict", "list", "missing-key", "wrong-shape"])
def test_a_file_that_is_no_revnmt_checkpoint_is_refused(work, tmp_path, name, spoil, message):
    _refused(work, tmp_path, name, spoil, message)


# ---------------------------------------------------------------------- writing


def _limited(command: list[str], kib: int, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` with files limited to ``kib`` KiB (ulimit -f): writing past it fails (EFBIG) as on a full
    disk (ENOSPC)."""
    return subprocess.run(["bash", "-c", f'ulimit -f {kib}; exec "$@"', "bash", *command], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_a_full_disk_while_saving_a_checkpoint_keeps_the_last_one(work, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(work / "run", run)
    before = (run / "last.pt").read_bytes()
    done = _limited(_train_command(work, run, "--max-steps", "4"), len(before) // 4 // 1024, tmp_path)
    _fails(done, f"cannot write to {run}: File too large; the checkpoint of step 2 is kept")
    assert (run / "last.pt").read_bytes() == before
    assert not [path for path in run.iterdir() if path.name.endswith(".tmp")]


def test_a_full_disk_while_writing_an_average_keeps_the_old_one(work, tmp_path):
    output = tmp_path / "average.pt"
    output.write_bytes(b"an older average")
    checkpoints = [str(work / "run" / name) for name in ("last.pt", "best.pt")]
    size = (work / "run" / "last.pt").stat().st_size
    done = _limited([str(BIN / "revnmt-average"), *checkpoints, "-o", str(output)], size // 4 // 1024, tmp_path)
    _fails(done, f"revnmt-average: error: cannot write {output}: File too large")
    assert output.read_bytes() == b"an older average" and os.listdir(tmp_path) == ["average.pt"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files_are_created_with_the_users_umask_and_replaced_files_keep_their_mode(work, tmp_path):
    run = tmp_path / "run"
    private = 'umask 077; exec "$@"'
    for command in (_train_command(work, run),
                    [str(BIN / "revnmt-average"), str(work / "run" / "last.pt"), "-o", str(tmp_path / "average.pt")],
                    _command("translate", work, work / "run", run, tmp_path / "out.de")):
        done = subprocess.run(["bash", "-c", private, "bash", *command], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    written = [run / name for name in ("last.pt", "best.pt", "src.vocab", "config.json", "train.log")]
    assert {path.name: _mode(path) for path in [*written, tmp_path / "average.pt", tmp_path / "out.de"]} == \
        {path.name: 0o600 for path in [*written, tmp_path / "average.pt", tmp_path / "out.de"]}

    (tmp_path / "out.de").chmod(0o640)
    done = subprocess.run(["bash", "-c", 'umask 022; exec "$@"', "bash",
                           *_command("translate", work, work / "run", run, tmp_path / "out.de")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and _mode(tmp_path / "out.de") == 0o640, done.stderr


@pytest.mark.parametrize("options, message", [
    (["-i", "test.en", "-o", "test.en"], "-o test.en is the same file as -i test.en"),
    (["-i", "test.en", "-o", "linked.en"], "-o linked.en is the same file as -i test.en"),
    (["-i", "test.en", "--reference", "test.de", "-o", "test.de"],
     "-o test.de is the same file as --reference test.de"),
    (["-i", "test.en", "--reference", "test.de", "--json", "test.de"],
     "--json test.de is the same file as --reference test.de"),
])
def test_translate_refuses_an_output_that_is_one_of_its_inputs(work, tmp_path, options, message):
    for name in ("test.en", "test.de"):
        shutil.copy(work / name, tmp_path / name)
    os.link(tmp_path / "test.en", tmp_path / "linked.en")
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    done = subprocess.run([str(BIN / "revnmt-translate"), "--checkpoint", str(work / "run"), *options], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    _fails(done, message)
    assert len(done.stderr.splitlines()) == 1  # before the checkpoint was even loaded
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


# ---------------------------------------------------------------------- signals


def _wait_until(ready: Callable[[], bool], process: subprocess.Popen, err: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert process.poll() is None and time.monotonic() < deadline, err.read_text()
        time.sleep(0.05)


def _holds_open(process: subprocess.Popen, path: Path) -> bool:
    """Whether ``process`` has ``path`` open: it is reading it."""
    folder = Path(f"/proc/{process.pid}/fd")
    try:
        return any(os.readlink(folder / fd) == str(path) for fd in os.listdir(folder))
    except FileNotFoundError:  # a descriptor closed meanwhile
        return False


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("name", ["translate", "average", "memory"])
def test_a_signal_ends_a_command_at_once_with_one_line_and_its_status(work, tmp_path, name, signum):
    (tmp_path / "many.en").write_text((work / "test.en").read_text() * 2000)
    checkpoint = work / "run" / "last.pt"
    commands = {
        "translate": [str(BIN / "revnmt-translate"), "--checkpoint", str(checkpoint), "-i", str(tmp_path / "many.en"),
                      "-o", str(tmp_path / "out"), "--beam", "5", "--device", "cpu"],
        "average": [str(BIN / "revnmt-average"), *[str(checkpoint)] * 5000, "-o", str(tmp_path / "out")],
        "memory": [str(BIN / "revnmt-memory"), "--checkpoint", str(checkpoint), "--batches", "250",
                   "--batch-size", "8", "--json", str(tmp_path / "out"), "--device", "cpu"],
    }
    err = tmp_path / "stderr"
    with err.open("w") as stderr:
        # A command that does not stop is aborted below; the fault handler then prints where each thread was.
        process = subprocess.Popen(commands[name], stdout=subprocess.DEVNULL, stderr=stderr, cwd=tmp_path,
                                   env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    working = {"translate": lambda: "INFO: loaded" in err.read_text(),
               "average": lambda: _holds_open(process, checkpoint),
               "memory": lambda: "measuring" in err.read_text()}
    _wait_until(working[name], process, err)
    process.send_signal(signum)
    try:
        status = process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        process.wait()
        pytest.fail(f"revnmt-{name} ran on 20 s after {signal.Signals(signum).name}:\n{err.read_text()}")
    assert status == 128 + signum, err.read_text()
    lines = err.read_text().splitlines()
    assert lines[-1] == f"revnmt-{name}: interrupted by {signal.Signals(signum).name}", lines
    assert "Traceback" not in err.read_text()
    assert sorted(os.listdir(tmp_path)) == ["many.en", "stderr"]  # no output, and no temporary file
