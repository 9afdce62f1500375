"""Optimizer and learning-rate schedule: decay on a dev-loss plateau, stop below a minimum rate."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

import torch
from torch.optim.lr_scheduler import ReduceLROnPlateau


def build_optimizer(args: argparse.Namespace, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """Adam or plain SGD at ``--lr``."""
    if args.optimizer == "adam":
        return torch.optim.Adam(params, lr=args.lr)
    return torch.optim.SGD(params, lr=args.lr)


def build_scheduler(args: argparse.Namespace, optimizer: torch.optim.Optimizer) -> ReduceLROnPlateau:
    """Multiply the LR by ``--lr-decay`` after ``--lr-patience`` + 1 epochs without a lower dev loss.

    No ``min_lr`` floor: the trainer stops once the rate is below ``--min-lr`` instead of going
    on at a rate that no longer changes the model.
    """
    return ReduceLROnPlateau(optimizer, mode="min", factor=args.lr_decay, patience=args.lr_patience)


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate of the (single) parameter group."""
    return optimizer.param_groups[0]["lr"]
