"""revnmt-memory: how much activation memory a model saves, on real batches.

    revnmt-memory [revnmt-train's data and model options] [--checkpoint RUN] [--batches N] [--json FILE]
                  [--memory-budget SIZE [--effective-batch-tokens N]] [--plot FILE.png]

With ``--checkpoint`` the trained model's gates (and its vocabularies and options) are used:
forgetting depends on the learned gates, so that is the figure to report.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import statistics
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
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
from revnmt.data import Batch, BatchSampler, DataConfig, TrainingData, load_data, make_batch
from revnmt.data.fingerprint import fingerprinted_prefixes
from revnmt.memory.budget import (
    OPTIMIZER_STATES,
    BudgetError,
    BudgetPlan,
    accumulation_for,
    measure_planned_step,
    plan_budget,
)
from revnmt.memory.peak import track_freed_memory
from revnmt.memory.plot import INSTALL, plot_report, require_matplotlib
from revnmt.memory.report import LABELS, USER_CHOICES, comparison_configs, format_report, memory_report
from revnmt.memory.sizes import format_bytes
from revnmt.model import ExecutionConfig, ModelConfig, ReversibleSeq2Seq, Seq2Seq, build_model
from revnmt.profiling.speed import interleaved_seconds, tokens_per_second
from revnmt.training import RunConfig
from revnmt.training.config import TrainingConfig, byte_size
from revnmt.training.interrupts import exit_on_signals
from revnmt.training.schedule import build_optimizer
from revnmt.training.trainer import clip_and_step, compute_gradients

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
                        help="optimizer state counted by --memory-budget, and stepped by --effective-batch-tokens "
                        "(default: adam)")
    parser.add_argument("--effective-batch-tokens", type=int, metavar="N", help="with --memory-budget: for the "
                        "reversible model, its ordinary twin and the checkpointed twin, the batches of gradient "
                        "accumulation each needs for updates of N padded tokens with the batch it fits (as "
                        "revnmt-train --update-freq plans them), and the measured time of such an update, side by "
                        "side on training batches")
    parser.add_argument("--timed-updates", type=int, default=3, metavar="N", help="updates of "
                        "--effective-batch-tokens timed per model, after one not timed; the median is reported "
                        "(default: 3)")
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="also draw the report as a PNG: bytes per "
                        "target token against the batches' length, and with --memory-budget the tokens per batch "
                        f"each model fits (needs matplotlib: {INSTALL})")
    args = parser.parse_args(argv)
    if args.batches < 1 or args.batch_size < 1 or args.timed_updates < 1:
        parser.error("--batches, --batch-size and --timed-updates must be positive")
    if args.effective_batch_tokens is not None:
        if args.memory_budget is None:
            parser.error("--effective-batch-tokens needs --memory-budget: the accumulation depends on the batch "
                         "each model fits under it")
        if args.effective_batch_tokens < 1:
            parser.error("--effective-batch-tokens must be positive")
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
    revnmt-train plans it, and the measured peak of one step on the costliest batch of each plan.

    Each model is planned in a process of its own that holds that model alone, as revnmt-train's process does: the
    budget bounds a process's peak, and this one holds the report's models, batches and measurements, which would
    shrink every plan (at small budgets, by most of the room)."""
    report: dict = {"bytes": args.memory_budget, "batch_tokens": {}, "costliest_batch": {}, "measured_peak": {}}
    mapped = data.train.mapped_bytes() + data.valid.mapped_bytes()
    for name, configs in comparison_configs(model.cfg, checkpoint_steps).items():
        weights = None
        if name == "reversible":  # as this command runs it, trained gates included; the twins' weights are their own
            configs, weights = (model.cfg, model.execution), model.state_dict()
        logger.info("planning %s under %s", LABELS[name], format_bytes(args.memory_budget))
        # spawn: a fresh interpreter, not a fork of this process's heap; its probes log as this command's lines do
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_log_to_stderr,
                                 initargs=(f"{PROG}: {LABELS[name]}: %(message)s",)) as pool:
            plan, peak = pool.submit(_plan_alone, configs, weights, args.memory_budget, args.optimizer,
                                     data.train.lengths, args.device, mapped, args.seed).result()
        report["batch_tokens"][name] = plan.batch_tokens
        report["costliest_batch"][name] = {"sentences": plan.worst_batch[0], "length": plan.worst_batch[1]}
        report["measured_peak"][name] = peak
        report["measured_by"] = f"peak {plan.measured_by}"
    return report


