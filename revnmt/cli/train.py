"""revnmt-train (also ``python train.py``): parse the options into a run config, hold the save directory, run
it (:func:`revnmt.training.run.run`) and turn how it ended into an exit status."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import torch

from revnmt.folders import NotOurs
from revnmt.memory.peak import track_freed_memory
from revnmt.training import (
    CHANGEABLE_ON_RESUME,
    DEFAULT_BATCH_SIZE,
    DEFAULT_LR,
    Interrupted,
    Job,
    RunConfig,
    TooManyFallbacks,
    TrainingConfig,
    WorkerError,
    process_group,
)
from revnmt.training.interrupts import Signalled, raise_on_signals
from revnmt.training.progress import logging_to
from revnmt.training.run import RunError, run
from revnmt.training.save_dir import SaveDirInUse, locked_save_dir
from revnmt.training.trainer import Diverged

from .options import (
    HelpFormatter,
    add_data_options,
    add_model_options,
    byte_size,
    check_device,
    checked_model_config,
    data_config,
    default_device,
    device_ids,
    non_negative_int,
    positive_float,
    positive_int,
    share,
)

PROG = "revnmt-train"
logger = logging.getLogger("revnmt.train")

USAGE_ERROR = 2  # the exit status of argparse errors, used for every mistake in the command or data
TRAINING_FAILED = 1  # training itself failed: a Hogwild! worker, too many reversal fallbacks, divergence


def build_parser() -> argparse.ArgumentParser:
    """The parser of revnmt-train (defaults: the paper's Multi30K setup, with Adam)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Train an attention encoder-decoder with reversible (or ordinary) RNNs. "
        "Running the same command again resumes from SAVE_DIR/last.pt. Ctrl-C or SIGTERM saves last.pt at the "
        "step reached and exits (130, 143); a second Ctrl-C aborts. One run at a time holds SAVE_DIR.",
        epilog="Resuming: the model, data, batching, seed and optimizer options are fixed for a run (a resume with "
        "others is refused); " + ", ".join(f"--{name.replace('_', '-')}" for name in CHANGEABLE_ON_RESUME)
        + " may change (applied and logged); the rest (device, parallelism, buffer backend, the corpora's paths) "
        "are each command's own. A resume on changed corpora is refused unless --restart-epoch.",
        formatter_class=HelpFormatter)
    add_data_options(parser)
    add_model_options(parser)
    _add_optimization_options(parser)
    _add_run_options(parser)
    return parser


def _add_optimization_options(parser: argparse.ArgumentParser) -> None:
    opt = parser.add_argument_group("optimization")
    opt.add_argument("--optimizer", choices=sorted(DEFAULT_LR), default="adam", help="update rule")
    opt.add_argument("--lr", type=positive_float, help="learning rate (default: 1e-3 for adam, 1.0 for sgd)")
    opt.add_argument("--clip", type=float, default=5.0, help="gradient-norm clipping (0: none)")
    opt.add_argument("--lr-decay", type=float, default=0.5, help="LR factor when the dev loss stops improving")
    opt.add_argument("--lr-patience", type=int, default=0,
                     help="epochs without dev-loss improvement before the LR decays")
    opt.add_argument("--min-lr", type=float, default=1e-5, help="stop once the LR decays below this")
    opt.add_argument("--epochs", type=positive_int, default=30, help="passes over the training data")
    opt.add_argument("--max-steps", type=positive_int, help="stop after this many updates (no limit)")
    opt.add_argument("--batch-size", type=positive_int,
                     help=f"sentences per batch (default: {DEFAULT_BATCH_SIZE} unless --batch-tokens is given)")
    opt.add_argument("--batch-tokens", type=positive_int, help="padded tokens per batch")
    opt.add_argument("--memory-budget", type=byte_size, metavar="SIZE",
                     help="e.g. 2GiB: the peak memory training may reach, measured as the process's resident memory "
                     "(RSS) on CPU and as the CUDA allocator's reserved memory on a GPU; the largest token batch "
                     "whose step fits is chosen (instead of --batch-size/--batch-tokens), and checked every step")
    opt.add_argument("--patience", type=positive_int, default=5, help="epochs without dev-BLEU improvement "
                     "before stopping")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("run")
    run.add_argument("--save-dir", required=True, help="checkpoints, vocabularies, logs")
    run.add_argument("--device", default=default_device(), help="cpu, cuda, cuda:N")
    run.add_argument("--seed", type=int, default=1, help="initialisation, dropout and batch order")
    run.add_argument("--valid-beam", type=positive_int, default=1, help="beam for dev BLEU (1: greedy)")
    run.add_argument("--test-beam", type=positive_int, default=5, help="beam for the test set")
    run.add_argument("--log-every", type=positive_int, default=100, help="steps between log lines")
    run.add_argument("--save-every", type=positive_int, help="also save last.pt every N steps")
    run.add_argument("--keep-checkpoints", type=non_negative_int, default=0, metavar="N",
                     help="also keep the checkpoints of the last N validations, as SAVE_DIR/step-<step>.pt (the step "
                     "zero-padded to 8 digits, so that the names sort), for revnmt-average and ensembles; 0: none")
    run.add_argument("--restart-epoch", action="store_true",
                     help="resume although the training or dev corpora changed: keep the weights, optimizer and "
                     "counters, and train the saved epoch again from its first batch (unchanged corpora resume "
                     "at the saved position)")
    run.add_argument("--max-reversal-fallbacks", type=share, default=0.01, metavar="SHARE",
                     help="a batch whose reversal fails its exactness check is trained by backpropagation instead; "
                     "stop once more than this share of the updates (and two at least) needed it")
    run.add_argument("--max-nonfinite", type=positive_int, default=10, metavar="N",
                     help="an update whose loss or gradients are not finite (NaN, inf; or whose fixed-point state "
                     "overflows) is skipped; stop after N in a row, keeping the last checkpoint")
    run.add_argument("--hogwild", type=positive_int, metavar="N",
                     help="train with N worker processes that update shared weights without locks (Hogwild!); "
                     "checkpoints at epoch ends, at --max-steps and on Ctrl-C")
    run.add_argument("--devices", type=device_ids, metavar="0,1,...",
                     help="with --hogwild: the GPUs the workers run on, round-robin (default: every GPU with "
                     "--device cuda)")


