"""Training across processes and machines with torch.distributed, as started by ``torchrun``.

torchrun sets WORLD_SIZE, RANK and LOCAL_RANK; with WORLD_SIZE > 1 train.py joins a process group
(gloo on the CPU; NCCL on CUDA, one GPU per local rank). Rank 0's weights are broadcast at the
start, every rank trains every world_size-th batch of the epoch, and after each batch the gradients
are averaged across the ranks, so every rank makes the same update and the weights stay identical
(checked when training ends). Rank 0 alone validates, writes checkpoints and logs (the other ranks
log warnings only); it broadcasts the outcome of each validation (trainer state, LR schedule), so
every rank decays the LR and stops at the same point. A signal to any rank (Ctrl-C, SIGTERM) and a
reversal that fell back to backpropagation travel with the gradients' all-reduce, so every rank learns
of them at the same update and all stop there together (rank 0 saving). So does each rank's loss: every
rank decides whether to skip an update (a non-finite loss or gradients) on the same summed loss and
averaged gradients, so all skip the same updates and stop together after ``--max-nonfinite`` of them.

DistributedDataParallel is not used: its reducer all-reduces from autograd hooks during one
``backward()`` of the module's output, while reversal fills ``.grad`` through many backward calls
of its own (one per decoder step, then the encoder's reverse sweep), so the hooks would not fire
as DDP expects. The gradients are all-reduced explicitly instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from revnmt.checkpoints import TrainerState
from revnmt.data import Batch, TrainingData
from revnmt.memory.budget import BudgetPlan
from revnmt.model import Seq2Seq

from .config import RunConfig
from .progress import StepReporter
from .schedule import current_lr
from .trainer import Trainer, clip_and_step, compute_gradients, derived_seed

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Job:
    """This process's place in a torchrun job; a world of one for an ordinary run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Job:
        """The job torchrun describes in the environment (none: a world of one)."""
        env = os.environ
        return cls(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that validates, saves and logs."""
        return self.rank == 0

    def from_main(self, compute: Callable[[], T]) -> T:
        """``compute()`` run by rank 0 alone; every rank gets its result, or raises its exception.

        For what rank 0 decides for all (the checkpoint to resume, the memory plan), so that
        ranks agree even when they do not share a filesystem.
        """
        if not self.distributed:
            return compute()
        outcome: list = [(None, None)]
        if self.is_main:
            try:
                outcome = [(compute(), None)]
            except Exception as error:  # raised on every rank below, so that none waits for the others
                outcome = [(None, error)]
        dist.broadcast_object_list(outcome, src=0)
        result, error = outcome[0]
        if error is not None:
            raise error
        return result


@contextmanager
def process_group(device: str, job: Job) -> Iterator[str]:
    """Be part of ``job``'s process group for the duration of a run (nothing for a world of one).
    Yields the device this process trains on: on CUDA each rank uses the GPU of its local rank.
    """
    if not job.distributed:
        yield device
        return
    cuda = torch.device(device).type == "cuda"
    if cuda:
        device = f"cuda:{job.local_rank}"
        torch.cuda.set_device(device)
    before = _threads()
    dist.init_process_group("nccl" if cuda else "gloo")
    group_threads = _threads() - before
    try:
        yield device
        # Leave together: a gloo rank that tears its group down while another still uses it
        # (rank 0 translating the test set) can abort ("terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()
        _wait_for_threads_to_end(group_threads)


#: How long a rank waits at the end for its process group's threads to end.
GROUP_THREADS_END_S = 10.0


def _threads() -> set[str]:
    """The ids of this process's native threads (Linux's /proc/self/task; elsewhere none are known)."""
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:
        return set()


def _wait_for_threads_to_end(threads: set[str]) -> None:
    """Return once none of ``threads`` runs, or after :data:`GROUP_THREADS_END_S`.

    destroy_process_group returns while gloo's worker threads are still dropping their last collectives, whose
    tensors Python made (all_gather_object's, for one): dropping them takes the GIL, and a thread that tries once
    the interpreter has begun to exit is killed inside a C++ destructor, which aborts the rank (SIGABRT,
    "terminate called without an active exception") after a run that trained and saved everything. Waiting here
    closes that window."""
    deadline = time.monotonic() + GROUP_THREADS_END_S
    while threads & _threads() and time.monotonic() < deadline:
        time.sleep(0.005)


def state_digest(state_dict: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of a model's weights (names and bytes): equal digests, bit-identical weights."""
    digest = hashlib.sha256()
    for name, tensor in state_dict.items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class DistributedTrainer(Trainer):
    """A Trainer that is one rank of a torchrun job."""

    def __init__(self, config: RunConfig, data: TrainingData, model: Seq2Seq, plan: BudgetPlan | None,
                 job: Job) -> None:
        super().__init__(config, data, model, plan)
        self.job = job
        self.rank, self.world_size = job.rank, job.world_size
        self._stop_agreed = False  # a rank was signalled: all stop before the next update
        if not job.is_main:
            # one progress bar per job: rank 0's
            self.reporter = StepReporter(config.training.log_every, logger, self._memory_line, bar=False)

    def train(self) -> str:
        """Start every rank from rank 0's weights, train, and check that the weights still agree."""
        for tensor in self.model.state_dict().values():
            dist.broadcast(tensor, src=0)
        if not self.job.is_main:
            # Rank 0 draws its dropout masks from the run's (checkpointed) generator; the others
            # need masks of their own. A resumed run repeats rank 0's masks exactly, not theirs.
            torch.manual_seed(derived_seed(self.config.training.seed, self.rank, self.state.step))
        freq = self.batching.update_freq
        logger.info("%d ranks: each update averages the gradients of %d batches, %d per rank; the last "
                    "(number of batches mod %d) batches of each epoch are left out", self.world_size,
                    self.world_size * freq, freq, self.world_size)
        reason = super().train()
        self._check_replicas()
        return reason

    def _update(self, parts: list[Batch], where: str) -> torch.Tensor | None:
        gradients = compute_gradients(self.model, parts, self.train_step)
        signum = self.stop.signum
        (sigint, sigterm, fallbacks), loss_sum = self._average_gradients(
            [signum == signal.SIGINT, signum == signal.SIGTERM, gradients.reversal_error is not None], gradients.loss)
        if sigint or sigterm:
            self.stop.request(signal.SIGINT if sigint else signal.SIGTERM)  # a rank that got none exits alike
            self._stop_agreed = True
        self._count_fallbacks(round(fallbacks), f"{where} on {round(fallbacks)} of {self.world_size} ranks",
                              gradients.reversal_error or "on another rank")
        stepped = clip_and_step(self.optimizer, self.config.training.clip, torch.tensor(loss_sum))
        self._count_skipped(None if stepped else gradients.skip_reason(), where)
        return gradients.loss if stepped else None

    def _should_stop(self) -> bool:
        return self._stop_agreed  # agreed in an all-reduce, so every rank stops before the same update

    def _average_gradients(self, counts: list[bool], loss: torch.Tensor) -> tuple[list[float], float]:
        """Average the ranks' gradients; returns ``counts`` and ``loss`` summed over the ranks (carried in the
        same collective: one per update)."""
        # Explicit all-reduce: DDP's autograd hooks do not fire for gradients that reversal
        # accumulates outside one backward() of the module output (see the module docstring).
        grads = [p.grad for p in self.model.parameters()]  # train_step (or an overflow) fills every parameter's
        extra = torch.cat([torch.tensor(counts, dtype=grads[0].dtype, device=grads[0].device),
                           loss.detach().reshape(1).to(grads[0].dtype)])
        flat = torch.cat([g.reshape(-1) for g in grads] + [extra])  # one collective rather than one per tensor
        dist.all_reduce(flat)
        *totals, loss_sum = flat[-len(extra):].tolist()
        flat = flat[:-len(extra)] / self.world_size
        for grad, average in zip(grads, flat.split([g.numel() for g in grads])):
            grad.copy_(average.view_as(grad))
        return totals, loss_sum

    def _stop_at_once(self) -> AbstractContextManager:
        # The other ranks wait for rank 0's validation in a broadcast: a signal stops the job after it.
        return nullcontext()

    def _validate(self, due: str) -> None:
        # Rank 0 validates and saves while the others wait in the broadcast of its outcome, which is
        # thus the epoch's barrier; with it every rank has the same state, LR and stop decision.
        if self.job.is_main:
            super()._validate(due)
        outcome = [(asdict(self.state), self.scheduler.state_dict(), current_lr(self.optimizer))]
        dist.broadcast_object_list(outcome, src=0)
        state, scheduler, lr = outcome[0]
        self.state = TrainerState(**state)
        self.scheduler.load_state_dict(scheduler)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _save(self, best: bool, numbered: bool = False) -> None:
        if self.job.is_main:
            super()._save(best, numbered)

    def _write_tsv_header(self) -> None:
        if self.job.is_main:
            super()._write_tsv_header()

    def _check_replicas(self) -> None:
        """Raise if the ranks' weights differ: identical updates must keep them bit-identical."""
        digests: list = [None] * self.world_size
        dist.all_gather_object(digests, state_digest(self.model.state_dict()))
        if len(set(digests)) > 1:
            raise RuntimeError(f"the ranks' weights differ after training (SHA-256 by rank: {digests})")
        logger.info("weights identical on all %d ranks: SHA-256 %s", self.world_size, digests[0])
