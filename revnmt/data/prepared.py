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
from pathlib import Path

import numpy as np

from .batching import EncodedDataset

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


def write_prepared(folder: Path, manifest: dict, models: dict[str, bytes],
                   datasets: dict[str, EncodedDataset]) -> dict:
    """Write ``datasets`` (``train``, ``valid``), the SentencePiece ``models`` (by :data:`MODEL_FILES` field)
    and ``manifest`` (its ``key``, ``src_vocab`` and ``tgt_vocab`` token lists included) into ``folder``,
    replacing what it held; returns the manifest as written (with the datasets' counts)."""
    staging = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")  # made with the user's umask, unlike mkdtemp
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        counts = {}
        for name, dataset in datasets.items():
            arrays = dataset.arrays()
            for side in ("src", "tgt"):
                arrays[side] = _ids(arrays[side], len(manifest[f"{side}_vocab"]))
            for part in _ARRAYS:
                np.save(staging / f"{name}.{part}.npy", arrays[part])
            counts[name] = {"pairs": len(dataset), "filtered": dataset.n_filtered}
        for field, model in models.items():
            (staging / MODEL_FILES[field]).write_bytes(model)
        manifest = manifest | {"datasets": counts}
        (staging / MANIFEST).write_text(json.dumps(manifest, ensure_ascii=False) + "\n", encoding="utf-8")
        old = folder.with_name(f".{folder.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if folder.exists():
            os.replace(folder, old)
        os.replace(staging, folder)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
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


def _ids(ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """Token ids as int16 where the vocabulary allows (half the bytes of int32)."""
    return ids.astype(np.int16) if vocab_size <= np.iinfo(np.int16).max + 1 else ids
