"""revnmt-train (also ``python train.py``): set up or resume a run, train it (in one process, with
Hogwild! workers or as a torchrun rank), then score the test set with the best checkpoint."""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from revnmt.atomic import atomic_write_bytes, atomic_write_text
from revnmt.checkpoint import LAST_CHECKPOINT, RESUMING, load_checkpoint
from revnmt.data import DataOptions, TrainingData, load_data, prepared_options, text_options
from revnmt.data.fingerprint import fingerprint_changes
from revnmt.data.loading import input_files
from revnmt.data.prepared import check_preparable
from revnmt.folders import NotOurs
from revnmt.memory.budget import BudgetError, BudgetPlan, plan_budget
from revnmt.memory.peak import PeakMeter, track_freed_memory
from revnmt.memory.sizes import format_bytes
from revnmt.model import Seq2Seq, build_model
from revnmt.training import (
    CHANGEABLE_ON_RESUME,
    DEFAULT_BATCH_SIZE,
    DEFAULT_LR,
    DistributedTrainer,
    HogwildTrainer,
    Interrupted,
    Job,
    RunConfig,
    TooManyFallbacks,
    Trainer,
    TrainingConfig,
    WorkerError,
    process_group,
)
from revnmt.training.interrupts import Signalled, raise_on_signals, stop_on_signals
from revnmt.training.progress import logging_to
from revnmt.training.save_dir import SaveDirInUse, locked_save_dir
from revnmt.training.trainer import Diverged
from revnmt.translator import Translator, evaluate

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

SPM_MODEL = "spm.model"
PREPARED_DATA = "data"  # the run's prepared ids, unless --prepared names another folder
USAGE_ERROR = 2  # the exit status of argparse errors, used for every mistake in the command or data
TRAINING_FAILED = 1  # a Hogwild worker failed


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
                return _run(replace(config, training=replace(config.training, device=device)), job)
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


