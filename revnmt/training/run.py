"""A training run, from its typed config to its checkpoints: what ``revnmt-train`` does once its options are
parsed (:func:`run`).

The run locates its data (Multi30K found or downloaded), checks the folders it will write, resumes a saved run
or starts one, reads or prepares the token ids, seeds the generators, builds the model, plans the memory budget,
trains (in one process, with Hogwild! workers, or as one torchrun rank) and translates the test set with best.pt.
The run directory it fills: ``config.json``, the vocabularies, the SentencePiece models, the prepared ids
(``data/``), the checkpoints, ``train.log``, ``valid.tsv``, ``test.hyp``, ``test.json`` and, with ``--tensorboard``,
the curves (``tensorboard/``). Failures are exceptions, which the command maps to exit statuses.
"""

from __future__ import annotations

import json
import logging
import random
import sys
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from revnmt.atomic import atomic_write_bytes, atomic_write_text
from revnmt.checkpoints import LAST_CHECKPOINT, RESUMING, Checkpoint, CheckpointError, Numerics
from revnmt.data import DataOptions, TrainingData, load_data, prepared_options, text_options
from revnmt.data.fingerprint import fingerprint_changes
from revnmt.data.loading import input_files
from revnmt.data.prepared import check_preparable
from revnmt.memory.budget import BudgetError, BudgetPlan, plan_budget, probe_step
from revnmt.memory.peak import PeakMeter
from revnmt.memory.sizes import format_bytes
from revnmt.model import Seq2Seq, build_model
from revnmt.translation import Translator, evaluate

from .config import CHANGEABLE_ON_RESUME, RunConfig, TrainingConfig
from .curves import TENSORBOARD_DIR, Curves, require_tensorboard
from .distributed import DistributedTrainer, Job
from .graphs import GraphedSteps, probe_graphed_step
from .hogwild import HogwildTrainer
from .interrupts import Interrupted, stop_on_signals
from .trainer import Trainer

logger = logging.getLogger("revnmt.train")

SPM_MODEL = "spm.model"
PREPARED_DATA = "data"  # the run's prepared ids, unless --prepared names another folder
TEST_JSON = "test.json"


class RunError(Exception):
    """What the user must fix before the run can go on: its data, a checkpoint or options that do not fit, a
    save directory that cannot be written. The message says what, in one line."""


def run(config: RunConfig, job: Job) -> str:
    """Set up or resume the run ``config`` describes, train it, and score the test set with best.pt (rank 0);
    return why training stopped.

    RunError for what the user must fix (data, a checkpoint or options that do not fit, a save directory that
    cannot be written), :class:`~revnmt.training.Interrupted` after a signal saved the step reached, and
    WorkerError, TooManyFallbacks or Diverged when training itself failed (last.pt is then the last good one).
    """
    save_dir, cfg = Path(config.training.save_dir), config.training
    try:
        if cfg.tensorboard and job.is_main:  # a missing package is said before any work, not after it
            require_tensorboard()
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
            options, vocabs = checkpoint.data, (checkpoint.src_vocab, checkpoint.tgt_vocab)
        if job.distributed:  # rank 0 prepares; the others read what it wrote (or, on a disk of their own, encode)
            job.from_main(lambda: load_data(config.data, options, vocabs, fingerprint, prepared) and None)
        data = load_data(config.data, options, vocabs, fingerprint, prepared, write=job.is_main)
    # Missing or malformed data and checkpoints are the user's to fix.
    except (OSError, ValueError, RuntimeError) as error:
        raise RunError(str(error)) from error

    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if config.model.share_embeddings and data.src_vocab.itos != data.tgt_vocab.itos:
        raise RunError("--share-embeddings needs one vocabulary for both languages: train with --subword and "
                       "--joint-vocab, or leave --share-embeddings out")
    config = config.with_vocab_sizes(len(data.src_vocab), len(data.tgt_vocab))
    model = build_model(config.model, config.execution).to(cfg.device)
    plan = None
    if cfg.memory_budget is not None:
        try:
            plan = job.from_main(lambda: _memory_plan(cfg, data, model, checkpoint))
        except (BudgetError, CheckpointError) as error:
            raise RunError(str(error)) from error
        _drop_too_long(data, plan)
    trainer = _make_trainer(config, data, model, plan, job)
    if checkpoint is not None:
        try:
            trainer.restore(checkpoint, restart_epoch=data_changed)
        except ValueError as error:
            raise RunError(str(error)) from error
        except (KeyError, TypeError) as error:  # its optimizer or scheduler state is not what this run keeps
            raise RunError(f"{save_dir / LAST_CHECKPOINT}: not a training state this run can resume ({error!r})"
                           ) from error
        logger.info("resumed %s at epoch %d, step %d", save_dir / LAST_CHECKPOINT, trainer.state.epoch,
                    trainer.state.step)
        _say_other_numerics(checkpoint, trainer.device, save_dir)
    checkpoint = None  # restored into the model and the trainer: its own copy of the weights and Adam's state
    # would otherwise stay resident for the whole run
    if job.is_main:
        atomic_write_text(save_dir / "config.json", json.dumps(config.options(), indent=2) + "\n")
        data.src_vocab.save(save_dir / "src.vocab")
        data.tgt_vocab.save(save_dir / "tgt.vocab")
        _save_subword_models(save_dir, data.options)
    if cfg.tensorboard and job.is_main:  # the process that logs draws the curves
        try:
            trainer.curves = Curves(save_dir / TENSORBOARD_DIR, trainer.state.step, PeakMeter(trainer.device).peak)
        except OSError as error:
            raise RunError(f"cannot write {save_dir / TENSORBOARD_DIR}: {error.strerror or error}") from error

    try:
        # The curves are closed however training ends, so that they hold every point up to it.
        with stop_on_signals(trainer.stop), trainer.curves or nullcontext():
            reason = trainer.train()
    except OSError as error:  # a checkpoint or log that cannot be written: disk full, folder gone
        kept = f"the checkpoint of step {trainer.saved_step} is kept" if trainer.saved_step is not None else \
            "no checkpoint was saved before"
        raise RunError(f"cannot write to {save_dir}: {error.strerror or error}; {kept}") from error
    if trainer.stop.requested():  # a signal during the last validation's save: the run is saved, not tested
        raise Interrupted(trainer.stop.signum, trainer.state.step)
    if data.test_text is not None and job.is_main:
        _test(config, data)
    return reason


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


