"""Prepared data: a run's corpora as token ids, written once as compact arrays and read memory-mapped.

Tokenizing and encoding a corpus takes minutes at a million pairs, and encoded pairs held as Python
objects would fill the process's memory. A folder of prepared data keeps, per dataset (the training and
the dev set), five flat ``.npy`` arrays: the source and target ids (int16 where the vocabulary allows,
else int32), their offsets and each pair's line in the corpus; beside them the SentencePiece models of a
subword run and ``manifest.json``: the key it was made for, the text options, the vocabularies and the
counts. A run reads the arrays with ``np.load(mmap_mode="r")``: only the pages its batches touch become
resident, and nothing is tokenized again at a resume or by a second run with the same key.

The key (:meth:`revnmt.data.loading.DataConfig.preparation_key`) is the corpora's fingerprints and every
option that changes the ids. A folder with another key is prepared anew and replaced whole: written
beside it, then renamed, so that a crash never leaves a half-written folder behind. Only a folder revnmt made
is replaced (:mod:`revnmt.folders`: it is marked, and holds nothing but prepared data), and never one the
corpora lie in. A staging folder left by a killed preparation is removed by the next one.

Nothing read is trusted: opening a folder checks every array against the manifest (shape, dtype, offsets
that rise from 0 to the ids' length, ids inside the vocabulary), so damage is one line naming the file instead
of a wrong batch or an IndexError deep in training.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from revnmt.folders import MARKER, PREPARED, check_outside, claim, marker_kind, write_marker

from .batching import EncodedDataset
from .encoding import ArrayWriter, id_dtype

MANIFEST = "manifest.json"
DATASETS = ("train", "valid")
_ARRAYS = ("src", "src_offsets", "tgt", "tgt_offsets", "lines")
#: The SentencePiece models of a subword run, by the field of DataOptions that holds them.
MODEL_FILES = {"src_spm": "src.spm", "tgt_spm": "tgt.spm"}
#: Everything a folder of prepared data holds: it is replaced whole only if it holds nothing else.
FILES = frozenset({MANIFEST, MARKER, *MODEL_FILES.values(), *(f"{name}.{part}.npy" for name in DATASETS
                                                               for part in _ARRAYS)})


class DamagedData(ValueError):
    """A folder of prepared data whose files do not agree with its manifest."""


def check_preparable(folder: Path, inputs: Iterable[Path]) -> None:
    """:class:`revnmt.folders.NotOurs` unless revnmt may prepare ``folder`` (replacing what it holds) from the files
    ``inputs``: checked before any work, and again when the new folder is put in place."""
    claim(folder, PREPARED, FILES)
    check_outside(folder, list(inputs))


def read_manifest(folder: Path, key: dict) -> dict | None:
    """The manifest of ``folder`` if it holds data prepared for ``key``, else None."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("key") == key else None


class Preparation:
    """A folder of prepared data being written: staged beside ``folder``, which it replaces whole on
    :meth:`commit`. As a context manager it removes the staging folder if the block fails (or never commits)."""

    def __init__(self, folder: Path, inputs: Iterable[Path] = ()) -> None:
        """``inputs``: the files it is prepared from, which must not lie inside ``folder``."""
        self.folder, self.inputs = folder, list(inputs)
        check_preparable(folder, self.inputs)
        folder.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(folder)
        # made with the user's umask, unlike mkdtemp; marked at once, so that a killed run's is known for ours
        self.staging = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
        _remove_ours(self.staging)
        self.staging.mkdir()
        write_marker(self.staging, PREPARED)
        self.counts: dict[str, dict[str, int]] = {}

    def __enter__(self) -> Preparation:
        return self

    def __exit__(self, *exc) -> None:
        _remove_ours(self.staging)

    def writer(self, name: str) -> ArrayWriter:
        """An :data:`revnmt.data.encoding.ArrayWriter` of dataset ``name``: each part an ``.npy`` file, written
        block by block (as :func:`revnmt.data.encoding.encode_corpus` produces them)."""
        def write(part: str, dtype: np.dtype, length: int, blocks: Iterable[np.ndarray]) -> None:
            with open(self.staging / f"{name}.{part}.npy", "wb") as f:
                np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                         "fortran_order": False, "shape": (length,)})
                written = 0
                for block in blocks:
                    f.write(np.ascontiguousarray(block, dtype=dtype).tobytes())
                    written += len(block)
            if written != length:
                raise RuntimeError(f"{name}.{part}: {written} values written for an array of {length}")
        return write

    def add(self, name: str, dataset: EncodedDataset, vocab_sizes: tuple[int, int]) -> None:
        """Write a dataset held in memory (the dev set) as dataset ``name``."""
        arrays = dataset.arrays()
        for side, size in zip(("src", "tgt"), vocab_sizes):
            arrays[side] = arrays[side].astype(id_dtype(size))
        for part in _ARRAYS:
            np.save(self.staging / f"{name}.{part}.npy", arrays[part])
        self.count(name, len(dataset), dataset.n_filtered)

    def count(self, name: str, pairs: int, filtered: int) -> None:
        """Record the counts of dataset ``name`` for the manifest."""
        self.counts[name] = {"pairs": pairs, "filtered": filtered}

    def commit(self, manifest: dict, models: dict[str, bytes]) -> dict:
        """Write the SentencePiece ``models`` (by :data:`MODEL_FILES` field) and ``manifest`` (its ``key``,
        ``src_vocab`` and ``tgt_vocab`` token lists included), and put the folder in place of the old one;
        returns the manifest as written (with the datasets' counts)."""
        for field, model in models.items():
            (self.staging / MODEL_FILES[field]).write_bytes(model)
        manifest = manifest | {"datasets": self.counts}
        (self.staging / MANIFEST).write_text(json.dumps(manifest, ensure_ascii=False) + "\n", encoding="utf-8")
        check_preparable(self.folder, self.inputs)  # the folder may have changed while this one was written
        old = self.folder.with_name(f".{self.folder.name}.{os.getpid()}.old")
        if self.folder.exists():
            os.replace(self.folder, old)
        os.replace(self.staging, self.folder)
        _remove_ours(old)
        return manifest