def _run(config: RunConfig, job: Job) -> int:
    save_dir, cfg = Path(config.training.save_dir), config.training
    try:
        config = replace(config, data=config.data.resolved())  # Multi30K located (or downloaded) once
        fingerprint = config.data.fingerprint()  # read once: compared on resume, then saved in checkpoints
        prepared = Path(config.data.prepared) if config.data.prepared else save_dir / PREPARED_DATA
        if job.is_main:  # before any work: a folder revnmt would replace must be its own, the corpora outside it
            check_preparable(prepared, input_files(config.data))
        checkpoint, data_changed = job.from_main(lambda: _resumable_checkpoint(config, fingerprint))
        if checkpoint is None:  # rank 0 trains the SentencePiece models of --subword (if not prepared), every rank
            # gets them
            options = job.from_main(lambda: prepared_options(config.data, fingerprint, prepared)
                                    or text_options(config.data))
            vocabs = None
        else:  # resuming: the checkpoint's SentencePiece models and vocabularies, never trained again
            options = DataOptions.from_dict(checkpoint["data"], str(save_dir / LAST_CHECKPOINT))
            vocabs = (checkpoint["src_vocab"], checkpoint["tgt_vocab"])
        if job.distributed:  # rank 0 prepares; the others read what it wrote (or, on a disk of their own, encode)
            job.from_main(lambda: load_data(config.data, options, vocabs, fingerprint, prepared) and None)
        data = load_data(config.data, options, vocabs, fingerprint, prepared, write=job.is_main)
    # Missing or malformed data and checkpoints are the user's to fix: one line, no traceback.
    except (OSError, ValueError, RuntimeError) as error:
        logger.error("%s", error)
        return USAGE_ERROR

    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if config.model.share_embeddings and data.src_vocab.itos != data.tgt_vocab.itos:
        logger.error("--share-embeddings needs one vocabulary for both languages: train with --subword and "
                     "--joint-vocab, or leave --share-embeddings out")
        return USAGE_ERROR
    config = config.with_vocab_sizes(len(data.src_vocab), len(data.tgt_vocab))
    model = build_model(config.model).to(cfg.device)
    plan = None
    if cfg.memory_budget is not None:
        try:
            plan = job.from_main(lambda: _memory_plan(cfg, data, model, checkpoint))
        except BudgetError as error:
            logger.error("%s", error)
            return USAGE_ERROR
        _drop_too_long(data, plan)
    trainer = _make_trainer(config, data, model, plan, job)
    if checkpoint is not None:
        try:
            trainer.restore(checkpoint, restart_epoch=data_changed)
        except ValueError as error:
            logger.error("%s", error)
            return USAGE_ERROR
        except (KeyError, TypeError) as error:  # its optimizer, scheduler or trainer state is not what this run keeps
            logger.error("%s: not a training state this run can resume (%r)", save_dir / LAST_CHECKPOINT, error)
            return USAGE_ERROR
        logger.info("resumed %s at epoch %d, step %d", save_dir / LAST_CHECKPOINT, trainer.state.epoch,
                    trainer.state.step)
    checkpoint = None  # restored into the model and the trainer: its own copy of the weights and Adam's state
    # would otherwise stay resident for the whole run
    if job.is_main:
        atomic_write_text(save_dir / "config.json", json.dumps(config.options(), indent=2) + "\n")
        data.src_vocab.save(save_dir / "src.vocab")
        data.tgt_vocab.save(save_dir / "tgt.vocab")
        _save_subword_models(save_dir, data.options)

    try:
        with stop_on_signals(trainer.stop):
            trainer.train()
        if trainer.stop.requested():  # a signal during the last validation's save: the run is saved, not tested
            raise Interrupted(trainer.stop.signum, trainer.state.step)
    except Interrupted as stop:
        logger.warning("%s", stop)
        return stop.exit_status
    except (WorkerError, TooManyFallbacks, Diverged) as error:  # last.pt is still the last good checkpoint
        logger.error("%s", error)
        return TRAINING_FAILED
    except OSError as error:  # a checkpoint or log that cannot be written: disk full, folder gone
        kept = f"the checkpoint of step {trainer.saved_step} is kept" if trainer.saved_step is not None else \
            "no checkpoint was saved before"
        logger.error("cannot write to %s: %s; %s", save_dir, error.strerror or error, kept)
        return USAGE_ERROR
    if data.test_text is not None and job.is_main:
        _test(config, data)
    return 0


def _save_subword_models(save_dir: Path, options: DataOptions) -> None:
    """The SentencePiece models beside the vocabularies, for other tools and for --spm-model: ``spm.model``
    for both languages, or ``src.spm.model`` and ``tgt.spm.model``. The checkpoints hold them too."""
    if not options.subwords:
        return
    if options.src_spm == options.tgt_spm:
        atomic_write_bytes(save_dir / SPM_MODEL, options.src_spm)
    else:
        atomic_write_bytes(save_dir / f"src.{SPM_MODEL}", options.src_spm)
        atomic_write_bytes(save_dir / f"tgt.{SPM_MODEL}", options.tgt_spm)


def _make_trainer(config: RunConfig, data: TrainingData, model: Seq2Seq, plan: BudgetPlan | None,
                  job: Job) -> Trainer:
    """The trainer of one process, Hogwild workers' main process, or one rank of a torchrun job."""
    if config.training.hogwild:
        return HogwildTrainer(config, data, model, plan)
    if job.distributed:
        return DistributedTrainer(config, data, model, plan, job)
    return Trainer(config, data, model, plan)


