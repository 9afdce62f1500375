"""Checkpoints that are never half-written, never trusted when read, the files a run keeps them in, and the
RNG state needed to resume a run exactly."""

from __future__ import annotations

import os
import pickle
import random
import re
import zipfile
from collections.abc import Collection
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from revnmt.atomic import atomic_file
from revnmt.data import SPECIALS, DataOptions, Vocabulary
from revnmt.model import ModelConfig, build_model

# What a training run writes into its checkpoint directory.
BEST_CHECKPOINT = "best.pt"
LAST_CHECKPOINT = "last.pt"
# With --keep-checkpoints, the checkpoints of the latest validations, by step: step-00001200.pt. Zero-padded
# to 8 digits so that the names sort by step (listed by the number they hold, which goes on past 8 digits).
_NUMBERED_CHECKPOINT = re.compile(r"step-(\d+)\.pt")

# What a checkpoint must hold to translate with (an averaged one holds these and "args"), and to resume its
# run (what Trainer.checkpoint() writes, less the optional keys below).
TRANSLATING = ("model_config", "model", "src_vocab", "tgt_vocab", "data")
RESUMING = (*TRANSLATING, "args", "optimizer", "scheduler", "trainer", "rng")
# The kind of every key a reader indexes into, checked wherever it is present ("data_fingerprint" and
# "memory_plan" are optional, and may be None).
_KINDS = {"model_config": dict, "model": dict, "src_vocab": list, "tgt_vocab": list, "data": dict, "args": dict,
          "optimizer": dict, "scheduler": dict, "trainer": dict, "rng": dict, "averaged_from": dict}


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


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu",
                    needs: Collection[str] = (), check_weights: bool = True) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`, checked by :func:`validate_checkpoint` to hold
    the keys ``needs`` (:data:`TRANSLATING`, :data:`RESUMING`) and, with ``check_weights``, the weights its
    model_config makes.

    The records' CRC-32s are verified first (torch.load does not verify them: damaged tensor bytes would
    load as silently changed weights), which reads the file once more, about 40 ms per 100 MB. Loads with
    ``weights_only=True``, so that a checkpoint cannot run code: its state must be built from tensors,
    numbers, strings and plain containers, as :func:`rng_state` and ``state_dict()`` are. CheckpointError
    for a file that is damaged or not a revnmt checkpoint.
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
            state = torch.load(file, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as error:
            raise CheckpointError(path, "it holds more than tensors and plain data, and loading it could run "
                                  "code: refused") from error
        # A damaged file fails deep inside zip or pickle code with any of several exception types whose
        # messages do not name the file. Their text is left out: torch's advises loading with
        # weights_only=False, which would let the file run code.
        except Exception as error:
            raise CheckpointError(path, f"corrupt or not a revnmt checkpoint ({type(error).__name__})") from error
    validate_checkpoint(state, path, needs, check_weights)
    return state


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


def validate_checkpoint(state: object, path: str | os.PathLike[str], needs: Collection[str] = (),
                        check_weights: bool = True) -> None:
    """CheckpointError naming ``path`` unless ``state`` is a revnmt checkpoint holding the keys ``needs``.

    Checks what the loaders rely on, so that a foreign file (a plain state_dict, a list, a checkpoint of
    another program) is one line here, not a KeyError or TypeError deep inside one of them: the keys and
    their kinds, vocabularies of strings that begin with the special tokens, the data options, a valid
    model_config, and with ``check_weights``, vocabularies of its sizes and weights of the names, shapes
    and dtypes it makes.
    """
    if not isinstance(state, dict):
        raise CheckpointError(path, f"not a revnmt checkpoint (it holds a {type(state).__name__}, not a dict)")
    if missing := [key for key in needs if key not in state]:
        raise CheckpointError(path, f"not a revnmt checkpoint (it has no {', '.join(missing)})")
    for key, kind in _KINDS.items():
        if key in state and not isinstance(state[key], kind):
            raise CheckpointError(path, f"its {key} is a {type(state[key]).__name__}, not a {kind.__name__}")
    if not all(isinstance(weight, torch.Tensor) for weight in state.get("model", {}).values()):
        raise CheckpointError(path, "its model holds more than tensors")
    for key in ("src_vocab", "tgt_vocab"):
        vocab = state.get(key, SPECIALS)
        if tuple(vocab[: len(SPECIALS)]) != SPECIALS or not all(isinstance(token, str) for token in vocab):
            raise CheckpointError(path, f"its {key} is not a vocabulary: strings that begin with {' '.join(SPECIALS)}")
        try:
            Vocabulary(vocab[len(SPECIALS):])
        except ValueError as error:  # duplicate or empty entries
            raise CheckpointError(path, f"its {key} is not a vocabulary ({error})") from None
    required = [f.name for f in fields(DataOptions) if f.default is MISSING]
    if "data" in state and (missing := [name for name in required if name not in state["data"]]):
        raise CheckpointError(path, f"its data options have no {', '.join(missing)}")
    if "model_config" in state:
        _check_model(state, path, check_weights)


def _check_model(state: dict[str, Any], path: str | os.PathLike[str], check_weights: bool) -> None:
    """:func:`validate_checkpoint`'s checks of the model_config, and with ``check_weights``, of the sizes of
    the vocabularies and the weights against it."""
    try:
        config = ModelConfig(**state["model_config"]).validate()
        # On the meta device: the names, shapes and dtypes of the weights, without their memory.
        with torch.device("meta"), _NoInitialisation():
            expected = build_model(config).state_dict()
    except (TypeError, ValueError, RuntimeError) as error:
        raise CheckpointError(path, f"its model_config is not valid ({error})") from None
    if not check_weights:
        return
    for key, size in (("src_vocab", config.src_vocab), ("tgt_vocab", config.tgt_vocab)):
        if key in state and len(state[key]) != size:
            raise CheckpointError(path, f"its {key} has {len(state[key])} entries, its model_config {size}")
    if "model" not in state:
        return
    weights = state["model"]
    if weights.keys() != expected.keys():
        names = sorted(weights.keys() ^ expected.keys(), key=str)
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        raise CheckpointError(path, f"its weights are not those of its model_config ({', '.join(map(str, names[:3]))}"
                              f"{more} differ)")
    for name, tensor in expected.items():
        weight = weights[name]
        if weight.shape != tensor.shape or weight.dtype != tensor.dtype:
            raise CheckpointError(path, f"its weight {name} is {tuple(weight.shape)} {weight.dtype}, its model_config "
                                  f"makes {tuple(tensor.shape)} {tensor.dtype}")


class _NoInitialisation(TorchFunctionMode):
    """Skips ``torch.nn.init``'s functions, which mean nothing on the meta device, where some of them
    (``normal_``) would import torch's compiler, seconds of work, for nothing."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]  # the tensor to initialise, as it is
        return func(*args, **kwargs)


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
