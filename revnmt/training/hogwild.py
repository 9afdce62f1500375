"""Hogwild! training: N worker processes update one set of weights in shared memory, without locks.

Reversal rebuilds the hidden states from the weights, so these must not change between a batch's
forward and backward sweeps, while other workers keep writing the shared ones. Each worker
therefore trains every batch on a private snapshot: it copies the shared weights into its own
model, runs ``train_step`` there (filling the private ``.grad``), and then applies the update to
the shared weights with an optimizer of its own over them (as in PyTorch's Hogwild example),
whose gradient tensors are the worker's and never shared. The shared weights live in host memory;
on CUDA a worker copies them to its GPU for each batch and its gradients back. Worker w of N
trains batches w, w + N, w + 2N, ... of each epoch's (deterministic) batch list, ``--update-freq`` of them
per update, all on one snapshot.

Between epochs the main process validates, checkpoints, decays the LR and decides whether to stop.
It talks to the workers through queues rather than an ``mp.Barrier``: a queue also carries the
epoch's LR, per-update reports and a failing worker's traceback, and waiting on it with a timeout
lets the main process notice a worker that died without a word (killed), where a barrier would
wait forever. A failure stops the run with ``WorkerError`` before anything more is saved, so the
last checkpoint stays the last good one. A worker skips an update whose loss or gradients are not finite
(:func:`~.trainer.clip_and_step`) and says so in its report; the main process counts the skips in the order
the reports arrive, as it counts reversal fallbacks, and stops the run as :class:`~.trainer.Trainer` does.

Resuming works at epoch granularity, from a ``--max-steps`` stop and from an interrupt: updates race,
so no run can be repeated exactly, and each worker's optimizer state (Adam's moments) is private, not
checkpointed, and starts afresh in a resumed run. A checkpoint's position must name a prefix of the
epoch's batches, all trained; on Ctrl-C or SIGTERM (which the workers ignore: the main process decides)
the main process therefore moves the epoch's end to just after the last batch any worker has started
(:class:`EpochEnd`), the workers finish the batches before it, and the run saves there.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import queue
import signal
import traceback
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from revnmt.data import BatchSampler, EncodedDataset, TrainingData, make_batch
from revnmt.memory.budget import BudgetPlan
from revnmt.memory.sizes import format_bytes
from revnmt.model import Seq2Seq

from .config import RunConfig, TrainingConfig
from .interrupts import ignore_signals
from .progress import peak_memory
from .schedule import build_optimizer, current_lr
from .trainer import Trainer, clip_and_step, compute_gradients, derived_seed

logger = logging.getLogger(__name__)

POLL_S = 1.0  # how often a waiting process checks that the other side is still alive
JOIN_S = 30.0  # how long workers told to stop may take before they are terminated


class WorkerError(RuntimeError):
    """A Hogwild worker failed or died: the run stops without saving anything more."""


@dataclass(frozen=True)
class EpochCommand:
    """What the main process asks of every worker: train batches [start, end) of an epoch at ``lr``."""

    epoch: int
    start: int
    end: int
    lr: float


class EpochEnd:
    """The end of the batches an epoch's workers train, movable while they run, in shared memory.

    A worker claims each batch index before training it; the main process can stop the epoch early at
    ``1 +`` the highest index claimed so far. Every index below that is then trained, since each worker
    claims its indices in order: the trained batches stay a prefix of the epoch, which a checkpoint can name.
    """

    def __init__(self, context) -> None:
        self._lock = context.Lock()
        self._end = context.RawValue("q", 0)
        self._claimed = context.RawValue("q", -1)

    def reset(self, end: int) -> None:
        with self._lock:
            self._end.value, self._claimed.value = end, -1

    def claim(self, index: int) -> bool:
        """Whether a worker may train batch ``index`` (it is before the end); noted as started if so."""
        with self._lock:
            if index >= self._end.value:
                return False
            self._claimed.value = max(self._claimed.value, index)
            return True

    def stop_early(self, start: int) -> int:
        """End the epoch after the batches already claimed (at ``start`` if none was); returns the new end."""
        with self._lock:
            self._end.value = min(self._end.value, max(start, self._claimed.value + 1))
            return self._end.value


@dataclass(frozen=True)
class WorkerSetup:
    """Everything a worker process needs besides the shared model and the queues."""

    rank: int
    n_workers: int
    device: str
    threads: int
    config: TrainingConfig
    train: EncodedDataset
    sampler: BatchSampler
    update_freq: int  # of the worker's own batches accumulated into each of its updates


def worker_devices(config: TrainingConfig) -> list[str]:
    """Each worker's device: round-robin over ``--devices``, else over every GPU with a CUDA
    ``--device``, else the CPU."""
    if config.devices:
        ids = list(config.devices)
    elif torch.device(config.device).type == "cuda":
        ids = list(range(torch.cuda.device_count()))
    else:
        return ["cpu"] * config.hogwild
    return [f"cuda:{ids[rank % len(ids)]}" for rank in range(config.hogwild)]


# ---------------------------------------------------------------------- worker processes

def _worker(setup: WorkerSetup, shared: Seq2Seq, commands: mp.Queue, results: mp.Queue, end: EpochEnd) -> None:
    """Worker process: train the epochs the main process sends until it sends None."""
    ignore_signals()
    try:
        _train(setup, shared, commands, results, end)
    except Exception:  # any failure (ReversalError included) must reach the main process, traceback and all
        results.put(("error", setup.rank, traceback.format_exc()))


def _train(setup: WorkerSetup, shared: Seq2Seq, commands: mp.Queue, results: mp.Queue, end: EpochEnd) -> None:
    # Messages to the main process: ("ready", rank) once set up, ("step", rank, batches trained, summed loss,
    # target tokens, the ReversalError's text if the batches fell back to backpropagation, else None, why the
    # update was skipped if it was, else None) after each update, ("done", rank) after each epoch, ("error", rank,
    # traceback) from _worker.
    torch.set_num_threads(setup.threads)  # N workers with every core each would oversubscribe the CPU
    device = torch.device(setup.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    private = type(shared)(shared.cfg, shared.execution).to(device).train()  # the shared model's class, its own weights
    optimizer = build_optimizer(setup.config, shared.parameters())
    results.put(("ready", setup.rank))
    while (command := _next_command(commands)) is not None:
        for group in optimizer.param_groups:
            group["lr"] = command.lr
        torch.manual_seed(derived_seed(setup.config.seed, command.epoch, setup.rank))  # dropout masks of its own
        batches = setup.sampler.batches(command.epoch)
        first = command.start + (setup.rank - command.start) % setup.n_workers  # the first index ≡ rank mod N
        mine = iter(range(first, command.end, setup.n_workers))
        # An update accumulates the next update_freq of the worker's batches, each claimed before it is trained.
        while claimed := [index for _, index in zip(range(setup.update_freq), mine) if end.claim(index)]:
            private.load_state_dict(shared.state_dict())  # the snapshot that stays fixed through the update
            parts = [make_batch(setup.train, batches[index]).to(device) for index in claimed]
            gradients = compute_gradients(private, parts)
            for shared_param, param in zip(shared.parameters(), private.parameters()):
                # On the CPU these are the private tensors themselves (no copy); shared_param.grad
                # was created in this process, so it is this worker's, not shared.
                shared_param.grad = None if param.grad is None else param.grad.to(shared_param.device)
            stepped = clip_and_step(optimizer, setup.config.clip, gradients.loss)
            # .item() costs no extra sync on CUDA: clip_and_step already waited for the loss.
            error = None if gradients.reversal_error is None else str(gradients.reversal_error)
            skipped = None if stepped else gradients.skip_reason()
            results.put(("step", setup.rank, len(claimed), gradients.loss.item(), sum(part.n_tokens for part in parts),
                         error, skipped))
        results.put(("done", setup.rank))


def _next_command(commands: mp.Queue) -> EpochCommand | None:
    """The next command; None to stop, also once the main process has gone (killed)."""
    while True:
        try:
            return commands.get(timeout=POLL_S)
        except queue.Empty:
            if not mp.parent_process().is_alive():
                return None


# ---------------------------------------------------------------------- the main process's side

class WorkerPool:
    """The worker processes of a Hogwild run and the main process's ends of their queues."""

    def __init__(self, config: TrainingConfig, shared: Seq2Seq, train: EncodedDataset,
                 sampler: BatchSampler, update_freq: int) -> None:
        # spawn: CUDA cannot be used in forked children, and fork risks deadlocks (threads, locks).
        context = mp.get_context("spawn")
        threads = max(1, torch.get_num_threads() // config.hogwild)  # the cores (or OMP_NUM_THREADS), split
        self.results = context.Queue()
        self.commands = [context.Queue() for _ in range(config.hogwild)]
        self.end = EpochEnd(context)
        self.processes = []
        for rank, device in enumerate(worker_devices(config)):
            setup = WorkerSetup(rank, config.hogwild, device, threads, config, train, sampler, update_freq)
            process = context.Process(target=_worker, args=(setup, shared, self.commands[rank], self.results, self.end),
                                      name=f"hogwild-{rank}", daemon=True)
            process.start()
            self.processes.append(process)
        # Starting takes seconds (each worker imports torch): wait, so that a worker that cannot
        # start fails here and the first epoch's progress and timing are its own.
        try:
            for _ in self.processes:
                self._receive()  # ("ready", rank): a worker sends nothing before it
        except BaseException:
            self.close(graceful=False)
            raise

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, error_type, error, tb) -> None:
        self.close(graceful=error_type is None)

    def run_epoch(self, command: EpochCommand) -> Iterator[tuple[int, int, float, int, str | None, str | None]]:
        """Have every worker train its share of ``command``; yields (rank, batches trained, summed loss, target
        tokens, reversal error or None, why the update was skipped or None) per update until all are done
        (:attr:`end` may end the epoch early). Raises WorkerError when a worker fails or dies."""
        self.end.reset(command.end)
        for commands in self.commands:
            commands.put(command)
        running = set(range(len(self.processes)))
        while running:
            kind, rank, *report = self._receive()
            if kind == "step":
                yield rank, *report
            else:
                running.discard(rank)

    def _receive(self) -> tuple:
        while True:
            try:
                return _checked(self.results.get(timeout=POLL_S))
            except queue.Empty:
                self._check_alive()

    def _check_alive(self) -> None:
        dead = [(rank, process) for rank, process in enumerate(self.processes) if not process.is_alive()]
        if not dead:
            return
        # A worker that failed with an exception queued its traceback before exiting: report that.
        with contextlib.suppress(queue.Empty):
            while True:
                _checked(self.results.get(timeout=0.1))
        rank, process = dead[0]
        code = process.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        raise WorkerError(f"Hogwild worker {rank} (pid {process.pid}) {how}")

    def close(self, graceful: bool = True) -> None:
        """Stop the workers: between epochs by asking them; after a failure (graceful=False) at once,
        since whatever they still compute would be discarded."""
        if graceful:
            for commands in self.commands:
                commands.put(None)
            for process in self.processes:
                process.join(JOIN_S)
        for process in self.processes:
            if process.is_alive():
                process.kill()  # not terminate(): workers ignore SIGTERM (the main process decides when to stop)
            process.join()


