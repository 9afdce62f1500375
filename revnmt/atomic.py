"""Files written atomically: a crash, Ctrl-C or full disk leaves the old file or the new one, never half of one.

Everything revnmt writes that a later run reads back (checkpoints, vocabularies, downloaded corpora,
translations, scores) goes through :func:`atomic_file`, so that a truncated file is never mistaken
for a complete one. Files a user names as outputs go through :func:`output_file`, which does the same
for regular files but writes into anything else (``/dev/null``, a FIFO, ``/dev/stdout``) in place.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TextIO


@contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file to write that replaces ``path`` only once the ``with`` block has succeeded.

    The data goes to a temporary file in the same folder (so the final rename stays on one filesystem,
    where ``os.replace`` is atomic) and is fsynced before the rename, so the new name never points at
    data still sitting in the page cache. On any error or interruption (KeyboardInterrupt, SystemExit) the
    temporary file is removed and ``path`` is left as it was.

    A new file gets the permissions the user's umask leaves; a file replaced keeps its own, set before
    anything is written, so that a private file's new contents are never readable by others.
    """
    path = Path(path)
    try:
        kept = os.stat(path)
    except FileNotFoundError:
        kept = None
    fd, temporary = _new_file_beside(path)
    try:
        with os.fdopen(fd, "wb") as file:
            if kept is not None and stat.S_ISREG(kept.st_mode):
                os.fchmod(fd, kept.st_mode & 0o777)  # the permission bits, never set-user-ID and the like
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _new_file_beside(path: Path) -> tuple[int, Path]:
    """A new empty file in ``path``'s folder, open for writing, and its name (hidden, ending in ``.tmp``).

    ``os.open`` creates it with mode 0666, which the kernel reduces by the umask (or a default ACL) as for
    any file a program creates, where ``tempfile.mkstemp`` would make it 0600 whatever the user asked for.
    No need to read the umask, which ``os.umask`` can only do by changing it, racing with other threads.
    """
    while True:
        name = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            # O_EXCL: never an existing file, nor a symbolic link planted under the name.
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), name
        except FileExistsError:  # a name drawn twice: draw again
            continue


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_file`)."""
    with atomic_file(path) as file:
        file.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8, atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def open_for_appending(path: str | os.PathLike[str]) -> TextIO:
    """``path`` opened to append UTF-8 text, created with the user's umask if missing, never through a symlink
    (OSError instead): for the logs a run keeps in its own directory (train.log, valid.tsv), which must not
    write into a file elsewhere that a link there points at."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    return os.fdopen(fd, "a", encoding="utf-8")


# Names of files other processes hold open: /dev/stdout is a link to /proc/self/fd/1, which the kernel
# resolves to whatever the shell opened there (a pipe, a terminal, a file opened with >>).
_OPEN_FILE_NAMES = ("/proc/", "/dev/fd/", "/dev/stdout", "/dev/stderr")


@contextmanager
def output_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file to write the output a user asked for to ``path``: atomically if it is a regular
    file or does not exist yet, in place otherwise.

    An atomic write (:func:`atomic_file`) creates a new file and renames it over ``path``. That is
    right for a file, but would replace a device (``-o /dev/null`` would leave a regular file named
    /dev/null for every program on the machine), a FIFO (its reader would wait forever), ``/dev/stdout``
    (the shell's ``> out`` or ``>> log`` would lose what else was written there) or a symlink (the link
    would become a copy). So a symlink is followed and its target, if a regular file, written atomically,
    the link kept; anything else is opened for appending (truncating means nothing to a device or a
    FIFO, and a file reached through /proc is another process's open file, whose earlier contents stay)
    and written in place, which is not atomic. Opening a FIFO waits for a reader.
    """
    if _written_in_place(path):
        with open(path, "ab") as file:
            yield file
    else:
        with atomic_file(os.path.realpath(path)) as file:
            yield file


def write_output_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8 (see :func:`output_file`)."""
    with output_file(path) as file:
        file.write(text.encode("utf-8"))


def check_output(path: str | os.PathLike[str]) -> None:
    """Raise OSError, with a message naming ``path``, if :func:`output_file` could not write it.

    For outputs of long work (a translation, a training run), checked before the work starts rather
    than lost at its end. Write permission is tried by creating (and removing) a file in the folder,
    as ``os.access`` answers yes to root even in a read-only folder. A full disk still shows only when
    writing.
    """
    name = os.fspath(path)
    if os.path.isdir(name):
        raise IsADirectoryError(f"{name} is a directory")
    if _written_in_place(name):
        try:
            if not stat.S_ISFIFO(os.stat(name).st_mode):
                os.close(os.open(name, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
            # A FIFO is not opened to try: its reader would take our closing it for the end of the output.
            elif not os.access(name, os.W_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        except OSError as error:
            raise type(error)(f"cannot write {name}: {error.strerror}") from None
        return
    folder = os.path.dirname(os.path.realpath(name))
    if not os.path.exists(folder):
        raise FileNotFoundError(f"cannot write {name}: the folder {folder} does not exist")
    if not os.path.isdir(folder):
        raise NotADirectoryError(f"cannot write {name}: {folder} is not a folder")
    try:
        fd, trial = tempfile.mkstemp(dir=folder, prefix=".write-test.", suffix=".tmp")
    except OSError as error:
        raise type(error)(f"cannot write {name}: cannot create files in {folder} ({error.strerror})") from None
    os.close(fd)
    os.remove(trial)


def same_file(output: str | os.PathLike[str], other: str | os.PathLike[str]) -> bool:
    """Whether writing ``output`` (with :func:`output_file`) would replace ``other``: both name one regular
    file, compared by device and inode so that hard and symbolic links count, or one file not made yet.

    Outputs written in place are never the same as anything: ``-o /dev/stdout`` and ``-i /dev/stdin`` may
    both be the terminal, and ``/dev/null`` may take any number of outputs.
    """
    try:
        a, b = os.stat(output), os.stat(other)
    except OSError:  # one of them does not exist (yet): the same only if both are one name to be
        return os.path.realpath(output) == os.path.realpath(other)
    return stat.S_ISREG(a.st_mode) and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) and not _written_in_place(output)


def _written_in_place(path: str | os.PathLike[str]) -> bool:
    """Whether :func:`output_file` writes ``path`` in place: it exists and is no regular file, or its
    name or a link on the way to it names a file that is held open (see ``_OPEN_FILE_NAMES``)."""
    name = os.path.abspath(path)
    for _ in range(40):  # as many links as Linux follows
        if name.startswith(_OPEN_FILE_NAMES):
            return True
        if not os.path.islink(name):
            break
        name = os.path.normpath(os.path.join(os.path.dirname(name), os.readlink(name)))
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):  # a new file (written atomically, or failing to)
        return False
