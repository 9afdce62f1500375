"""The checkpoint format: :class:`Checkpoint`, the one reader and writer of what a checkpoint file holds.

A checkpoint file (:mod:`.files`) holds one dict of tensors, numbers, strings and plain containers, whose layout
its format fixes, a version stored under ``"format"``:

- format 1: every checkpoint written before the version existed, which have no ``"format"``;
- format 2: format 1's layout, with its version;
- format 3 (:data:`FORMAT`): format 2's, a trained checkpoint adding ``numerics`` (:class:`Numerics`).

To translate: ``model_config`` (the fields of :class:`~revnmt.model.ModelConfig`), ``model`` (the weights),
``src_vocab`` and ``tgt_vocab`` (each vocabulary's tokens, the special ones first) and ``data`` (the fields of
:class:`~revnmt.data.DataOptions`). A trained checkpoint adds ``args`` (the run's options), its training state
(``optimizer``, ``scheduler``, ``trainer``, ``rng``), what it computed with (``numerics``) and, if known,
``data_fingerprint`` and ``memory_plan``; an averaged one keeps ``args`` and adds ``averaged_from``.

A format 1 dict is upgraded as it is read: what its writers added over time (``data_fingerprint``,
``memory_plan``, model and data options, trainer counters) takes its default where it is missing; formats 1
and 2 have no ``numerics``. A format newer than :data:`FORMAT` is refused: this revnmt would misread it.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Callable, Collection
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode

from revnmt.checkpoints.files import CheckpointError, read_checkpoint_file, save_checkpoint
from revnmt.data import SPECIALS, DataOptions, Vocabulary
from revnmt.model import ExecutionConfig, ModelConfig, Seq2Seq, build_model

# The format this revnmt writes, and the newest it reads. Bump it whenever what a checkpoint holds changes (a key,
# or a field of the model options, data options or trainer state, added, removed or renamed), and upgrade the
# older formats where they are read.
FORMAT = 3
_FORMAT_KEY = "format"

# The keys every checkpoint holds (what translating needs), and those of its optional parts.
_TRANSLATING = ("model_config", "model", "src_vocab", "tgt_vocab", "data")
_PARTS = {"args": ("args",), "training": ("optimizer", "scheduler", "trainer", "rng")}
# The parts resuming a run needs (Checkpoint.load's ``needs``).
RESUMING = ("args", "training")
# The kind of every key, checked wherever it is present; those of _MAY_BE_NONE may also be None.
_KINDS = {"model_config": dict, "model": dict, "src_vocab": list, "tgt_vocab": list, "data": dict, "args": dict,
          "optimizer": dict, "scheduler": dict, "trainer": dict, "rng": dict, "data_fingerprint": dict,
          "memory_plan": dict, "averaged_from": dict, "numerics": dict}
_MAY_BE_NONE = ("data_fingerprint", "memory_plan")

_T = TypeVar("_T")


@dataclass
class TrainerState:
    """Where a training run stands: the trainer's counters, saved in checkpoints as ``"trainer"``."""

    epoch: int = 1  # the epoch in progress, from 1
    batch_in_epoch: int = 0  # batches of ``sampler.batches(epoch)`` already trained on
    step: int = 0  # updates so far, skipped ones included
    best_bleu: float = -1.0  # of all validations (best.pt); below any score, so the first one counts
    best_step: int = 0
    # --patience compares the dev BLEU of scheduled validations (at epoch ends and every --valid-every updates) with
    # the best of them only, so that a validation at a --max-steps stop does not change when a resumed run stops.
    epoch_best_bleu: float = -1.0  # the best scheduled validation's (named when epochs were the only schedule)
    bad_epochs: int = 0  # scheduled validations since it, without a better dev BLEU
    elapsed_s: float = 0.0  # training and validation time over all sessions
    train_tokens: int = 0  # target tokens of this process's updates, for throughput
    train_s: float = 0.0  # time in this process's update loop alone (no validation), over all sessions
    reversal_fallbacks: int = 0  # batches trained by backpropagation because reversal failed
    nonfinite_in_a_row: int = 0  # the last updates, skipped for a non-finite loss or gradients (or an overflow)
    # The validation the position calls for and a signal interrupted, done first by a resumed run: the trainer's
    # EPOCH_END, VALID_EVERY (every --valid-every updates) or MAX_STEPS (a --max-steps stop inside an epoch); None
    # when none is due.
    validation_due: str | None = None


