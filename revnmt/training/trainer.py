"""The training loop: updates, validation, LR decay, early stopping, checkpoints that resume exactly.

An update trains ``--update-freq`` consecutive batches (their gradients accumulated) on each process.
A checkpoint holds the model, optimizer, scheduler, every RNG and the position inside the epoch.
Batch order is a pure function of (seed, epoch), so a resumed run rebuilds the epoch's batches,
skips those already trained on, and makes the same updates as a run that was never interrupted.
A signal (Ctrl-C, SIGTERM) ends the run after the current update with such a checkpoint
(:mod:`.interrupts`), and a batch whose reversal fails is trained by backpropagation instead
(:func:`compute_gradients`), so neither loses work. Divergence is a fault, not a result: an update whose
loss or gradients are not finite, or whose fixed-point state overflows, is skipped (:func:`clip_and_step`);
``--max-nonfinite`` of them in a row, or weights that are not finite, stop the run (:class:`Diverged`)
before such weights are saved; and a dev score that is not finite never makes best.pt.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from buffers import FixedPointOverflowError
from revnmt.atomic import atomic_write_text, open_for_appending
from revnmt.checkpoints import (
    BEST_CHECKPOINT,
    LAST_CHECKPOINT,
    Checkpoint,
    Numerics,
    TrainerState,
    TrainingState,
    numbered_checkpoint_name,
    prune_numbered_checkpoints,
    rng_state,
    set_rng_state,
)
from revnmt.data import Batch, BatchSampler, TrainingData, make_batch, sorted_batches
from revnmt.memory.budget import BudgetGuard, BudgetPlan, accumulation_for
from revnmt.model import Seq2Seq, StepResult
from revnmt.rnn import ReversalError
from revnmt.translation import Translator, evaluate

from .config import RunConfig, TrainingConfig
from .curves import Curves
from .graphs import TrainStep, training_step
from .interrupts import Interrupted, Signalled, StopRequest, raise_on_signals
from .progress import StepReporter, Window, peak_memory
from .schedule import build_optimizer, build_scheduler, current_lr

logger = logging.getLogger(__name__)

VALID_TSV = "valid.tsv"
VALID_COLUMNS = ("epoch", "step", "dev_loss", "dev_ppl", "dev_bleu", "lr", "elapsed_s")


def derived_seed(*keys: int) -> int:
    """A seed for a random stream of its own (a worker's, a rank's), from the run's seed and a position."""
    return int(np.random.SeedSequence(keys).generate_state(1)[0])


class TooManyFallbacks(RuntimeError):
    """More batches than ``--max-reversal-fallbacks`` allows needed backpropagation instead of reversal."""


class Diverged(RuntimeError):
    """``--max-nonfinite`` updates in a row were skipped, or the weights are not finite: nothing more is saved."""


@dataclass(frozen=True)
class Gradients:
    """What :func:`compute_gradients` did: the batch's summed loss, the error that made it fall back
    to backpropagation (None when reversal succeeded), and the overflow that left it without gradients."""

    loss: torch.Tensor
    reversal_error: ReversalError | None = None
    overflow: FixedPointOverflowError | None = None

    def skip_reason(self) -> str:
        """Why an update on these gradients was skipped, for the log."""
        return str(self.overflow) if self.overflow is not None else "non-finite loss or gradients"


def compute_gradients(model: Seq2Seq, parts: list[Batch], step: TrainStep | None = None) -> Gradients:
    """Set ``model``'s ``.grad`` to the gradients of the batch made of ``parts``, each trained by ``step``
    (default: ``model.train_step``; :func:`.graphs.training_step` chooses one for a run).

    ``train_step`` accumulates the gradients itself (reversible models train by reversal), so the old
    ones are dropped first, and each part's loss is divided by the whole batch's target tokens: the
    parts' gradients add up to the batch's.

    If reversal fails its exactness check (:class:`ReversalError`), the batch is trained again by ordinary
    backpropagation through the same fixed-point model (``train_step_autograd``), with the same dropout
    masks (the generators are rewound): the gradients reversal would have given, at the memory cost of an
    ordinary model for this one batch.

    A fixed-point state that leaves its range (:class:`FixedPointOverflowError`: diverging weights) leaves no
    gradients: the loss is NaN and every gradient zero, so that the update is skipped as any other with a
    non-finite loss (:func:`clip_and_step`), and a torchrun rank still has gradients to all-reduce.
    """
    try:
        return _gradients(model, parts, step or model.train_step)
    except FixedPointOverflowError as overflow:
        for param in model.parameters():
            param.grad = torch.zeros_like(param)
        return Gradients(torch.tensor(math.nan, device=next(model.parameters()).device), overflow=overflow)