def read_models(folder: Path) -> dict[str, bytes]:
    """The SentencePiece models a folder holds, by the field of DataOptions they belong in (none for words)."""
    return {field: (folder / file).read_bytes() for field, file in MODEL_FILES.items() if (folder / file).is_file()}


def load_prepared(folder: Path, manifest: dict) -> dict[str, EncodedDataset]:
    """The memory-mapped datasets of a folder whose ``manifest`` :func:`read_manifest` returned, checked against
    it; :class:`DamagedData` naming the file that disagrees."""
    return {name: mapped_dataset(folder, name, Expected.of(folder, name, manifest)) for name in DATASETS}


@dataclass(frozen=True)
class Expected:
    """What dataset ``name`` of a manifest must hold; small, as a Hogwild! worker receives it with the dataset."""

    key_digest: str  # of the manifest's key: the folder must still hold the data of that key
    pairs: int
    filtered: int
    vocab: dict[str, int]  # vocabulary sizes, "src" and "tgt"

    @classmethod
    def of(cls, folder: Path, name: str, manifest: dict) -> Expected:
        try:
            counts = manifest["datasets"][name]
            return cls(_digest(manifest["key"]), int(counts["pairs"]), int(counts["filtered"]),
                       {side: len(manifest[f"{side}_vocab"]) for side in ("src", "tgt")})
        except (KeyError, TypeError, ValueError) as error:
            raise DamagedData(f"{folder / MANIFEST}: not a manifest of prepared data ({error!r})") from None


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def mapped_dataset(folder: Path, name: str, expected: Expected) -> EncodedDataset:
    """Dataset ``name`` of ``folder``, memory-mapped and checked against what its manifest says (and pickled as this
    call: see ``EncodedDataset.from_arrays``). A Hogwild! worker that unpickles it opens the folder again, so the
    folder's manifest is read again first: it must still hold the data of the same key."""
    try:
        on_disk = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DamagedData(f"{folder / MANIFEST}: unreadable ({error})") from None
    if not isinstance(on_disk, dict) or _digest(on_disk.get("key")) != expected.key_digest:
        raise DamagedData(f"{folder} was prepared again with other corpora or options while a run used it: give "
                          f"each run's data options their own --prepared folder")
    arrays = {part: _mapped_array(folder / f"{name}.{part}.npy") for part in _ARRAYS}
    _check_dataset(folder, name, arrays, expected)
    return EncodedDataset.from_arrays(arrays, expected.filtered, reopen=(mapped_dataset, (folder, name, expected)))


def _mapped_array(path: Path) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as error:  # missing, truncated ("mmap length is greater than file size"), no .npy
        raise DamagedData(f"{path}: damaged prepared data ({error})") from None
    if array.ndim != 1 or array.dtype.kind != "i":
        raise DamagedData(f"{path}: damaged prepared data (a {array.ndim}-d array of {array.dtype}, expected "
                          f"1-d integers)")
    return array


def _check_dataset(folder: Path, name: str, arrays: dict[str, np.ndarray], expected: Expected) -> None:
    """DamagedData unless the arrays of dataset ``name`` hold the expected pairs, whose offsets rise from 0 to the
    end of their ids, and whose ids are inside the vocabularies. Reads each array once (a second or so at a million
    pairs; the pages stay in the page cache for training)."""
    def damaged(part: str, what: str) -> DamagedData:
        return DamagedData(f"{folder / f'{name}.{part}.npy'}: damaged prepared data ({what}); prepare the folder "
                           f"again (revnmt made it: remove it and rerun)")

    pairs, vocab = expected.pairs, expected.vocab
    if len(arrays["lines"]) != pairs:
        raise damaged("lines", f"{len(arrays['lines'])} lines for {pairs} pairs")
    for side in ("src", "tgt"):
        ids, offsets = arrays[side], arrays[f"{side}_offsets"]
        if len(offsets) != pairs + 1:
            raise damaged(f"{side}_offsets", f"{len(offsets)} offsets for {pairs} pairs")
        if offsets[0] != 0 or offsets[-1] != len(ids) or (np.diff(offsets) < 0).any():
            raise damaged(f"{side}_offsets", f"offsets do not rise from 0 to the {len(ids)} ids")
        if len(ids) and (ids.min() < 0 or ids.max() >= vocab[side]):
            raise damaged(side, f"ids outside the vocabulary of {vocab[side]}")


_STAGING = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)\.(?:tmp|old)")


def _remove_stale(folder: Path) -> None:
    """Remove the staging folders beside ``folder`` that preparations killed before they ended left behind (their
    process is gone), if revnmt marked them."""
    for entry in folder.parent.iterdir():
        match = _STAGING.fullmatch(entry.name)
        if match and match["name"] == folder.name and not _alive(int(match["pid"])):
            _remove_ours(entry)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_ours(folder: Path) -> None:
    """Delete ``folder`` if it is revnmt's prepared data (marked so); leave anything else alone."""
    if folder.is_dir() and not folder.is_symlink() and marker_kind(folder) == PREPARED:
        shutil.rmtree(folder, ignore_errors=True)
