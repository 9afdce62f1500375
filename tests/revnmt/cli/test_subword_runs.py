"""Subword runs from the command line: revnmt-train --subword, revnmt-translate and revnmt-memory on its
checkpoint, resuming, and the mistakes a user can make, on the toy corpus with a tiny model."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from revnmt.checkpoints import Checkpoint
from revnmt.cli import memory, translate
from revnmt.data import SubwordTokenizer, Vocabulary

SUBWORD = ["--subword", "bpe", "--vocab-size", "400"]  # the toy corpus's characters and 256 byte pieces need ~300
TRAINED = "trained a SentencePiece bpe model of 400 pieces"


def test_a_subword_run_keeps_its_model_and_translates_raw_text_from_the_checkpoint_alone(train, toy, tmp_path,
                                                                                          capsys):
    run = tmp_path / "run"
    assert train(run, *SUBWORD, "--max-steps", "3", "--test", toy["test"], "--test-beam", "2") == 0
    assert {p.name for p in run.iterdir()} == {".lock", ".revnmt", "data", "config.json", "src.vocab", "tgt.vocab",
                                               "spm.model", "last.pt", "best.pt", "train.log", "valid.tsv",
                                               "test.hyp", "test.json"}
    model = (run / "spm.model").read_bytes()
    checkpoint = Checkpoint.load(run / "best.pt")
    assert checkpoint.data.src_spm == checkpoint.data.tgt_spm == model
    assert Vocabulary.load(run / "src.vocab") == SubwordTokenizer(model).vocabulary()
    assert checkpoint.src_vocab == checkpoint.tgt_vocab == SubwordTokenizer(model).vocabulary().itos
    config = json.loads((run / "config.json").read_text())
    assert (config["subword"], config["vocab_size"], config["joint_vocab"], config["lowercase"]) == (
        "bpe", 400, True, False)
    log = (run / "train.log").read_text()
    assert TRAINED in log and "vocabularies: en 400, de 400 pieces; pieces per training sentence" in log
    assert len((run / "test.hyp").read_text().splitlines()) == 10

    alone = tmp_path / "alone" / "model.pt"  # no spm.model, no vocabularies: the checkpoint holds them
    alone.parent.mkdir()
    shutil.copy(run / "best.pt", alone)
    lines = ["A man runs in the Park 😀 .", "", "The DOG sleeps in a street named Zoë-Ærøskøbing ."]
    (tmp_path / "in.en").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    (tmp_path / "ref.de").write_text("Ein Mann läuft im Park 😀 .\n\nDer HUND schläft .\n", encoding="utf-8")
    out, scores = tmp_path / "out.de", tmp_path / "scores.json"
    capsys.readouterr()
    assert translate.main(["--checkpoint", str(alone), "-i", str(tmp_path / "in.en"), "-o", str(out), "--beam", "2",
                           "--device", "cpu", "--reference", str(tmp_path / "ref.de"), "--json", str(scores)]) == 0
    outputs = out.read_text(encoding="utf-8").split("\n")
    assert len(outputs) == len(lines) + 1 and outputs[1] == "" and outputs[-1] == ""
    assert not any("▁" in line or "<0x" in line for line in outputs)  # decoded, not pieces
    result = json.loads(scores.read_text())
    assert "case:mixed" in result["signature"] and "tokenized_bleu" in result

    assert translate.main(["--checkpoint", str(alone), "-i", str(tmp_path / "in.en"), "--replace-unk"]) == 2
    assert "--replace-unk is for word vocabularies" in capsys.readouterr().err

    report = tmp_path / "memory.json"
    assert memory.main(["--checkpoint", str(run), "--train", toy["train"], "--valid", toy["valid"], "--batches", "2",
                        "--batch-size", "8", "--device", "cpu", "--json", str(report)]) == 0
    saved = json.loads(report.read_text())
    assert saved["config"]["src_vocab"] == saved["config"]["tgt_vocab"] == 400 and saved["batches"] == 2


def test_per_language_models_are_kept_side_by_side(train, tmp_path):
    run = tmp_path / "run"
    assert train(run, "--subword", "unigram", "--vocab-size", "300", "--no-joint-vocab", "--max-steps", "1") == 0
    names = {p.name for p in run.iterdir()}
    assert {"src.spm.model", "tgt.spm.model"} <= names and "spm.model" not in names
    data = Checkpoint.load(run / "last.pt").data
    assert (data.src_spm, data.tgt_spm) == ((run / "src.spm.model").read_bytes(),
                                                  (run / "tgt.spm.model").read_bytes())
    # A user's ready models: the run's own, given back with --spm-model.
    given = tmp_path / "given"
    assert train(given, "--spm-model", str(run / "src.spm.model"), str(run / "tgt.spm.model"), "--max-steps", "1") == 0
    assert Checkpoint.load(given / "last.pt").data == data
    assert TRAINED.replace("bpe", "unigram") not in (given / "train.log").read_text()


def test_resuming_reuses_the_stored_model_and_never_retrains_it(train, toy, tmp_path, capsys):
    run = tmp_path / "run"
    assert train(run, *SUBWORD, "--max-steps", "2") == 0
    model = (run / "spm.model").read_bytes()
    # The corpus changes under the same name: a model trained again would differ.
    for lang in ("en", "de"):
        path = Path(f"{toy['train']}.{lang}")
        path.write_text(path.read_text(encoding="utf-8").upper(), encoding="utf-8")
    assert train(run, *SUBWORD, "--max-steps", "4") == 2  # refused unless asked for (the position means nothing now)
    assert "train.en has other contents of the same size" in capsys.readouterr().err
    assert train(run, *SUBWORD, "--max-steps", "4", "--restart-epoch") == 0
    checkpoint = Checkpoint.load(run / "last.pt")
    assert checkpoint.step == 4 and checkpoint.data.src_spm == model
    assert (run / "spm.model").read_bytes() == model
    assert (run / "train.log").read_text().count(TRAINED) == 1 and "resumed" in capsys.readouterr().err

    assert train(run, "--subword", "unigram", "--vocab-size", "400", "--max-steps", "6") == 2
    assert "--subword bpe -> unigram" in capsys.readouterr().err


def _write(prefix: Path, en: str, de: str) -> str:
    prefix.with_suffix(".en").write_text(en, encoding="utf-8")
    prefix.with_suffix(".de").write_text(de, encoding="utf-8")
    return str(prefix)


@pytest.mark.parametrize("case, options, message", [
    ("empty", [], "corpus file is empty: "),
    ("blank", [], "has no pair with text on both sides"),
    ("toy", ["--vocab-size", "5000"], "--vocab-size 5000 is more pieces than this training data can give: it allows "
                                      "at most "),
    ("toy", ["--vocab-size", "100"], "--vocab-size 100 is too small: the characters of the training data, the 256 "
                                     "byte pieces and the specials need at least "),
])
def test_training_data_that_cannot_give_the_model_is_one_line_and_nothing_is_written(train, toy, tmp_path, capsys,
                                                                                     case, options, message):
    prefix = {"empty": lambda: _write(tmp_path / "empty", "", ""),
              "blank": lambda: _write(tmp_path / "blank", " \n\n", "\t\n\n"),
              "toy": lambda: toy["train"]}[case]()
    run = tmp_path / "run"
    assert train(run, "--subword", "bpe", *options, train_prefix=prefix) == 2
    _assert_one_line_error(capsys, message)
    # no model, vocabulary, config or temporary file
    assert sorted(p.name for p in run.iterdir()) == [".lock", ".revnmt", "train.log"]


@pytest.mark.parametrize("content, message", [
    (None, "SentencePiece model not found: "),
    (b"a man runs\n", ": not a SentencePiece model (corrupt, truncated or another file)"),
    (b"", ": empty, not a SentencePiece model"),
])
def test_a_missing_or_corrupt_model_file_is_one_line_and_nothing_is_written(train, tmp_path, capsys, content,
                                                                             message):
    path = tmp_path / "user.model"
    if content is not None:
        path.write_bytes(content)
    run = tmp_path / "run"
    assert train(run, "--spm-model", str(path)) == 2
    _assert_one_line_error(capsys, message)
    assert sorted(p.name for p in run.iterdir()) == [".lock", ".revnmt", "train.log"]


def test_a_checkpoint_with_a_corrupt_model_is_refused_and_left_as_it_was(train, tmp_path, capsys):
    run = tmp_path / "run"
    assert train(run, *SUBWORD, "--max-steps", "1") == 0
    checkpoint = Checkpoint.load(run / "last.pt")
    replace(checkpoint, data=replace(checkpoint.data, tgt_spm=checkpoint.data.tgt_spm[:100])).save(run / "last.pt")
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert train(run, *SUBWORD, "--max-steps", "2") == 2
    _assert_one_line_error(capsys, f"{run / 'last.pt'}: the de SentencePiece model: not a SentencePiece model")
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert after.keys() == before.keys()
    assert all(after[name] == before[name] for name in before if name.name != "train.log")

    assert translate.main(["--checkpoint", str(run / "last.pt"), "-i", str(run / "config.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("revnmt-translate: error: ") and "not a SentencePiece model" in err
    assert "Traceback" not in err


def _assert_one_line_error(capsys, message: str) -> None:
    """One error line, holding ``message``, and no traceback (a warning may come before it: a corpus's
    dropped empty pairs)."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err
