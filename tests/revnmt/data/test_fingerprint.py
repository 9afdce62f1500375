"""Tests of revnmt.data.fingerprint: what changed in a run's corpora, and what does not count."""

import shutil

from revnmt.data.fingerprint import corpus_fingerprint, fingerprint_changes


def test_changes_in_size_or_content_are_named_and_a_moved_corpus_is_the_same(toy, tmp_path):
    saved = corpus_fingerprint(toy["train"], toy["valid"], "en", "de")
    assert set(saved) == {"train.en", "train.de", "valid.en", "valid.de"}
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("train.en", "train.de", "valid.en", "valid.de"):
        shutil.copy(tmp_path / name, moved / name)
    assert fingerprint_changes(saved, corpus_fingerprint(str(moved / "train"), str(moved / "valid"), "en", "de")) == []

    train_en = tmp_path / "train.en"
    text = train_en.read_text()
    train_en.write_text(text.swapcase())
    changed = fingerprint_changes(saved, corpus_fingerprint(toy["train"], toy["valid"], "en", "de"))
    assert changed == [f"train.en has other contents of the same size ({train_en})"]
    train_en.write_text(text[:10])
    changed = fingerprint_changes(saved, corpus_fingerprint(toy["train"], toy["valid"], "en", "de"))
    assert changed == [f"train.en {len(text.encode()):,} -> 10 bytes ({train_en})"]
