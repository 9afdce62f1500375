"""The console commands as users run them (installed by ``pip install -e .``, as scripts/setup.sh does):
subprocesses, a tiny RevGRU, a few hundred pairs."""

import json
import queue
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from revnmt.checkpoints import Checkpoint
from revnmt.data import decode_lines, find_multi30k, read_lines
from revnmt.translation.translator import Translator

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


@pytest.fixture(scope="module")
def tiny_run(corpus, tmp_path_factory) -> Path:
    """A run directory of a default model trained for one step, scaled down."""
    run = tmp_path_factory.mktemp("tiny") / "run"
    trained = _run("revnmt-train", "--train", str(corpus / "train"), "--valid", str(corpus / "val"), "--save-dir",
                   str(run), "--emb-dim", "16", "--hidden-size", "16", "--slice-dim", "4", "--max-steps", "1",
                   "--device", "cpu")
    assert trained.returncode == 0, trained.stderr.decode()
    return run


def test_train_resume_translate(corpus, tmp_path):
    run = tmp_path / "run"
    command = ["--train", str(corpus / "train"), "--valid", str(corpus / "val"), "--test", str(corpus / "test"),
               "--lowercase", "--save-dir", str(run), "--rnn", "revgru", "--attention", "emb+slice", "--emb-dim", "32",
               "--hidden-size", "32", "--slice-dim", "8", "--min-freq", "1", "--batch-size", "32", "--test-beam", "2",
               "--device", "cpu"]
    first = _run("revnmt-train", *command, "--max-steps", "4")
    assert first.returncode == 0, first.stderr.decode()
    assert {p.name for p in run.iterdir()} == {".lock", ".revnmt", "data", "config.json", "src.vocab", "tgt.vocab",
                                               "last.pt", "best.pt", "train.log", "valid.tsv", "test.hyp", "test.json"}
    assert len((run / "test.hyp").read_text(encoding="utf-8").splitlines()) == SIZES["test"]

    resumed = _run("revnmt-train", *command, "--max-steps", "12")  # across the end of epoch 1 (10 batches)
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert "resumed" in resumed.stderr.decode() and "validation after epoch 1, step 10" in resumed.stderr.decode()
    assert Checkpoint.load(run / "last.pt").step == 12
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


def test_translate_reads_stdin_and_reports_bad_input(tiny_run, tmp_path):
    run = tiny_run
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


@pytest.mark.slow
def test_translate_streams_stdin_and_matches_the_file_path(tiny_run, corpus, tmp_path):
    sources = read_lines(corpus / "test.en")[:9]
    # An empty line, invalid UTF-8 and Windows line ends among them.
    raw = [s.encode() for s in sources[:4]] + [b"", b"\xff broken"] + [s.encode() + b"\r" for s in sources[4:]]
    references = tmp_path / "refs.de"
    references.write_text("".join(f"{line}\n" for line in read_lines(corpus / "test.de")[: len(raw)]), encoding="utf-8")
    stderr = tmp_path / "stderr"
    with stderr.open("wb") as err:  # a file: a pipe nobody reads could fill up and block the translator
        process = subprocess.Popen([str(BIN / "revnmt-translate"), "--checkpoint", str(tiny_run), "--beam", "2",
                                    "--batch-size", "4", "--reference", str(references)],
                                   cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    replies: queue.Queue[bytes | None] = queue.Queue()

    def read_replies() -> None:
        for line in process.stdout:
            replies.put(line)
        replies.put(None)

    threading.Thread(target=read_replies, daemon=True).start()
    try:
        process.stdin.write(raw[0] + b"\n")
        process.stdin.flush()
        try:  # stdin stays open: the first line must be translated without more input or its end
            first = replies.get(timeout=120)
        except queue.Empty:
            pytest.fail(f"no translation of a first line before end of input: {stderr.read_text()}")
        process.stdin.write(b"".join(line + b"\n" for line in raw[1:]))
        process.stdin.close()
        assert process.wait(timeout=300) == 0, stderr.read_text()
    finally:
        process.kill()
    outputs = [first, *iter(replies.get, None)]
    assert all(line.endswith(b"\n") for line in outputs)
    # A sentence translates the same alone, in the stream's batches or in the file path's sorted ones.
    expected = Translator.from_checkpoint(tiny_run).translate(decode_lines(b"\n".join(raw), "raw"), beam=2)
    assert [line.decode("utf-8")[:-1] for line in outputs] == expected
    assert len(set(expected)) > 2  # enough different outputs for the order to show
    err = stderr.read_text()
    assert "stdin: invalid UTF-8 replaced by U+FFFD on 1 line(s): 6" in err and "sacreBLEU: BLEU = " in err

    references.write_text("one line\n", encoding="utf-8")
    mismatch = _run("revnmt-translate", "--checkpoint", str(tiny_run), "--reference", str(references), stdin=b"a\nb\n")
    assert mismatch.returncode == 2 and mismatch.stdout.count(b"\n") == 2
    assert f"revnmt-translate: error: {references} has 1 lines but the input has 2" in mismatch.stderr.decode()


def test_translate_reads_a_redirected_file_whole_and_stops_quietly_when_the_reader_leaves(tiny_run, corpus):
    sources = corpus / "test.en"
    with sources.open("rb") as stdin:  # a regular file on stdin: read whole, batches sorted by length
        redirected = subprocess.run([str(BIN / "revnmt-translate"), "--checkpoint", str(tiny_run), "--beam", "2"],
                                    stdin=stdin, capture_output=True, timeout=300)
    assert redirected.returncode == 0, redirected.stderr.decode()
    expected = Translator.from_checkpoint(tiny_run).translate(read_lines(sources), beam=2)
    assert redirected.stdout.decode("utf-8").split("\n")[:-1] == expected

    # The reader has gone (as after | head): no traceback, as with other Unix tools.
    with sources.open("rb") as stdin:
        process = subprocess.Popen([str(BIN / "revnmt-translate"), "--checkpoint", str(tiny_run), "--beam", "1"],
                                   stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        process.stdout.close()
        _, err = process.communicate(timeout=300)
    assert process.returncode == 1 and b"Traceback" not in err, err.decode()
