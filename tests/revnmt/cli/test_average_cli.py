"""revnmt-average on a toy run trained with --keep-checkpoints, and what translates with its output: the
averaged checkpoint, and the run's checkpoints as an ensemble. Mistakes are one line and status 2."""

import json
import logging
from pathlib import Path

import pytest
import tomllib
import torch
from conftest import TINY_MODEL, write_toy_corpus

from revnmt.checkpoint import load_checkpoint, numbered_checkpoints, save_checkpoint
from revnmt.cli import average, translate

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A toy run of two epochs that keeps the checkpoints of its two validations (steps 7 and 14)."""
    from revnmt.cli.train import main  # imported late: TRITON_INTERPRET is set by conftest first

    folder = tmp_path_factory.mktemp("average")
    corpus = write_toy_corpus(folder, {"train": 200, "valid": 20, "test": 10})
    assert main(["--train", corpus["train"], "--valid", corpus["valid"], "--save-dir", str(folder / "run"),
                 *TINY_MODEL, "--batch-size", "32", "--epochs", "2", "--keep-checkpoints", "2"]) == 0
    return folder / "run"


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("revnmt-average: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_the_average_of_a_runs_last_checkpoints_translates(run, tmp_path, capsys, caplog):
    kept = numbered_checkpoints(run)
    assert [path.name for path in kept] == ["step-00000007.pt", "step-00000014.pt"]
    output = tmp_path / "average.pt"
    assert average.main([str(run), "--last", "2", "-o", str(output)]) == 0
    assert f"averaged 2 checkpoints (steps 7, 14) into {output}" in capsys.readouterr().err
    averaged, first, last = (load_checkpoint(path) for path in (output, *kept))
    for key, value in averaged["model"].items():
        assert torch.allclose(value, (first["model"][key] + last["model"][key]) / 2, rtol=0, atol=1e-7)
    assert averaged["src_vocab"] == last["src_vocab"] and averaged["args"] == last["args"]

    (tmp_path / "in.en").write_text("A man runs in the park .\nThe small dog sleeps .\n")
    with caplog.at_level(logging.INFO):
        assert translate.main(["--checkpoint", str(output), "-i", str(tmp_path / "in.en"), "-o",
                               str(tmp_path / "out"), "--device", "cpu"]) == 0
    assert len((tmp_path / "out").read_text().splitlines()) == 2
    assert f"loaded {output} (average of 2 checkpoints, steps 7, 14)" in caplog.text

    # without --last: every numbered checkpoint the run keeps; given as files: the same average
    for inputs in ([str(run)], [str(path) for path in kept]):
        again = tmp_path / "again.pt"
        assert average.main([*inputs, "-o", str(again)]) == 0
        assert all(torch.equal(value, load_checkpoint(again)["model"][key]) for key, value in averaged["model"].items())


def test_a_runs_checkpoints_translate_as_an_ensemble(run, tmp_path, caplog):
    (tmp_path / "in.en").write_text("A man runs in the park .\n\nThe small dog sleeps .\n")
    (tmp_path / "ref.de").write_text("Ein mann läuft im park .\n\nDer kleiner hund schläft .\n")
    checkpoints = [str(path) for path in numbered_checkpoints(run)]
    for beam in ("1", "3"):
        with caplog.at_level(logging.INFO):
            assert translate.main(["--checkpoint", *checkpoints, "-i", str(tmp_path / "in.en"), "-o",
                                   str(tmp_path / "out"), "--beam", beam, "--replace-unk", "--length-penalty", "0.6",
                                   "--length-penalty-type", "gnmt", "--reference", str(tmp_path / "ref.de"), "--json",
                                   str(tmp_path / "scores.json"), "--device", "cpu"]) == 0
        assert len((tmp_path / "out").read_text().split("\n")) == 4
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert (scores["beam"], scores["length_penalty"], scores["length_penalty_type"]) == (3, 0.6, "gnmt")
    assert all(f"loaded {path} (step {step})" in caplog.text for path, step in zip(checkpoints, (7, 14)))


def test_averaging_mistakes_are_one_line_and_leave_the_inputs_alone(run, tmp_path, capsys):
    kept = numbered_checkpoints(run)
    before = [path.read_bytes() for path in kept]
    assert average.main([str(run), "--last", "3", "-o", str(tmp_path / "a.pt")]) == 2
    assert "--last 3: " in _one_line_error(capsys) and not (tmp_path / "a.pt").exists()
    assert average.main([str(kept[0]), str(kept[1]), "-o", str(kept[1])]) == 2
    assert "is one of the checkpoints to average" in _one_line_error(capsys)
    assert average.main([str(tmp_path), "-o", str(tmp_path / "a.pt")]) == 2
    assert "holds no numbered checkpoints" in _one_line_error(capsys)

    other = load_checkpoint(kept[0])
    other["src_vocab"] = other["src_vocab"][:-1]
    save_checkpoint(tmp_path / "other.pt", other)
    assert average.main([str(kept[0]), str(tmp_path / "other.pt"), "-o", str(tmp_path / "a.pt")]) == 2
    assert f"cannot average {kept[0]} and {tmp_path / 'other.pt'}: their source vocabularies" in _one_line_error(capsys)
    assert [path.read_bytes() for path in kept] == before

    for argv in ([str(kept[0]), "--last", "2", "-o", "x.pt"], [str(run), str(kept[0]), "-o", "x.pt"]):
        with pytest.raises(SystemExit) as stop:
            average.main(argv)
        assert stop.value.code == 2


def test_revnmt_average_is_a_console_script():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["revnmt-average"] == "revnmt.cli.average:main"
