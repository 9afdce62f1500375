"""Multi30K En→De results: reversible against ordinary models, BLEU and memory, in one table.

    python benchmarks/multi30k.py                      # the four core models, trained to convergence
    python benchmarks/multi30k.py --quick              # the whole pipeline in minutes (small models, few pairs)
    python benchmarks/multi30k.py --models all --jobs 2 --threads 1
    python benchmarks/multi30k.py --models subword --jobs 2 --threads 1   # the core models on BPE pieces
    python benchmarks/multi30k.py --report             # the table of what RUNS holds now, training nothing

Every model trains with revnmt-train in RUNS/<name>, with the paper's Multi30K setup (its defaults:
1+1 layers, 300-unit embeddings and states, dropout 0.4, batch 64, tokenized and lowercased) and Adam
(lr 1e-3, halved whenever the dev loss does not improve, stopped after 5 epochs without a better dev
BLEU or below lr 1e-5, at most 30 epochs). Training itself scores test2016 with best.pt at beam 5
(test.json); ``revnmt-translate --replace-unk`` scores it again with every ``<unk>`` replaced by the
attended source word, as the paper's BLEU was (test-replace-unk.json). Reversible models are then
measured on their trained gates with ``revnmt-memory --checkpoint`` (memory.json): encoder and decoder
ratios, and the token batch that fits --memory-budget, for the model and for its ordinary counterpart
of the same size.

The ``subword`` models are the core four on SentencePiece pieces instead of Moses words: a joint BPE
model of 8,000 pieces trained on the training corpus (``--subword bpe --vocab-size 8000 --joint-vocab``),
lowercased like the word models, so that both BLEUs compare with theirs and the paper's. They have no
``--replace-unk`` score: subwords leave no ``<unk>`` to replace.

The ``quality`` models (``*-bi-bpe8k``) keep the checkpoints of their last 5 validations
(``--keep-checkpoints 5``), and are decoded three more ways after training: ``revnmt-average RUN --last 5``
averages those checkpoints (average.pt); the length penalty is tuned on the dev set, the averaged model
translating it at beam 5 with each penalty of a small grid (dev-length-penalty/), the one of best dev
sacreBLEU chosen (length-penalty.json); test2016 is scored with that penalty from best.pt (test-best-lp.json)
and from average.pt (test-average.json). Once every reversible ``quality`` run has its average.pt, their
ensemble is tuned on the dev set in the same way and scored on test2016 (RUNS/ensemble-reversible/ and
RUNS/ensemble-reversible.json).

Running the command again resumes unfinished runs (training resumes exactly) and skips finished
steps (each is done once its output file exists), so a long CPU campaign can be stopped and continued.
The table goes to stdout, RUNS/results.md and RUNS/results.json; runs still training appear with their
progress so far.
``--speed N`` times N training batches of every model, the models taking turns, with the same threads
(speed.json), so that the tokens/s column compares like with like; the runs' own averages depend on
what else shared the machine. ``--results DIR`` also copies the table and each run's small files (logs,
dev scores, test and memory reports, the test2016 translations; no checkpoints) to DIR, to be kept with the code.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from machine import cpu_name

from revnmt.arguments import run_config as train_config
from revnmt.atomic import atomic_write_text
from revnmt.checkpoints import BEST_CHECKPOINT, LAST_CHECKPOINT, Checkpoint
from revnmt.data import Batch, BatchSampler, language_file, load_data, make_batch, multi30k_prefix
from revnmt.memory.sizes import format_bytes
from revnmt.model import build_model
from revnmt.profiling.speed import tokens_per_second
from revnmt.training.config import byte_size
from revnmt.training.schedule import build_optimizer
from revnmt.training.trainer import clip_and_step, compute_gradients
from revnmt.translation import LengthPenalty

ROOT = Path(__file__).resolve().parent.parent  # where runs/ goes by default

POLL_S = 30.0  # how often running jobs' progress is checked


@dataclass(frozen=True)
class Model:
    name: str  # the run directory's name
    rnn: str
    attention: str
    bits: str  # max forgetting, "" for ordinary models
    text: tuple[str, ...] = ()  # revnmt-train's subword options; none: Moses-tokenized words
    extra: tuple[str, ...] = ()  # further model options of revnmt-train
    # how long and with which lanes a full run trains (--quick replaces it): the first campaign's runs were 30 epochs
    # at most, when 16 buffer lanes were the default; they are pinned so that its runs resume exactly
    training: tuple[str, ...] = ("--epochs", "30", "--buffer-lanes", "16")
    # --keep-checkpoints N (--quick included): the last N validations' checkpoints are kept, averaged after training
    # and decoded with a length penalty tuned on the dev set; 0: none
    keep_checkpoints: int = 0
    slice_dim: int = 20  # encoder units a direction that slice attention reads

    @property
    def reversible(self) -> bool:
        return self.rnn.startswith("rev")

    @property
    def subwords(self) -> bool:
        return bool(self.text)

    @property
    def attention_label(self) -> str:
        """The attention as the tables name it: with the slice's units a direction where they are not 20."""
        return f"{self.attention} ({self.slice_dim})" if "slice" in self.attention and self.slice_dim != 20 \
            else self.attention

    def options(self) -> list[str]:
        options = ["--rnn", self.rnn, "--attention", self.attention]
        options += ["--slice-dim", str(self.slice_dim)] if "slice" in self.attention else []
        options += ["--max-forget-bits", self.bits] if self.reversible else []
        return options + list(self.text) + list(self.extra)


