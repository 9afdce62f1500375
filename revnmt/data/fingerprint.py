"""What a run's data were: each corpus file's path, size and SHA-256, saved in every checkpoint.

A resumed run continues at a saved position inside a list of batches made from its corpora. If the corpora
changed since, that position points into other batches (or past the last one), so resuming compares the
fingerprints first and refuses a changed corpus, naming what changed. Only sizes and contents are compared:
the same corpus found at another path (a moved Multi30K) is the same data.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .corpus import language_file

_CHUNK = 1 << 20


def corpus_fingerprint(train: str, valid: str, src: str, tgt: str) -> dict[str, dict]:
    """``{"train.en": {"path", "size", "sha256"}, ...}`` for both sides of the training and dev corpora (the
    file prefixes ``train`` and ``valid``); FileNotFoundError if a side is missing."""
    files = {f"{role}.{lang}": language_file(prefix, lang) for role, prefix in (("train", train), ("valid", valid))
             for lang in (src, tgt)}
    return {name: file_fingerprint(path) for name, path in files.items()}


def fingerprinted_prefixes(fingerprint: dict[str, dict], src: str) -> tuple[str, str]:
    """The training and dev corpora's file prefixes a fingerprint names (absolute), as ``--train`` and ``--valid``
    take them: a run's own corpora, wherever the command that trained it was started."""
    prefixes = []
    for role in ("train", "valid"):
        path = fingerprint[f"{role}.{src}"]["path"]
        prefixes.append(path.removesuffix(".gz").removesuffix(f".{src}"))
    return prefixes[0], prefixes[1]


def file_fingerprint(path: Path) -> dict:
    """Path, size and SHA-256 of one file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return {"path": str(path.resolve()), "size": path.stat().st_size, "sha256": digest.hexdigest()}


def fingerprint_changes(saved: dict[str, dict], current: dict[str, dict]) -> list[str]:
    """What differs between two fingerprints, one phrase per file (empty: the same data)."""
    changes = []
    for name in sorted(saved.keys() | current.keys()):
        old, new = saved.get(name), current.get(name)
        if old is None or new is None:
            changes.append(f"{name} {'added' if old is None else 'removed'}")
        elif old["size"] != new["size"]:
            changes.append(f"{name} {old['size']:,} -> {new['size']:,} bytes ({new['path']})")
        elif old["sha256"] != new["sha256"]:
            changes.append(f"{name} has other contents of the same size ({new['path']})")
    return changes
