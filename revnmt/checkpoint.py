"""Checkpoints that are never half-written, the files a run keeps them in, and the RNG state needed to
resume a run exactly."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from revnmt.atomic import atomic_file

# What a training run writes into its checkpoint directory.
BEST_CHECKPOINT = "best.pt"
LAST_CHECKPOINT = "last.pt"
# With --keep-checkpoints, the checkpoints of the latest validations, by step: step-00001200.pt. Zero-padded
# to 8 digits so that the names sort by step (listed by the number they hold, which goes on past 8 digits).
_NUMBERED_CHECKPOINT = re.compile(r"step-(\d+)\.pt")


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Save ``state`` to ``path`` atomically: a crash leaves either the old file or the new one.
    ``torch.save`` streams into the temporary file, so the checkpoint never exists as one bytes object."""
    with atomic_file(path) as file:
        torch.save(state, file)


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`.

    Loads with ``weights_only=True`` (torch's default), so a checkpoint cannot run code: its
    state must be built from tensors, numbers, strings and plain containers, as
    :func:`rng_state` and ``state_dict()`` are.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, not a checkpoint file")
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    try:
        return torch.load(path, map_location=map_location)
    # A damaged file fails deep inside zip or pickle code with any of several exception types
    # (RuntimeError, EOFError, UnpicklingError, ...) whose messages do not name the file. Their text is
    # left out: torch's advises loading with weights_only=False, which would let the file run code.
    except Exception as error:
        raise RuntimeError(f"cannot load checkpoint {path}: truncated, corrupt or not a revnmt checkpoint "
                           f"({type(error).__name__})") from error


def resolve_checkpoint(path_or_dir: str | os.PathLike[str]) -> Path:
    """A checkpoint file as is; for a run directory, its ``best.pt``, else its ``last.pt``."""
    path = Path(path_or_dir)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint file or directory at {path}")
    for name in (BEST_CHECKPOINT, LAST_CHECKPOINT):
        if (path / name).is_file():
            return path / name
    raise FileNotFoundError(f"no checkpoint in {path}: looked for {BEST_CHECKPOINT} and {LAST_CHECKPOINT}")


def numbered_checkpoint_name(step: int) -> str:
    """The name of the checkpoint a run keeps of its validation at ``step``."""
    return f"step-{step:08d}.pt"


def numbered_checkpoints(run_dir: str | os.PathLike[str]) -> list[Path]:
    """A run directory's numbered checkpoints, oldest (lowest step) first."""
    found = [(int(match.group(1)), path) for path in Path(run_dir).iterdir()
             if (match := _NUMBERED_CHECKPOINT.fullmatch(path.name)) and path.is_file()]
    return [path for _, path in sorted(found)]


def prune_numbered_checkpoints(run_dir: str | os.PathLike[str], keep: int) -> None:
    """Delete all but the ``keep`` newest numbered checkpoints of a run directory."""
    old = numbered_checkpoints(run_dir)
    for path in old[: max(len(old) - keep, 0)]:
        path.unlink(missing_ok=True)


def rng_state() -> dict[str, Any]:
    """The state of every random generator training draws from: Python, numpy, torch CPU and CUDA."""
    numpy_state = np.random.get_state(legacy=False)
    # As a tensor the numpy key loads under weights_only=True; an ndarray would not.
    numpy_state["state"]["key"] = torch.from_numpy(numpy_state["state"]["key"].astype(np.int64))
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore generators saved by :func:`rng_state`.

    CUDA states are skipped when no GPU is present: a run resumed on the CPU never draws from them.
    """
    random.setstate(state["python"])
    numpy_state = dict(state["numpy"])
    numpy_state["state"] = {**numpy_state["state"], "key": numpy_state["state"]["key"].cpu().numpy().astype(np.uint32)}
    np.random.set_state(numpy_state)
    # .cpu(): a checkpoint loaded with map_location="cuda" moves these byte tensors too.
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