CORE = (
    Model("revgru-emb+slice-3bit", "revgru", "emb+slice", "3"),
    Model("gru-hidden", "gru", "hidden", ""),
    Model("lstm-hidden", "lstm", "hidden", ""),
    Model("revlstm-emb+slice-3bit", "revlstm", "emb+slice", "3"),
)
EXTRA = (
    Model("revgru-emb-3bit", "revgru", "emb", "3"),
    Model("revgru-slice-3bit", "revgru", "slice", "3"),
    Model("revgru-emb+slice-2bit", "revgru", "emb+slice", "2"),
    Model("revgru-emb+slice-5bit", "revgru", "emb+slice", "5"),
)
BPE_8K = ("--subword", "bpe", "--vocab-size", "8000", "--joint-vocab")
SUBWORD = tuple(Model(f"{m.name}-bpe8k", m.rnn, m.attention, m.bits, BPE_8K) for m in CORE)
# What users of JoeyNMT, OpenNMT-py and fairseq take for granted, for the reversible and the ordinary models alike,
# trained until the patience rule stops them (60 epochs is a cap no run is expected to reach), at the default lanes.
IMPROVED = ("--encoder", "bidirectional", "--tie-embeddings", "--label-smoothing", "0.1")


def _quality(name: str, rnn: str, attention: str, bits: str = "", slice_dim: int = 20) -> Model:
    """A model of the quality recipe; the last 5 validations' checkpoints are kept for averaging (revnmt-average)."""
    return Model(name, rnn, attention, bits, BPE_8K, IMPROVED, ("--epochs", "60"), keep_checkpoints=5,
                 slice_dim=slice_dim)


QUALITY = tuple(_quality(f"{m.name.removesuffix('-3bit')}-bi-bpe8k", m.rnn, m.attention, m.bits) for m in CORE)
# What attention memory and forgetting cost each cell: the quality recipe with the ordinary LSTM reading what the
# RevLSTM reads (embeddings and 20 units a direction), the RevLSTM reading what the LSTM reads (its full states: the
# encoder keeps them for attention only), wider slices and looser forgetting; the RevGRU alike. The RevLSTM's 100-unit
# slices beat its full states, so the last entry widens them to the most a slice takes (half its 300 units).
TRADEOFF = (
    _quality("lstm-emb+slice-bi-bpe8k", "lstm", "emb+slice"),
    _quality("revlstm-hidden-bi-bpe8k", "revlstm", "hidden", "3"),
    _quality("revlstm-emb+slice100-bi-bpe8k", "revlstm", "emb+slice", "3", slice_dim=100),
    _quality("revlstm-emb+slice100-5bit-bi-bpe8k", "revlstm", "emb+slice", "5", slice_dim=100),
    _quality("revlstm-emb+slice100-nolimit-bi-bpe8k", "revlstm", "emb+slice", "none", slice_dim=100),
    _quality("revgru-hidden-bi-bpe8k", "revgru", "hidden", "3"),
    _quality("revgru-emb+slice100-bi-bpe8k", "revgru", "emb+slice", "3", slice_dim=100),
    _quality("revlstm-emb+slice150-bi-bpe8k", "revlstm", "emb+slice", "3", slice_dim=150),
)
ENSEMBLE = "ensemble-reversible"  # the reversible quality models' averaged checkpoints, decoded together
MODELS = {m.name: m for m in CORE + EXTRA + SUBWORD + QUALITY + TRADEOFF}
GROUPS = {"core": CORE, "all": CORE + EXTRA, "subword": SUBWORD, "quality": QUALITY, "tradeoff": TRADEOFF}
TEXT_LABELS = {(): "words", BPE_8K: "BPE 8k"}  # the table's name for what a model reads

# Lanes change only the lowest bits of the states; the memory reports measure the trained models at the default.
# The length penalties tried on the dev set: revnmt's default (average, alpha 1) and its neighbours, and GNMT's usual
# range; each is a decode of the 1,014 dev sentences at beam 5.
FULL = {"train": ["--save-every", "200"], "test_beam": 5,
        "memory_batches": 20, "budget": "2GiB",
        "length_penalties": (LengthPenalty(0.0), LengthPenalty(0.5), LengthPenalty(1.0), LengthPenalty(1.5),
                             LengthPenalty(0.6, "gnmt"), LengthPenalty(1.0, "gnmt"))}
# A pipeline check, not a result: 64-unit models on 1,000 pairs for 2 epochs, greedy test decoding (which no length
# penalty changes: two are tried all the same, so that the choice among several is made).
QUICK = {"train": ["--epochs", "2", "--train-limit", "1000", "--emb-dim", "64", "--hidden-size", "64"], "test_beam": 1,
         "memory_batches": 2, "budget": "1GiB", "length_penalties": (LengthPenalty(1.0), LengthPenalty(1.0, "gnmt"))}
