"""The console commands as users run them (installed by ``pip install -e .``, as scripts/setup.sh does):
subprocesses, a tiny RevGRU, a few hundred pairs."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from revnmt.checkpoint import load_checkpoint
from revnmt.data import find_multi30k, read_lines

REPO = Path(__file__).resolve().parents[2]
SIZES = {"train": 300, "val": 40, "test": 20}


def _write_corpus(folder: Path) -> Path:
    """The first pairs of real Multi30K if it is here, else a word-by-word toy language."""
    try:
        multi30k = find_multi30k(download=False)
        pairs = {split: [read_lines(multi30k / f"{split if split != 'test' else 'test_2016_flickr'}.{lang}.gz")[:n]
                         for lang in ("en", "de")] for split, n in SIZES.items()}
    except FileNotFoundError:
        rng, words = random.Random(0), {"a": "ein", "man": "mann", "dog": "hund", "runs": "läuft", "red": "roter"}
        sentences = {split: [rng.choices(list(words), k=rng.randint(2, 8)) for _ in range(n)]
                     for split, n in SIZES.items()}
        pairs = {split: [[" ".join(s) + "." for s in ss], [" ".join(words[w] for w in s) + "." for s in ss]]
                 for split, ss in sentences.items()}
    for split, (en, de) in pairs.items():
        (folder / f"{split}.en").write_text("".join(f"{line}\n" for line in en), encoding="utf-8")
        (folder / f"{split}.de").write_text("".join(f"{line}\n" for line in de), encoding="utf-8")
    return folder


BIN = Path(sys.executable).parent  # the environment's console scripts


def _run(command: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / command), *args], cwd=REPO, input=stdin, capture_output=True, timeout=600)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _write_corpus(tmp_path_factory.mktemp("corpus"))


def test_train_resume_translate(corpus, tmp_path):
    run = tmp_path / "run"
    command = ["--train", str(corpus / "train"), "--valid", str(corpus / "val"), "--test", str(corpus / "test"),
               "--lowercase", "--save-dir", str(run), "--rnn", "revgru", "--attention", "emb+slice", "--emb-dim", "32",
               "--hidden-size", "32", "--slice-dim", "8", "--min-freq", "1", "--batch-size", "32", "--test-beam", "2",
               "--device", "cpu"]
    first = _run("revnmt-train", *command, "--max-steps", "4")
    assert first.returncode == 0, first.stderr.decode()
    assert {p.name for p in run.iterdir()} == {"config.json", "src.vocab", "tgt.vocab", "last.pt", "best.pt",
                                               "train.log", "valid.tsv", "test.hyp", "test.json"}
    assert len((run / "test.hyp").read_text(encoding="utf-8").splitlines()) == SIZES["test"]

    resumed = _run("revnmt-train", *command, "--max-steps", "12")  # across the end of epoch 1 (10 batches)
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert "resumed" in resumed.stderr.decode() and "validation after epoch 1, step 10" in resumed.stderr.decode()
    assert load_checkpoint(run / "last.pt")["trainer"]["step"] == 12
    assert len((run / "valid.tsv").read_text().splitlines()) == 1 + 3  # header, steps 4, 10 and 12

    out = tmp_path / "test.hyp"
    translated = _run("revnmt-translate", "--checkpoint", str(run), "-i", str(corpus / "test.en"), "-o", str(out),
                      "--reference", str(corpus / "test.de"), "--beam", "3", "--json", str(tmp_path / "scores.json"))
    assert translated.returncode == 0, translated.stderr.decode()
    assert len(out.read_text(encoding="utf-8").splitlines()) == SIZES["test"]
    err = translated.stderr.decode()
    assert "sacreBLEU: BLEU = " in err and "(signature: nrefs:1|case:lc|" in err
    assert "tokenized lowercased BLEU (paper): " in err
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["beam"] == 3 and not scores["replace_unk"] and scores["signature"].startswith("nrefs:1|case:lc|")
    assert f"tokenized lowercased BLEU (paper): {scores['tokenized_bleu']:.2f}" in err


def test_translate_reads_stdin_and_reports_bad_input(corpus, tmp_path):
    run = tmp_path / "run"
    trained = _run("revnmt-train", "--train", str(corpus / "train"), "--valid", str(corpus / "val"), "--save-dir",
                   str(run), "--emb-dim", "16", "--hidden-size", "16", "--slice-dim", "4", "--max-steps", "1",
                   "--device", "cpu")
    assert trained.returncode == 0, trained.stderr.decode()

    lines = b"A man.\n\n\xff\xfe broken bytes\r\nTwo dogs.\n"
    translated = _run("revnmt-translate", "--checkpoint", str(run / "last.pt"), "--beam", "1", "--replace-unk",
                      stdin=lines)
    assert translated.returncode == 0, translated.stderr.decode()
    outputs = translated.stdout.decode("utf-8").split("\n")
    assert len(outputs) == 4 + 1 and outputs[1] == "" and outputs[-1] == ""  # one line each, newline-terminated
    assert "stdin: invalid UTF-8 replaced by U+FFFD on 1 line(s): 3" in translated.stderr.decode()

    for args in (["--checkpoint", str(tmp_path / "nowhere")], ["--checkpoint", str(run), "-i", "missing.txt"]):
        failed = _run("revnmt-translate", *args, stdin=b"")
        assert failed.returncode == 2
        assert failed.stderr.decode().startswith("revnmt-translate: error: ") and b"Traceback" not in failed.stderr


def test_every_command_answers_help_and_the_top_level_scripts_are_the_same_commands():
    for command in ("revnmt-train", "revnmt-translate", "revnmt-memory"):
        shown = _run(command, "--help")
        assert shown.returncode == 0 and b"usage: " + command.encode() in shown.stdout, shown.stderr
    for script, command in (("train.py", "revnmt-train"), ("translate.py", "revnmt-translate")):
        shim = subprocess.run([sys.executable, script, "--help"], cwd=REPO, capture_output=True, timeout=120)
        assert shim.returncode == 0 and shim.stdout == _run(command, "--help").stdout
