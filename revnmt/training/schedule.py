"""Optimizer and learning-rate schedule: decay on a dev-loss plateau, stop below a minimum rate."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau

from .config import TrainingConfig


class _Eager(Optimizer):
    """An optimizer whose methods skip the wrappers that exclude them from ``torch.compile``.

    torch's optimizers wrap ``add_param_group``, ``state_dict``, ``load_state_dict``, ``zero_grad`` and ``step``
    in functions that import ``torch._dynamo`` when first called, to disable the compiler for them (or to break a
    compiled graph). That import brings in the compiler's stack (``torch._inductor``, sympy, and triton where it
    is installed), resident for the rest of the run (benchmarks/README.md, "Data at scale" measures it), although
    revnmt never compiles. Without compilation the wrappers only call the function they wrap, so calling it
    directly performs the same updates, and the state dicts are the same (checkpoints load into either class).
    """

    add_param_group = inspect.unwrap(Optimizer.add_param_group)
    state_dict = inspect.unwrap(Optimizer.state_dict)
    load_state_dict = inspect.unwrap(Optimizer.load_state_dict)
    zero_grad = inspect.unwrap(Optimizer.zero_grad)


def _step_without_grad(step: Callable) -> Callable:
    """``step`` as torch runs it (without autograd: these optimizers are not differentiable), without the wrapper
    that imports ``torch._dynamo`` to break a compiled graph around it."""
    unwrapped = inspect.unwrap(step)

    @torch.no_grad()
    def eager_step(self: Optimizer, closure: Callable[[], float] | None = None) -> float | None:
        return unwrapped(self, closure)

    return eager_step


class Adam(_Eager, torch.optim.Adam):
    """torch's Adam, the same updates, without importing ``torch._dynamo`` (:class:`_Eager`).

    :func:`build_optimizer` makes it ``fused``: one kernel updates each tensor in place, where the default
    (single-tensor) update makes parameter-sized temporaries, which set the first training step's peak memory
    with large vocabularies, and takes several passes (figures: benchmarks/README.md, "Data at scale"). Its updates
    round differently from the single-tensor one's by an ulp here and there, so a run resumed across the two would
    not go on bit for bit; within one implementation it does."""

    step = _step_without_grad(torch.optim.Adam.step)


class SGD(_Eager, torch.optim.SGD):
    """torch's SGD, the same updates, without importing ``torch._dynamo`` (:class:`_Eager`)."""

    step = _step_without_grad(torch.optim.SGD.step)


def build_optimizer(config: TrainingConfig, params: Iterable[torch.nn.Parameter]) -> Optimizer:
    """Adam (fused: :class:`Adam`) or plain SGD at ``--lr``."""
    if config.optimizer == "adam":
        return Adam(params, lr=config.lr, fused=True)
    return SGD(params, lr=config.lr)


def build_scheduler(config: TrainingConfig, optimizer: torch.optim.Optimizer) -> ReduceLROnPlateau:
    """Multiply the LR by ``--lr-decay`` after ``--lr-patience`` + 1 scheduled validations (epoch ends, and
    every ``--valid-every`` updates) without a lower dev loss.

    No ``min_lr`` floor: the trainer stops once the rate is below ``--min-lr`` instead of going
    on at a rate that no longer changes the model.
    """
    return ReduceLROnPlateau(optimizer, mode="min", factor=config.lr_decay, patience=config.lr_patience)


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate of the (single) parameter group."""
    return optimizer.param_groups[0]["lr"]
