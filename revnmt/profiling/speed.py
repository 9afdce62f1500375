"""Training speed of several models compared fairly: side by side, on the same batches, in one process."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from revnmt.data import Batch


def tokens_per_second(steps: dict[str, Callable[[Batch], None]], batches: Sequence[Batch],
                      warmup: int = 2) -> dict[str, float]:
    """Target tokens per second of each named training step on ``batches``.

    The steps take turns batch by batch, so that a slow phase of a shared machine weighs on all of
    them alike; the first ``warmup`` batches (allocator, caches, compilation) are not timed. A step
    must return only once its work is done (on CUDA: synchronize, or read a result).
    """
    if len(batches) <= warmup:
        raise ValueError(f"need more than {warmup} batches to time after the warm-up, got {len(batches)}")
    seconds = dict.fromkeys(steps, 0.0)
    for i, batch in enumerate(batches):
        for name, step in steps.items():
            start = time.perf_counter()
            step(batch)
            if i >= warmup:
                seconds[name] += time.perf_counter() - start
    tokens = sum(batch.n_tokens for batch in batches[warmup:])
    return {name: tokens / spent for name, spent in seconds.items()}
