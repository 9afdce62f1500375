"""Atomic writes: the old file or the new one, never a truncated one, and no temporary file left; outputs
that are no regular files (devices, FIFOs, /dev/stdout) written in place, never replaced."""

import errno
import os
import signal
import stat
import threading

import pytest
from conftest import device_node

from revnmt.atomic import atomic_file, atomic_write_bytes, check_output, same_file, write_output_text
from revnmt.training.interrupts import Signalled


def test_atomic_write_replaces_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["f.bin"]


def test_atomic_write_failure_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f.bin"]


def test_an_error_inside_the_block_keeps_the_old_file(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt), atomic_file(path) as file:
        file.write(b"half of the new")
        raise KeyboardInterrupt
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f.bin"]



def test_an_output_file_is_replaced_atomically_and_a_full_disk_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "out.txt"
    path.write_text("old\n")
    write_output_text(path, "new\n")
    assert path.read_text() == "new\n" and os.listdir(tmp_path) == ["out.txt"]

    def full_disk(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        write_output_text(path, "newer\n")
    assert path.read_text() == "new\n" and os.listdir(tmp_path) == ["out.txt"]


def test_a_symlink_is_written_through_and_kept(tmp_path):
    (tmp_path / "target").write_text("old\n")
    (tmp_path / "link").symlink_to("target")
    (tmp_path / "dangling").symlink_to("new")
    write_output_text(tmp_path / "link", "through\n")
    write_output_text(tmp_path / "dangling", "created\n")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "target").read_text() == "through\n"
    assert (tmp_path / "dangling").is_symlink() and (tmp_path / "new").read_text() == "created\n"
    assert sorted(os.listdir(tmp_path)) == ["dangling", "link", "new", "target"]


def test_a_fifo_is_written_in_place_for_its_reader(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    write_output_text(fifo, "one\ntwo\n")
    reader.join(timeout=10)
    assert received == ["one\ntwo\n"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_devices_are_written_in_place_and_stay_devices(tmp_path):
    null, full = device_node(tmp_path, "null"), device_node(tmp_path, "full")
    write_output_text(null, "gone\n")
    with pytest.raises(OSError) as raised:
        write_output_text(full, "too much\n")
    assert raised.value.errno == errno.ENOSPC
    assert stat.S_ISCHR(os.lstat(null).st_mode) and stat.S_ISCHR(os.lstat(full).st_mode)
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


def test_a_file_held_open_elsewhere_is_appended_to_not_replaced(tmp_path):
    # -o /dev/stdout >> log: the shell's open file, reached through /proc, keeps what it had.
    log = tmp_path / "log"
    log.write_text("earlier\n")
    inode = log.stat().st_ino
    with log.open("ab") as held:
        write_output_text(f"/proc/self/fd/{held.fileno()}", "appended\n")
    assert log.read_text() == "earlier\nappended\n" and log.stat().st_ino == inode


def test_check_output_accepts_what_can_be_written_and_leaves_nothing_behind(tmp_path):
    (tmp_path / "old.txt").write_text("old\n")
    os.mkfifo(tmp_path / "fifo")  # no reader: checked without opening it, which would wait
    for path in ("new.txt", "old.txt", "fifo"):
        check_output(tmp_path / path)
    check_output(device_node(tmp_path, "full"))  # a full disk shows only when writing
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]  # the file made to try
    assert (tmp_path / "old.txt").read_text() == "old\n"


@pytest.mark.parametrize("where, message", [
    ("folder", "is a directory"),
    ("missing/out.txt", "the folder .*missing does not exist"),
    ("file/out.txt", "file is not a folder"),
    ("/proc/out.txt", "cannot write /proc/out.txt"),  # read-only, even for root (an absolute path: not in tmp_path)
])
def test_check_output_says_why_a_place_cannot_be_written(tmp_path, where, message):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match=message):
        check_output(tmp_path / where)
    assert sorted(os.listdir(tmp_path)) == ["file", "folder"]


@pytest.mark.parametrize("interruption", [SystemExit(143), Signalled(signal.SIGTERM)], ids=["exit", "SIGTERM"])
def test_an_interruption_inside_the_block_leaves_no_temporary_file(tmp_path, interruption):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    with pytest.raises(type(interruption)), atomic_file(path) as file:
        file.write(b"half of the new")
        raise interruption
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]


@pytest.fixture
def umask():
    """Sets the process's umask for a test (``umask(0o077)``), and restores it after."""
    before = os.umask(0o022)
    yield os.umask
    os.umask(before)


@pytest.mark.parametrize("mask, mode", [(0o077, 0o600), (0o022, 0o644), (0o002, 0o664)])
def test_a_new_file_gets_the_mode_the_umask_leaves(tmp_path, umask, mask, mode):
    umask(mask)
    atomic_write_bytes(tmp_path / "f.bin", b"new")
    write_output_text(tmp_path / "out.txt", "new\n")
    assert [stat.S_IMODE((tmp_path / name).stat().st_mode) for name in ("f.bin", "out.txt")] == [mode, mode]


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o604, 0o755])
def test_a_replaced_file_keeps_its_mode_whatever_the_umask(tmp_path, umask, mode):
    umask(0o022)
    for name in ("f.bin", "target"):
        (tmp_path / name).write_bytes(b"old")
        (tmp_path / name).chmod(mode)
    (tmp_path / "link").symlink_to("target")
    atomic_write_bytes(tmp_path / "f.bin", b"new")
    write_output_text(tmp_path / "link", "new\n")  # the file the link names
    assert [stat.S_IMODE((tmp_path / name).stat().st_mode) for name in ("f.bin", "target")] == [mode, mode]
    assert (tmp_path / "f.bin").read_bytes() == b"new" and (tmp_path / "target").read_text() == "new\n"


def test_same_file_compares_regular_files_by_inode(tmp_path):
    (tmp_path / "a").write_text("a\n")
    (tmp_path / "b").write_text("a\n")
    os.link(tmp_path / "a", tmp_path / "hard")
    (tmp_path / "soft").symlink_to("a")
    assert same_file(tmp_path / "a", tmp_path / "hard") and same_file(tmp_path / "soft", tmp_path / "a")
    assert same_file(tmp_path / "new", tmp_path / "sub" / ".." / "new")  # one file to be
    assert not same_file(tmp_path / "a", tmp_path / "b") and not same_file(tmp_path / "new", tmp_path / "a")
    # written in place, and so never replacing anything: a device, also the terminal that -i /dev/stdin reads
    null = device_node(tmp_path, "null")
    assert not same_file(null, null)
