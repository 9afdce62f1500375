"""revnmt-memory: how much activation memory a model saves, on real batches.

    revnmt-memory [revnmt-train's data and model options] [--checkpoint RUN] [--batches N] [--json FILE]

With ``--checkpoint`` the trained model's gates (and its vocabularies and options) are used:
forgetting depends on the learned gates, so that is the figure to report.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from revnmt.arguments import (
    add_data_options,
    add_model_options,
    check_device,
    checked_model_configs,
    data_config,
    default_device,
    model_config,
)
from revnmt.atomic import check_output, write_output_text
from revnmt.checkpoints import Checkpoint, resolve_checkpoint
from revnmt.data import BatchSampler, DataConfig, TrainingData, load_data, make_batch
from revnmt.data.fingerprint import fingerprinted_prefixes
from revnmt.memory.budget import OPTIMIZER_STATES, BudgetError, measure_planned_step, plan_budget
from revnmt.memory.peak import track_freed_memory
from revnmt.memory.report import LABELS, comparison_configs, format_report, memory_report
from revnmt.memory.sizes import format_bytes
from revnmt.model import ReversibleSeq2Seq, Seq2Seq, build_model
from revnmt.profiling.speed import tokens_per_second
from revnmt.training import RunConfig
from revnmt.training.config import byte_size
from revnmt.training.interrupts import exit_on_signals

PROG = "revnmt-memory"
logger = logging.getLogger("revnmt.memory")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    add_data_options(parser, test_set=False)
    add_model_options(parser)
    parser.add_argument("--checkpoint", metavar="PATH", help="trained run directory or checkpoint file: its "
                        "model, vocabularies and data options (SentencePiece models included) replace the model and "
                        "text options (but --buffer-lanes), and without --data/--data-dir/--train/--valid the run's "
                        "own corpora and prepared ids are measured")
    parser.add_argument("--batches", type=int, default=20, help="training batches measured (default: 20)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch (default: 64)")
    parser.add_argument("--device", default=default_device(), help="cpu, cuda, cuda:N")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the report to this file")
    parser.add_argument("--memory-budget", type=byte_size, metavar="SIZE", help="also report the token batch "
                        "each model fits under this budget of peak memory (e.g. 2GiB; the process's RSS on CPU, "
                        "the allocator's reserved memory on CUDA), as revnmt-train --memory-budget chooses it")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZER_STATES), default="adam",
                        help="optimizer state counted by --memory-budget (default: adam)")
    args = parser.parse_args(argv)
    if args.batches < 1 or args.batch_size < 1:
        parser.error("--batches and --batch-size must be positive")
    check_device(parser, args.device)
    args.corpus_given = any(value is not None for value in (args.data, args.data_dir, args.train, args.valid))
    args.data_config = data_config(parser, args)
    _, args.execution = checked_model_configs(parser, args, args.device)
    return args


SPEED_WARMUP = 2  # measured batches not timed


def _speed(model: Seq2Seq, checkpoint_steps: int | str, batches: list) -> dict[str, float]:
    """Training tokens/s (a step's forward and backward) of the model and of each model it is compared
    with, side by side on ``batches``."""
    device = batches[0].src.device
    models = {}
    for name, configs in comparison_configs(model.cfg, checkpoint_steps).items():
        models[name] = model if name == "reversible" else build_model(*configs).to(device)

    def step(net: Seq2Seq):
        def train(batch) -> None:
            net.train_step(batch.src, batch.src_len, batch.tgt_in, batch.tgt_out, float(batch.n_tokens)).loss.item()
            net.zero_grad(set_to_none=True)
        return train

    return tokens_per_second({name: step(net) for name, net in models.items()}, batches, warmup=SPEED_WARMUP)


def budget_report(model: Seq2Seq, args: argparse.Namespace, data: TrainingData, checkpoint_steps: int | str) -> dict:
    """The token batch the model and each model it is compared with fit under ``--memory-budget``, as
    revnmt-train plans it, and the measured peak of one step on the costliest batch of each plan."""
    device = torch.device(args.device)
    report: dict = {"bytes": args.memory_budget, "batch_tokens": {}, "costliest_batch": {}, "measured_peak": {}}
    for name, configs in comparison_configs(model.cfg, checkpoint_steps).items():
        candidate = model if name == "reversible" else build_model(*configs).to(device)
        plan = plan_budget(candidate, args.memory_budget, args.optimizer, data.train.lengths, device,
                           mapped_bytes=data.train.mapped_bytes() + data.valid.mapped_bytes())
        report["batch_tokens"][name] = plan.batch_tokens
        report["costliest_batch"][name] = {"sentences": plan.worst_batch[0], "length": plan.worst_batch[1]}
        report["measured_peak"][name] = measure_planned_step(candidate, plan, device)
        report["measured_by"] = f"peak {plan.measured_by}"
        del candidate
    return report



def _prepared(config: DataConfig) -> Path | None:
    """The folder of prepared ids to read if it serves; revnmt-memory never writes one."""
    return Path(config.prepared) if config.prepared else None


def _measured_corpora(checkpoint: Checkpoint, path: Path, args: argparse.Namespace) -> DataConfig:
    """The data a checkpoint's run is measured on: its own text options (which decide the ids, and so whether a
    folder of prepared ids serves) on the corpora the command names, or else on the run's own corpora with the ids
    it prepared (``--prepared``, else the run's folder): Multi30K as the run found it, or the files its data
    fingerprint names (absolute, so the command works from any folder)."""
    run = RunConfig.from_checkpoint(checkpoint).data
    given = args.data_config
    if args.corpus_given or not checkpoint.data_fingerprint:  # checkpoints from before fingerprints name none
        return replace(run, data=given.data, data_dir=given.data_dir, train=given.train, valid=given.valid,
                       test=None, prepared=given.prepared)
    folders = (run.prepared, str(path.parent / "data"))
    prepared = given.prepared or next((folder for folder in folders if folder and Path(folder).is_dir()), None)
    if run.train is None:
        return replace(run, test=None, prepared=prepared)
    train, valid = fingerprinted_prefixes(checkpoint.data_fingerprint, run.src)
    return replace(run, train=train, valid=valid, test=None, prepared=prepared)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.memory_budget is not None:
        track_freed_memory()  # as revnmt-train --memory-budget runs
    logging.basicConfig(level=logging.INFO, format=f"{PROG}: %(message)s", stream=sys.stderr)
    return exit_on_signals(PROG, lambda: _measure(args))


def _measure(args: argparse.Namespace) -> int:
    """Measure and report as ``args`` say; the exit status."""
    torch.manual_seed(args.seed)
    try:
        if args.json is not None:
            check_output(args.json)  # before minutes of measuring
        if args.checkpoint is None:
            data = load_data(args.data_config, prepared=_prepared(args.data_config), write=False)
            model = build_model(model_config(args, len(data.src_vocab), len(data.tgt_vocab)), args.execution)
        else:
            path = resolve_checkpoint(args.checkpoint)
            checkpoint = Checkpoint.load(path, needs=("args",))  # args: the run's options
            corpora = _measured_corpora(checkpoint, path, args)
            # The checkpoint decides how text becomes ids: its options, SentencePiece models and vocabularies.
            data = load_data(corpora, checkpoint.data, (checkpoint.src_vocab, checkpoint.tgt_vocab),
                             prepared=_prepared(corpora), write=False)
            # How the model computes is not part of what it learned: this command's --buffer-lanes,
            # --buffer-backend and --decoder-chunk-steps apply.
            model = checkpoint.trained_model(args.execution)
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    if not isinstance(model, ReversibleSeq2Seq):
        print(f"{PROG}: error: --rnn must be revgru or revlstm; the report compares it "
              "with the ordinary model of the same size", file=sys.stderr)
        return 2
    sampler = BatchSampler(data.train.lengths, batch_size=args.batch_size, seed=args.seed)
    batches = [make_batch(data.train, idx).to(args.device) for idx in sampler.batches(0)[: args.batches]]
    logger.info("measuring %s %s attention on %d batches of %d sentences (%s)", model.cfg.rnn,
                model.cfg.attention, len(batches), args.batch_size, args.device)
    report = memory_report(model.to(args.device), batches)
    report["config"] = model.cfg.to_dict()
    print(format_report(report))
    if len(batches) > SPEED_WARMUP:
        report["tokens_per_s"] = _speed(model, report["checkpoint_steps"], batches)
        print("training tokens/s, side by side on these batches: " + ", ".join(
            f"{LABELS[name]} {value:,.0f}" for name, value in report["tokens_per_s"].items()))
    if args.memory_budget is not None:
        try:
            report["budget"] = budget_report(model, args, data, report["checkpoint_steps"])
        except BudgetError as error:
            print(f"{PROG}: error: {error}", file=sys.stderr)
            return 2
        budget = report["budget"]
        fits, peaks = budget["batch_tokens"], budget["measured_peak"]
        print(f"tokens per batch under a {format_bytes(args.memory_budget)} budget of {budget['measured_by']} "
              f"({args.optimizer}), and the peak of one step on each plan's costliest batch:")
        for name, label in LABELS.items():
            print(f"  {label:48s} {fits[name]:>10,} tokens (reversible / this: "
                  f"{fits['reversible'] / fits[name]:.1f}x), peak {format_bytes(peaks[name])}")
    if args.json:
        try:
            write_output_text(args.json, json.dumps(report, indent=2) + "\n")
        except OSError as error:
            print(f"{PROG}: error: cannot write {args.json}: {error.strerror or error}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