def _gradients(model: Seq2Seq, parts: list[Batch], step: TrainStep) -> Gradients:
    rewind = _torch_rng_state()
    try:
        return Gradients(_accumulate(model, parts, step))
    except ReversalError as error:
        _set_torch_rng_state(rewind)
        return Gradients(_accumulate(model, parts, model.train_step_autograd), error)


def _accumulate(model: Seq2Seq, parts: list[Batch], step: Callable[..., StepResult]) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    n_tokens = sum(part.n_tokens for part in parts)
    return sum(step(part.src, part.src_len, part.tgt_in, part.tgt_out, normalizer=n_tokens).loss for part in parts)


def _torch_rng_state() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The generators a training step draws its dropout masks from (host-side state: no device sync)."""
    return torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []


def _set_torch_rng_state(state: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda:
        torch.cuda.set_rng_state_all(cuda)


def clip_and_step(optimizer: torch.optim.Optimizer, clip: float, loss: torch.Tensor) -> bool:
    """Clip the gradient norm of ``optimizer``'s parameters to ``clip`` (0: no clipping) and step, unless
    ``loss`` or the gradient norm is not finite (NaN, inf): then drop the gradients and skip the step. Returns
    whether it stepped.

    The verdict is read on the host: one sync per update on CUDA, where the next batch's blocking copy to the
    device waits for this update anyway; all it costs is the overlap of the optimizer's kernel launches with
    the end of the backward pass.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    # clip_grad_norm_ computes the total norm anyway (and returns it); without clipping, the norm alone
    if clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if not bool(torch.isfinite(norm) & torch.isfinite(loss)):
        optimizer.zero_grad(set_to_none=True)
        return False
    optimizer.step()
    return True


# Where a validation is due (TrainerState.validation_due). EPOCH_END and VALID_EVERY are the scheduled ones: they
# step the LR schedule and count towards --patience.
EPOCH_END, VALID_EVERY, MAX_STEPS = "end of epoch", "every N updates", "max steps"


@dataclass(frozen=True)
class Validation:
    loss: float  # per target token
    bleu: float

    @property
    def ppl(self) -> float:
        return math.exp(min(self.loss, 100.0))


@dataclass(frozen=True)
class Batching:
    """How the training data becomes updates: each batch's size (padded tokens, or sentences) and how many
    consecutive batches' gradients one update accumulates (``--update-freq``)."""

    batch_tokens: int | None
    batch_size: int | None
    update_freq: int

    @classmethod
    def of(cls, cfg: TrainingConfig, plan: BudgetPlan | None) -> Batching:
        """The options' batching, or the memory plan's: the largest batch that fits, or (with ``--batch-tokens``
        as the effective batch) the fewest batches that fit and reach it."""
        if plan is None:
            return cls(cfg.batch_tokens, cfg.batch_size, cfg.update_freq)
        if cfg.batch_tokens is None:
            return cls(plan.batch_tokens, None, cfg.update_freq)
        update_freq, batch_tokens = accumulation_for(cfg.batch_tokens, plan.batch_tokens)
        return cls(batch_tokens, None, update_freq)

    def describe(self) -> str:
        batch = f"{self.batch_tokens} padded tokens" if self.batch_tokens else f"{self.batch_size} sentences"
        if self.update_freq == 1:
            return f"batches of up to {batch}, one per update"
        return (f"batches of up to {batch}, {self.update_freq} accumulated per update (--update-freq): an "
                f"effective batch of up to {self.update_freq} x {batch}")


