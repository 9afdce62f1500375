"""Checkpoint averaging (``revnmt-average``): one model whose weights are the element-wise mean of several
checkpoints' weights, usually the last few of one run (``revnmt-train --keep-checkpoints N``). The mean of
nearby points of one training trajectory tends to translate a little better than any of them.

The checkpoints must share vocabularies, tokenization and architecture (:mod:`revnmt.checkpoints.compatibility`).
Floating-point weights are summed in float64 and divided once, so the mean of copies of one checkpoint is
that checkpoint exactly. Integer and boolean tensors (counters, masks) are not averaged: the last
checkpoint's are taken.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

import torch

from revnmt.checkpoints.compatibility import architecture_differences, text_differences
from revnmt.checkpoints.record import AveragedFrom, Checkpoint


def average_checkpoints(paths: Sequence[str | os.PathLike[str]]) -> Checkpoint:
    """A checkpoint whose model is the mean of the models of the checkpoint files ``paths``, with the last
    one's options, vocabularies and tokenization, and ``averaged_from``: each input's name and step. It has no
    training state: it is for translating, not for resuming.

    Loads one checkpoint at a time. ValueError (naming both files) for checkpoints that cannot be averaged.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    first, steps = None, []
    sums: dict[str, torch.Tensor] = {}
    for path in paths:
        # Weights (and vocabularies) are compared among the checkpoints, not with the model their options make:
        # averaged as they are, integer tensors included; translating refuses an average that fits no model.
        checkpoint = Checkpoint.load(path, check_weights=False)
        if first is None:
            first = checkpoint
        elif differences := text_differences(first, checkpoint) or architecture_differences(first, checkpoint):
            raise ValueError(f"cannot average {paths[0]} and {path}: {'; '.join(differences)}")
        for key, tensor in checkpoint.weights.items():
            if not tensor.is_floating_point():
                sums[key] = tensor
            elif key in sums:
                sums[key] += tensor
            else:
                sums[key] = tensor.double()
        steps.append(checkpoint.step)
    weights = {key: (total / len(paths)).to(checkpoint.weights[key].dtype) if total.is_floating_point() else total
               for key, total in sums.items()}
    return replace(checkpoint, weights=weights, training=None, numerics=None,
                   averaged_from=AveragedFrom([os.fspath(path) for path in paths], steps))
