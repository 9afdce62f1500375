"""Locating (and if need be downloading) the Multi30K English-German data set (task 1, raw text)."""

from __future__ import annotations

import http.client
import logging
import os
import urllib.request
from pathlib import Path

from revnmt.atomic import atomic_write_bytes

logger = logging.getLogger(__name__)

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
# train.en.gz comes last on purpose: a folder counts as complete once it holds train.en(.gz), so an
# interrupted download must not leave that file behind without the others.
MULTI30K_FILES = (
    "train.de.gz",
    "val.en.gz",
    "val.de.gz",
    "test_2016_flickr.en.gz",
    "test_2016_flickr.de.gz",
    "train.en.gz",
)
MULTI30K_SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
DOWNLOAD_TIMEOUT_S = 30
DATA_ENV_VAR = "REVNMT_DATA"
_GZIP_MAGIC = b"\x1f\x8b"
# Relative to the working directory: searched after $REVNMT_DATA, and where a download goes.
LOCAL_DIR = Path("data/multi30k")


def _holds_multi30k(folder: Path) -> bool:
    return (folder / "train.en").is_file() or (folder / "train.en.gz").is_file()


def _in_folder_or_child(folder: Path) -> Path | None:
    """``folder`` itself or its ``multi30k/`` subfolder, whichever holds the data."""
    for candidate in (folder, folder / "multi30k"):
        if _holds_multi30k(candidate):
            return candidate.resolve()
    return None


def find_multi30k(data_dir: str | os.PathLike[str] | None = None, download: bool = True) -> Path:
    """Return the folder holding Multi30K (``train.en(.gz)`` etc.), downloading it if nowhere found.

    Search order: ``data_dir`` (the folder or its ``multi30k/`` child; if given it must hold the
    data), ``$REVNMT_DATA`` (likewise), then ``./data/multi30k``. Failing these the raw files are
    downloaded into ``./data/multi30k``, or ``FileNotFoundError`` is raised if ``download`` is
    false.
    """
    if data_dir is not None:
        found = _in_folder_or_child(Path(data_dir))
        if found is None:
            # An explicit choice that does not hold the data is a mistake to report, not a hint to
            # silently use some other copy.
            raise FileNotFoundError(
                f"data dir {data_dir}: neither it nor {Path(data_dir) / 'multi30k'} holds train.en(.gz)"
            )
        return found

    searched: list[Path] = []
    env_dir = os.environ.get(DATA_ENV_VAR)
    if env_dir:
        found = _in_folder_or_child(Path(env_dir))
        if found is not None:
            return found
        logger.warning("$%s=%s holds no Multi30K (train.en(.gz)); searching elsewhere", DATA_ENV_VAR, env_dir)
        searched += [Path(env_dir), Path(env_dir) / "multi30k"]

    searched.append(LOCAL_DIR)
    if _holds_multi30k(LOCAL_DIR):
        return LOCAL_DIR.resolve()

    where = ", ".join(str(p.resolve()) for p in searched)
    if not download:
        raise FileNotFoundError(f"Multi30K not found (looked in {where})")
    logger.info("Multi30K not found locally (looked in %s); downloading it into %s", where, LOCAL_DIR)
    _download(LOCAL_DIR, where)
    return LOCAL_DIR.resolve()


def _download(target: Path, searched: str) -> None:
    """Fetch the missing raw files into ``target``, each written atomically."""
    target.mkdir(parents=True, exist_ok=True)
    for name in MULTI30K_FILES:
        path = target / name
        if path.is_file():
            continue  # kept from an earlier, interrupted download
        url = MULTI30K_URL + name
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                data = response.read()
        except (OSError, http.client.HTTPException) as err:  # URLError, HTTPError, timeouts are OSErrors
            raise _download_error(url, searched, err) from err
        # A proxy or captive portal can answer with an HTML page; do not store that as data.
        if not data.startswith(_GZIP_MAGIC):
            raise _download_error(url, searched, "the response is not a gzip file")
        atomic_write_bytes(path, data)
        logger.info("downloaded %s (%d bytes)", path, len(data))


def _download_error(url: str, searched: str, reason: object) -> RuntimeError:
    return RuntimeError(
        f"Multi30K was not found locally (looked in {searched}) and downloading {url} failed: {reason}. "
        f"Get the files {', '.join(MULTI30K_FILES)} from {MULTI30K_URL} by hand and pass their "
        f"folder with --data-dir or the {DATA_ENV_VAR} environment variable."
    )


def multi30k_prefix(split: str, data_dir: str | os.PathLike[str] | None = None, download: bool = True) -> str:
    """The file prefix of a Multi30K split ("train", "valid" or "test") for ``load_parallel``."""
    if split not in MULTI30K_SPLITS:
        raise ValueError(f"unknown Multi30K split {split!r}; expected one of {sorted(MULTI30K_SPLITS)}")
    return str(find_multi30k(data_dir, download=download) / MULTI30K_SPLITS[split])