class Trainer:
    """Trains ``model`` on ``data`` as ``config`` says, saving into its ``save_dir``."""

    def __init__(self, config: RunConfig, data: TrainingData, model: Seq2Seq, plan: BudgetPlan | None = None) -> None:
        """``plan`` (from ``--memory-budget``) replaces the batch options."""
        cfg = config.training
        self.config, self.data, self.model, self.plan = config, data, model, plan
        self.save_dir = Path(cfg.save_dir)
        self.optimizer = build_optimizer(cfg, model.parameters())
        self.scheduler = build_scheduler(cfg, self.optimizer)
        self.state = TrainerState()
        self.batching = Batching.of(cfg, plan)
        self.sampler = BatchSampler(data.train.lengths, batch_tokens=self.batching.batch_tokens,
                                    batch_size=self.batching.batch_size, shuffle=True, seed=cfg.seed)
        self.translator = Translator(model, data.src_vocab, data.tgt_vocab, data.options)
        self.device = next(model.parameters()).device
        self.train_step = training_step(model)  # model.train_step, or its CUDA graphs (--cuda-graphs on)
        # With a budget, every step's measured peak is checked against it (and the log shows both).
        self.guard = BudgetGuard(plan, self.device) if plan else None
        self.reporter = StepReporter(cfg.log_every, logger, self._status_line, on_window=self._plot_window)
        self.curves: Curves | None = None  # --tensorboard's, opened by the run in the process that logs
        self.eval_batch_size = plan.eval_batch_size if plan else cfg.eval_batch_size
        # Each update trains batch ``rank`` of a group of ``world_size`` consecutive batches, one per
        # process (DistributedTrainer); a single process trains every batch.
        self.rank, self.world_size = 0, 1
        self._session_start, self._elapsed_before = time.monotonic(), 0.0
        # Set by a signal handler (revnmt.cli.train installs it): stop after the current update.
        self.stop = StopRequest()
        self.saved_step: int | None = None  # the step of the last.pt on disk, None before the first

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self) -> Checkpoint:
        """Everything needed to translate with the model or to resume the run."""
        self.state.elapsed_s = self.elapsed()
        training = TrainingState(optimizer=self.optimizer.state_dict(), scheduler=self.scheduler.state_dict(),
                                 trainer=replace(self.state), rng=rng_state())  # a copy: the run goes on
        return Checkpoint(
            model_config=self.model.cfg, weights=self.model.state_dict(), src_vocab=self.data.src_vocab.itos,
            tgt_vocab=self.data.tgt_vocab.itos, data=self.data.options, args=self.config.options(), training=training,
            data_fingerprint=self.data.fingerprint, numerics=Numerics.of(self.device),
            memory_plan=None if self.plan is None else self.plan.to_dict() | {"measured_peak": self._memory_line()})

    def restore(self, checkpoint: Checkpoint, restart_epoch: bool = False) -> None:
        """Continue the run saved in ``checkpoint``, loaded with its training state (its model options must be
        this model's).

        The options that may change on resume (:data:`revnmt.training.config.CHANGEABLE_ON_RESUME`) take
        this run's values: a new ``--lr`` replaces the (possibly decayed) rate, new ``--lr-decay`` /
        ``--lr-patience`` the schedule's. ``restart_epoch`` trains the current epoch again from its first
        batch (the data changed, so the saved position means nothing).
        """
        training, cfg = checkpoint.training, self.config.training
        self.model.load_state_dict(checkpoint.weights)
        self.optimizer.load_state_dict(training.optimizer)
        self.scheduler.load_state_dict(training.scheduler)
        if checkpoint.args.get("lr") != cfg.lr:
            for group in self.optimizer.param_groups:
                group["lr"] = cfg.lr
        self.scheduler.factor, self.scheduler.patience = cfg.lr_decay, cfg.lr_patience
        self.state = replace(training.trainer)  # a copy: the checkpoint's stays as it was saved
        if restart_epoch:
            self.state.batch_in_epoch = 0
        self._check_position()
        self.saved_step = self.state.step
        self._elapsed_before = self.state.elapsed_s
        set_rng_state(training.rng)  # last: building the model above drew from the generators

    def _check_position(self) -> None:
        """A saved position must lie inside its epoch: past its end, training would never reach the
        epoch's end (the batches were made from other data or options)."""
        n_batches = len(self.sampler.batches(self.state.epoch))
        if self.state.batch_in_epoch > n_batches:
            raise ValueError(f"the checkpoint's position, batch {self.state.batch_in_epoch} of epoch "
                             f"{self.state.epoch}, lies past the epoch's {n_batches} batches: the data or the "
                             f"batching changed since it was saved")

    def _save(self, best: bool, numbered: bool = False) -> None:
        """Save last.pt, and best.pt too if ``best``. With ``numbered`` (a validation's save) and
        ``--keep-checkpoints N``, also the step's numbered checkpoint; only once it is written are the
        numbered ones beyond the newest N deleted."""
        checkpoint = self.checkpoint()
        checkpoint.save(self.save_dir / LAST_CHECKPOINT)
        self.saved_step = self.state.step
        if best:
            checkpoint.save(self.save_dir / BEST_CHECKPOINT)
        keep = self.config.training.keep_checkpoints
        if numbered and keep:
            checkpoint.save(self.save_dir / numbered_checkpoint_name(self.state.step))
            prune_numbered_checkpoints(self.save_dir, keep)

    def elapsed(self) -> float:
        return self._elapsed_before + time.monotonic() - self._session_start

    # ------------------------------------------------------------------ the loop

    def stop_reason(self) -> str | None:
        """Why training is over, or None while it is not."""
        cfg, state = self.config.training, self.state
        if cfg.max_steps is not None and state.step >= cfg.max_steps:
            return f"reached --max-steps {cfg.max_steps}"
        if state.epoch > cfg.epochs:
            return f"completed --epochs {cfg.epochs}"
        if state.bad_epochs >= cfg.patience:
            return f"no dev BLEU improvement in {state.bad_epochs} validations (--patience {cfg.patience})"
        if current_lr(self.optimizer) < cfg.min_lr:
            return f"learning rate {current_lr(self.optimizer):.2e} is below --min-lr {cfg.min_lr:g}"
        return None

    def train(self) -> str:
        """Train until a stop condition holds; return it.

        Validation follows every epoch, every ``--valid-every`` updates, and a stop at ``--max-steps``
        inside an epoch. Only the scheduled ones (epoch ends, every N updates) step the LR schedule and
        the patience count, so where a run was stopped and resumed changes neither its updates nor
        when it stops (only best.pt can differ: the stop's validation may find a better model).
        """
        if self.state.step == 0:
            self._write_tsv_header()
        logger.info("training from epoch %d, step %d: %d batches per epoch, %d parameters; %s; %s", self.state.epoch,
                    self.state.step, len(self.sampler.batches(self.state.epoch)),
                    sum(p.numel() for p in self.model.parameters()), self.batching.describe(),
                    Numerics.of(self.device).describe())
        # self.state, not a local name for it: a torchrun rank takes rank 0's state object after a validation
        while self.state.validation_due is not None or (reason := self.stop_reason()) is None:
            if self.state.validation_due is None:
                before = self.state.step
                epoch_done = self._train_epoch()
                self._check_weights()  # before the checkpoint of a stop or a validation
                self.state.validation_due = self._validation_due(epoch_done, before)
            if self.state.validation_due is not None and not self._should_stop():
                try:
                    self._validate(self.state.validation_due)
                except Signalled as signalled:  # in the dev translation: saved as due, the resumed run validates
                    self.stop.request(signalled.signum)
            if self._should_stop():
                logger.warning("%s received: saving %s at step %d", signal.Signals(self.stop.signum).name,
                               LAST_CHECKPOINT, self.state.step)
                self._save(best=False)
                raise Interrupted(self.stop.signum, self.state.step)
        logger.info("training stopped: %s; best dev BLEU %.2f at step %d", reason, self.state.best_bleu,
                    self.state.best_step)
        return reason

    def _validation_due(self, epoch_done: bool, before: int) -> str | None:
        """The validation due after training from step ``before`` to this one, which ended the epoch if
        ``epoch_done``; None if none is."""
        cfg, step = self.config.training, self.state.step
        if epoch_done:
            return EPOCH_END
        if cfg.valid_every and step // cfg.valid_every > before // cfg.valid_every:
            return VALID_EVERY
        if cfg.max_steps is not None and step >= cfg.max_steps:
            return MAX_STEPS
        return None

    def _train_epoch(self) -> bool:
        """Train on the rest of the current epoch; False if ``--max-steps``, a validation every
        ``--valid-every`` updates or a signal cut it short."""
        cfg, state = self.config.training, self.state
        batches = self.sampler.batches(state.epoch)
        # With several processes the last len % world_size batches are left out: every process
        # must take part in every update (DistributedTrainer averages their gradients).
        n_batches = len(batches) - len(batches) % self.world_size
        # An update trains a group of update_freq batches on each process: those of the group's positions
        # ≡ rank (mod world_size). An epoch's last group may be smaller; it still spans every process.
        group = self.world_size * self.batching.update_freq
        self.model.train()
        tick = time.monotonic()
        with self.reporter.epoch(state.epoch, n_batches, state.batch_in_epoch):
            for first in range(state.batch_in_epoch, n_batches, group):
                if self._should_stop():
                    break
                end = min(first + group, n_batches)
                mine = range(first + self.rank, end, self.world_size)
                split = [self._parts(batches[index]) for index in mine]
                parts = [part for pieces in split for part in pieces]
                named = f"batch {mine[0]}" if len(mine) == 1 else f"batches {mine[0]}-{mine[-1]}"
                loss = self._update(parts, f"{named} of epoch {state.epoch} (step {state.step + 1})")
                if self.guard is not None:
                    self._check_budget([batches[index] for index in mine], split)
                state.step, state.batch_in_epoch = state.step + 1, end
                n_tokens = sum(part.n_tokens for part in parts) if loss is not None else 0
                # Counted per step (not per epoch) so that a --save-every checkpoint carries it.
                state.train_tokens += n_tokens
                state.train_s += time.monotonic() - tick
                self.reporter.step(state.step, state.batch_in_epoch, loss, n_tokens, current_lr(self.optimizer))
                if cfg.save_every and state.step % cfg.save_every == 0:
                    self._check_weights()
                    self._save(best=False)
                tick = time.monotonic()
                if cfg.max_steps is not None and state.step >= cfg.max_steps:
                    break
                if cfg.valid_every and state.step % cfg.valid_every == 0:
                    break
        return state.batch_in_epoch == n_batches

    def _parts(self, indices: list[int]) -> list[Batch]:
        """The batch of these training pairs, on the device: whole, or in parts of at most the plan's
        ``step_tokens`` padded tokens once a step has gone over the memory budget."""
        limit = self.plan.step_tokens if self.plan is not None else None
        length = int(self.data.train.lengths[indices].max())
        if limit is None or len(indices) * length <= limit:
            return [make_batch(self.data.train, indices).to(self.device)]
        ordered = sorted(indices, key=lambda i: -int(self.data.train.lengths[i]))  # similar lengths together
        size = max(1, limit // length)
        return [make_batch(self.data.train, ordered[i: i + size]).to(self.device) for i in range(0, len(ordered), size)]

    def _check_budget(self, group: list[list[int]], split: list[list[Batch]]) -> None:
        """Hold the update's measured peak against the plan, as a step on the group's costliest batch (the one
        of most padded tokens; ``split[k]``: the parts batch ``group[k]`` trained in)."""
        lengths = self.data.train.lengths
        padded = [len(indices) * int(lengths[indices].max()) for indices in group]
        costliest = padded.index(max(padded))
        indices, parts = group[costliest], split[costliest]
        length = int(lengths[indices].max())
        if not self.guard.check(len(indices), length, max(len(part) for part in parts) * length):
            logger.info("%s", self.plan.describe())

    def _memory_line(self) -> str:
        return self.guard.describe_peak() if self.guard is not None else peak_memory(self.device)

    def _status_line(self) -> str:
        """What a progress line ends with: the memory peak, and the reversal fallbacks if there were any."""
        fallbacks = self.state.reversal_fallbacks
        return self._memory_line() + (f" | {fallbacks} reversal fallbacks" if fallbacks else "")

    def _plot_window(self, window: Window) -> None:
        """A closed progress window's points on the curves, with the run's reversal fallbacks so far."""
        if self.curves is not None:
            self.curves.train(window, self.state.reversal_fallbacks)

    def _should_stop(self) -> bool:
        """Whether a signal asked the run to stop (between updates)."""
        return self.stop.requested()

    def _update(self, parts: list[Batch], where: str) -> torch.Tensor | None:
        """One optimizer step on the batch made of ``parts`` (``where`` names it for the log); returns its
        summed loss, or None if the update was skipped (:meth:`_count_skipped`)."""
        gradients = compute_gradients(self.model, parts, self.train_step)
        self._count_fallbacks(int(gradients.reversal_error is not None), where, gradients.reversal_error)
        stepped = clip_and_step(self.optimizer, self.config.training.clip, gradients.loss)
        self._count_skipped(None if stepped else gradients.skip_reason(), where)
        return gradients.loss if stepped else None

    def _count_fallbacks(self, new: int, where: str, error: Exception | str | None) -> None:
        """Count ``new`` batches of the coming update (step + 1) trained by backpropagation after a failed
        reversal; TooManyFallbacks once
        they are more than ``--max-reversal-fallbacks`` of the updates (two at least: one fault may be chance,
        a repeated one is a bug)."""
        if not new:
            return
        state, share = self.state, self.config.training.max_reversal_fallbacks
        state.reversal_fallbacks += new
        logger.warning("%s: reversal failed (%s); its gradients were computed by backpropagation instead "
                       "(%d such batches so far)", where, error, state.reversal_fallbacks)
        updates = state.step + 1
        if state.reversal_fallbacks >= 2 and state.reversal_fallbacks > share * updates:
            raise TooManyFallbacks(
                f"reversal failed on {state.reversal_fallbacks} of {updates} updates, more than "
                f"--max-reversal-fallbacks {share:g} allows: see the warnings in train.log (resuming with "
                f"another --buffer-backend may avoid the fault)")

    def _count_skipped(self, reason: str | None, where: str) -> None:
        """Count the coming update (step + 1) as skipped for ``reason``, or (None) end a run of skipped ones;
        Diverged once ``--max-nonfinite`` in a row were skipped. A skipped update changed nothing, so the
        weights, and the last checkpoint, are still those of the last update made."""
        state, limit = self.state, self.config.training.max_nonfinite
        if reason is None:
            state.nonfinite_in_a_row = 0
            return
        state.nonfinite_in_a_row += 1
        logger.warning("%s: %s; the update was skipped (%d in a row)", where, reason, state.nonfinite_in_a_row)
        if state.nonfinite_in_a_row >= limit:
            raise Diverged(f"training diverged at step {state.step + 1}: {state.nonfinite_in_a_row} updates in a row "
                           f"had a non-finite loss or gradients (--max-nonfinite {limit}); {self._kept()}")

    def _check_weights(self) -> None:
        """Diverged if a weight is not finite (an update with finite gradients can still make it so): such
        weights are never saved. Between epochs and before a --save-every checkpoint, on every rank alike."""
        if not bool(torch.stack([torch.isfinite(p).all() for p in self.model.parameters()]).all()):
            raise Diverged(f"training diverged at step {self.state.step}: the weights are not finite; {self._kept()}")

    def _kept(self) -> str:
        """What a stop for divergence leaves, and what to do about it."""
        kept = f"the checkpoint of step {self.saved_step} is kept" if self.saved_step is not None else \
            "no checkpoint was saved"
        return f"{kept} (resuming with a lower --lr or --clip may avoid the fault)"

    # ------------------------------------------------------------------ validation

    def evaluate(self) -> Validation:
        """Dev loss per token (teacher forcing) and sacreBLEU of the dev translations; both NaN if the
        model's fixed-point state overflows (diverging weights). A signal stops it at once (:class:`Signalled`):
        it changes nothing a resumed run would not do again."""
        self.model.eval()
        try:
            with self._stop_at_once():
                total, tokens = 0.0, 0
                for indices in sorted_batches(self.data.valid.lengths, self.eval_batch_size):
                    batch = make_batch(self.data.valid, indices).to(self.device)
                    total += self.model.loss(batch.src, batch.src_len, batch.tgt_in, batch.tgt_out).item()
                    tokens += batch.n_tokens
                hyps = self.translator.translate(self.data.valid_text.src, beam=self.config.training.valid_beam,
                                                 batch_size=self.eval_batch_size, progress=self.reporter.use_bar)
        except FixedPointOverflowError as overflow:
            logger.warning("dev set: %s", overflow)
            return Validation(loss=math.nan, bleu=math.nan)
        finally:
            self.model.train()
        scores = evaluate(hyps, self.data.valid_text.tgt, self.data.options)
        for line in scores.lines():
            logger.info("dev %s", line)
        return Validation(loss=total / tokens, bleu=scores.sacrebleu.score)

    def _stop_at_once(self) -> AbstractContextManager:
        """Where a signal stops validation at once (raising :class:`Signalled`) rather than after it."""
        return raise_on_signals()

    def _validate(self, due: str) -> None:
        """The validation ``due`` (EPOCH_END, VALID_EVERY or MAX_STEPS): score the dev set, log it, save, and for
        a scheduled one step the LR schedule and the patience count; after EPOCH_END the next epoch begins."""
        state, epoch, lr = self.state, self.state.epoch, current_lr(self.optimizer)
        result = self.evaluate()
        finite = math.isfinite(result.loss) and math.isfinite(result.bleu)  # else a diverged model's: never best
        improved = finite and result.bleu > state.best_bleu
        if improved:
            state.best_bleu, state.best_step = result.bleu, state.step
        if due in (EPOCH_END, VALID_EVERY):
            if finite and result.bleu > state.epoch_best_bleu:
                state.epoch_best_bleu, state.bad_epochs = result.bleu, 0
            else:
                state.bad_epochs += 1
            self.scheduler.step(result.loss)
            if current_lr(self.optimizer) < lr:
                logger.info("dev loss did not improve: learning rate %.2e -> %.2e", lr, current_lr(self.optimizer))
        if due == EPOCH_END:
            state.epoch, state.batch_in_epoch = epoch + 1, 0
        state.validation_due = None
        where = {EPOCH_END: "after epoch %d", VALID_EVERY: "in epoch %d", MAX_STEPS: "in epoch %d (part)"}[due]
        logger.info(f"validation {where}, step %d: dev loss %.3f | ppl %.2f | BLEU %.2f%s", epoch, state.step,
                    result.loss, result.ppl, result.bleu,
                    " (best)" if improved else f"{'' if finite else ' (not finite)'} (best {state.best_bleu:.2f} at "
                    f"step {state.best_step})")
        row = (epoch, state.step, f"{result.loss:.4f}", f"{result.ppl:.2f}", f"{result.bleu:.2f}", f"{lr:.3g}",
               f"{self.elapsed():.0f}")
        with open_for_appending(self.save_dir / VALID_TSV) as f:
            f.write("\t".join(map(str, row)) + "\n")
        if self.curves is not None:
            self.curves.dev(state.step, result.loss, result.ppl, result.bleu)
        self._save(best=improved, numbered=True)

    def _write_tsv_header(self) -> None:
        atomic_write_text(self.save_dir / VALID_TSV, "\t".join(VALID_COLUMNS) + "\n")
