"""benchmarks/data_scale.py on a tiny corpus synthesized from Multi30K and a tiny model: every phase reaches its
figure, the resumed and prepared runs read their prepared ids as they are."""

import gzip
import json
import os
import random
import subprocess
import sys
from numbers import Real
from pathlib import Path

import pytest
from benchmark_scripts import load_script
from conftest import TINY_MODEL

from revnmt.data import find_multi30k

REPO = Path(__file__).resolve().parents[2]
PAIRS = 300


@pytest.mark.slow
def test_each_phase_times_its_process_and_reads_its_memory(tmp_path):
    try:
        multi30k = find_multi30k(download=False)
    except FileNotFoundError as error:
        pytest.skip(str(error))
    out, work = tmp_path / "scale.json", tmp_path / "work"
    model = [option for option in TINY_MODEL if option not in ("--log-every", "2", "--device", "cpu")]
    command = [sys.executable, str(REPO / "benchmarks/data_scale.py"), "--pairs", str(PAIRS), "--text", "words",
               "--work", str(work), "--json", str(out), "--", *model]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "REVNMT_DATA": str(multi30k)})
    assert done.returncode == 0, done.stderr[-3000:]

    report = json.loads(out.read_text())
    assert report["cpu_count"] == os.cpu_count() and report["extra"] == model
    [case] = report["cases"]
    assert (case["pairs"], case["text"]) == (PAIRS, "words")
    prepare, first, resumed, prepared = (case[name] for name in ("prepare", "first_run", "resumed_run",
                                                                 "prepared_run"))
    assert prepare["command"][2:4] == ["revnmt.cli.prepare", "--train"] and prepare["exit_status"] == 0
    assert "--hidden-size" not in prepare["command"] and "--min-freq" in prepare["command"]  # data options only
    assert prepare["pairs_per_s"] == pytest.approx(PAIRS / prepare["seconds"])
    assert first["step"] == 1 and first["saved_step"] >= 1
    assert resumed["command"] == first["command"] and resumed["step"] == first["saved_step"] + 1
    assert prepared["step"] == 1 and "--prepared" in prepared["command"]
    assert not resumed["data_rewritten"] and not prepared["data_rewritten"]
    for run in (first, resumed, prepared):
        assert run["exit_status"] == 130  # stopped by the SIGINT, after saving
        assert 0 < run["start_seconds"] < run["seconds"]
        assert isinstance(run["step_peak_mib"], Real) and run["step_peak_mib"] > 0
    for phase in (prepare, first, resumed, prepared):
        assert isinstance(phase["seconds"], Real) and phase["seconds"] > 0
        assert isinstance(phase["max_rss_mib"], Real) and phase["max_rss_mib"] > 0
        assert phase["tree_peak_pss_mib"] is None or phase["tree_peak_pss_mib"] > 0
    assert f"{PAIRS}" in done.stdout.splitlines()[1] and "words" in done.stdout.splitlines()[1]

    # the corpus: line i joins the same two Multi30K sentences on both sides, drawn by random.Random(seed 0)
    for lang in ("en", "de"):
        sentences = gzip.decompress((multi30k / f"train.{lang}.gz").read_bytes()).decode().splitlines()
        rng = random.Random(0)
        lines = (work / f"corpus-{PAIRS}-seed0.{lang}").read_text(encoding="utf-8").splitlines()
        assert len(lines) == PAIRS
        for line in lines[:20]:
            assert line == f"{sentences[rng.randrange(len(sentences))]} {sentences[rng.randrange(len(sentences))]}"


def test_a_work_folder_of_the_users_is_never_emptied(tmp_path):
    # --work DIR: the benchmark empties only the case folders it made (marked), and refuses one holding other files.
    data_scale = load_script("data_scale")
    mine = tmp_path / "300-words"
    (mine / "run").mkdir(parents=True)
    (mine / "run" / "last.pt").write_text("the user's")
    with pytest.raises(SystemExit, match="did not make"):
        data_scale.case_folder(mine)
    assert (mine / "run" / "last.pt").read_text() == "the user's"
    with pytest.raises(ValueError, match="not a case folder"):
        data_scale.fresh(mine / "run")
    assert (mine / "run" / "last.pt").exists()
    made = data_scale.case_folder(tmp_path / "new")
    (made / "run").mkdir()
    assert data_scale.case_folder(made) == made and not data_scale.fresh(made / "run").exists()
