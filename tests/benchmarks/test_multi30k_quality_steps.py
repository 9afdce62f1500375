"""benchmarks/multi30k.py after training a quality model, without training: the steps it still needs in fake run
directories (averaging, the length penalty tuned on the dev set, the test decodes with it, the ensemble of the
reversible runs), and the table rows those steps' files make."""

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_script

from revnmt.checkpoints import Checkpoint, TrainerState, TrainingState
from revnmt.data import DataOptions
from revnmt.model import ModelConfig, build_model

REPO = Path(__file__).resolve().parents[2]
REVGRU, REVLSTM, GRU = "revgru-emb+slice-bi-bpe8k", "revlstm-emb+slice-bi-bpe8k", "gru-hidden-bi-bpe8k"
FULL_GRID = ["average-0", "average-0.5", "average-1", "average-1.5", "gnmt-0.6", "gnmt-1"]


@pytest.fixture(scope="module")
def multi30k():
    """benchmarks/multi30k.py as a module."""
    return load_script("multi30k")


@pytest.fixture
def data(tmp_path):
    """A folder that passes for Multi30K: the script only names its files."""
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("train.en", "val.en", "val.de", "test_2016_flickr.en", "test_2016_flickr.de"):
        (folder / name).write_text("a\n")
    return folder


def options(multi30k, tmp_path, data, *more):
    return multi30k.parse_args(["--runs", str(tmp_path / "runs"), "--data-dir", str(data), *more])


def value(command: list[str], option: str, count: int = 1) -> list[str] | str:
    """What follows ``option`` in ``command``: its value, or its next ``count`` words."""
    start = command.index(option) + 1
    return command[start] if count == 1 else command[start: start + count]


def checkpoints(command: list[str]) -> list[str]:
    """A revnmt-translate command's --checkpoint paths."""
    return command[command.index("--checkpoint") + 1: command.index("-i")]


def write_json(path: Path, content: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content))


def scores(penalty_type: str, alpha: float, sacrebleu: float, beam: int = 5) -> dict:
    """What revnmt-translate --json writes."""
    return {"beam": beam, "length_penalty": alpha, "length_penalty_type": penalty_type, "replace_unk": False,
            "sacrebleu": sacrebleu, "tokenized_bleu": sacrebleu + 0.5, "signature": "nrefs:1|case:lc|tok:13a"}


def finished_run(run: Path) -> None:
    """A run directory as training leaves it: test.json and the kept checkpoints (empty: never loaded here)."""
    run.mkdir(parents=True)
    write_json(run / "test.json", scores("average", 1.0, 30.0))
    for step in range(5):
        (run / f"step-{step:08d}.pt").touch()