def _plan_alone(configs: tuple[ModelConfig, ExecutionConfig], weights: dict[str, torch.Tensor] | None, budget: int,
                optimizer: str, lengths: np.ndarray, device: str, mapped_bytes: int,
                seed: int) -> tuple[BudgetPlan, int]:
    """In a process of its own: the plan of the model of ``configs`` (with ``weights``, else initialised from
    ``seed``) under ``budget``, and the measured peak of one step on the plan's costliest batch."""
    torch.manual_seed(seed)
    model = build_model(*configs).to(device)
    if weights is not None:
        model.load_state_dict(weights)
    plan = plan_budget(model, budget, optimizer, lengths, torch.device(device), mapped_bytes=mapped_bytes)
    return plan, measure_planned_step(model, plan, torch.device(device))


UPDATE_WARMUP = 1  # updates of each model not timed


def effective_batch_report(model: Seq2Seq, args: argparse.Namespace, data: TrainingData,
                           checkpoint_steps: int | str, fitted: dict[str, int]) -> dict:
    """Updates of ``--effective-batch-tokens`` for the reversible model and the twins a user would train instead:
    the gradient accumulation each needs with the batch it fits (``fitted``, by model) as revnmt-train plans it
    (:func:`~revnmt.memory.budget.accumulation_for`), and the measured time of such an update: forward and backward
    of ``update_freq`` training batches of the planned size (:func:`_fullest_batches`), then one optimizer step, as
    revnmt-train makes it. The models take turns update by update (:func:`~revnmt.profiling.speed.interleaved_seconds`),
    and each update is on batches of its own. The updates change the weights: this is measured last."""
    device, target = torch.device(args.device), args.effective_batch_tokens
    # revnmt-train's optimizer and clipping (no run directory: nothing is saved)
    training = TrainingConfig(save_dir="", optimizer=args.optimizer)
    configs = comparison_configs(model.cfg, checkpoint_steps)
    models, updates = {}, {}
    for name in USER_CHOICES:
        net = model if name == "reversible" else build_model(*configs[name]).to(device)
        update_freq, batch_tokens = accumulation_for(target, fitted[name])
        batches = [make_batch(data.train, indices).to(device) for indices in
                   _fullest_batches(data, batch_tokens, args.seed, (UPDATE_WARMUP + args.timed_updates) * update_freq)]
        groups = [batches[i: i + update_freq] for i in range(0, len(batches), update_freq)]
        updates[name] = _update(net, build_optimizer(training, net.parameters()), training.clip, groups)
        timed = groups[UPDATE_WARMUP:]
        models[name] = {
            "fitted_batch_tokens": fitted[name], "update_freq": update_freq, "batch_tokens": batch_tokens,
            # what the batches of at most batch_tokens held, on average per timed update
            "padded_tokens_per_update": statistics.mean(sum(len(b) * b.length for b in g) for g in timed),
            "target_tokens_per_update": statistics.mean(sum(b.n_tokens for b in g) for g in timed)}
    seconds = interleaved_seconds(updates, args.timed_updates, UPDATE_WARMUP)
    for name, spent in seconds.items():
        median = statistics.median(spent)
        # at equal updates (N / s), and what was trained (as revnmt-train logs it), which the first overstates
        # where the sampler's batches hold fewer padded tokens than planned
        models[name].update(seconds=spent, seconds_per_update=median, tokens_per_s=target / median,
                            target_tokens_per_s=models[name]["target_tokens_per_update"] / median)
    return {"tokens": target, "optimizer": args.optimizer, "timed_updates": args.timed_updates,
            "device": str(device), "models": models}