def _resumable_checkpoint(config: RunConfig, fingerprint: dict[str, dict]) -> tuple[Checkpoint | None, bool]:
    """``last.pt`` of the run's directory if there is one, and whether its corpora changed since (their
    ``fingerprint`` now against the saved one); ValueError if it was trained with other fixed options or on other
    data (unless ``--restart-epoch``). Changed options that may change are logged."""
    save_dir = Path(config.training.save_dir)
    path = save_dir / LAST_CHECKPOINT
    if not path.is_file():
        return None, False
    checkpoint = Checkpoint.load(path, needs=RESUMING)
    refused = config.changes_from(checkpoint.args)
    if refused:
        raise ValueError(f"{save_dir} holds a run trained with other fixed options ({', '.join(refused)}): run "
                         f"it with the options it was started with to resume it, or choose another --save-dir")
    saved = checkpoint.data_fingerprint  # checkpoints from before fingerprints have none: not checked
    changed_data = fingerprint_changes(saved, fingerprint) if saved else []
    if changed_data and not config.training.restart_epoch:
        raise ValueError(f"the corpora of {save_dir} changed since it was saved ({'; '.join(changed_data)}): resume "
                         f"with the same corpora, add --restart-epoch to go on with these from the start of the "
                         f"saved epoch, or choose another --save-dir")
    if changed_data:
        logger.warning("the corpora changed (%s): --restart-epoch trains epoch %d again from its first batch",
                       "; ".join(changed_data), checkpoint.training.trainer.epoch)
    for change in config.changes_from(checkpoint.args, CHANGEABLE_ON_RESUME):
        logger.info("changed on resume: %s", change)
    if config.model.reversible and "buffer_tile" not in checkpoint.args:
        # Saved before the information buffer had tiles: its rows shared lanes across the whole batch.
        logger.warning("%s was trained with the information buffer's earlier layout (lanes shared by the whole "
                       "batch); it resumes with tiles of %d sentences. Weights and optimizer state carry over; the "
                       "lowest bits of what it computes from here differ from what the earlier layout would have "
                       "given (docs/reliability.md#resuming-across-buffer-layouts)", save_dir,
                       config.execution.buffer_tile)
    return checkpoint, bool(changed_data)


def _say_other_numerics(checkpoint: Checkpoint, device: torch.device, save_dir: Path) -> None:
    """Warn if the run resumes with another torch, device or thread count than it was saved with (checkpoints
    before format 3 do not say): it goes on correctly, but no longer repeats an uninterrupted run bit for bit."""
    if checkpoint.numerics is None:
        return
    changes = checkpoint.numerics.changes_to(Numerics.of(device))
    if changes:
        logger.warning("%s resumes with other numerics than it was saved with (%s): it trains on correctly, but from "
                       "here its floating-point results differ in their lowest bits from an uninterrupted run's "
                       "(docs/reliability.md#resuming-with-other-numerics)", save_dir, "; ".join(changes))


def _memory_plan(cfg: TrainingConfig, data: TrainingData, model: Seq2Seq, checkpoint: Checkpoint | None
                 ) -> BudgetPlan:
    """The batch that fits ``--memory-budget``.

    A resumed run keeps the plan it started with: re-measuring a trained model could choose
    another batch, and the run would no longer repeat an uninterrupted one.
    """
    graphs = model.execution.cuda_graphs == "on"  # each kept shape's graphs hold memory between steps
    if checkpoint is not None and checkpoint.memory_plan:
        try:
            plan = BudgetPlan.from_dict(checkpoint.memory_plan)
        except BudgetError as error:
            raise CheckpointError(Path(cfg.save_dir) / LAST_CHECKPOINT, str(error)) from None
        if graphs != bool(plan.kept_bytes):
            logger.warning("the memory plan was made %s CUDA graphs and is kept, so that the batches stay the same: "
                           "the budget's check after every step shrinks them if the graphs' memory does not fit",
                           "with" if plan.kept_bytes else "without")
    else:
        capacity = PeakMeter(cfg.device).capacity()
        if capacity is not None and cfg.memory_budget > capacity:
            logger.warning("--memory-budget %s is more than this machine has (%s): the plan may choose a batch "
                           "that does not fit", format_bytes(cfg.memory_budget), format_bytes(capacity))
        plan = plan_budget(model, cfg.memory_budget, cfg.optimizer, data.train.lengths, torch.device(cfg.device),
                           beam=max(cfg.valid_beam, cfg.test_beam),
                           mapped_bytes=data.train.mapped_bytes() + data.valid.mapped_bytes(),
                           probe=probe_graphed_step if graphs else probe_step,
                           shapes=model.execution.cuda_graph_shapes if graphs else 1,
                           held_for_good=GraphedSteps.gradient_bytes(model) if graphs else 0)
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


