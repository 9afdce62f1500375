"""revnmt touches only the folders it made (docs/reliability.md, "Folders revnmt owns"): the console commands
pointed at a user's folders, files, links and damaged prepared data, as a careless user or a hostile
environment would."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import write_toy_corpus

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
TINY = ["--emb-dim", "16", "--hidden-size", "16", "--slice-dim", "4", "--buffer-lanes", "4", "--min-freq", "1",
        "--batch-size", "8", "--device", "cpu"]


def _run(command: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / command), *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def _refused(done: subprocess.CompletedProcess, message: str) -> None:
    """Exit 2 with one error line holding ``message`` and no traceback."""
    assert done.returncode == 2, done.stderr
    assert message in done.stderr.strip().splitlines()[-1], done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def _tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (links as their targets) and its SHA-256: what must not change."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(folder))] = "-> " + os.readlink(path)
        elif path.is_file():
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture
def project(tmp_path) -> Path:
    """A user's project: its corpora in data/, notes beside them."""
    (tmp_path / "data").mkdir()
    write_toy_corpus(tmp_path / "data", {"train": 60, "valid": 6})
    (tmp_path / "notes.txt").write_text("my notes\n")
    return tmp_path


def _data(project: Path) -> list[str]:
    return ["--train", str(project / "data" / "train"), "--valid", str(project / "data" / "valid")]


def test_prepare_refuses_a_folder_that_holds_its_corpora(project):
    before = _tree(project)
    done = _run("revnmt-prepare", "--prepared", str(project / "data"), *_data(project), "--min-freq", "1")
    _refused(done, "revnmt did not make")
    assert _tree(project) == before


def test_a_save_dir_holding_a_project_is_refused(project):
    before = _tree(project)
    done = _run("revnmt-train", *_data(project), "--save-dir", ".", *TINY, "--max-steps", "1", cwd=project)
    _refused(done, "revnmt did not make")
    assert _tree(project) == before


