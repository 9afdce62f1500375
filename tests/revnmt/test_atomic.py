"""Atomic writes: the old file or the new one, never a truncated one, and no temporary file left."""

import os

import pytest

from revnmt.atomic import atomic_file, atomic_write_bytes


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
