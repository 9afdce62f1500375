"""How a run trains: the typed options of the optimizer, the batches, stopping, logging and the processes.

The model and the data have their own configs (:class:`revnmt.model.ModelConfig`,
:class:`revnmt.data.DataConfig`); :class:`RunConfig` holds all three, and is what the command line
(``revnmt-train``) builds and what a checkpoint records.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields, replace

from revnmt.data import DataConfig
from revnmt.model import ModelConfig

DEFAULT_BATCH_SIZE = 64
DEFAULT_LR = {"adam": 1e-3, "sgd": 1.0}

# Resuming a run sorts its options into three classes (documented in docs/reliability.md and --help):
#
# Options that fix what a run trains, on what data, in which order and with which update rule: resuming
# with other values would silently continue a different run, so resuming refuses it.
RUN_DEFINING = ("src", "tgt", "lowercase", "max_len", "min_freq", "max_vocab", "train_limit", "subword", "vocab_size",
                "joint_vocab", "spm_model", "batch_size", "batch_tokens", "memory_budget", "seed", "rnn", "attention",
                "slice_dim", "max_forget_bits", "emb_dim", "hidden_size", "layers", "dropout", "buffer_lanes",
                "label_smoothing", "optimizer", "encoder", "tie_embeddings", "share_embeddings")
# Options a resumed run may change: applied from the resumed step on, and logged.
CHANGEABLE_ON_RESUME = ("lr", "clip", "lr_decay", "lr_patience", "min_lr", "epochs", "max_steps", "patience",
                        "valid_beam", "test_beam", "log_every", "save_every", "max_reversal_fallbacks",
                        "max_nonfinite", "keep_checkpoints")
# Everything else concerns where and how one command runs (device, devices, hogwild, buffer_backend, the
# corpora's paths, whose contents the data fingerprint checks): changed freely, not logged.


@dataclass(frozen=True)
class TrainingConfig:
    """Optimization, batching, stopping, logging and parallelism of a run (defaults: the paper's
    Multi30K setup, with Adam)."""

    save_dir: str
    device: str = "cpu"
    seed: int = 1  # initialisation, dropout and batch order
    optimizer: str = "adam"  # "adam" or "sgd"
    lr: float = DEFAULT_LR["adam"]
    clip: float = 5.0  # gradient-norm clipping (0: none)
    lr_decay: float = 0.5  # LR factor when the dev loss stops improving
    lr_patience: int = 0  # epochs without dev-loss improvement before the LR decays
    min_lr: float = 1e-5  # stop once the LR decays below this
    epochs: int = 30
    max_steps: int | None = None
    batch_size: int | None = DEFAULT_BATCH_SIZE  # sentences per batch
    batch_tokens: int | None = None  # padded tokens per batch (instead of, or as well as, batch_size)
    memory_budget: int | None = None  # bytes of peak memory; a plan then replaces batch_size/batch_tokens
    patience: int = 5  # epochs without dev-BLEU improvement before stopping
    valid_beam: int = 1
    test_beam: int = 5
    log_every: int = 100
    save_every: int | None = None  # also save last.pt every N steps
    keep_checkpoints: int = 0  # numbered checkpoints of the latest validations kept (step-<step>.pt)
    hogwild: int | None = None  # worker processes updating shared weights without locks
    restart_epoch: bool = False  # resume on changed corpora: train the current epoch again from its start
    max_reversal_fallbacks: float = 0.01  # share of updates that may be trained by backpropagation, reversal failing
    max_nonfinite: int = 10  # updates skipped in a row (non-finite loss or gradients) that stop the run
    devices: tuple[int, ...] | None = None  # GPUs of the Hogwild workers (round-robin)

    @property
    def eval_batch_size(self) -> int:
        """Sentences per batch for dev loss and translation."""
        return self.batch_size or DEFAULT_BATCH_SIZE


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a training run."""

    data: DataConfig
    model: ModelConfig
    training: TrainingConfig

    @classmethod
    def from_checkpoint(cls, checkpoint: dict) -> RunConfig:
        """The run a checkpoint was saved by (its ``"args"`` and ``"model_config"``)."""
        options = dict(checkpoint["args"])
        for key in ("devices", "spm_model"):  # lists in JSON and checkpoints, tuples in the frozen configs
            if options.get(key) is not None:
                options[key] = tuple(options[key])

        def pick(kind: type) -> object:
            return kind(**{f.name: options[f.name] for f in fields(kind) if f.name in options})

        return cls(pick(DataConfig), ModelConfig(**checkpoint["model_config"]), pick(TrainingConfig))

    def with_vocab_sizes(self, src_vocab: int, tgt_vocab: int) -> RunConfig:
        """The same run with the model's vocabulary sizes, known once the data is read."""
        return replace(self, model=replace(self.model, src_vocab=src_vocab, tgt_vocab=tgt_vocab).validate())

    def options(self) -> dict:
        """Every option by its command-line name (``max_len`` for ``--max-len``), in one flat dict: what
        ``config.json`` and a checkpoint's ``"args"`` hold, and what resuming compares."""
        model = {f.name: getattr(self.model, f.name) for f in fields(self.model)
                 if f.name not in ("src_vocab", "tgt_vocab")}  # known from the data, not options
        data, training = asdict(self.data), asdict(self.training)
        data["spm_model"] = list(data["spm_model"])
        if training["devices"] is not None:
            training["devices"] = list(training["devices"])
        return {**data, **model, **training}

    def changes_from(self, saved: dict, names: tuple[str, ...] = RUN_DEFINING) -> list[str]:
        """The options of ``names`` (default: the run-defining ones) whose values differ from a checkpoint's
        ``"args"``, as ``--name saved -> current``. An option the checkpoint lacks came after it was saved:
        its run had the option's default (as :meth:`from_checkpoint` takes it)."""
        current, saved = self.options(), {**_option_defaults(), **saved}
        return [f"--{key.replace('_', '-')} {saved.get(key)} -> {current[key]}"
                for key in names if saved.get(key) != current[key]]


def _option_defaults() -> dict:
    """Every option's default, as :meth:`RunConfig.options` writes it."""
    defaults = {f.name: f.default for kind in (DataConfig, ModelConfig, TrainingConfig) for f in fields(kind)
                if f.default is not MISSING}
    return {name: list(value) if isinstance(value, tuple) else value for name, value in defaults.items()}
