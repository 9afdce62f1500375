"""Checkpoint files: never half-written, never trusted when read (their records are checked, and they cannot run
code; what they hold is :mod:`.record`'s to check), the files a run keeps them in, and the RNG state needed to
resume a run exactly."""

from __future__ import annotations

import os
import pickle
import random
import re
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from revnmt.atomic import atomic_file

# What a training run writes into its checkpoint directory.
BEST_CHECKPOINT = "best.pt"
LAST_CHECKPOINT = "last.pt"
# With --keep-checkpoints, the checkpoints of the latest validations, by step: step-00001200.pt. Zero-padded
# to 8 digits so that the names sort by step (listed by the number they hold, which goes on past 8 digits).
_NUMBERED_CHECKPOINT = re.compile(r"step-(\d+)\.pt")


class CheckpointError(ValueError):
    """A file that cannot be used as a checkpoint: damaged, or not one revnmt wrote. The message names it."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"cannot load checkpoint {path}: {reason}")


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Save ``state`` to ``path`` atomically: a crash leaves either the old file or the new one.
    ``torch.save`` streams into the temporary file, so the checkpoint never exists as one bytes object.

    An OSError while writing (no space left, file too large, quota exceeded, a read-only file system) is
    raised as it is: torch would report it as a RuntimeError ("unexpected pos") that does not say what.
    """
    with atomic_file(path) as file:
        recording = _ErrorRecordingFile(file)
        try:
            torch.save(state, recording)
        except RuntimeError:
            if recording.error is None:
                raise
            raise recording.error from None


class _ErrorRecordingFile:
    """The file ``torch.save`` writes into, keeping the exception its ``write`` raised (an OSError, or a
    KeyboardInterrupt arriving in it), which torch's writer replaces by a RuntimeError of its own."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.error = file, None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except BaseException as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.file.flush()


def read_checkpoint_file(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> object:
    """What the checkpoint file ``path`` holds, as :func:`save_checkpoint` wrote it, unchecked beyond the file
    itself: :meth:`revnmt.checkpoints.Checkpoint.load` reads it as a checkpoint.

    The records' CRC-32s are verified first (torch.load does not verify them: damaged tensor bytes would
    load as silently changed weights), which reads the file once more, about 40 ms per 100 MB. Loads with
    ``weights_only=True``, so that a checkpoint cannot run code: its state must be built from tensors,
    numbers, strings and plain containers, as :func:`rng_state` and ``state_dict()`` are. CheckpointError
    for a file that is damaged or not one torch wrote.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, not a checkpoint file")
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    try:
        file = path.open("rb")
    except OSError as error:
        raise type(error)(f"cannot read checkpoint {path}: {error.strerror}") from None
    with file:  # one open file for both reads: a checkpoint replaced meanwhile is not read half old, half new
        _check_records(file, path)
        file.seek(0)
        try:
            # Explicit, as an explicit weights_only=True is final: TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 only
            # changes torch's default (torch 2.13's torch.load reads it only when weights_only is not given).
            return torch.load(file, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as error:
            raise CheckpointError(path, "it holds more than tensors and plain data, and loading it could run "
                                  "code: refused") from error
        # A damaged file fails deep inside zip or pickle code with any of several exception types whose
        # messages do not name the file. Their text is left out: torch's advises loading with
        # weights_only=False, which would let the file run code.
        except Exception as error:
            raise CheckpointError(path, f"corrupt or not a revnmt checkpoint ({type(error).__name__})") from error


def _check_records(file: BinaryIO, path: Path) -> None:
    """CheckpointError unless ``file`` is a zip archive, as ``torch.save`` writes, whose every record
    matches its CRC-32."""
    try:
        with zipfile.ZipFile(file) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError) as error:
        raise CheckpointError(path, f"truncated, or not a checkpoint (not a zip archive as torch.save writes: "
                              f"{error})") from None
    if damaged is not None:
        raise CheckpointError(path, f"damaged: its record {damaged} does not match its CRC-32")


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
