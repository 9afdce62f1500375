"""train.py: set up or resume a run, train it (in one process, with Hogwild workers or as a torchrun rank),
then score the test set with the best checkpoint."""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from revnmt.checkpoint import LAST_CHECKPOINT, load_checkpoint
from revnmt.data import atomic_write_bytes
from revnmt.memory.budget import BudgetError, BudgetPlan, plan_budget
from revnmt.memory.peak import track_freed_memory
from revnmt.model import Seq2Seq
from revnmt.translator import Translator, evaluate

from .data import TrainingData, load_data
from .distributed import DistributedTrainer, Job, process_group
from .hogwild import HogwildTrainer, WorkerError
from .options import RUN_DEFINING, build_parser, eval_batch_size, model_config, parse_args
from .progress import logging_to
from .trainer import Trainer

logger = logging.getLogger(__name__)

USAGE_ERROR = 2  # the exit status of argparse errors, used for every mistake in the command or data
TRAINING_FAILED = 1  # a Hogwild worker failed


def main(argv: Sequence[str] | None = None) -> int:
    """Run train.py with ``argv`` (default: the command line); return the exit status.

    Under torchrun every rank runs this; rank 0 alone writes the run directory and logs (the
    others show warnings and errors only).
    """
    args = parse_args(argv)
    if args.memory_budget is not None:
        track_freed_memory()  # the RSS then follows what is alive: what the budget bounds (revnmt.memory.peak)
    job = Job.from_env()
    if job.distributed and args.hogwild:
        build_parser().error("--hogwild starts worker processes of its own: run it with python, not torchrun")
    save_dir = Path(args.save_dir)
    if job.is_main:
        save_dir.mkdir(parents=True, exist_ok=True)
    log_file, level = (save_dir / "train.log", logging.INFO) if job.is_main else (None, logging.WARNING)
    label = f"[rank {job.rank}] " if job.distributed else ""
    with logging_to(log_file, level, label), process_group(args, job):
        logger.info("train.py %s", " ".join(sys.argv[1:] if argv is None else argv))
        return _run(args, job, save_dir)


def _run(args: argparse.Namespace, job: Job, save_dir: Path) -> int:
    try:
        checkpoint = job.from_main(lambda: _resumable_checkpoint(args, save_dir))
        vocabs = None if checkpoint is None else (checkpoint["src_vocab"], checkpoint["tgt_vocab"])
        data = load_data(args, vocabs)
    # Missing or malformed data and checkpoints are the user's to fix: one line, no traceback.
    except (OSError, ValueError, RuntimeError) as error:
        logger.error("%s", error)
        return USAGE_ERROR

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    model = Seq2Seq(model_config(args, len(data.src_vocab), len(data.tgt_vocab))).to(args.device)
    plan = None
    if args.memory_budget is not None:
        try:
            plan = job.from_main(lambda: _memory_plan(args, data, model, checkpoint))
        except BudgetError as error:
            logger.error("%s", error)
            return USAGE_ERROR
        _drop_too_long(data, plan)
    trainer = _make_trainer(args, data, model, save_dir, plan, job)
    if checkpoint is not None:
        trainer.restore(checkpoint)
        logger.info("resumed %s at epoch %d, step %d", save_dir / LAST_CHECKPOINT, trainer.state.epoch,
                    trainer.state.step)
    if job.is_main:
        atomic_write_bytes(save_dir / "config.json", (json.dumps(vars(args), indent=2) + "\n").encode("utf-8"))
        data.src_vocab.save(save_dir / "src.vocab")
        data.tgt_vocab.save(save_dir / "tgt.vocab")

    try:
        trainer.train()
    except WorkerError as error:  # last.pt is still the last good checkpoint
        logger.error("%s", error)
        return TRAINING_FAILED
    if data.test_text is not None and job.is_main:
        _test(args, data, save_dir)
    return 0


def _make_trainer(args: argparse.Namespace, data: TrainingData, model: Seq2Seq, save_dir: Path,
                  plan: BudgetPlan | None, job: Job) -> Trainer:
    """The trainer of one process, Hogwild workers' main process, or one rank of a torchrun job."""
    if args.hogwild:
        return HogwildTrainer(args, data, model, save_dir, plan)
    if job.distributed:
        return DistributedTrainer(args, data, model, save_dir, plan, job)
    return Trainer(args, data, model, save_dir, plan)


def _resumable_checkpoint(args: argparse.Namespace, save_dir: Path) -> dict | None:
    """``last.pt`` of ``save_dir`` if there is one; ValueError if it was trained with other options."""
    path = save_dir / LAST_CHECKPOINT
    if not path.is_file():
        return None
    checkpoint = load_checkpoint(path)
    saved, current = checkpoint["args"], vars(args)
    changed = [f"--{key.replace('_', '-')} {saved.get(key)} (now {current[key]})"
               for key in RUN_DEFINING if saved.get(key) != current[key]]
    if changed:
        raise ValueError(f"{save_dir} holds a run trained with {', '.join(changed)}: run the same command "
                         f"to resume it, or choose another --save-dir")
    return checkpoint


def _memory_plan(args: argparse.Namespace, data: TrainingData, model: Seq2Seq, checkpoint: dict | None) -> BudgetPlan:
    """The batch that fits ``--memory-budget``.

    A resumed run keeps the plan it started with: re-measuring a trained model could choose
    another batch, and the run would no longer repeat an uninterrupted one.
    """
    if checkpoint is not None and checkpoint.get("memory_plan"):
        plan = BudgetPlan.from_dict(checkpoint["memory_plan"])
    else:
        lengths = data.train.lengths
        plan = plan_budget(model, args.memory_budget, args.optimizer, lengths,
                           torch.device(args.device), beam=max(args.valid_beam, args.test_beam))
    logger.info("%s", plan.describe())
    return plan


def _drop_too_long(data: TrainingData, plan: BudgetPlan) -> None:
    """Drop the training pairs too long to fit ``plan``'s budget even alone."""
    too_long = data.train.lengths > plan.max_length
    if too_long.any():
        data.train = data.train.subset(~too_long)
        logger.warning("skipped %d training pairs longer than %d tokens: a step on one of them alone would not "
                       "fit the memory budget", int(too_long.sum()), plan.max_length)


TEST_JSON = "test.json"


def _test(args: argparse.Namespace, data: TrainingData, save_dir: Path) -> None:
    """Translate the test set with best.pt, write test.hyp, log its scores and write them to test.json."""
    translator = Translator.from_checkpoint(save_dir, args.device)
    hyps = translator.translate(data.test_text.src, beam=args.test_beam, batch_size=eval_batch_size(args),
                                progress=sys.stderr.isatty())
    atomic_write_bytes(save_dir / "test.hyp", "".join(f"{hyp}\n" for hyp in hyps).encode("utf-8"))
    scores = evaluate(hyps, data.test_text.tgt, translator.data)
    for line in scores.lines():
        logger.info("test (%s, beam %d) %s", args.test, args.test_beam, line)
    result = {"test": args.test, "beam": args.test_beam, **scores.to_dict()}
    atomic_write_bytes(save_dir / TEST_JSON, (json.dumps(result, indent=2) + "\n").encode("utf-8"))
