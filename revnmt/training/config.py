"""How a run trains: the typed options of the optimizer, the batches, stopping, logging and the processes.

The model and the data have their own configs (:class:`revnmt.model.ModelConfig`,
:class:`revnmt.data.DataConfig`); :class:`RunConfig` holds all three, and is what the command line
(``revnmt-train``) builds and what a checkpoint records.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, fields, replace

from revnmt.checkpoints import Checkpoint
from revnmt.data import DataConfig
from revnmt.memory.sizes import parse_bytes
from revnmt.model import ExecutionConfig, ModelConfig
from revnmt.options import (
    CHANGEABLE,
    RUN_DEFINING,
    RUN_TIME,
    check_options,
    declared,
    flag_of,
    non_negative,
    non_negative_number,
    option,
    options_with_role,
    positive,
    positive_number,
    share,
    strictly_between_0_and_1,
)

DEFAULT_BATCH_SIZE = 64
DEFAULT_LR = {"adam": 1e-3, "sgd": 1.0}
OPTIMIZATION, RUN = "optimization", "run"  # the --help sections of the training options


def byte_size(text: str) -> int:
    """Command-line type of sizes such as 2GiB."""
    try:
        return parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def device_ids(text: str) -> tuple[int, ...]:
    """Command-line type of GPU numbers separated by commas."""
    try:
        ids = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be GPU numbers separated by commas, e.g. 0,1, got {text}") from None
    if min(ids) < 0:
        raise argparse.ArgumentTypeError(f"GPU numbers must be >= 0, got {text}")
    return ids


@dataclass(frozen=True)
class TrainingConfig:
    """Optimization, batching, stopping, logging and parallelism of a run (defaults: the paper's Multi30K setup,
    with Adam), checked when built. Unset, ``lr`` is the optimizer's default and ``batch_size``
    :data:`DEFAULT_BATCH_SIZE` unless ``batch_tokens`` or ``memory_budget`` chooses the batch."""

    save_dir: str = option(group=RUN, role=RUN_TIME, help="checkpoints, vocabularies, logs")
    device: str = option("cpu", group=RUN, role=RUN_TIME, help="cpu, cuda, cuda:N")
    seed: int = option(1, group=RUN, role=RUN_DEFINING, help="initialisation, dropout and batch order")
    optimizer: str = option("adam", choices=tuple(sorted(DEFAULT_LR)), role=RUN_DEFINING, help="update rule")
    lr: float | None = option(None, type=float, check=positive_number, role=CHANGEABLE,
                              help="learning rate (default: 1e-3 for adam, 1.0 for sgd)")
    clip: float = option(5.0, check=non_negative_number, role=CHANGEABLE, help="gradient-norm clipping (0: none)")
    lr_decay: float = option(0.5, check=strictly_between_0_and_1, role=CHANGEABLE,
                             help="LR factor when the dev loss stops improving")
    lr_patience: int = option(0, check=non_negative, role=CHANGEABLE,
                              help="validations without dev-loss improvement before the LR decays")
    min_lr: float = option(1e-5, check=non_negative_number, role=CHANGEABLE,
                           help="stop once the LR decays below this")
    epochs: int = option(30, check=positive, role=CHANGEABLE, help="passes over the training data")
    max_steps: int | None = option(None, type=int, check=positive, role=CHANGEABLE,
                                   help="stop after this many updates (no limit)")
    batch_size: int | None = option(None, type=int, check=positive, role=RUN_DEFINING,
                                    help=f"sentences per batch (default: {DEFAULT_BATCH_SIZE} unless --batch-tokens "
                                    "is given)")
    batch_tokens: int | None = option(None, type=int, check=positive, role=RUN_DEFINING,
                                      help="padded tokens per batch")
    update_freq: int = option(1, check=positive, metavar="N", role=RUN_DEFINING,
                              help="accumulate the gradients of N consecutive batches into one update (fairseq's "
                              "name): an effective batch N times as large at one batch's memory")
    memory_budget: int | None = option(None, type=byte_size, check=positive, metavar="SIZE", role=RUN_DEFINING,
                                       help="e.g. 2GiB: the peak memory training may reach, measured as the "
                                       "process's resident memory (RSS) on CPU and as the CUDA allocator's reserved "
                                       "memory on a GPU; the largest token batch whose step fits is chosen (instead "
                                       "of --batch-size), and checked every step. With --batch-tokens N, N is the "
                                       "effective batch: the fewest batches that fit are accumulated to reach it "
                                       "(the --update-freq is chosen)")
    patience: int = option(5, check=positive, role=CHANGEABLE,
                           help="validations (at epoch ends, and every --valid-every updates) without dev-BLEU "
                           "improvement before stopping")
    valid_every: int | None = option(None, type=int, check=positive, metavar="N", group=RUN, role=CHANGEABLE,
                                     help="also validate every N updates, with everything a validation at an epoch's "
                                     "end does: best.pt, --keep-checkpoints, the LR schedule and --patience")
    valid_beam: int = option(1, check=positive, group=RUN, role=CHANGEABLE, help="beam for dev BLEU (1: greedy)")
    test_beam: int = option(5, check=positive, group=RUN, role=CHANGEABLE, help="beam for the test set")
    log_every: int = option(100, check=positive, group=RUN, role=CHANGEABLE, help="steps between log lines")
    tensorboard: bool = option(False, flag="store_true", group=RUN, role=CHANGEABLE,
                               help="also write the run's curves for TensorBoard into SAVE_DIR/tensorboard: train "
                               "loss, perplexity, LR, tokens/s, peak memory and reversal fallbacks every --log-every "
                               "steps, dev loss, perplexity and BLEU at each validation (needs the tensorboard "
                               "package: pip install 'revnmt[tensorboard]')")
    save_every: int | None = option(None, type=int, check=positive, group=RUN, role=CHANGEABLE,
                                    help="also save last.pt every N steps")
    keep_checkpoints: int = option(0, check=non_negative, metavar="N", group=RUN, role=CHANGEABLE,
                                   help="also keep the checkpoints of the last N validations, as "
                                   "SAVE_DIR/step-<step>.pt (the step zero-padded to 8 digits, so that the names "
                                   "sort), for revnmt-average and ensembles; 0: none")
    restart_epoch: bool = option(False, flag="store_true", group=RUN, role=RUN_TIME,
                                 help="resume although the training or dev corpora changed: keep the weights, "
                                 "optimizer and counters, and train the saved epoch again from its first batch "
                                 "(unchanged corpora resume at the saved position)")
    max_reversal_fallbacks: float = option(0.01, check=share, metavar="SHARE", group=RUN, role=CHANGEABLE,
                                           help="a batch whose reversal fails its exactness check is trained by "
                                           "backpropagation instead; stop once more than this share of the updates "
                                           "(and two at least) needed it")
    max_nonfinite: int = option(10, check=positive, metavar="N", group=RUN, role=CHANGEABLE,
                                help="an update whose loss or gradients are not finite (NaN, inf; or whose "
                                "fixed-point state overflows) is skipped; stop after N in a row, keeping the last "
                                "checkpoint")
    hogwild: int | None = option(None, type=int, check=positive, metavar="N", group=RUN, role=RUN_TIME,
                                 help="train with N worker processes that update shared weights without locks "
                                 "(Hogwild!); checkpoints at epoch ends, at --max-steps and on Ctrl-C")
    devices: tuple[int, ...] | None = option(None, type=device_ids, metavar="0,1,...", group=RUN, role=RUN_TIME,
                                             help="with --hogwild: the GPUs the workers run on, round-robin (default: "
                                             "every GPU with --device cuda)")

    def __post_init__(self) -> None:
        if self.lr is None:
            object.__setattr__(self, "lr", DEFAULT_LR.get(self.optimizer))
        if self.batch_size is None and self.batch_tokens is None and self.memory_budget is None:
            object.__setattr__(self, "batch_size", DEFAULT_BATCH_SIZE)
        if self.devices is not None:
            object.__setattr__(self, "devices", tuple(self.devices))  # a list in JSON
        check_options(self)
        if self.memory_budget is not None and self.batch_size:
            raise ValueError("--memory-budget chooses the batch: leave out --batch-size (--batch-tokens sets the "
                             "effective batch it accumulates to)")
        if self.memory_budget is not None and self.batch_tokens and self.update_freq > 1:
            raise ValueError("--memory-budget with --batch-tokens chooses the --update-freq that reaches the "
                             "effective batch: leave out --update-freq")
        if self.lr < self.min_lr:
            raise ValueError(f"--lr {self.lr:g} is below --min-lr {self.min_lr:g}: training would stop at once")
        if self.devices is not None and not self.hogwild:
            raise ValueError("--devices chooses the GPUs of --hogwild workers: give --hogwild N too")
        if self.hogwild and self.save_every:
            raise ValueError("--save-every cannot be used with --hogwild: Hogwild runs save at epoch ends only")

    @property
    def eval_batch_size(self) -> int:
        """Sentences per batch for dev loss and translation."""
        return self.batch_size or DEFAULT_BATCH_SIZE


_CONFIGS = (DataConfig, ModelConfig, ExecutionConfig, TrainingConfig)  # the options of a run, by kind
#: The options that fix a run (resuming with other values is refused) and those a resumed run may change
#: (applied and logged); the rest are each command's own (:class:`revnmt.options.Role`).
RUN_DEFINING_OPTIONS = options_with_role(RUN_DEFINING, *_CONFIGS)
CHANGEABLE_ON_RESUME = options_with_role(CHANGEABLE, *_CONFIGS)


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a training run: its data, its model, how the model computes, and how it trains."""

    data: DataConfig
    model: ModelConfig
    training: TrainingConfig
    execution: ExecutionConfig = ExecutionConfig()

    def __post_init__(self) -> None:
        self.execution.check_for(self.model)
        if self.execution.cuda_graphs == "on":
            if not self.training.device.startswith("cuda"):
                raise ValueError(f"--cuda-graphs on needs a GPU (--device cuda), not --device {self.training.device}")
            if self.training.hogwild:
                raise ValueError("--cuda-graphs on is for one process a GPU (torchrun), not --hogwild workers")

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> RunConfig:
        """The run a checkpoint was saved by (its ``args`` and ``model_config``); an option its ``args`` lack
        came after it was saved, and takes its default."""
        options = checkpoint.args

        def pick(kind: type) -> object:
            return kind(**{f.name: options[f.name] for f in fields(kind) if f.name in options})

        return cls(pick(DataConfig), checkpoint.model_config, pick(TrainingConfig), pick(ExecutionConfig))

    def with_vocab_sizes(self, src_vocab: int, tgt_vocab: int) -> RunConfig:
        """The same run with the model's vocabulary sizes, known once the data is read."""
        return replace(self, model=replace(self.model, src_vocab=src_vocab, tgt_vocab=tgt_vocab))

    def options(self) -> dict:
        """Every option by its command-line name (``max_len`` for ``--max-len``), in one flat dict: what
        ``config.json`` and a checkpoint's ``"args"`` hold, and what resuming compares."""
        configs = (self.data, self.model, self.execution, self.training)
        return {f.name: _plain(getattr(config, f.name)) for config in configs for f, _ in declared(type(config))}

    def changes_from(self, saved: dict, names: tuple[str, ...] = RUN_DEFINING_OPTIONS) -> list[str]:
        """The options of ``names`` (default: the run-defining ones) whose values differ from a checkpoint's
        ``"args"``, as ``--name saved -> current``. An option the checkpoint lacks came after it was saved:
        its run had the option's default (as :meth:`from_checkpoint` takes it)."""
        current, saved = self.options(), {**_option_defaults(), **saved}
        return [f"{flag_of(key)} {saved.get(key)} -> {current[key]}" for key in names if saved.get(key) != current[key]]


def _plain(value: object) -> object:
    """An option's value as JSON holds it: tuples as lists."""
    return list(value) if isinstance(value, tuple) else value


def _option_defaults() -> dict:
    """Every option's default, as :meth:`RunConfig.options` writes it."""
    return {f.name: _plain(f.default) for kind in _CONFIGS for f, _ in declared(kind) if f.default is not MISSING}
