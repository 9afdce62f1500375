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
beside it, then renamed, so that a crash never leaves a half-written folder behind.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from .batching import EncodedDataset
from .encoding import ArrayWriter, id_dtype

MANIFEST = "manifest.json"
DATASETS = ("train", "valid")
_ARRAYS = ("src", "src_offsets", "tgt", "tgt_offsets", "lines")
#: The SentencePiece models of a subword run, by the field of DataOptions that holds them.
MODEL_FILES = {"src_spm": "src.spm", "tgt_spm": "tgt.spm"}


def read_manifest(folder: Path, key: dict) -> dict | None:
    """The manifest of ``folder`` if it holds data prepared for ``key``, else None."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if manifest.get("key") == key else None


class Preparation:
    """A folder of prepared data being written: staged beside ``folder``, which it replaces whole on
    :meth:`commit`. As a context manager it removes the staging folder if the block fails (or never commits)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        # made with the user's umask, unlike mkdtemp
        self.staging = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        self.counts: dict[str, dict[str, int]] = {}

    def __enter__(self) -> Preparation:
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)

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
        old = self.folder.with_name(f".{self.folder.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if self.folder.exists():
            os.replace(self.folder, old)
        os.replace(self.staging, self.folder)
        shutil.rmtree(old, ignore_errors=True)
        return manifest


def read_models(folder: Path) -> dict[str, bytes]:
    """The SentencePiece models a folder holds, by the field of DataOptions they belong in (none for words)."""
    return {field: (folder / file).read_bytes() for field, file in MODEL_FILES.items() if (folder / file).is_file()}


def load_prepared(folder: Path, manifest: dict) -> dict[str, EncodedDataset]:
    """The memory-mapped datasets of a folder whose ``manifest`` :func:`read_manifest` returned."""
    return {name: mapped_dataset(folder, name, manifest["datasets"][name]["filtered"]) for name in DATASETS}


def mapped_dataset(folder: Path, name: str, n_filtered: int) -> EncodedDataset:
    """Dataset ``name`` of ``folder``, memory-mapped (and pickled as this call: see ``EncodedDataset.from_arrays``)."""
    arrays = {part: np.load(folder / f"{name}.{part}.npy", mmap_mode="r") for part in _ARRAYS}
    return EncodedDataset.from_arrays(arrays, n_filtered, reopen=(mapped_dataset, (folder, name, n_filtered)))