REPLACE_UNK_JSON = "test-replace-unk.json"
AVERAGE_CHECKPOINT = "average.pt"
DEV_GRID_DIR = "dev-length-penalty"  # one dev decode per length penalty tried: <type>-<alpha>.json and .hyp
LENGTH_PENALTY_JSON = "length-penalty.json"  # the dev scores of every penalty tried, and the one chosen
TEST_BEST_LP_JSON = "test-best-lp.json"  # test2016 from best.pt with the chosen penalty
TEST_AVERAGE_JSON = "test-average.json"  # test2016 from average.pt with the chosen penalty


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="core",
                        help="'core' (the four word-level models), 'all' (every word-level model), 'subword' (the "
                        "core four on BPE pieces), 'quality' (the core four on BPE pieces with a bidirectional "
                        "encoder, tied embeddings and label smoothing), 'tradeoff' (that recipe with other "
                        "attention memories and forgetting limits) or a comma-separated list of "
                        f"{', '.join(MODELS)} (default: core)")
    parser.add_argument("--quick", action="store_true", help="small models on 1,000 pairs: checks the pipeline")
    parser.add_argument("--runs", type=Path, help="run directories (default: runs/multi30k, runs/multi30k-quick)")
    parser.add_argument("--data-dir", help="Multi30K folder (default: found as revnmt-train finds it)")
    parser.add_argument("--device", default="cpu", help="revnmt-train --device (default: cpu)")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at the same time (default: 1)")
    parser.add_argument("--threads", type=int, help="torch threads per job (default: cores / jobs)")
    parser.add_argument("--memory-budget", type=byte_size, metavar="SIZE",
                        help="budget for the batch-tokens column (default: 2GiB; 1GiB with --quick)")
    parser.add_argument("--report", action="store_true", help="only tabulate what the run directories hold")
    parser.add_argument("--results", type=Path, help="also copy the table and the runs' logs and reports here")
    parser.add_argument("--speed", type=int, default=0, metavar="N",
                        help="time N training batches of each model side by side (after 5 warm-up batches)")
    args = parser.parse_args(argv)
    names = [m.name for m in GROUPS[args.models]] if args.models in GROUPS else args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    if args.jobs < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--jobs and --threads must be positive")
    args.models = [MODELS[n] for n in names]
    args.setup = QUICK if args.quick else FULL
    args.runs = args.runs or ROOT / "runs" / ("multi30k-quick" if args.quick else "multi30k")
    args.memory_budget = args.memory_budget or byte_size(args.setup["budget"])
    args.threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    return args


# ---------------------------------------------------------------------------- running

@dataclass(frozen=True)
class Step:
    """One step of a run, done once ``output`` exists (a rerun skips it): a ``command`` run as a child process, or
    an ``action``, instant work done in this process that writes ``output`` and returns the line to show."""
    output: Path
    command: list[str] | None = None
    action: Callable[[], str] | None = None


@dataclass(frozen=True)
class Job:
    """What :func:`run_all` runs, ``--jobs`` at a time: a model's run or the ensemble. ``steps`` lists what it
    still needs from the files ``directory`` holds now."""
    name: str
    directory: Path  # the train.log its progress is read from; its console log is DIRECTORY.console.log beside it
    steps: Callable[[], list[Step]]


def train_options(args: argparse.Namespace, model: Model) -> list[str]:
    data = ["--data-dir", args.data_dir] if args.data_dir else []
    length = () if args.quick else model.training
    keep = ["--keep-checkpoints", str(model.keep_checkpoints)] if model.keep_checkpoints else []
    return ["--data", "multi30k", *data, *model.options(), *length, *keep, *args.setup["train"], "--test-beam",
            str(args.setup["test_beam"]), "--device", args.device, "--save-dir", str(args.runs / model.name)]


def train_command(args: argparse.Namespace, model: Model) -> list[str]:
    return [sys.executable, "-m", "revnmt.cli.train", *train_options(args, model)]


def memory_command(args: argparse.Namespace, model: Model) -> list[str]:
    run = args.runs / model.name
    data = ["--data-dir", args.data_dir] if args.data_dir else []
    return [sys.executable, "-m", "revnmt.cli.memory", "--checkpoint", str(run), *data, "--device", args.device,
            "--batches", str(args.setup["memory_batches"]), "--memory-budget", str(args.memory_budget),
            "--json", str(run / "memory.json")]


def translate_command(args: argparse.Namespace, checkpoints: Sequence[Path], split: str, scores: Path,
                      *options: str) -> list[str]:
    """revnmt-translate of the Multi30K ``split`` ("valid" or "test") at the setup's test beam with ``options``,
    scored against its German side into ``scores`` (JSON), the translations beside it (.hyp). A run directory
    stands for its best.pt; several checkpoints make an ensemble."""
    prefix = multi30k_prefix(split, args.data_dir)
    return [sys.executable, "-m", "revnmt.cli.translate", "--checkpoint", *map(str, checkpoints),
            "-i", str(language_file(prefix, "en")), "-o", str(scores.with_suffix(".hyp")),
            "--beam", str(args.setup["test_beam"]), *options, "--reference", str(language_file(prefix, "de")),
            "--json", str(scores), "--device", args.device]


