"""One run per save directory: a run holds an exclusive OS lock on ``SAVE_DIR/.lock`` while it trains.

Two runs writing one directory would overwrite each other's checkpoints and interleave their logs. The lock
is an ``fcntl.flock`` on a file that stays in the directory: the kernel releases it when the holder exits,
however it exits (kill -9 included), so a dead run never leaves a stale lock behind, and the file itself
means nothing once nobody holds it. It holds the holder's PID, for the message a second run prints.
Readers (``revnmt-translate``, ``revnmt-memory --checkpoint``) take no lock: checkpoints are replaced
atomically, so a reader sees the old file or the new one.

A save directory is revnmt's own (:mod:`revnmt.folders`): new or empty when the run starts, then marked, and
refused if it holds anything else (a project's files, prepared data). The lock file is opened without following
a symlink and must be a plain file of its own (one link): the PID written into it never lands in another file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from revnmt.folders import RUN, claim, write_marker

LOCK_FILE = ".lock"


class SaveDirInUse(RuntimeError):
    """Another process holds the save directory's lock."""


@contextmanager
def locked_save_dir(save_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Create ``save_dir`` if needed and hold its lock for the duration of the block.

    Raises SaveDirInUse (naming the PID that holds it) if another run has it, :class:`revnmt.folders.NotOurs` if
    the folder holds what revnmt did not make, OSError if it cannot be made or written."""
    save_dir = Path(save_dir)
    claim(save_dir, RUN)
    save_dir.mkdir(parents=True, exist_ok=True)
    write_marker(save_dir, RUN)
    # Opened without truncation (the holder's PID must survive a second run's failed attempt) and without
    # following a symlink.
    try:
        fd = os.open(save_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise OSError(errno.ELOOP, f"{save_dir / LOCK_FILE} is a symbolic link; revnmt does not write through it: "
                      f"remove it") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise OSError(errno.EEXIST, f"{save_dir / LOCK_FILE} is not revnmt's lock file (a link to another file, "
                          f"or no plain file): remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise SaveDirInUse(f"{save_dir} is in use by another revnmt-train run (PID {holder}): wait for it to "
                               f"end, stop it, or choose another --save-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield save_dir
    finally:
        os.close(fd)  # releases the lock