def test_corpora_inside_an_empty_prepared_folder_are_refused(project, tmp_path):
    # The folder holds nothing but a folder of corpora: replacing it would delete them.
    (project / "data" / "corpus").mkdir()
    write_toy_corpus(project / "data" / "corpus", {"train": 20, "valid": 4})
    inner = project / "data" / "corpus"
    before = _tree(project)
    done = _run("revnmt-prepare", "--prepared", str(inner.parent), "--train", str(inner / "train"),
                "--valid", str(inner / "valid"), "--min-freq", "1")
    _refused(done, "revnmt did not make")
    assert _tree(project) == before


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A finished run and its corpora."""
    folder = tmp_path_factory.mktemp("run")
    corpus = write_toy_corpus(folder, {"train": 60, "valid": 6})
    run = folder / "run"
    done = _run("revnmt-train", "--train", corpus["train"], "--valid", corpus["valid"], "--save-dir", str(run),
                *TINY, "--max-steps", "3")
    assert done.returncode == 0, done.stderr
    return run, corpus


def test_prepared_data_is_never_written_over_a_run(run_dir):
    run, corpus = run_dir
    before = _tree(run)
    done = _run("revnmt-prepare", "--prepared", str(run), "--train", corpus["train"], "--valid", corpus["valid"],
                "--min-freq", "1")
    _refused(done, "is revnmt's run, not prepared data")
    assert _tree(run) == before


def test_prepared_data_is_never_written_over_a_file(run_dir, tmp_path):
    _, corpus = run_dir
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    done = _run("revnmt-train", "--train", corpus["train"], "--valid", corpus["valid"], "--prepared", str(notes),
                "--save-dir", str(tmp_path / "run"), *TINY, "--max-steps", "1")
    _refused(done, "is not a folder")
    assert notes.read_text() == "mine\n"


@pytest.mark.parametrize("name, link, message", [(".lock", os.symlink, "symbolic link"),
                                                  (".lock", os.link, "not revnmt's lock file"),
                                                  ("train.log", os.symlink, "symbolic links")])
def test_a_run_file_that_links_elsewhere_is_never_written(run_dir, tmp_path, name, link, message):
    run, corpus = run_dir
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(run), str(copy)], check=True)
    (copy / name).unlink()
    link(victim, copy / name)
    done = _run("revnmt-train", "--train", corpus["train"], "--valid", corpus["valid"], "--save-dir", str(copy),
                *TINY, "--max-steps", "4")
    _refused(done, message)
    assert victim.read_text() == "precious\n"


def test_a_run_made_before_markers_resumes(run_dir, tmp_path):
    run, corpus = run_dir
    old = tmp_path / "old"
    subprocess.run(["cp", "-a", str(run), str(old)], check=True)
    (old / ".revnmt").unlink()
    (old / "data" / ".revnmt").unlink()
    done = _run("revnmt-train", "--train", corpus["train"], "--valid", corpus["valid"], "--save-dir", str(old),
                *TINY, "--max-steps", "4")
    assert done.returncode == 0, done.stderr
    assert "resumed" in (old / "train.log").read_text()
    assert json.loads((old / ".revnmt").read_text()) == {"kind": "run", "format": 1}


def _prepared(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    corpus = write_toy_corpus(tmp_path, {"train": 60, "valid": 6})
    folder = tmp_path / "prepared"
    done = _run("revnmt-prepare", "--prepared", str(folder), "--train", corpus["train"], "--valid", corpus["valid"],
                "--min-freq", "1")
    assert done.returncode == 0, done.stderr
    return folder, corpus


def _damage_ids(folder: Path) -> None:
    ids = np.load(folder / "train.src.npy", mmap_mode="r+")
    ids[3] = 30000


def _damage_offsets(folder: Path) -> None:
    offsets = np.load(folder / "train.tgt_offsets.npy", mmap_mode="r+")
    offsets[5] = offsets[4] - 1


def _shorten_vocabulary(folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["src_vocab"] = manifest["src_vocab"][:6]
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _truncate(folder: Path) -> None:
    path = folder / "train.tgt.npy"
    path.write_bytes(path.read_bytes()[:-10])


@pytest.mark.parametrize("damage", [_damage_ids, _damage_offsets, _shorten_vocabulary, _truncate])
def test_damaged_prepared_data_is_found_and_prepared_anew(tmp_path, damage):
    folder, corpus = _prepared(tmp_path)
    damage(folder)
    done = _run("revnmt-train", "--train", corpus["train"], "--valid", corpus["valid"], "--prepared", str(folder),
                "--save-dir", str(tmp_path / "run"), *TINY, "--max-steps", "2")
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "run" / "train.log").read_text()
    assert "damaged prepared data" in log and "preparing it anew" in log, log
    again = _run("revnmt-prepare", "--prepared", str(folder), "--train", corpus["train"], "--valid",
                 corpus["valid"], "--min-freq", "1")
    assert "prepared with these options already" in again.stderr and "anew" not in again.stderr, again.stderr


def test_a_staging_folder_left_by_a_killed_preparation_is_removed(tmp_path):
    folder, corpus = _prepared(tmp_path)
    dead = _dead_pid()
    stale = tmp_path / f".prepared.{dead}.tmp"
    stale.mkdir()
    (stale / ".revnmt").write_text(json.dumps({"kind": "prepared data", "format": 1}))
    (stale / "train.src.npy").write_bytes(b"x" * 1000)
    foreign = tmp_path / f".prepared.{dead}.old"  # not marked: not revnmt's, kept
    foreign.mkdir()
    done = _run("revnmt-prepare", "--prepared", str(folder), "--train", corpus["train"], "--valid", corpus["valid"],
                "--min-freq", "1", "--lowercase")  # other options: prepared anew
    assert done.returncode == 0, done.stderr
    assert not stale.exists() and foreign.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".prepared")) == [foreign.name]


def _dead_pid() -> int:
    """The PID of a process that has ended."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("holds", ["runs", "file"])
def test_the_gpu_check_refuses_a_folder_that_holds_anything(tmp_path, holds):
    # scripts/gpu_check.sh writes its logs, a toy corpus and runs into OUTDIR and removes the runs at the end: a
    # folder of the user's (a runs/ of their trainings) is refused before anything is written, on any machine.
    out = tmp_path / "out"
    target = out if holds == "runs" else tmp_path / "a-file"
    if holds == "runs":
        (out / "runs" / "mine").mkdir(parents=True)
        (out / "runs" / "mine" / "last.pt").write_text("weights")
    else:
        target.write_text("mine")
    before = _tree(tmp_path)
    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"
    done = subprocess.run(["bash", str(script), str(target)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "is not an empty folder" in done.stderr.strip().splitlines()[-1]
    assert _tree(tmp_path) == before
