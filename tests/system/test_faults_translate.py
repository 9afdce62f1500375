"""revnmt-translate as a user runs it when things go wrong: outputs that are no regular files, places that
cannot be written, damaged input, stdin or stdout closed or full. A failure is one line of error and
status 2, found before any translating where it can be, and leaves the files it touched as they were."""

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import write_toy_corpus

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent  # the environment's console scripts
SENTENCES = 10


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


def _device(folder: Path, name: str) -> str:
    """/dev/null or /dev/full; as root a node of the same device made in ``folder``, so that a bug that
    replaced it would not break the machine's."""
    if os.geteuid() != 0:
        return f"/dev/{name}"  # nobody but root can replace it
    node = folder / name
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, {"null": 3, "full": 7}[name]))
    return str(node)


def test_output_onto_a_full_device_fails_and_keeps_the_device(work, tmp_path):
    full = _device(tmp_path, "full")
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
