"""Optimizer and learning-rate schedule: decay on a dev-loss plateau, stop below a minimum rate."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.optim.lr_scheduler import ReduceLROnPlateau

from .config import TrainingConfig


def build_optimizer(config: TrainingConfig, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """Adam or plain SGD at ``--lr``."""
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr)
    return torch.optim.SGD(params, lr=config.lr)


def build_scheduler(config: TrainingConfig, optimizer: torch.optim.Optimizer) -> ReduceLROnPlateau:
    """Multiply the LR by ``--lr-decay`` after ``--lr-patience`` + 1 epochs without a lower dev loss.

    No ``min_lr`` floor: the trainer stops once the rate is below ``--min-lr`` instead of going
    on at a rate that no longer changes the model.
    """
    return ReduceLROnPlateau(optimizer, mode="min", factor=config.lr_decay, patience=config.lr_patience)


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate of the (single) parameter group."""
    return optimizer.param_groups[0]["lr"]