@dataclass(frozen=True, eq=False)
class TrainingState:
    """What resuming a run needs besides its weights: the optimizer's and the LR scheduler's ``state_dict()``,
    where the run stands, and every random generator's state (:func:`~revnmt.checkpoints.rng_state`)."""

    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    trainer: TrainerState
    rng: dict[str, Any]


@dataclass(frozen=True)
class Numerics:
    """What decides the lowest bits of a run's arithmetic besides its options: the torch build, the device (a GPU
    by its name), torch's CPU threads, which split the sums of matrix products and reductions among them, and, on
    the CPU, the processor: torch and its BLAS pick their kernels by its instruction set (AVX2, AVX-512) and maker,
    and kernels of other vector widths sum in another order. Resumed with the same, a run repeats an uninterrupted
    one bit for bit; with others it goes on as correctly, its floating-point results differing in their lowest bits
    from the resumed step on."""

    torch: str
    device: str
    threads: int
    cpu: str = ""  # the processor and the instruction set torch dispatches to; "" on a GPU and before it was kept

    def __post_init__(self) -> None:
        if not (type(self.torch) is str and type(self.device) is str and type(self.cpu) is str):
            raise TypeError("torch, device and cpu must be strings")
        if type(self.threads) is not int or self.threads < 1:
            raise ValueError(f"threads must be a positive whole number, not {self.threads!r}")

    @classmethod
    def of(cls, device: torch.device | str) -> Numerics:
        """This process's, computing on ``device``."""
        device = torch.device(device)
        on_gpu = device.type == "cuda"
        name = torch.cuda.get_device_name(device) if on_gpu else device.type
        cpu = "" if on_gpu else f"{_processor()} ({torch.backends.cpu.get_cpu_capability()})"
        # str(): torch.__version__ is a TorchVersion, which a weights-only load refuses to unpickle
        return cls(torch=str(torch.__version__), device=name, threads=torch.get_num_threads(), cpu=cpu)

    def describe(self) -> str:
        """E.g. ``torch 2.13.0+cpu on cpu, 1 thread, AMD EPYC, x86 family 25 model 17 (AVX512)``."""
        threads = f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        return ", ".join([f"torch {self.torch} on {self.device}", threads] + ([self.cpu] if self.cpu else []))

    def changes_to(self, other: Numerics) -> list[str]:
        """What differs in ``other``, e.g. ``threads 1 -> 2``."""
        return [f"{f.name} {getattr(self, f.name) or '(not recorded)'} -> {getattr(other, f.name) or '(none)'}"
                for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


@functools.cache  # the processor does not change under a running process; a run asks at every save
def _processor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The processor's model name and, on x86, its family and model numbers (Linux's ``cpuinfo``; elsewhere what
    the platform module knows). A virtual machine may show a generation-less name ("AMD EPYC") for processors that
    sum some products in other orders; the numbers tell them apart."""
    found: dict[str, str] = {}
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if not key and found:  # the first processor's block has ended
                    break
                if key in ("model name", "cpu family", "model") and value:
                    found.setdefault(key, value)
    except OSError:
        pass
    name = found.get("model name") or platform.processor() or platform.machine() or "unknown processor"
    if "cpu family" in found and "model" in found:
        return f"{name}, x86 family {found['cpu family']} model {found['model']}"
    return name


@dataclass(frozen=True)
class AveragedFrom:
    """The checkpoints an averaged one was made of, and their steps (None for one without a training state)."""

    checkpoints: list[str]
    steps: list[int | None]


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """What a checkpoint holds: a trained model to translate with and, for a run's own checkpoints, what resuming
    the run needs (:meth:`load` reads one, :meth:`save` writes one)."""

    model_config: ModelConfig
    weights: dict[str, torch.Tensor]  # the model's state_dict()
    src_vocab: list[str]  # the vocabulary's tokens, the special ones first (Vocabulary.itos)
    tgt_vocab: list[str]
    data: DataOptions  # how text becomes tokens, the SentencePiece models included
    args: dict[str, Any] | None = None  # the run's options by command-line name (RunConfig.options())
    training: TrainingState | None = None  # a trained checkpoint's, to resume its run
    data_fingerprint: dict[str, dict] | None = None  # the training corpora's, compared on resume
    memory_plan: dict[str, Any] | None = None  # the --memory-budget plan (BudgetPlan.to_dict()) and its measured peak
    averaged_from: AveragedFrom | None = None
    numerics: Numerics | None = None  # a trained checkpoint's, compared on resume; None before format 3

    @classmethod
    def load(cls, path: str | os.PathLike[str], map_location: str | torch.device = "cpu", needs: Collection[str] = (),
             check_weights: bool = True) -> Checkpoint:
        """The checkpoint of the file ``path``, of any format up to :data:`FORMAT`, holding the optional parts
        ``needs`` (``"args"``, ``"training"``; both: :data:`RESUMING`) and, with ``check_weights``, vocabularies
        and weights that fit its model_config (:meth:`check_weights`).

        A foreign or damaged file (a plain state_dict, a list, a checkpoint of another program, of a newer
        format, or one whose parts are not what they should be) is a CheckpointError naming it, in one line:
        never a KeyError or TypeError deep inside a caller. Loading cannot run code
        (:func:`~revnmt.checkpoints.files.read_checkpoint_file`). Corrupt SentencePiece models are a ValueError
        naming the file.
        """
        state = read_checkpoint_file(path, map_location)
        _check_stored(state, path, needs)
        config = _parsed(model_config_from_dict, state, "model_config", path)
        training = None
        if "trainer" in state:
            trainer = _parsed(lambda stored: TrainerState(**stored), state, "trainer", path)
            training = TrainingState(state["optimizer"], state["scheduler"], trainer, state["rng"])
        averaged_from = None
        if "averaged_from" in state:
            averaged_from = _parsed(lambda stored: AveragedFrom(**stored), state, "averaged_from", path)
        numerics = _parsed(lambda stored: Numerics(**stored), state, "numerics", path) if "numerics" in state else None
        checkpoint = cls(model_config=config, weights=state["model"], src_vocab=state["src_vocab"],
                         tgt_vocab=state["tgt_vocab"], data=DataOptions.from_dict(state["data"], str(path)),
                         args=state.get("args"), training=training, data_fingerprint=state.get("data_fingerprint"),
                         memory_plan=state.get("memory_plan"), averaged_from=averaged_from, numerics=numerics)
        if check_weights:
            checkpoint.check_weights(path)
        return checkpoint

    def to_dict(self) -> dict[str, Any]:
        """What its file holds, in format :data:`FORMAT`: tensors, numbers, strings and plain containers only."""
        state = {_FORMAT_KEY: FORMAT, "model_config": self.model_config.to_dict(), "model": self.weights,
                 "src_vocab": self.src_vocab, "tgt_vocab": self.tgt_vocab, "data": self.data.to_dict()}
        if self.training is not None:
            training = self.training
            state |= {"optimizer": training.optimizer, "scheduler": training.scheduler,
                      "trainer": asdict(training.trainer), "rng": training.rng}
        optional = {"args": self.args, "data_fingerprint": self.data_fingerprint, "memory_plan": self.memory_plan,
                    "averaged_from": None if self.averaged_from is None else asdict(self.averaged_from),
                    "numerics": None if self.numerics is None else asdict(self.numerics)}
        return state | {key: value for key, value in optional.items() if value is not None}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write it to ``path`` atomically (:func:`~revnmt.checkpoints.save_checkpoint`)."""
        save_checkpoint(path, self.to_dict())

    def check_weights(self, path: str | os.PathLike[str]) -> None:
        """CheckpointError naming ``path`` unless its vocabularies have the sizes its model_config says and its
        weights the names, shapes and dtypes of the model that makes (built on the meta device: no memory)."""
        config = self.model_config
        try:
            with torch.device("meta"), _NoInitialisation():
                expected = build_model(config).state_dict()
        except (TypeError, ValueError, RuntimeError) as error:
            raise CheckpointError(path, f"its model_config is not valid ({error})") from None
        for key, vocab, size in (("src_vocab", self.src_vocab, config.src_vocab),
                                 ("tgt_vocab", self.tgt_vocab, config.tgt_vocab)):
            if len(vocab) != size:
                raise CheckpointError(path, f"its {key} has {len(vocab)} entries, its model_config {size}")
        if self.weights.keys() != expected.keys():
            names = sorted(self.weights.keys() ^ expected.keys(), key=str)
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            raise CheckpointError(path, f"its weights are not those of its model_config "
                                  f"({', '.join(map(str, names[:3]))}{more} differ)")
        for name, tensor in expected.items():
            weight = self.weights[name]
            if weight.shape != tensor.shape or weight.dtype != tensor.dtype:
                raise CheckpointError(path, f"its weight {name} is {tuple(weight.shape)} {weight.dtype}, its "
                                      f"model_config makes {tuple(tensor.shape)} {tensor.dtype}")

    def trained_model(self, execution: ExecutionConfig | None = None) -> Seq2Seq:
        """Its model with its weights, on CPU, computing as ``execution`` says (default: the defaults)."""
        model = build_model(self.model_config, execution)
        model.load_state_dict(self.weights)
        return model

    @property
    def step(self) -> int | None:
        """The update it was saved after; None without a training state (an average)."""
        return None if self.training is None else self.training.trainer.step