def _fullest_batches(data: TrainingData, batch_tokens: int, seed: int, count: int) -> list[np.ndarray]:
    """``count`` batches of at most ``batch_tokens`` padded tokens, as revnmt-train's sampler forms them from an
    epoch of the training data, the fullest first, repeated if the epoch has fewer. The sampler cuts a batch where
    the next pair's length would overflow it, so the last batches of a run of lengths hold fewer tokens (the
    epoch's longest pairs, a few thousand tokens where 49,152 were planned): an update of them is not one of
    ``batch_tokens``."""
    lengths = data.train.lengths
    epoch = BatchSampler(lengths, batch_tokens=batch_tokens, seed=seed).batches(0)
    fullest = sorted((epoch[i] for i in range(len(epoch))),
                     key=lambda indices: -len(indices) * int(lengths[indices].max()))
    return [fullest[i % len(fullest)] for i in range(count)]


def _update(model: Seq2Seq, optimizer: torch.optim.Optimizer, clip: float,
            groups: list[list[Batch]]) -> Callable[[int], None]:
    """An update of ``model`` on the ``i``-th group of batches, its gradients accumulated over the group."""
    model.train()

    def update(i: int) -> None:
        clip_and_step(optimizer, clip, compute_gradients(model, groups[i]).loss)
        if groups[i][0].src.device.type == "cuda":
            torch.cuda.synchronize()  # the step's kernels are done
    return update


def format_effective_batch(report: dict) -> str:
    """A plain-text table of :func:`effective_batch_report`."""
    lines = [f"updates of N = {report['tokens']:,} padded tokens by gradient accumulation ({report['optimizer']}; "
             f"median of {report['timed_updates']}, timed side by side on {report['device']}):",
             f"  {'':40s} {'fits':>8s} {'update-freq':>11s} {'batch':>8s} {'padded':>8s} {'s/update':>8s} "
             f"{'N/s':>8s} {'target/s':>8s}"]
    for name in USER_CHOICES:
        row = report["models"][name]
        lines.append(f"  {LABELS[name]:40s} {row['fitted_batch_tokens']:8,d} {row['update_freq']:11d} "
                     f"{row['batch_tokens']:8,d} {row['padded_tokens_per_update']:8,.0f} "
                     f"{row['seconds_per_update']:8.2f} {row['tokens_per_s']:8,.0f} {row['target_tokens_per_s']:8,.0f}")
    lines.append("  (fits, batch: padded tokens per batch under the budget and as used; padded: padded tokens the "
                 "timed updates held, on average; N/s: N / s per update; target/s: target tokens trained per second)")
    return "\n".join(lines)


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


def _log_to_stderr(line_format: str) -> None:
    """This command's progress lines, on stderr (in the planning processes too: a plan takes minutes)."""
    logging.basicConfig(level=logging.INFO, format=line_format, stream=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.memory_budget is not None:
        track_freed_memory()  # as revnmt-train --memory-budget runs
    _log_to_stderr(f"{PROG}: %(message)s")
    return exit_on_signals(PROG, lambda: _measure(args))


def _measure(args: argparse.Namespace) -> int:
    """Measure and report as ``args`` say; the exit status."""
    torch.manual_seed(args.seed)
    try:
        for output in (args.json, args.plot):
            if output is not None:
                check_output(output)  # before minutes of measuring
        if args.plot is not None:
            require_matplotlib()
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
    except ImportError:
        print(f"{PROG}: error: --plot needs matplotlib: {INSTALL}", file=sys.stderr)
        return 2
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
    report["config"], report["batch_size"] = model.cfg.to_dict(), args.batch_size
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
    if args.effective_batch_tokens is not None:
        report["effective_batch"] = effective_batch_report(model, args, data, report["checkpoint_steps"],
                                                           report["budget"]["batch_tokens"])
        print(format_effective_batch(report["effective_batch"]))
    for output, write in ((args.json, lambda path: write_output_text(path, json.dumps(report, indent=2) + "\n")),
                          (args.plot, lambda path: plot_report(report, path))):
        if output is None:
            continue
        try:
            write(output)
        except OSError as error:
            print(f"{PROG}: error: cannot write {output}: {error.strerror or error}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