def parse_args(argv: Sequence[str] | None = None) -> RunConfig:
    """Parse and check revnmt-train's options into a run config, resolving the defaults that depend on
    other options; a mistake exits with argparse's message and status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    data = data_config(parser, args)
    lr = DEFAULT_LR[args.optimizer] if args.lr is None else args.lr
    if args.memory_budget is not None and (args.batch_size or args.batch_tokens):
        parser.error("--memory-budget chooses the batch: leave out --batch-size and --batch-tokens")
    batch_size = args.batch_size
    if batch_size is None and args.batch_tokens is None and args.memory_budget is None:
        batch_size = DEFAULT_BATCH_SIZE
    if args.clip < 0:
        parser.error(f"--clip must be >= 0, got {args.clip}")
    if not 0 < args.lr_decay < 1:
        parser.error(f"--lr-decay must be in (0, 1), got {args.lr_decay}")
    if lr < args.min_lr:
        parser.error(f"--lr {lr:g} is below --min-lr {args.min_lr:g}: training would stop at once")
    if args.lr_patience < 0:
        parser.error(f"--lr-patience must be >= 0, got {args.lr_patience}")
    check_device(parser, args.device)
    if args.devices is not None:
        if not args.hogwild:
            parser.error("--devices chooses the GPUs of --hogwild workers: give --hogwild N too")
        if max(args.devices) >= torch.cuda.device_count():
            parser.error(f"--devices {','.join(map(str, args.devices))}: this machine has "
                         f"{torch.cuda.device_count()} CUDA devices")
    if args.hogwild and args.save_every:
        parser.error("--save-every cannot be used with --hogwild: Hogwild runs save at epoch ends only")
    if args.hogwild and Job.from_env().distributed:
        parser.error("--hogwild starts worker processes of its own: run it with python, not torchrun")
    model = checked_model_config(parser, args, args.device)
    training = TrainingConfig(
        save_dir=args.save_dir, device=args.device, seed=args.seed, optimizer=args.optimizer, lr=lr, clip=args.clip,
        lr_decay=args.lr_decay, lr_patience=args.lr_patience, min_lr=args.min_lr, epochs=args.epochs,
        max_steps=args.max_steps, batch_size=batch_size, batch_tokens=args.batch_tokens,
        memory_budget=args.memory_budget, patience=args.patience, valid_beam=args.valid_beam,
        test_beam=args.test_beam, log_every=args.log_every, save_every=args.save_every, hogwild=args.hogwild,
        devices=args.devices, restart_epoch=args.restart_epoch, max_reversal_fallbacks=args.max_reversal_fallbacks,
        keep_checkpoints=args.keep_checkpoints, max_nonfinite=args.max_nonfinite)
    return RunConfig(data, model, training)


def main(argv: Sequence[str] | None = None) -> int:
    """Run revnmt-train with ``argv`` (default: the command line); return the exit status.

    Under torchrun every rank runs this; rank 0 alone holds the save directory's lock, writes the run
    directory and logs (the others show warnings and errors only).
    """
    if sys.stderr is None:  # started with stderr closed (2>&-): train.log still gets every line
        sys.stderr = open(os.devnull, "w", encoding="utf-8")
    config = parse_args(argv)
    if config.training.memory_budget is not None:
        track_freed_memory()  # the RSS then follows what is alive: what the budget bounds (revnmt.memory.peak)
    job = Job.from_env()
    save_dir = Path(config.training.save_dir)
    log_file, level = (save_dir / "train.log", logging.INFO) if job.is_main else (None, logging.WARNING)
    label = f"[rank {job.rank}] " if job.distributed else ""
    with ExitStack() as stack:
        try:
            if job.is_main:
                stack.enter_context(locked_save_dir(save_dir))
            stack.enter_context(logging_to(log_file, level, label))
        except (SaveDirInUse, NotOurs) as error:
            return _fail(str(error))
        except OSError as error:
            return _fail(f"cannot create or write --save-dir {save_dir}: {error.strerror or error}")
        device = stack.enter_context(process_group(config.training.device, job))
        logger.info("%s %s", PROG, " ".join(sys.argv[1:] if argv is None else argv))
        try:
            # Outside the updates (loading, preparing data, the test set) a signal stops the run at once: what it
            # interrupts is done again by the same command. Training installs its own handlers.
            with raise_on_signals():
                run(replace(config, training=replace(config.training, device=device)), job)
            return 0
        except RunError as error:  # the user's to fix: one line, no traceback
            logger.error("%s", error)
            return USAGE_ERROR
        except Interrupted as stop:  # last.pt holds the step reached
            logger.warning("%s", stop)
            return stop.exit_status
        except (WorkerError, TooManyFallbacks, Diverged) as error:  # last.pt is still the last good checkpoint
            logger.error("%s", error)
            return TRAINING_FAILED
        except Signalled as stop:
            logger.error("%s: nothing was saved since the last checkpoint", stop)
            return stop.exit_status
        except KeyboardInterrupt:  # a second Ctrl-C in training
            logger.error("aborted: nothing was saved since the last checkpoint")
            return 128 + signal.SIGINT


def _fail(message: str) -> int:
    """An error before logging is set up: one line on stderr, argparse's style and status."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