def model_config_from_dict(stored: dict[str, Any]) -> ModelConfig:
    """The model options a checkpoint of any format stores, validated: the one place they are read, where options
    that moved or changed are upgraded. TypeError or ValueError if they are not valid.

    Format 1 kept how the model computes (:class:`~revnmt.model.ExecutionConfig`) among them; its ``args`` hold
    those options too, which is where a run's execution is read from (``RunConfig.from_checkpoint``)."""
    execution = {f.name for f in fields(ExecutionConfig)}
    return ModelConfig(**{key: value for key, value in stored.items() if key not in execution})


def _check_stored(state: object, path: str | os.PathLike[str], needs: Collection[str]) -> None:
    """CheckpointError naming ``path`` unless ``state`` is what a checkpoint file of a known format holds, with the
    optional parts ``needs``: the keys and their kinds, tensors for weights, vocabularies of strings that begin with
    the special tokens, and the data options. Formats 1 and 2 have format 3's layout less ``numerics``: one check
    serves all three."""
    if not isinstance(state, dict):
        raise CheckpointError(path, f"not a revnmt checkpoint (it holds a {type(state).__name__}, not a dict)")
    version = state.get(_FORMAT_KEY, 1)
    if type(version) is not int or version < 1:
        raise CheckpointError(path, f"its format {version!r} is not a checkpoint format")
    if version > FORMAT:
        raise CheckpointError(path, f"it has checkpoint format {version}, newer than this revnmt reads (up to "
                              f"{FORMAT}): load it with the newer revnmt that wrote it")
    # A part that is there must be whole, whether or not it is needed.
    parts = [part for part, keys in _PARTS.items() if part in needs or any(key in state for key in keys)]
    if missing := [key for key in (*_TRANSLATING, *(key for part in parts for key in _PARTS[part]))
                   if key not in state]:
        raise CheckpointError(path, f"not a revnmt checkpoint (it has no {', '.join(missing)})")
    for key, kind in _KINDS.items():
        if key in state and not isinstance(state[key], kind) and not (key in _MAY_BE_NONE and state[key] is None):
            raise CheckpointError(path, f"its {key} is a {type(state[key]).__name__}, not a {kind.__name__}")
    if not all(isinstance(weight, torch.Tensor) for weight in state["model"].values()):
        raise CheckpointError(path, "its model holds more than tensors")
    for key in ("src_vocab", "tgt_vocab"):
        vocab = state[key]
        if tuple(vocab[: len(SPECIALS)]) != SPECIALS or not all(isinstance(token, str) for token in vocab):
            raise CheckpointError(path, f"its {key} is not a vocabulary: strings that begin with {' '.join(SPECIALS)}")
        try:
            Vocabulary(vocab[len(SPECIALS):])
        except ValueError as error:  # duplicate or empty entries
            raise CheckpointError(path, f"its {key} is not a vocabulary ({error})") from None
    required = [f.name for f in fields(DataOptions) if f.default is MISSING]
    if missing := [name for name in required if name not in state["data"]]:
        raise CheckpointError(path, f"its data options have no {', '.join(missing)}")


def _parsed(parse: Callable[[dict[str, Any]], _T], state: dict[str, Any], key: str,
            path: str | os.PathLike[str]) -> _T:
    """``parse(state[key])``; a CheckpointError naming ``path`` if it fails as invalid fields make it fail."""
    try:
        return parse(state[key])
    except (TypeError, ValueError) as error:
        raise CheckpointError(path, f"its {key} is not valid ({error})") from None


class _NoInitialisation(TorchFunctionMode):
    """Skips ``torch.nn.init``'s functions, which mean nothing on the meta device, where some of them
    (``normal_``) would import torch's compiler, seconds of work, for nothing."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]  # the tensor to initialise, as it is
        return func(*args, **kwargs)