# ---------------------------------------------------------------------- the trainer

class HogwildTrainer(Trainer):
    """A Trainer whose epochs are trained by ``--hogwild`` worker processes on shared weights."""

    def __init__(self, config: RunConfig, data: TrainingData, model: Seq2Seq, plan: BudgetPlan | None = None) -> None:
        super().__init__(config, data, model, plan)
        # The master weights live in shared host memory. On the CPU they are the very model the
        # main process validates and saves; on a GPU that model is a copy, refreshed every epoch.
        self.shared = model if self.device.type == "cpu" else copy.deepcopy(model).cpu()
        self.shared.share_memory()
        self.pool: WorkerPool | None = None

    def train(self) -> str:
        """Start the workers, train as Trainer.train does, stop them (at once if training failed)."""
        _copy_weights(self.model, self.shared)  # weights restored from a checkpoint
        with WorkerPool(self.config.training, self.shared, self.data.train, self.sampler,
                        self.batching.update_freq) as self.pool:
            return super().train()

    def _memory_line(self) -> str:
        # The workers train, each on batches of the plan; this process holds the shared weights and validates. A
        # --memory-budget thus bounds each worker's steps, not the run: say so where the peak is shown.
        line = f"main process {peak_memory(self.device)}"
        if self.plan is not None:
            line += (f"; the {format_bytes(self.plan.budget_bytes)} budget bounds each of the "
                     f"{self.config.training.hogwild} workers' steps")
        return line

    def _train_epoch(self) -> bool:
        cfg, state = self.config.training, self.state
        if self._should_stop():
            return False
        n_batches = len(self.sampler.batches(state.epoch))
        start = state.batch_in_epoch
        freq = self.batching.update_freq
        end = n_batches if cfg.max_steps is None else min(n_batches, start + (cfg.max_steps - state.step) * freq)
        if cfg.valid_every:  # the workers stop at the next validation's step, or just past it (their groups race)
            end = min(end, start + (cfg.valid_every - state.step % cfg.valid_every) * freq)
        command = EpochCommand(state.epoch, start, end, current_lr(self.optimizer))
        updates, trained = [0] * cfg.hogwild, start
        with self.reporter.epoch(state.epoch, n_batches, start):
            for rank, batches, loss, n_tokens, error, skipped in self.pool.run_epoch(command):
                where = f"{'a batch' if freq == 1 else 'batches'} of Hogwild worker {rank} (step {state.step + 1})"
                self._count_fallbacks(int(error is not None), where, error)
                self._count_skipped(skipped, where)
                updates[rank] += 1
                state.step, trained = state.step + 1, trained + batches
                self.reporter.step(state.step, trained, None if skipped else torch.tensor(loss), n_tokens, command.lr)
                if self._should_stop() and end == command.end:
                    end = self.pool.end.stop_early(start)
        # Every batch of [start, end) is trained now, so a --max-steps stop or an interrupt resumes at ``end``.
        state.batch_in_epoch = end
        logger.info("epoch %d: updates by Hogwild worker %s", state.epoch,
                    ", ".join(f"{rank}: {n}" for rank, n in enumerate(updates)))
        _copy_weights(self.shared, self.model)
        return end == n_batches


def _checked(message: tuple) -> tuple:
    """``message`` from a worker, unless it reports a failure: then WorkerError."""
    if message[0] == "error":
        raise WorkerError(f"Hogwild worker {message[1]} failed:\n{message[2].rstrip()}")
    return message


def _copy_weights(source: Seq2Seq, target: Seq2Seq) -> None:
    if target is not source:
        target.load_state_dict(source.state_dict())
