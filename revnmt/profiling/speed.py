"""Training speed of several models compared fairly: side by side, on the same batches, in one process."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from revnmt.data import Batch


def interleaved_seconds(calls: dict[str, Callable[[int], None]], rounds: int, warmup: int) -> dict[str, list[float]]:
    """The seconds of each named call in each of ``rounds`` timed rounds, after ``warmup`` untimed ones.

    Round ``i`` calls every ``call(i)`` in turn, so that a slow phase of a shared machine weighs on all of
    them alike; the warm-up rounds (allocator, caches, compilation) are numbered first. A call must return
    only once its work is done (on CUDA: synchronize, or read a result).
    """
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(warmup + rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call(i)
            if i >= warmup:
                seconds[name].append(time.perf_counter() - start)
    return seconds


def tokens_per_second(steps: dict[str, Callable[[Batch], None]], batches: Sequence[Batch],
                      warmup: int = 2) -> dict[str, float]:
    """Target tokens per second of each named training step on ``batches``, taking turns batch by batch
    (:func:`interleaved_seconds`); the first ``warmup`` batches are not timed."""
    if len(batches) <= warmup:
        raise ValueError(f"need more than {warmup} batches to time after the warm-up, got {len(batches)}")
    seconds = interleaved_seconds({name: lambda i, step=step: step(batches[i]) for name, step in steps.items()},
                                  len(batches) - warmup, warmup)
    tokens = sum(batch.n_tokens for batch in batches[warmup:])
    return {name: tokens / sum(spent) for name, spent in seconds.items()}
