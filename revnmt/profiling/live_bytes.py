"""Live tensor bytes by the site that made them: what a step's memory peak is made of, tensor by tensor.

A dispatch mode follows every tensor storage created inside it until it is freed, with the innermost two revnmt
frames that made it, and keeps the snapshot of live bytes by site at the peak. It sees tensors only: the C heap,
numba's numpy scratch and the math libraries' work buffers are not among them.
"""

from __future__ import annotations

import traceback
import weakref
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_PACKAGE = str(Path(__file__).resolve().parent.parent)  # revnmt/
_PROFILING = str(Path(__file__).resolve().parent)


def _site() -> str:
    """The innermost two revnmt frames of the current stack (the measuring tools' own left out): where a tensor
    was made, and by whom."""
    frames = [f for f in traceback.extract_stack()
              if f.filename.startswith(_PACKAGE) and not f.filename.startswith(_PROFILING)]
    return " < ".join(f"{Path(f.filename).stem}:{f.lineno} {f.name}" for f in reversed(frames[-2:]))


class LiveBytesBySite(TorchDispatchMode):
    """Live tensor storages created inside the context, with the sites they were made at; the snapshot of
    live bytes by site at the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[int, str]] = {}
        self.current = self.peak = 0
        self.at_peak: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs))[0]
                  if isinstance(a, torch.Tensor)}
        grew = False
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in self.live or key in inputs or storage.nbytes() == 0:
                continue
            self.live[key] = storage.nbytes(), f"{func.__name__} @ {_site()}"
            self.current += storage.nbytes()
            weakref.finalize(storage, self._free, key)
            grew = True
        if grew and self.current > self.peak:
            self.peak = self.current
            self.at_peak = Counter()
            for size, site in self.live.values():
                self.at_peak[site] += size
        return out

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, (0, ""))[0]