def test_a_finished_quality_run_is_averaged_then_tuned_then_scored(multi30k, tmp_path, data):
    args = options(multi30k, tmp_path, data, "--models", "quality")
    model, run = multi30k.MODELS[REVGRU], tmp_path / "runs" / REVGRU
    train = multi30k.train_command(args, model)
    assert value(train, "--keep-checkpoints") == "5" and train.count("--keep-checkpoints") == 1
    assert value(train, "--epochs") == "60"
    # --quick keeps the checkpoints too, and averages the fewer that 2 epochs leave
    quick = options(multi30k, tmp_path, data, "--quick")
    assert "--keep-checkpoints" in multi30k.train_command(quick, model)
    assert "--last" not in multi30k.average_command(quick, model)
    assert "--keep-checkpoints" not in multi30k.train_command(args, multi30k.MODELS["revgru-emb+slice-3bit-bpe8k"])

    # Untrained: training first, then what is known before the length penalty is chosen.
    steps = multi30k.pending_steps(args, model)
    assert [s.output.name for s in steps] == ["test.json", "memory.json", "average.pt",
                                              *(f"{g}.json" for g in FULL_GRID), "length-penalty.json"]
    assert steps[0].command == train and steps[-1].command is None

    finished_run(run)
    write_json(run / "memory.json", {})
    average, *grid, choose = multi30k.pending_steps(args, model)
    assert average.command[2:] == ["revnmt.cli.average", str(run), "--last", "5", "-o", str(run / "average.pt")]
    dev = grid[1].command
    assert checkpoints(dev) == [str(run / "average.pt")] and value(dev, "--beam") == "5"
    assert Path(value(dev, "-i")) == data / "val.en" and Path(value(dev, "--reference")) == data / "val.de"
    assert value(dev, "--length-penalty", 3) == ["0.5", "--length-penalty-type", "average"]
    assert value(dev, "--json") == str(run / "dev-length-penalty/average-0.5.json")
    assert value(dev, "-o") == str(run / "dev-length-penalty/average-0.5.hyp")

    # Resumable: a dev decode already done is not run again. The choice takes the best dev sacreBLEU, the first
    # of equals in grid order.
    (run / "average.pt").touch()
    dev_scores = dict(zip(FULL_GRID, [30.1, 31.0, 31.3, 30.9, 31.2, 31.3]))
    write_json(run / "dev-length-penalty/average-0.5.json", scores("average", 0.5, dev_scores["average-0.5"]))
    steps = multi30k.pending_steps(args, model)
    assert [s.output.stem for s in steps] == [g for g in FULL_GRID if g != "average-0.5"] + ["length-penalty"]
    for name, sacrebleu in dev_scores.items():
        penalty_type, alpha = name.split("-")
        write_json(run / f"dev-length-penalty/{name}.json", scores(penalty_type, float(alpha), sacrebleu))
    [choose] = multi30k.pending_steps(args, model)
    assert choose.action() == "length penalty average 1: dev sacreBLEU 31.30, the best of 6"
    choice = json.loads((run / "length-penalty.json").read_text())
    assert (choice["length_penalty_type"], choice["length_penalty"], choice["dev_sacrebleu"]) == ("average", 1.0, 31.3)
    assert [point["sacrebleu"] for point in choice["grid"]] == list(dev_scores.values())

    # With the choice made, the test decodes use it: best.pt, then average.pt.
    best, averaged = multi30k.pending_steps(args, model)
    assert (best.output.name, averaged.output.name) == ("test-best-lp.json", "test-average.json")
    for step, checkpoint in ((best, "best.pt"), (averaged, "average.pt")):
        assert checkpoints(step.command) == [str(run / checkpoint)]
        assert Path(value(step.command, "-i")) == data / "test_2016_flickr.en"
        assert value(step.command, "--length-penalty", 3) == ["1", "--length-penalty-type", "average"]
    write_json(run / "test-best-lp.json", scores("average", 1.0, 33.0))
    write_json(run / "test-average.json", scores("average", 1.0, 34.0))
    assert multi30k.pending_steps(args, model) == []


def test_word_models_are_scored_with_replace_unk_and_not_averaged(multi30k, tmp_path, data):
    args = options(multi30k, tmp_path, data)
    run = tmp_path / "runs" / "gru-hidden"
    finished_run(run)
    [step] = multi30k.pending_steps(args, multi30k.MODELS["gru-hidden"])
    assert step.output == run / "test-replace-unk.json" and "--replace-unk" in step.command
    assert checkpoints(step.command) == [str(run)] and value(step.command, "--json") == str(step.output)
    assert Path(value(step.command, "-i")) == data / "test_2016_flickr.en"
    assert "--length-penalty" not in step.command