def replace_unk_command(args: argparse.Namespace, model: Model) -> list[str]:
    """test2016 scored as the paper scored it, with ``<unk>`` replaced by the attended source word."""
    run = args.runs / model.name
    return translate_command(args, [run], "test", run / REPLACE_UNK_JSON, "--replace-unk")


def average_command(args: argparse.Namespace, model: Model) -> list[str]:
    """revnmt-average of the checkpoints ``model``'s run kept (its last validations') into average.pt."""
    run = args.runs / model.name
    # --quick trains 2 epochs, fewer than the checkpoints a full run keeps: it averages the ones it has.
    last = [] if args.quick else ["--last", str(model.keep_checkpoints)]
    return [sys.executable, "-m", "revnmt.cli.average", str(run), *last, "-o", str(run / AVERAGE_CHECKPOINT)]


def penalty_options(penalty: LengthPenalty) -> list[str]:
    """revnmt-translate's options for ``penalty``."""
    return ["--length-penalty", f"{penalty.alpha:g}", "--length-penalty-type", penalty.type]


def dev_scores_file(directory: Path, penalty: LengthPenalty) -> Path:
    """Where the dev decode with ``penalty`` writes its scores, e.g. dev-length-penalty/gnmt-0.6.json."""
    return directory / DEV_GRID_DIR / f"{penalty.type}-{penalty.alpha:g}.json"


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def choose_length_penalty(args: argparse.Namespace, directory: Path) -> str:
    """Write ``directory``/length-penalty.json from its dev decodes of the setup's grid: every penalty's dev scores,
    and the one of best dev sacreBLEU, the BLEU that training picks best.pt by (of equals, the first in grid order).
    Return the line to show."""
    grid = []
    for penalty in args.setup["length_penalties"]:
        scores = read_json(dev_scores_file(directory, penalty))
        grid.append({key: scores[key] for key in
                     ("length_penalty_type", "length_penalty", "beam", "sacrebleu", "tokenized_bleu")})
    best = max(grid, key=lambda point: point["sacrebleu"])  # max keeps the first of equals
    choice = {"chosen_by": "dev sacreBLEU", "length_penalty_type": best["length_penalty_type"],
              "length_penalty": best["length_penalty"], "dev_sacrebleu": best["sacrebleu"],
              "dev_tokenized_bleu": best["tokenized_bleu"], "grid": grid}
    atomic_write_text(directory / LENGTH_PENALTY_JSON, json.dumps(choice, indent=2) + "\n")
    return (f"length penalty {best['length_penalty_type']} {best['length_penalty']:g}: dev sacreBLEU "
            f"{best['sacrebleu']:.2f}, the best of {len(grid)}")


def tuned_decoding_steps(args: argparse.Namespace, tuned_on: Sequence[Path], directory: Path,
                         tests: Sequence[tuple[Sequence[Path], Path]]) -> list[Step]:
    """Decoding with a length penalty tuned on the dev set: the dev set translated by the checkpoints ``tuned_on``
    with each penalty of the setup's grid (``directory``/dev-length-penalty/), the choice
    (``directory``/length-penalty.json), then test2016 with it, by each (checkpoints, scores file) of ``tests``.
    The test commands need the choice: until it is made, the steps end with making it."""
    choice = directory / LENGTH_PENALTY_JSON
    if choice.is_file():
        tuned = read_json(choice)
        penalty = penalty_options(LengthPenalty(tuned["length_penalty"], tuned["length_penalty_type"]))
        return [Step(scores, translate_command(args, checkpoints, "test", scores, *penalty))
                for checkpoints, scores in tests if not scores.is_file()]
    steps = []
    for penalty in args.setup["length_penalties"]:
        dev = dev_scores_file(directory, penalty)
        if not dev.is_file():
            steps.append(Step(dev, translate_command(args, tuned_on, "valid", dev, *penalty_options(penalty))))
    return steps + [Step(choice, action=partial(choose_length_penalty, args, directory))]


def pending_steps(args: argparse.Namespace, model: Model) -> list[Step]:
    """The steps ``model`` still needs, as far as they are known now: training (until test.json exists), the test
    scores with ``--replace-unk`` (word models), the memory report (reversible models), then, for models that keep
    checkpoints, averaging and the decodes with the tuned length penalty (:func:`tuned_decoding_steps`)."""
    run = args.runs / model.name
    steps = [] if (run / "test.json").is_file() else [Step(run / "test.json", train_command(args, model))]
    if not model.subwords and not (run / REPLACE_UNK_JSON).is_file():
        steps.append(Step(run / REPLACE_UNK_JSON, replace_unk_command(args, model)))
    if model.reversible and not (run / "memory.json").is_file():
        steps.append(Step(run / "memory.json", memory_command(args, model)))
    if model.keep_checkpoints:
        average = run / AVERAGE_CHECKPOINT
        if not average.is_file():
            steps.append(Step(average, average_command(args, model)))
        steps += tuned_decoding_steps(args, [average], run, [([run / BEST_CHECKPOINT], run / TEST_BEST_LP_JSON),
                                                             ([average], run / TEST_AVERAGE_JSON)])
    return steps


def ensemble_members() -> list[Model]:
    """The models whose averaged checkpoints decode together as the ensemble: the reversible quality models."""
    return [model for model in QUALITY if model.reversible]


