"""Folders revnmt makes, marks as its own, and alone may replace or delete.

A run directory (``--save-dir``) and a folder of prepared data (``--prepared``, a run's ``data/``) are folders
revnmt fills and, for prepared data, replaces whole. A path a user names may hold anything, though: a project
whose ``data/`` keeps the corpora, a run directory given as ``--prepared``, a file. So each folder revnmt makes
carries a marker file, ``.revnmt``, that says what it is and in which format::

    {"kind": "run", "format": 1}

and revnmt writes into, replaces or deletes only a folder that is new, empty, or marked with the kind it
expects. Anything else is refused with one line (:class:`NotOurs`) before anything is touched.

Folders made before markers existed are recognised by what they hold (:func:`_made_before_markers`): a run by
the files every run writes at its start, prepared data by holding nothing but prepared data's own files. They
are marked the first time they are used.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MARKER = ".revnmt"
FORMAT = 1
RUN = "run"
PREPARED = "prepared data"

# What a run writes into its directory before its first step (revnmt.cli.train): a directory holding all of them
# and no marker was made by revnmt before markers existed.
_RUN_FILES = ("config.json", "src.vocab", "tgt.vocab")


class NotOurs(ValueError):
    """A folder revnmt would write into, replace or delete holds something revnmt did not make."""


def marker_kind(folder: Path) -> str | None:
    """The kind ``folder``'s marker names, or None if it has none (or one revnmt cannot read)."""
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("format") != FORMAT or not isinstance(marker.get("kind"), str):
        return None
    return marker["kind"]


def write_marker(folder: Path, kind: str) -> None:
    """Mark ``folder`` as revnmt's folder of ``kind``. Created exclusively and never through a symlink: a marker
    that is already there stays as it is."""
    try:
        fd = os.open(folder / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(json.dumps({"kind": kind, "format": FORMAT}) + "\n")


def claim(folder: Path, kind: str, files: frozenset[str] | None = None) -> None:
    """Make sure revnmt may fill (and, for prepared data, replace) ``folder`` as a folder of ``kind``; NotOurs,
    naming what is in the way, otherwise. The folder may be missing or empty, or hold revnmt's marker of
    ``kind``; with ``files``, the names a folder of that kind holds, nothing else may be in it either, so that
    replacing the folder whole loses nothing."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise NotOurs(f"{folder} is not a folder: choose a folder revnmt may create or that it made")
    if not folder.exists():
        return
    entries = {entry.name for entry in folder.iterdir()}
    if not entries:
        return
    found = marker_kind(folder)
    if found is None and _made_before_markers(folder, kind, entries, files):
        return
    if found is None:
        raise NotOurs(f"{folder} holds files revnmt did not make ({_some(sorted(entries))}): revnmt writes only "
                      f"into a new or empty folder or one it made; choose another {_option(kind)}")
    if found != kind:
        raise NotOurs(f"{folder} is revnmt's {found}, not {kind}: choose another {_option(kind)}")
    unknown = sorted(entries - files - {MARKER}) if files is not None else []
    if unknown:
        raise NotOurs(f"{folder} holds files that are not revnmt's {kind} ({_some(unknown)}): revnmt replaces it "
                      f"whole, so it leaves it as it is; move them or choose another {_option(kind)}")


def _made_before_markers(folder: Path, kind: str, entries: set[str], files: frozenset[str] | None) -> bool:
    """Whether an unmarked ``folder`` holding ``entries`` is a folder of ``kind`` that revnmt made before it marked
    its folders (it is marked now)."""
    if kind == RUN:
        made = all(name in entries for name in _RUN_FILES)
    else:
        made = files is not None and "manifest.json" in entries and entries <= files
    if made:
        try:
            write_marker(folder, kind)
        except OSError:  # a read-only folder (shared prepared data) is recognised by what it holds every time
            pass
    return made


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _option(kind: str) -> str:
    return "--save-dir" if kind == RUN else "--prepared folder"


def check_outside(folder: Path, inputs: list[Path]) -> None:
    """NotOurs if one of ``inputs`` (files a run reads) lies inside ``folder``, which is about to be replaced."""
    root = Path(os.path.realpath(folder))
    for path in inputs:
        real = Path(os.path.realpath(path))
        if real == root or root in real.parents:
            raise NotOurs(f"{path} lies inside {folder}, which revnmt would replace with the prepared data: keep the "
                          f"corpora outside the --prepared folder")
