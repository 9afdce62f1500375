"""Command lines to typed configs: the generated data and model options the commands share, revnmt-train's
whole parser (:func:`run_config`, also what benchmarks use to describe a run as revnmt-train would), and the
devices. The configs check the values; the command line's own grammar (which options go together) is checked
here. All of it before any data is read; a mistake exits with argparse's message and status 2."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from revnmt.data import SPECIALS, DataConfig
from revnmt.model import ExecutionConfig, ModelConfig
from revnmt.options import add_options, flag_of, from_arguments
from revnmt.rnn import backends
from revnmt.training import CHANGEABLE_ON_RESUME, Job, RunConfig, TrainingConfig
from revnmt.training.config import OPTIMIZATION

TRAIN_PROG = "revnmt-train"

Config = TypeVar("Config")


def positive_int(text: str) -> int:
    """argparse type of the commands' own options: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type of the commands' own options: a finite float >= 0."""
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except unset ones (their help says what happens then)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def add_data_options(parser: argparse.ArgumentParser, test_set: bool = True) -> None:
    """The data options (``revnmt-train``; ``revnmt-memory`` and ``revnmt-prepare`` read no test set)."""
    add_options(parser, DataConfig, "data", skip=() if test_set else ("test",))


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The model options, how it computes included (``revnmt-train`` and ``revnmt-memory``)."""
    add_options(parser, ModelConfig, "model")
    add_options(parser, ExecutionConfig, "model")


def checked(parser: argparse.ArgumentParser, build: Callable[[], Config]) -> Config:
    """``build()``, a config whose ValueError (a value it refuses) becomes the parser's usage error."""
    try:
        return build()
    except ValueError as error:
        parser.error(str(error))


def model_config(args: argparse.Namespace, src_vocab: int, tgt_vocab: int) -> ModelConfig:
    """The model options of ``args`` for these vocabulary sizes; ValueError with a message for the user."""
    return from_arguments(ModelConfig, args, src_vocab=src_vocab, tgt_vocab=tgt_vocab)


def checked_model_configs(parser: argparse.ArgumentParser, args: argparse.Namespace,
                          device: str) -> tuple[ModelConfig, ExecutionConfig]:
    """The model options of ``args`` and how the model computes, checked now, before minutes go into reading the
    data: the vocabulary sizes are known only then, so they are placeholders here (the smallest valid ones)."""
    config = checked(parser, lambda: model_config(args, len(SPECIALS) + 1, len(SPECIALS) + 1))
    execution = checked(parser, lambda: from_arguments(ExecutionConfig, args).check_for(config))
    if config.reversible:
        try:
            backends.resolve(execution.buffer_backend, device)
        except ValueError as error:
            parser.error(f"--buffer-backend: {error}")
    return config, execution


def data_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> DataConfig:
    """The data options of ``args``, checked, with the defaults that depend on what was given filled in
    (Multi30K without --train, lowercasing for Multi30K, one SentencePiece model or two)."""
    data = args.data
    if args.train or args.valid:
        if args.data or args.data_dir:
            parser.error("give either --data/--data-dir or --train/--valid, not both")
        if not (args.train and args.valid):
            parser.error("--train and --valid go together")
    else:
        data = "multi30k"
    spm_model = tuple(args.spm_model or ())
    subword_options = [name for name, value in (("--subword", args.subword), ("--vocab-size", args.vocab_size),
                                                ("--joint-vocab", args.joint_vocab)) if value is not None]
    if spm_model and subword_options:
        parser.error(f"--spm-model brings its own SentencePiece models: leave out {', '.join(subword_options)}")
    if args.subword in (None, "none") and (args.vocab_size is not None or args.joint_vocab is not None):
        parser.error("--vocab-size and --joint-vocab shape the SentencePiece models --subword trains: give "
                     "--subword bpe or unigram")
    lowercase = data == "multi30k" if args.lowercase is None else args.lowercase
    joint_vocab = len(spm_model) < 2 if spm_model else args.joint_vocab is not False
    return checked(parser, lambda: from_arguments(DataConfig, args, data=data, lowercase=lowercase,
                                                  joint_vocab=joint_vocab))


def check_device(parser: argparse.ArgumentParser, device: str) -> None:
    """Refuse a ``--device`` that is not a torch device or not on this machine."""
    try:
        torch.device(device)
    except RuntimeError:
        parser.error(f"--device {device!r} is not a torch device (e.g. cpu, cuda, cuda:1)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available (use --device cpu)")


def default_device() -> str:
    """cuda where a GPU is present, else cpu."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_parser() -> argparse.ArgumentParser:
    """The parser of revnmt-train (defaults: the paper's Multi30K setup, with Adam)."""
    parser = argparse.ArgumentParser(
        prog=TRAIN_PROG, description="Train an attention encoder-decoder with reversible (or ordinary) RNNs. "
        "Running the same command again resumes from SAVE_DIR/last.pt. Ctrl-C or SIGTERM saves last.pt at the "
        "step reached and exits (130, 143); a second Ctrl-C aborts. One run at a time holds SAVE_DIR.",
        epilog="Resuming: the model, data, batching, seed and optimizer options are fixed for a run (a resume with "
        "others is refused); " + ", ".join(map(flag_of, CHANGEABLE_ON_RESUME))
        + " may change (applied and logged); the rest (device, parallelism, buffer backend, the corpora's paths) "
        "are each command's own. A resume on changed corpora is refused unless --restart-epoch.",
        formatter_class=HelpFormatter)
    add_data_options(parser)
    add_model_options(parser)
    add_options(parser, TrainingConfig, OPTIMIZATION)
    parser.set_defaults(device=default_device())
    return parser


def run_config(argv: Sequence[str] | None = None) -> RunConfig:
    """Parse and check revnmt-train's options into a run config, resolving the defaults that depend on
    other options; a mistake exits with argparse's message and status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    data = data_config(parser, args)
    check_device(parser, args.device)
    if args.devices is not None and args.hogwild and max(args.devices) >= torch.cuda.device_count():
        parser.error(f"--devices {','.join(map(str, args.devices))}: this machine has "
                     f"{torch.cuda.device_count()} CUDA devices")
    if args.hogwild and Job.from_env().distributed:
        parser.error("--hogwild starts worker processes of its own: run it with python, not torchrun")
    model, execution = checked_model_configs(parser, args, args.device)
    training = checked(parser, lambda: from_arguments(TrainingConfig, args))
    return checked(parser, lambda: RunConfig(data, model, training, execution))