def unaveraged_members(args: argparse.Namespace) -> list[str]:
    """The ensemble's members without an averaged checkpoint yet: training or averaging has not finished."""
    return [m.name for m in ensemble_members() if not (args.runs / m.name / AVERAGE_CHECKPOINT).is_file()]


def ensemble_steps(args: argparse.Namespace) -> list[Step]:
    """The ensemble's steps: its own length penalty tuned on the dev set (the members' averaged log-probabilities
    need not favour the lengths either member's do), in RUNS/ensemble-reversible/, and test2016 with it
    (RUNS/ensemble-reversible.json); none until every member is averaged."""
    if unaveraged_members(args):
        return []
    checkpoints = [args.runs / m.name / AVERAGE_CHECKPOINT for m in ensemble_members()]
    return tuned_decoding_steps(args, checkpoints, args.runs / ENSEMBLE,
                                [(checkpoints, args.runs / f"{ENSEMBLE}.json")])


def reports_ensemble(args: argparse.Namespace) -> bool:
    """Whether this call makes and tabulates the ensemble: it does when it runs one of the members."""
    return any(model in args.models for model in ensemble_members())


def run_pipeline(args: argparse.Namespace) -> list[str]:
    """Every model's pending steps, then the ensemble's once all its members are averaged (else say which it waits
    for); return the jobs that failed."""
    failed = run_all(args, [Job(m.name, args.runs / m.name, partial(pending_steps, args, m)) for m in args.models])
    if not reports_ensemble(args):
        return failed
    waiting = unaveraged_members(args)
    if waiting:
        print(f"[{ENSEMBLE}] waits for {', '.join(waiting)} to finish training and averaging", flush=True)
        return failed
    return failed + run_all(args, [Job(ENSEMBLE, args.runs / ENSEMBLE, partial(ensemble_steps, args))])


