"""revnmt-translate's mistakes and failures, in process: each one line and status 2, found before any
translating where it can be, and never at the cost of an old output file. The model is a stand-in; the
real command is run in tests/system/test_faults_translate.py."""

import errno
import json
import math
import os
import re
import signal
import sys
import time
from collections.abc import Iterable, Iterator

import pytest
import torch
from conftest import device_node

from buffers import FixedPointOverflowError
from revnmt.checkpoints import Checkpoint, TrainerState, TrainingState
from revnmt.cli import translate
from revnmt.data import DataOptions, Vocabulary
from revnmt.model import ModelConfig, build_model
from revnmt.translation import Translation
from revnmt.translation.length_penalty import LengthPenalty


class _Shouting:
    """Stands in for a trained Translator: a line's translation is the line in capitals, the next best ones add
    exclamation marks. Keeps the checkpoints it was loaded from and the options it was asked to translate with."""

    data = DataOptions("en", "de", lowercase=False, max_len=None)

    def __init__(self, checkpoints: list[str] | None = None) -> None:
        self.checkpoints, self.options = checkpoints, {}

    def check_replace_unk(self, replace_unk: bool = True) -> None:
        pass

    def translate_nbest(self, lines: list[str], nbest: int | None, **options) -> list[list[Translation]]:
        self.options = dict(options, nbest=nbest)
        return [[Translation(line.upper() + "!" * k, -0.5 * (k + 1)) for k in range(nbest or 1)] for line in lines]

    def translate_stream_nbest(self, lines: Iterable[str], nbest: int | None, **options) -> Iterator[list[Translation]]:
        for line in lines:
            yield from self.translate_nbest([line], nbest, **options)


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


@pytest.mark.parametrize("options, message", [
    (["-i", "in.en", "-o", "in.en"], "-o {in.en} is the same file as -i {in.en}"),
    (["-i", "in.en", "-o", "hard.en"], "-o {hard.en} is the same file as -i {in.en}"),  # a hard link
    (["-i", "soft.en", "-o", "in.en"], "-o {in.en} is the same file as -i {soft.en}"),  # a symbolic link
    (["-i", "in.en", "--reference", "ref.de", "-o", "ref.de"], "-o {ref.de} is the same file as --reference {ref.de}"),
    (["-i", "in.en", "--reference", "ref.de", "--json", "ref.de"],
     "--json {ref.de} is the same file as --reference {ref.de}"),
    (["-i", "in.en", "--reference", "ref.de", "--json", "in.en"], "--json {in.en} is the same file as -i {in.en}"),
    (["-i", "in.en", "--reference", "ref.de", "-o", "new", "--json", "new"],
     "-o {new} is the same file as --json {new}"),
])
def test_an_output_that_would_replace_an_input_is_refused_before_any_work(source, tmp_path, monkeypatch, capsys,
                                                                         options, message):
    (tmp_path / "ref.de").write_text("ein mann\nder hund\n")
    os.link(source, tmp_path / "hard.en")
    (tmp_path / "soft.en").symlink_to("in.en")
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    monkeypatch.setattr(translate.Translator, "from_checkpoints", lambda *args: pytest.fail("loaded a checkpoint"))
    argv = [str(tmp_path / option) if not option.startswith("-") else option for option in options]
    assert translate.main(["--checkpoint", "any", *argv]) == 2
    expected = re.sub(r"\{(.*?)\}", lambda name: str(tmp_path / name.group(1)), message)
    assert f"error: {expected}: choose another" in _one_line_error(capsys)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


def test_a_device_may_be_both_input_and_output(source, tmp_path):
    null = device_node(tmp_path, "null")  # written in place, never replaced: as -i /dev/stdin -o /dev/stdout on a tty
    assert translate.main(["--checkpoint", "any", "-i", null, "-o", null]) == 0


