"""Files written atomically: a crash, Ctrl-C or full disk leaves the old file or the new one, never half of one.

Everything revnmt writes that a later run reads back (checkpoints, vocabularies, downloaded corpora,
translations, scores) goes through :func:`atomic_file`, so that a truncated file is never mistaken
for a complete one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file to write that replaces ``path`` only once the ``with`` block has succeeded.

    The data goes to a temporary file in the same folder (so the final rename stays on one filesystem,
    where ``os.replace`` is atomic) and is fsynced before the rename, so the new name never points at
    data still sitting in the page cache. On an error the temporary file is removed and ``path`` is
    left as it was.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.chmod(tmp_name, 0o644)  # mkstemp makes 0600 files; outputs are meant to be shared
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_file`)."""
    with atomic_file(path) as file:
        file.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8, atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))