def run_all(args: argparse.Namespace, jobs: Sequence[Job]) -> list[str]:
    """Run the jobs' pending steps, ``--jobs`` jobs at a time, showing progress; return the jobs whose step failed.
    A job's steps are listed again after each step: later commands can depend on what it wrote (the length
    penalty chosen)."""
    queue = [job for job in jobs if job.steps()]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    running: dict[str, tuple[Job, Step, subprocess.Popen, float]] = {}
    shown: dict[str, str] = {}
    failed = []

    def start(job: Job) -> bool:
        """Start the job's next command, doing the instant steps before it; False if none is left."""
        job.directory.parent.mkdir(parents=True, exist_ok=True)
        while steps := job.steps():
            step = steps[0]
            if step.action is not None:
                print(f"[{job.name}] {step.action()}", flush=True)
                continue
            step.output.parent.mkdir(parents=True, exist_ok=True)  # revnmt-translate writes into existing folders
            # the commands log to the console; it goes to a file (tracebacks included).
            # beside the run, not in it: revnmt-train writes only into a new or empty folder, or a run it made
            console = open(console_log(job), "a", encoding="utf-8")
            print(f"[{job.name}] {' '.join(step.command[1:])}", flush=True)
            process = subprocess.Popen(step.command, stdout=console, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            console.close()
            running[job.name] = (job, step, process, time.monotonic())
            return True
        return False

    try:
        while queue or running:
            while queue and len(running) < args.jobs:
                start(queue.pop(0))
            time.sleep(min(POLL_S, 1.0 if args.quick else POLL_S))
            for name, (job, step, process, started) in list(running.items()):
                line = last_progress_line(job.directory)
                if line and shown.get(name) != line:
                    print(f"[{name}] {line}", flush=True)
                    shown[name] = line
                if process.poll() is None:
                    continue
                del running[name]
                # A command that succeeds without writing its output would otherwise be started again and again.
                if process.returncode != 0 or not step.output.is_file():
                    why = f"exit {process.returncode}" if process.returncode else f"it wrote no {step.output.name}"
                    print(f"[{name}] failed ({why}): see {console_log(job)}", flush=True)
                    failed.append(name)
                elif not start(job):
                    print(f"[{name}] done ({(time.monotonic() - started) / 60:.1f} min for its last step)", flush=True)
    except KeyboardInterrupt:  # the children got the same SIGINT; their last.pt lets a rerun resume
        print("interrupted: run the same command again to resume", file=sys.stderr)
        raise SystemExit(130) from None
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return failed


def console_log(job: Job) -> Path:
    """Where a job's commands write their console output (tracebacks included)."""
    return job.directory.with_name(f"{job.directory.name}.console.log")


def last_progress_line(run: Path) -> str:
    """The newest step or validation line of ``run``'s train.log, without its time stamp."""
    try:
        lines = (run / "train.log").read_text(encoding="utf-8").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if " | step " in line or "INFO validation " in line or "test (" in line:
            return line.split(" INFO ", 1)[-1]
    return ""


WARMUP_BATCHES = 5


def measure_speed(args: argparse.Namespace) -> dict[str, float]:
    """Training tokens/s of every model on the same Multi30K batches (64 sentences), in this process
    with ``--threads`` threads: fresh weights, Adam, clipping, as revnmt-train. The models take turns
    batch by batch, so that a slow phase of a shared machine weighs on all of them alike; models on
    words and models on pieces read different batches, so each kind of text takes its own turns."""
    torch.set_num_threads(args.threads)
    speed: dict[str, float] = {}
    for text in dict.fromkeys(model.text for model in args.models):
        speed |= _speed_side_by_side(args, [model for model in args.models if model.text == text])
    for name, value in speed.items():
        print(f"[{name}] {value:.0f} training tokens/s ({args.speed} batches, {args.threads} threads)", flush=True)
    return speed


def _speed_side_by_side(args: argparse.Namespace, models: list[Model]) -> dict[str, float]:
    """:func:`measure_speed` of models that read the same text (their data options are shared)."""
    data = load_data(train_config(train_options(args, models[0])).data)
    batches = BatchSampler(data.train.lengths, batch_size=64, seed=1).batches(1)[: WARMUP_BATCHES + args.speed]
    nets, optimizers, clips = {}, {}, {}
    for model in models:
        config = train_config(train_options(args, model)).with_vocab_sizes(len(data.src_vocab), len(data.tgt_vocab))
        torch.manual_seed(config.training.seed)
        nets[model.name] = build_model(config.model, config.execution).to(args.device)
        optimizers[model.name] = build_optimizer(config.training, nets[model.name].parameters())
        clips[model.name] = config.training.clip

    def step(name: str) -> Callable[[Batch], None]:
        def train(batch: Batch) -> None:
            loss = compute_gradients(nets[name], [batch]).loss
            clip_and_step(optimizers[name], clips[name], loss)  # reads the loss: the step is done (CUDA) before timing
        return train

    batches = [make_batch(data.train, indices).to(args.device) for indices in batches]
    return tokens_per_second({name: step(name) for name in nets}, batches, warmup=WARMUP_BATCHES)


# ---------------------------------------------------------------------------- the table

def collect(args: argparse.Namespace, model: Model, speed: dict[str, float]) -> dict | None:
    """What ``model``'s run directory says, or None if it has not started. Without its checkpoints (the small files
    ``--results`` keeps), the best step is the one train.log names and the run's own tokens/s is not known."""
    run = args.runs / model.name
    if (run / LAST_CHECKPOINT).is_file():
        state = Checkpoint.load(run / LAST_CHECKPOINT, needs=("training",)).training.trainer
        best_step, best_bleu = state.best_step, state.best_bleu
        run_tokens_per_s = state.train_tokens / state.train_s if state.train_s else None
    elif (run / "valid.tsv").is_file():
        best_step, best_bleu, run_tokens_per_s = logged_best_step(run), None, None
    else:
        return None
    with open(run / "valid.tsv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    best = next((r for r in rows if int(r["step"]) == best_step), None)
    result = {
        "model": model.name, "rnn": model.rnn, "attention": model.attention_label, "bits": model.bits,
        "text": TEXT_LABELS[model.text],
        "finished": (run / "test.json").is_file(),
        "epochs_trained": len(rows),
        "dev_bleu_by_epoch": [float(r["dev_bleu"]) for r in rows],
        "dev_bleu": (best_bleu if best_bleu is not None else float(best["dev_bleu"])) if best else None,
        "best_epoch": int(best["epoch"]) if best else None,
        "minutes_to_best": int(best["elapsed_s"]) / 60 if best else None,
        "run_tokens_per_s": run_tokens_per_s,
        "tokens_per_s": speed.get(model.name),
    }
    if result["finished"]:
        test = read_json(run / "test.json")
        result |= {"test_tokenized_bleu": test["tokenized_bleu"], "test_sacrebleu": test["sacrebleu"],
                   "sacrebleu_signature": test["signature"], "test_beam": test["beam"]}
    if (run / REPLACE_UNK_JSON).is_file():
        test = read_json(run / REPLACE_UNK_JSON)
        result |= {"test_replace_unk_tokenized_bleu": test["tokenized_bleu"],
                   "test_replace_unk_sacrebleu": test["sacrebleu"]}
    if model.keep_checkpoints:
        result |= tuned_results(run, [("best", run / TEST_BEST_LP_JSON), ("averaged", run / TEST_AVERAGE_JSON)])
    if (run / "memory.json").is_file():
        memory = read_json(run / "memory.json")
        result["memory"] = {side: {k: memory[side][k] for k in ("actual_ratio", "optimal_ratio")}
                            for side in ("encoder", "decoder")}
        budget = memory.get("budget")
        # Only plans of the peak a memory limit sees (RSS on CPU, reserved memory on CUDA); reports made
        # before the planner measured that peak ("cpu accounting") do not bound it.
        result["budget"] = budget if budget and budget.get("measured_by", "").startswith("peak") else None
    return result


def tuned_results(directory: Path, tests: Sequence[tuple[str, Path]]) -> dict:
    """What decoding with the length penalty tuned in ``directory`` gave so far: the dev scores of every penalty
    tried and the choice (``length_penalty_tuning``), and a ``decodings`` entry for each (checkpoint label, test
    scores file) of ``tests`` that exists."""
    if not (directory / LENGTH_PENALTY_JSON).is_file():
        return {}
    decodings = []
    for checkpoint, path in tests:
        if path.is_file():
            test = read_json(path)
            decodings.append({"checkpoint": checkpoint, "length_penalty_type": test["length_penalty_type"],
                              "length_penalty": test["length_penalty"], "test_beam": test["beam"],
                              "test_tokenized_bleu": test["tokenized_bleu"], "test_sacrebleu": test["sacrebleu"],
                              "sacrebleu_signature": test["signature"]})
    return {"length_penalty_tuning": read_json(directory / LENGTH_PENALTY_JSON), "decodings": decodings}


# revnmt-train's line after each validation: "(best)" when it improved on every one before, else the best's step
_VALIDATION = re.compile(r"INFO validation .*, step (\d+): .*\| BLEU \S+ (?:\(not finite\) )?"
                         r"\((?:best\)|best \S+ at step (\d+)\))")


def logged_best_step(run: Path) -> int | None:
    """The step of the best dev BLEU, as the last validation ``run``'s train.log records names it (None: none yet):
    the checkpoint's own ``best_step``, read without the checkpoint."""
    try:
        text = (run / "train.log").read_text(encoding="utf-8")
    except OSError:
        return None
    found = _VALIDATION.findall(text)
    if not found:
        return None
    step, best = found[-1]
    return int(best or step)


def collect_ensemble(args: argparse.Namespace) -> dict | None:
    """The ensemble's row, once its length penalty is chosen; None before."""
    members = ensemble_members()
    tuned = tuned_results(args.runs / ENSEMBLE, [("averaged", args.runs / f"{ENSEMBLE}.json")])
    if not tuned:
        return None
    first = members[0]  # the members differ in their RNN only
    return {"model": ENSEMBLE, "members": [m.name for m in members], "rnn": " + ".join(m.rnn for m in members),
            "attention": first.attention_label, "bits": first.bits, "text": TEXT_LABELS[first.text], **tuned}


def budget_tokens(results: list[dict], row: dict) -> int | None:
    """Token batch under the budget: a reversible model's own plan; for an ordinary model, the plan
    its reversible counterpart's report made for it (same size and text; an ordinary model's plan
    does not depend on its trained weights)."""
    if row.get("budget"):
        return row["budget"]["batch_tokens"]["reversible"]
    for other in results:
        if other.get("budget") and other["rnn"] == "rev" + row["rnn"] and other.get("text") == row.get("text"):
            return other["budget"]["batch_tokens"]["ordinary"]
    return None


def row_label(row: dict) -> str:
    """The model column: the RNN, and its text unless it reads words."""
    return row["rnn"] if row.get("text", "words") == "words" else f"{row['rnn']} ({row['text']})"


def column_label(row: dict) -> str:
    """A model as a column or a row of the smaller tables names it: RNN, text, attention and forgetting limit."""
    bits = {"": "", "none": ", no forgetting limit"}.get(row["bits"], f", {row['bits']} bits")
    return f"{row_label(row)} {row['attention']}{bits}"


def num(value: float | None, fmt: str = ".2f") -> str:
    return "–" if value is None else format(value, fmt)


def penalty_label(entry: dict) -> str:
    """A length penalty of a decoding or of length-penalty.json, e.g. "gnmt 0.6"."""
    return f"{entry['length_penalty_type']} {entry['length_penalty']:g}"


def markdown(results: list[dict], budget: int, ensemble: dict | None = None) -> str:
    """The results table (with, under a model that keeps checkpoints, a row per decoding with the tuned length
    penalty, and the ensemble's last), the length penalty tuning, dev BLEU per epoch, and sacreBLEU's signature."""
    def ratio(row: dict, side: str) -> str:
        m = row.get("memory", {}).get(side)
        return "–" if m is None else f"{m['actual_ratio']:.1f}× ({m['optimal_ratio']:.1f}×)"

    head = ("| model | attention | bits | test BLEU tok. | test sacreBLEU | "
            "test BLEU tok. / sacreBLEU, --replace-unk | dev BLEU | best epoch / trained | "
            f"minutes to best | train tok/s (side by side) | encoder actual (optimal) | decoder actual (optimal) | "
            f"batch tokens in {format_bytes(budget)} |")
    columns = head.count(" | ") + 1
    lines = [head, "|" + "---|" * columns]

    def decoding_rows(r: dict) -> list[str]:
        """A row per test decoding with the tuned length penalty: its test scores; the training's figures are
        in the model's row."""
        return [f"| {row_label(r)}: {d['checkpoint']}, length penalty {penalty_label(d)} | {r['attention']} | "
                f"{r['bits'] or '–'} | {num(d['test_tokenized_bleu'])} | {num(d['test_sacrebleu'])} |"
                + " – |" * (columns - 5) for d in r.get("decodings", [])]

    for r in results:
        status = "" if r["finished"] else " (training)"
        lines.append(
            f"| {row_label(r)}{status} | {r['attention']} | {r['bits'] or '–'} | {num(r.get('test_tokenized_bleu'))} | "
            f"{num(r.get('test_sacrebleu'))} | {num(r.get('test_replace_unk_tokenized_bleu'))} / "
            f"{num(r.get('test_replace_unk_sacrebleu'))} | {num(r['dev_bleu'])} | {num(r['best_epoch'], 'd')} / "
            f"{r['epochs_trained']} | {num(r['minutes_to_best'], '.0f')} | {num(r['tokens_per_s'], '.0f')} | "
            f"{ratio(r, 'encoder')} | {ratio(r, 'decoder')} | {num(budget_tokens(results, r), ',')} |")
        lines += decoding_rows(r)
    tuned = [r for r in results if r.get("length_penalty_tuning")]
    if ensemble:
        lines += decoding_rows(ensemble)
        tuned.append(ensemble)
    if tuned:
        lines += ["", length_penalty_table(tuned)]
    lines += ["", dev_curves(results)]
    decodings = [d for r in results + ([ensemble] if ensemble else []) for d in r.get("decodings", [])]
    signatures = {r["sacrebleu_signature"] for r in results + decodings if r.get("sacrebleu_signature")}
    if signatures:
        lines.append("")
        lines.append("sacreBLEU signature: " + "; ".join(sorted(signatures)))
    return "\n".join(lines) + "\n"


def length_penalty_table(tuned: list[dict]) -> str:
    """Dev sacreBLEU of every length penalty tried, a row per model or ensemble tuned, the chosen one in bold."""
    grid = list(dict.fromkeys(penalty_label(point) for r in tuned for point in r["length_penalty_tuning"]["grid"]))
    beams = sorted({point["beam"] for r in tuned for point in r["length_penalty_tuning"]["grid"]})
    lines = [f"Length penalty tuned on the dev set: dev sacreBLEU of the averaged checkpoints at beam "
             f"{', '.join(map(str, beams))}, the chosen one in bold; the test rows above decode with it.", "",
             "| averaged | " + " | ".join(grid) + " |", "|---|" + "---:|" * len(grid)]
    for r in tuned:
        tuning = r["length_penalty_tuning"]
        scores = {penalty_label(point): point["sacrebleu"] for point in tuning["grid"]}
        cells = [("**{:.2f}**" if label == penalty_label(tuning) else "{:.2f}").format(scores[label])
                 if label in scores else "" for label in grid]
        lines.append(f"| {column_label(r)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def dev_curves(results: list[dict]) -> str:
    """Dev BLEU after every epoch, one column per model: how the runs compare while they train."""
    head = "| epoch | " + " | ".join(column_label(r) for r in results) + " |"
    lines = [head, "|---:|" + "---:|" * len(results)]
    for epoch in range(max((r["epochs_trained"] for r in results), default=0)):
        cells = [f"{r['dev_bleu_by_epoch'][epoch]:.2f}" if epoch < r["epochs_trained"] else "" for r in results]
        lines.append(f"| {epoch + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def hardware(args: argparse.Namespace) -> dict:
    cpu = cpu_name()
    gpu = torch.cuda.get_device_name(0) if args.device.startswith("cuda") and torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "torch": torch.__version__, "device": args.device,
            "jobs": args.jobs, "threads_per_job": args.threads}


# with the test2016 translations (tens of kB each), so that a score can be compared again without the checkpoints
# (sacrebleu's paired bootstrap, say)
KEPT_FILES = ("config.json", "train.log", "valid.tsv", "test.json", REPLACE_UNK_JSON, "memory.json",
              LENGTH_PENALTY_JSON, TEST_BEST_LP_JSON, TEST_AVERAGE_JSON,
              *(Path(name).with_suffix(".hyp").name for name in ("test.json", REPLACE_UNK_JSON, TEST_BEST_LP_JSON,
                                                                 TEST_AVERAGE_JSON)))
TABLE_FILES = ("results.md", "results.json", "speed.json", f"{ENSEMBLE}.json")


def publish(args: argparse.Namespace, names: list[str]) -> None:
    """Copy the table and every run's small files (never checkpoints) to ``--results``; ``names``: the runs, and
    the ensemble's directory (its length-penalty.json)."""
    args.results.mkdir(parents=True, exist_ok=True)
    for name in TABLE_FILES:
        if (args.runs / name).is_file():
            shutil.copy2(args.runs / name, args.results / name)
    for name in names:
        (args.results / name).mkdir(exist_ok=True)
        for kept in KEPT_FILES:
            if (args.runs / name / kept).is_file():
                shutil.copy2(args.runs / name / kept, args.results / name / kept)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.runs.mkdir(parents=True, exist_ok=True)
    failed = [] if args.report else run_pipeline(args)
    speed_file = args.runs / "speed.json"
    if args.speed:
        speed_file.write_text(json.dumps(measure_speed(args), indent=2) + "\n", encoding="utf-8")
    speed = json.loads(speed_file.read_text(encoding="utf-8")) if speed_file.is_file() else {}
    results = [r for r in (collect(args, m, speed) for m in args.models) if r is not None]
    ensemble = collect_ensemble(args) if reports_ensemble(args) else None
    table = markdown(results, args.memory_budget, ensemble)
    print(table, end="")
    (args.runs / "results.md").write_text(table, encoding="utf-8")
    report = {"hardware": hardware(args), "quick": args.quick, "train_options": args.setup["train"],
              "test_beam": args.setup["test_beam"],
              "memory_budget": args.memory_budget, "results": results}
    if ensemble:
        report["ensemble"] = ensemble
    (args.runs / "results.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.results:
        publish(args, [r["model"] for r in results] + ([ENSEMBLE] if ensemble else []))
    complete = all(r["finished"] for r in results) and len(results) == len(args.models)
    return 0 if complete and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