def _interrupt(signum: int):
    """A stand-in for work that a signal interrupts: it sends ``signum`` to this process, which raises in it."""
    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signum)
        time.sleep(10)
        pytest.fail(f"{signal.Signals(signum).name} did not interrupt")
    return interrupted


@pytest.fixture
def unhandled_signals_fail():
    """SIGINT and SIGTERM fail the test unless the command handles them (SIGTERM would kill pytest)."""
    def unhandled(signum, frame):
        raise AssertionError(f"{signal.Signals(signum).name} was not handled")

    before = {signum: signal.signal(signum, unhandled) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield unhandled
    for signum, handler in before.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("where", ["translating", "writing"])
def test_a_signal_stops_with_one_line_its_status_and_the_old_output(source, tmp_path, monkeypatch, capsys,
                                                                     unhandled_signals_fail, signum, where):
    out = tmp_path / "out.de"
    out.write_text("yesterday's translations\n")
    interrupted = (_Shouting, "translate_nbest") if where == "translating" else (os, "fsync")
    monkeypatch.setattr(*interrupted, _interrupt(signum))
    assert translate.main(["--checkpoint", "any", "-i", str(source), "-o", str(out)]) == 128 + signum
    assert capsys.readouterr().err == f"revnmt-translate: interrupted by {signal.Signals(signum).name}\n"
    assert out.read_text() == "yesterday's translations\n" and sorted(os.listdir(tmp_path)) == ["in.en", "out.de"]
    assert signal.getsignal(signal.SIGINT) is signal.getsignal(signal.SIGTERM) is unhandled_signals_fail  # restored


def test_a_model_whose_states_overflow_is_one_line(source, monkeypatch, capsys):
    # A checkpoint of a diverged reversible run: its fixed-point states leave their range while encoding.
    def overflowing(self, lines, nbest, **options):
        raise FixedPointOverflowError("a fixed-point value left the int32 range")

    monkeypatch.setattr(_Shouting, "translate_nbest", overflowing)
    assert translate.main(["--checkpoint", "run", "-i", str(source)]) == 2
    assert "the model's weights overflow its fixed-point states" in _one_line_error(capsys)


def test_nbest_writes_numbered_lists_and_scores_the_first_of_each(source, tmp_path):
    source.write_text("a man rides a red bike\ntwo dogs play in the snow\n")
    (tmp_path / "ref.de").write_text("A MAN RIDES A RED BIKE\nTWO DOGS PLAY IN THE SNOW\n")
    assert translate.main(["--checkpoint", "any", "-i", str(source), "-o", str(tmp_path / "out"), "--nbest", "2",
                           "--reference", str(tmp_path / "ref.de"), "--json", str(tmp_path / "scores.json")]) == 0
    assert (tmp_path / "out").read_text() == (
        "0 ||| A MAN RIDES A RED BIKE ||| -0.500000\n0 ||| A MAN RIDES A RED BIKE! ||| -1.000000\n"
        "1 ||| TWO DOGS PLAY IN THE SNOW ||| -0.500000\n1 ||| TWO DOGS PLAY IN THE SNOW! ||| -1.000000\n")
    assert json.loads((tmp_path / "scores.json").read_text())["sacrebleu"] == pytest.approx(100.0)


@pytest.mark.parametrize("nbest", [None, 3])
def test_nbest_lists_stream_from_a_pipe_numbered_across_batches(tmp_path, monkeypatch, capsys, nbest):
    monkeypatch.setattr(translate.Translator, "from_checkpoints", lambda *args: _Shouting())
    (tmp_path / "in.en").write_text("a man\nthe dog\nsnow\n")
    options = ["--checkpoint", "any", "--batch-size", "1"] + (["--nbest", str(nbest)] if nbest else [])
    assert translate.main([*options, "-i", str(tmp_path / "in.en"), "-o", str(tmp_path / "out")]) == 0
    read, write = os.pipe()
    os.write(write, b"a man\nthe dog\nsnow\n")
    os.close(write)
    with open(read) as pipe:
        monkeypatch.setattr(sys, "stdin", pipe)
        assert translate.main(options) == 0
    assert capsys.readouterr().out == (tmp_path / "out").read_text()
    assert (tmp_path / "out").read_text().splitlines()[-1] == ("2 ||| SNOW!! ||| -1.500000" if nbest else "SNOW")


@pytest.mark.parametrize("options, message", [
    (["--nbest", "3", "--beam", "2"], "--nbest 3 needs --beam 3 or more, got --beam 2"),
    (["--nbest", "2", "--beam", "1"], "--nbest 2 needs --beam 2 or more, got --beam 1"),
    (["--nbest", "6"], "--nbest 6 needs --beam 6 or more, got --beam 5"),  # the default beam
    (["--nbest", "0"], "--nbest must be positive, got 0"),
    (["--nbest", "-2", "--beam", "1"], "--nbest must be positive, got -2"),
])
def test_nbest_beyond_the_beam_is_a_usage_error_before_any_loading(tmp_path, monkeypatch, capsys, options, message):
    monkeypatch.setattr(translate.Translator, "from_checkpoints", lambda *args: pytest.fail("loaded a checkpoint"))
    with pytest.raises(SystemExit) as stop:
        translate.main(["--checkpoint", "any", "-i", str(tmp_path / "in.en"), *options])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"revnmt-translate: error: {message}" in err and err.count("error") == 1


WORDS = Vocabulary(sorted(set("a man rides a red bike . two dogs play in the snow".split())))


def test_an_ensemble_writes_nbest_lists_whose_first_translations_are_its_translations(tmp_path):
    checkpoints = []
    for seed, rnn in enumerate(["revgru", "gru"]):
        torch.manual_seed(seed)
        model = build_model(ModelConfig(rnn=rnn, emb_dim=8, hidden_size=8, slice_dim=2, src_vocab=len(WORDS),
                                        tgt_vocab=len(WORDS)))
        checkpoints.append(str(tmp_path / f"{rnn}.pt"))
        Checkpoint(model.cfg, model.state_dict(), WORDS.itos, WORDS.itos, DataOptions("en", "de", True, 5),
                   training=TrainingState({}, {}, TrainerState(step=3), {})).save(checkpoints[-1])
    (tmp_path / "in.en").write_text("Two dogs play.\n\nA man rides a red bike in the snow.\n")
    (tmp_path / "ref.de").write_text("two dogs play .\n\na man rides .\n")
    runs = {}
    for name, nbest in (("one-best", []), ("nbest", ["--nbest", "3"])):
        assert translate.main(["--checkpoint", *checkpoints, "-i", str(tmp_path / "in.en"), "--beam", "3", *nbest,
                               "--length-penalty", "0.6", "--length-penalty-type", "gnmt", "-o",
                               str(tmp_path / name), "--reference", str(tmp_path / "ref.de"), "--json",
                               str(tmp_path / f"{name}.json")]) == 0
        runs[name] = (tmp_path / name).read_text().splitlines()
    lists = [re.fullmatch(r"(\d+) \|\|\| (.*) \|\|\| (\S+)", line).groups() for line in runs["nbest"]]
    numbers = [int(number) for number, _, _ in lists]
    assert numbers == [0, 0, 0, 1, 2, 2, 2]  # the line without words has one translation, the empty one
    assert lists[3][1:] == ("", "nan")
    for number in (0, 2):
        texts, scores = zip(*[(text, float(score)) for i, text, score in lists if int(i) == number])
        assert texts[0] == runs["one-best"][number] and len(set(texts)) == 3
        assert list(scores) == sorted(scores, reverse=True) and all(math.isfinite(score) for score in scores)
    assert (json.loads((tmp_path / "nbest.json").read_text()) == json.loads((tmp_path / "one-best.json").read_text()))
