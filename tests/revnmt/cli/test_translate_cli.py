"""revnmt-translate's mistakes and failures, in process: each one line and status 2, found before any
translating where it can be, and never at the cost of an old output file. The model is a stand-in; the
real command is run in tests/system/test_faults_translate.py."""

import errno
import os
import re
import sys

import pytest

from revnmt.cli import translate
from revnmt.length_penalty import LengthPenalty


class _Shouting:
    """Stands in for a trained Translator: a line's translation is the line in capitals. Keeps the checkpoints it
    was loaded from and the options it was asked to translate with."""

    def __init__(self, checkpoints: list[str] | None = None) -> None:
        self.checkpoints, self.options = checkpoints, {}

    def check_replace_unk(self, replace_unk: bool = True) -> None:
        pass

    def translate(self, lines: list[str], **options) -> list[str]:
        self.options = options
        return [line.upper() for line in lines]


@pytest.fixture
def source(tmp_path, monkeypatch):
    """A file of two sentences to translate, with the stand-in model loaded for any checkpoint."""
    monkeypatch.setattr(translate.Translator, "from_checkpoints", lambda *args: _Shouting())
    path = tmp_path / "in.en"
    path.write_text("a man\nthe dog\n")
    return path


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("revnmt-translate: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_the_stand_in_translates(source, tmp_path):
    assert translate.main(["--checkpoint", "any", "-i", str(source), "-o", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out").read_text() == "A MAN\nTHE DOG\n"


@pytest.mark.parametrize("option", ["-o", "--json"])
@pytest.mark.parametrize("where, message", [
    ("/proc/out.txt", "cannot write /proc/out.txt"),
    ("missing/out.txt", "the folder .*missing does not exist"),
    ("in.en/out.txt", "in.en is not a folder"),
    (".", "is a directory"),
])
def test_an_output_that_cannot_be_written_fails_before_the_checkpoint_is_even_read(tmp_path, capsys, option, where,
                                                                                   message):
    (tmp_path / "in.en").write_text("a man\n")
    options = ["--reference", str(tmp_path / "in.en")] if option == "--json" else []
    assert translate.main(["--checkpoint", str(tmp_path / "no-such-run"), "-i", str(tmp_path / "in.en"),
                           option, str(tmp_path / where), *options]) == 2
    err = _one_line_error(capsys)
    assert re.search(message, err) and "no-such-run" not in err


def test_a_full_disk_while_writing_the_output_keeps_the_old_file(source, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out.de"
    out.write_text("yesterday's translations\n")

    def full_disk(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full_disk)
    assert translate.main(["--checkpoint", "any", "-i", str(source), "-o", str(out)]) == 2
    assert f"cannot write {out}: No space left on device" in _one_line_error(capsys)
    assert out.read_text() == "yesterday's translations\n"
    assert sorted(os.listdir(tmp_path)) == ["in.en", "out.de"]


@pytest.mark.parametrize("stream, message", [
    ("stdin", "stdin is closed: give -i FILE or pipe sentences in"),
    ("stdout", "stdout is closed: give -o FILE or redirect the output"),
])
def test_a_closed_stdin_or_stdout_is_said_so(source, monkeypatch, capsys, stream, message):
    monkeypatch.setattr(sys, stream, None)  # as Python sets it when started with <&- or >&-
    options = ["-i", str(source)] if stream == "stdout" else []
    assert translate.main(["--checkpoint", "any", *options]) == 2
    assert message in _one_line_error(capsys)


@pytest.mark.parametrize("name, data, message", [
    ("in.en.gz", b"\x1f\x8b\x08\x00", "in.en.gz: truncated or corrupt gzip file"),
    ("folder", None, "folder is a directory"),
])
def test_an_input_that_cannot_be_read_is_said_so(source, tmp_path, capsys, name, data, message):
    if data is None:
        (tmp_path / name).mkdir()
    else:
        (tmp_path / name).write_bytes(data)
    assert translate.main(["--checkpoint", "any", "-i", str(tmp_path / name)]) == 2
    assert message in _one_line_error(capsys)


def test_several_checkpoints_and_the_length_penalty_reach_the_translator(source, tmp_path, monkeypatch):
    loaded = []
    monkeypatch.setattr(translate.Translator, "from_checkpoints",
                        lambda paths, *args: loaded.append(_Shouting(paths)) or loaded[-1])
    assert translate.main(["--checkpoint", "a.pt", "runs/b", "-i", str(source), "-o", str(tmp_path / "out")]) == 0
    assert loaded[-1].checkpoints == ["a.pt", "runs/b"]
    assert loaded[-1].options["length_penalty"] == LengthPenalty(1.0, "average")  # the default: mean per token
    assert translate.main(["--checkpoint", "a.pt", "-i", str(source), "-o", str(tmp_path / "out"),
                           "--length-penalty", "0.6", "--length-penalty-type", "gnmt"]) == 0
    assert loaded[-1].options["length_penalty"] == LengthPenalty(0.6, "gnmt")


@pytest.mark.parametrize("options, message", [
    (["--length-penalty", "-1"], "argument --length-penalty: must be a number >= 0, got -1"),
    (["--length-penalty-type", "wu"], "argument --length-penalty-type: invalid choice: 'wu'"),
    (["--checkpoint"], "argument --checkpoint: expected at least one argument"),
])
def test_length_penalty_and_checkpoint_mistakes_are_usage_errors(source, capsys, options, message):
    with pytest.raises(SystemExit) as stop:
        translate.main(["--checkpoint", "a.pt", "-i", str(source), *options])
    assert stop.value.code == 2 and message in capsys.readouterr().err