def test_the_ensemble_waits_for_every_reversible_run_and_tunes_its_own_penalty(multi30k, tmp_path, data):
    args = options(multi30k, tmp_path, data, "--models", f"{REVGRU},{GRU}")
    runs = tmp_path / "runs"
    assert [m.name for m in multi30k.ensemble_members()] == [REVGRU, REVLSTM]
    assert multi30k.reports_ensemble(args) and not multi30k.reports_ensemble(options(multi30k, tmp_path, data))
    finished_run(runs / REVGRU)
    (runs / REVGRU / "average.pt").touch()
    assert multi30k.unaveraged_members(args) == [REVLSTM] and multi30k.ensemble_steps(args) == []

    finished_run(runs / REVLSTM)
    (runs / REVLSTM / "average.pt").touch()
    *grid, choose = multi30k.ensemble_steps(args)
    tuning = runs / "ensemble-reversible"
    assert [s.output for s in grid] == [tuning / "dev-length-penalty" / f"{g}.json" for g in FULL_GRID]
    members = [str(runs / REVGRU / "average.pt"), str(runs / REVLSTM / "average.pt")]
    assert checkpoints(grid[0].command) == members and Path(value(grid[0].command, "-i")) == data / "val.en"
    assert choose.output == runs / "ensemble-reversible/length-penalty.json"

    write_json(choose.output, {"length_penalty_type": "average", "length_penalty": 0.5, "grid": []})
    [test] = multi30k.ensemble_steps(args)
    assert test.output == runs / "ensemble-reversible.json"
    assert checkpoints(test.command) == members and value(test.command, "--length-penalty") == "0.5"
    assert Path(value(test.command, "-i")) == data / "test_2016_flickr.en"


def fake_training(run: Path) -> None:
    """last.pt and valid.tsv of a finished run: what the table's training columns read."""
    vocab = ["<pad>", "<unk>", "<s>", "</s>", "a"]
    config = ModelConfig(rnn="gru", emb_dim=4, hidden_size=4, attention="hidden", src_vocab=5, tgt_vocab=5)
    trainer = TrainerState(best_step=20, best_bleu=32.5, train_s=100.0, train_tokens=50000)
    data = DataOptions("en", "de", lowercase=True, max_len=50)
    Checkpoint(config, build_model(config).state_dict(), vocab, vocab, data,
               training=TrainingState({"state": {}}, {}, trainer, {})).save(run / "last.pt")
    (run / "valid.tsv").write_text("step\tepoch\tdev_bleu\telapsed_s\n10\t1\t30.0\t60\n20\t2\t32.5\t120\n")


def tuning(best: tuple[str, float], sacrebleus: dict[str, float]) -> dict:
    """length-penalty.json."""
    grid = [{"length_penalty_type": name.split("-")[0], "length_penalty": float(name.split("-")[1]), "beam": 5,
             "sacrebleu": value, "tokenized_bleu": value + 0.5} for name, value in sacrebleus.items()]
    return {"chosen_by": "dev sacreBLEU", "length_penalty_type": best[0], "length_penalty": best[1],
            "dev_sacrebleu": max(sacrebleus.values()), "grid": grid}


