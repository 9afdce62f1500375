"""train.py: set up or resume a run, train it, then score the test set with the best checkpoint."""

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
from revnmt.model import Seq2Seq
from revnmt.translator import Translator, evaluate

from .data import TrainingData, load_data
from .options import RUN_DEFINING, eval_batch_size, model_config, parse_args
from .progress import logging_to
from .trainer import Trainer

logger = logging.getLogger(__name__)

USAGE_ERROR = 2  # the exit status of argparse errors, used for every mistake in the command or data


def main(argv: Sequence[str] | None = None) -> int:
    """Run train.py with ``argv`` (default: the command line); return the exit status."""
    args = parse_args(argv)
    save_dir = Path(args.save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    with logging_to(save_dir / "train.log"):
        logger.info("train.py %s", " ".join(sys.argv[1:] if argv is None else argv))
        try:
            checkpoint = _resumable_checkpoint(args, save_dir)
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
                plan = _memory_plan(args, data, model, checkpoint)
            except BudgetError as error:
                logger.error("%s", error)
                return USAGE_ERROR
        trainer = Trainer(args, data, model, save_dir, plan)
        if checkpoint is not None:
            trainer.restore(checkpoint)
            logger.info("resumed %s at epoch %d, step %d", save_dir / LAST_CHECKPOINT, trainer.state.epoch,
                        trainer.state.step)
        atomic_write_bytes(save_dir / "config.json", (json.dumps(vars(args), indent=2) + "\n").encode("utf-8"))
        data.src_vocab.save(save_dir / "src.vocab")
        data.tgt_vocab.save(save_dir / "tgt.vocab")

        trainer.train()
        if data.test_text is not None:
            _test(args, data, save_dir)
    return 0


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
    """The batch that fits ``--memory-budget``; pairs too long to fit even alone are dropped.

    A resumed run keeps the plan it started with: re-measuring a trained model could choose
    another batch, and the run would no longer repeat an uninterrupted one.
    """
    if checkpoint is not None and checkpoint.get("memory_plan"):
        fields = {k: v for k, v in checkpoint["memory_plan"].items() if k != "measured_peak"}
        plan = BudgetPlan(**fields)
    else:
        lengths = data.train.lengths
        plan = plan_budget(model, args.memory_budget, args.optimizer, int(lengths.min()), int(lengths.max()),
                           torch.device(args.device), beam=max(args.valid_beam, args.test_beam))
    too_long = data.train.lengths > plan.max_length
    if too_long.any():
        data.train = data.train.subset(~too_long)
        logger.warning("skipped %d training pairs longer than %d tokens: a step on one of them alone would not "
                       "fit the memory budget", int(too_long.sum()), plan.max_length)
    logger.info("%s", plan.describe())
    return plan


def _test(args: argparse.Namespace, data: TrainingData, save_dir: Path) -> None:
    """Translate the test set with best.pt, write test.hyp and log its scores."""
    translator = Translator.from_checkpoint(save_dir, args.device)
    hyps = translator.translate(data.test_text.src, beam=args.test_beam, batch_size=eval_batch_size(args),
                                progress=sys.stderr.isatty())
    atomic_write_bytes(save_dir / "test.hyp", "".join(f"{hyp}\n" for hyp in hyps).encode("utf-8"))
    for line in evaluate(hyps, data.test_text.tgt, translator.data).lines():
        logger.info("test (%s, beam %d) %s", args.test, args.test_beam, line)