def _resumable_checkpoint(config: RunConfig, fingerprint: dict[str, dict]) -> tuple[dict | None, bool]:
    """``last.pt`` of the run's directory if there is one, and whether its corpora changed since (their
    ``fingerprint`` now against the saved one); ValueError if it was trained with other fixed options or on other
    data (unless ``--restart-epoch``). Changed options that may change are logged."""
    save_dir = Path(config.training.save_dir)
    path = save_dir / LAST_CHECKPOINT
    if not path.is_file():
        return None, False
    checkpoint = load_checkpoint(path, needs=RESUMING)
    refused = config.changes_from(checkpoint["args"])
    if refused:
        raise ValueError(f"{save_dir} holds a run trained with other fixed options ({', '.join(refused)}): run "
                         f"it with the options it was started with to resume it, or choose another --save-dir")
    saved = checkpoint.get("data_fingerprint")  # checkpoints from before fingerprints have none: not checked
    changed_data = fingerprint_changes(saved, fingerprint) if saved else []
    if changed_data and not config.training.restart_epoch:
        raise ValueError(f"the corpora of {save_dir} changed since it was saved ({'; '.join(changed_data)}): resume "
                         f"with the same corpora, add --restart-epoch to go on with these from the start of the "
                         f"saved epoch, or choose another --save-dir")
    if changed_data:
        logger.warning("the corpora changed (%s): --restart-epoch trains epoch %d again from its first batch",
                       "; ".join(changed_data), checkpoint["trainer"]["epoch"])
    for change in config.changes_from(checkpoint["args"], CHANGEABLE_ON_RESUME):
        logger.info("changed on resume: %s", change)
    return checkpoint, bool(changed_data)


def _memory_plan(cfg: TrainingConfig, data: TrainingData, model: Seq2Seq, checkpoint: dict | None) -> BudgetPlan:
    """The batch that fits ``--memory-budget``.

    A resumed run keeps the plan it started with: re-measuring a trained model could choose
    another batch, and the run would no longer repeat an uninterrupted one.
    """
    if checkpoint is not None and checkpoint.get("memory_plan"):
        plan = BudgetPlan.from_dict(checkpoint["memory_plan"])
    else:
        capacity = PeakMeter(cfg.device).capacity()
        if capacity is not None and cfg.memory_budget > capacity:
            logger.warning("--memory-budget %s is more than this machine has (%s): the plan may choose a batch "
                           "that does not fit", format_bytes(cfg.memory_budget), format_bytes(capacity))
        plan = plan_budget(model, cfg.memory_budget, cfg.optimizer, data.train.lengths, torch.device(cfg.device),
                           beam=max(cfg.valid_beam, cfg.test_beam),
                           mapped_bytes=data.train.mapped_bytes() + data.valid.mapped_bytes())
    logger.info("%s", plan.describe())
    if cfg.hogwild:
        logger.warning("--memory-budget %s bounds each training process's steps: with --hogwild %d the workers "
                       "together may hold about %d × %s, besides this process (the shared weights counted once)",
                       format_bytes(cfg.memory_budget), cfg.hogwild, cfg.hogwild, format_bytes(cfg.memory_budget))
    return plan


def _drop_too_long(data: TrainingData, plan: BudgetPlan) -> None:
    """Drop the training pairs too long to fit ``plan``'s budget even alone."""
    too_long = data.train.lengths > plan.max_length
    if too_long.any():
        data.train = data.train.subset(~too_long)
        logger.warning("skipped %d training pairs longer than %d tokens: a step on one of them alone would not "
                       "fit the memory budget", int(too_long.sum()), plan.max_length)


TEST_JSON = "test.json"


def _test(config: RunConfig, data: TrainingData) -> None:
    """Translate the test set with best.pt, write test.hyp, log its scores and write them to test.json."""
    cfg, save_dir, test = config.training, Path(config.training.save_dir), config.data.test
    translator = Translator.from_checkpoint(save_dir, cfg.device)
    hyps = translator.translate(data.test_text.src, beam=cfg.test_beam, batch_size=cfg.eval_batch_size,
                                progress=sys.stderr.isatty())
    atomic_write_text(save_dir / "test.hyp", "".join(f"{hyp}\n" for hyp in hyps))
    scores = evaluate(hyps, data.test_text.tgt, translator.data)
    for line in scores.lines():
        logger.info("test (%s, beam %d) %s", test, cfg.test_beam, line)
    result = {"test": test, "beam": cfg.test_beam, **scores.to_dict()}
    atomic_write_text(save_dir / TEST_JSON, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