def test_the_report_has_a_row_per_tuned_decoding_and_the_ensemble(multi30k, tmp_path, data):
    runs = tmp_path / "runs"
    for name in (REVGRU, REVLSTM, GRU):
        finished_run(runs / name)
        fake_training(runs / name)
    write_json(runs / REVGRU / "length-penalty.json", tuning(("gnmt", 1.0), {"average-1": 31.0, "gnmt-1": 31.5}))
    write_json(runs / REVGRU / "test-best-lp.json", scores("gnmt", 1.0, 33.25))
    write_json(runs / REVGRU / "test-average.json", scores("gnmt", 1.0, 34.25))
    write_json(runs / REVLSTM / "length-penalty.json", tuning(("average", 1.0), {"average-1": 32.0, "gnmt-1": 31.0}))
    write_json(runs / REVLSTM / "test-best-lp.json", scores("average", 1.0, 33.75))  # its average not decoded yet
    write_json(runs / "ensemble-reversible/length-penalty.json",
               tuning(("average", 0.5), {"average-0.5": 33.0, "average-1": 32.5}))
    write_json(runs / "ensemble-reversible.json", scores("average", 0.5, 35.5))

    kept = tmp_path / "kept"
    assert multi30k.main(["--models", "quality", "--report", "--runs", str(runs), "--data-dir", str(data),
                          "--results", str(kept)]) == 1  # the LSTM has not started
    table = (runs / "results.md").read_text()
    head, _, *rows = table.split("\n\n")[0].splitlines()  # the results table
    assert [row.split(" | ")[0] for row in rows[:6]] == [
        "| revgru (BPE 8k)", "| revgru (BPE 8k): best, length penalty gnmt 1",
        "| revgru (BPE 8k): averaged, length penalty gnmt 1", "| gru (BPE 8k)", "| revlstm (BPE 8k)",
        "| revlstm (BPE 8k): best, length penalty average 1"]
    assert rows[2].startswith("| revgru (BPE 8k): averaged, length penalty gnmt 1 | emb+slice | 3 | 34.75 | 34.25 | "
                              "– |")
    assert rows[6].startswith("| revgru + revlstm (BPE 8k): averaged, length penalty average 0.5 | emb+slice | 3 | "
                              "36.00 | 35.50 | – |")
    assert len(rows) == 7 and all(row.count(" | ") == head.count(" | ") for row in rows)
    assert "| revgru (BPE 8k) | emb+slice | 3 | 30.50 | 30.00 | – / – | 32.50 | 2 / 2 |" in table  # training's own

    # The tuning: one row per tuned system, a column per penalty tried, the chosen one in bold.
    assert "| averaged | average 1 | gnmt 1 | average 0.5 |" in table
    assert "| revgru (BPE 8k) emb+slice, 3 bits | 31.00 | **31.50** |  |" in table
    assert "| revgru + revlstm (BPE 8k) emb+slice, 3 bits | 32.50 |  | **33.00** |" in table

    report = json.loads((runs / "results.json").read_text())
    revgru, gru, revlstm = report["results"]
    assert [d["checkpoint"] for d in revgru["decodings"]] == ["best", "averaged"] and "decodings" not in gru
    assert revgru["length_penalty_tuning"]["length_penalty_type"] == "gnmt"
    assert report["ensemble"]["members"] == [REVGRU, REVLSTM]
    assert report["ensemble"]["decodings"][0]["test_sacrebleu"] == 35.5
    assert (kept / "ensemble-reversible.json").is_file()
    assert (kept / "ensemble-reversible/length-penalty.json").is_file()
    assert sorted(p.name for p in (kept / REVGRU).iterdir()) == [
        "length-penalty.json", "test-average.json", "test-best-lp.json", "test.json", "valid.tsv"]

    # Older groups' tables are as they were: no tuned rows, no tuning table, no ensemble.
    subword = runs / "revgru-emb+slice-3bit-bpe8k"
    finished_run(subword)
    fake_training(subword)
    assert multi30k.main(["--models", subword.name, "--report", "--runs", str(runs)]) == 0
    assert "ensemble" not in json.loads((runs / "results.json").read_text())
    table = (runs / "results.md").read_text()
    assert "length penalty" not in table and len(table.split("\n\n")[0].splitlines()) == 3


def test_the_report_reads_a_run_from_the_small_files_kept_without_its_checkpoints(multi30k, tmp_path, data):
    # What --results keeps (no last.pt): the best step as train.log's last validation names it, its dev BLEU and
    # epoch from valid.tsv; the run's own tokens/s is not known.
    run = tmp_path / "runs" / REVGRU
    finished_run(run)
    (run / "valid.tsv").write_text("epoch\tstep\tdev_bleu\telapsed_s\n1\t10\t30.0\t60\n2\t20\t32.5\t120\n"
                                   "3\t30\t32.0\t180\n")
    (run / "train.log").write_text(
        "2026-01-01 00:00:00 INFO validation after epoch 1, step 10: dev loss 2.000 | ppl 7.39 | BLEU 30.00 (best)\n"
        "2026-01-01 00:01:00 INFO validation after epoch 2, step 20: dev loss 1.900 | ppl 6.69 | BLEU 32.50 (best)\n"
        "2026-01-01 00:02:00 INFO validation after epoch 3, step 30: dev loss 1.950 | ppl 7.03 | BLEU 32.00 "
        "(best 32.50 at step 20)\n")
    assert multi30k.logged_best_step(run) == 20
    row = multi30k.collect(options(multi30k, tmp_path, data), multi30k.MODELS[REVGRU], {})
    assert (row["best_epoch"], row["dev_bleu"], row["epochs_trained"], row["run_tokens_per_s"]) == (2, 32.5, 3, None)
    assert row["finished"] and row["test_sacrebleu"] == 30.0
