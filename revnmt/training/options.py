"""Command-line options of train.py, checked before any data is read."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

from buffers import BACKENDS, backends
from revnmt.data import SPECIALS
from revnmt.memory.sizes import parse_bytes
from revnmt.model import ATTENTION_TYPES, RNN_TYPES, ModelConfig
from revnmt.rnn import DEFAULT_LANES

DEFAULT_BATCH_SIZE = 64
DEFAULT_LR = {"adam": 1e-3, "sgd": 1.0}

# Options that fix what a run trains on and in which order: resuming with other values would
# silently continue a different run, so main() refuses it.
RUN_DEFINING = ("src", "tgt", "lowercase", "max_len", "min_freq", "max_vocab", "train_limit", "batch_size",
                "batch_tokens", "memory_budget", "seed", "rnn", "attention", "slice_dim", "max_forget_bits", "emb_dim",
                "hidden_size", "layers", "dropout", "buffer_lanes")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def byte_size(text: str) -> int:
    """argparse type for sizes such as 2GiB."""
    try:
        return parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def _device_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be GPU numbers separated by commas, e.g. 0,1, got {text}") from None
    if min(ids) < 0:
        raise argparse.ArgumentTypeError(f"GPU numbers must be >= 0, got {text}")
    return ids


def _forget_bits(text: str) -> int | None:
    # The choices themselves are checked by ModelConfig, so its message is the one users see.
    return None if text.lower() == "none" else int(text)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except unset ones (their help says what happens then)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The parser of train.py (defaults: the paper's Multi30K setup, with Adam)."""
    parser = argparse.ArgumentParser(
        prog="train.py", description="Train an attention encoder-decoder with reversible (or ordinary) RNNs. "
        "Running the same command again resumes from SAVE_DIR/last.pt.",
        formatter_class=_HelpFormatter)
    add_data_options(parser)
    add_model_options(parser)
    add_optimization_options(parser)
    add_run_options(parser)
    return parser


def add_data_options(parser: argparse.ArgumentParser) -> None:
    """The data options of train.py (shared with ``python -m revnmt.memory``)."""
    data = parser.add_argument_group("data")
    data.add_argument("--data", choices=["multi30k"], help="a known data set (the default without --train)")
    data.add_argument("--data-dir", help="folder holding Multi30K (default: searched for, else downloaded)")
    data.add_argument("--train", metavar="PREFIX", help="training corpus PREFIX.SRC / PREFIX.TGT (plain or .gz)")
    data.add_argument("--valid", metavar="PREFIX", help="dev corpus, for loss, BLEU and early stopping")
    data.add_argument("--test", metavar="PREFIX", help="test corpus translated with best.pt after training "
                      "(Multi30K: test2016 by default)")
    data.add_argument("--src", default="en", help="source language (file suffix and Moses rules)")
    data.add_argument("--tgt", default="de", help="target language")
    data.add_argument("--lowercase", action=argparse.BooleanOptionalAction,
                      help="lowercase tokens (default: on for Multi30K, off otherwise)")
    data.add_argument("--max-len", type=_positive_int, default=50,
                      help="drop training pairs with more tokens on a side; translation truncates longer inputs")
    data.add_argument("--min-freq", type=_positive_int, default=2, help="vocabulary: minimum token count")
    data.add_argument("--max-vocab", type=_positive_int, help="vocabulary: most frequent tokens kept (no limit)")
    data.add_argument("--train-limit", type=_positive_int, metavar="N", help="train on the first N pairs only")



def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The model options of train.py (shared with ``python -m revnmt.memory``)."""
    model = parser.add_argument_group("model")
    defaults = ModelConfig()
    model.add_argument("--rnn", choices=RNN_TYPES, default=defaults.rnn, help="reversible or ordinary cells")
    model.add_argument("--attention", choices=ATTENTION_TYPES, default=defaults.attention,
                       help="attention memory: full encoder states, source embeddings, stored slices, or both")
    model.add_argument("--slice-dim", type=int, default=defaults.slice_dim,
                       help="encoder units per source position kept for slice attention")
    model.add_argument("--max-forget-bits", type=_forget_bits, default=defaults.max_forget_bits,
                       metavar="{1,2,3,5,none}", help="bits a reversible unit may forget per step")
    model.add_argument("--emb-dim", type=int, default=defaults.emb_dim, help="word embedding size")
    model.add_argument("--hidden-size", type=int, default=defaults.hidden_size, help="RNN units per layer")
    model.add_argument("--layers", type=int, default=defaults.layers, help="encoder and decoder layers")
    model.add_argument("--dropout", type=float, default=defaults.dropout, help="locked dropout probability")
    model.add_argument("--buffer-lanes", type=int, default=defaults.buffer_lanes,
                       help="information-buffer lanes per sentence, shared by the batch (reversible RNNs; default: "
                       f"{DEFAULT_LANES['numba']} with the numba backend, {DEFAULT_LANES['triton']} with triton or "
                       "torch)")
    model.add_argument("--buffer-backend", choices=BACKENDS, default=defaults.buffer_backend,
                       help="where the information buffer's arithmetic runs (reversible RNNs): compiled CPU loops "
                       "(numba), one Triton kernel per update (triton, CUDA), or tensor ops (torch, any device; "
                       "slow); auto: numba on CPU, triton on CUDA. All give the same results bit for bit")



def add_optimization_options(parser: argparse.ArgumentParser) -> None:
    opt = parser.add_argument_group("optimization")
    opt.add_argument("--optimizer", choices=sorted(DEFAULT_LR), default="adam", help="update rule")
    opt.add_argument("--lr", type=_positive_float, help="learning rate (default: 1e-3 for adam, 1.0 for sgd)")
    opt.add_argument("--clip", type=float, default=5.0, help="gradient-norm clipping (0: none)")
    opt.add_argument("--lr-decay", type=float, default=0.5, help="LR factor when the dev loss stops improving")
    opt.add_argument("--lr-patience", type=int, default=0,
                     help="epochs without dev-loss improvement before the LR decays")
    opt.add_argument("--min-lr", type=float, default=1e-5, help="stop once the LR decays below this")
    opt.add_argument("--epochs", type=_positive_int, default=30, help="passes over the training data")
    opt.add_argument("--max-steps", type=_positive_int, help="stop after this many updates (no limit)")
    opt.add_argument("--batch-size", type=_positive_int,
                     help=f"sentences per batch (default: {DEFAULT_BATCH_SIZE} unless --batch-tokens is given)")
    opt.add_argument("--batch-tokens", type=_positive_int, help="padded tokens per batch")
    opt.add_argument("--memory-budget", type=byte_size, metavar="SIZE",
                     help="e.g. 2GiB: the peak memory training may reach, measured as the process's resident memory "
                     "(RSS) on CPU and as the CUDA allocator's reserved memory on a GPU; the largest token batch "
                     "whose step fits is chosen (instead of --batch-size/--batch-tokens), and checked every step")
    opt.add_argument("--patience", type=_positive_int, default=5, help="epochs without dev-BLEU improvement "
                     "before stopping")



def add_run_options(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("run")
    run.add_argument("--save-dir", required=True, help="checkpoints, vocabularies, logs")
    run.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu, cuda, cuda:N")
    run.add_argument("--seed", type=int, default=1, help="initialisation, dropout and batch order")
    run.add_argument("--valid-beam", type=_positive_int, default=1, help="beam for dev BLEU (1: greedy)")
    run.add_argument("--test-beam", type=_positive_int, default=5, help="beam for the test set")
    run.add_argument("--log-every", type=_positive_int, default=100, help="steps between log lines")
    run.add_argument("--save-every", type=_positive_int, help="also save last.pt every N steps")
    run.add_argument("--hogwild", type=_positive_int, metavar="N",
                     help="train with N worker processes that update shared weights without locks (Hogwild!); "
                     "checkpoints and resumption at epoch ends only")
    run.add_argument("--devices", type=_device_ids, metavar="0,1,...",
                     help="with --hogwild: the GPUs the workers run on, round-robin (default: every GPU with "
                     "--device cuda)")


def model_config(args: argparse.Namespace, src_vocab: int, tgt_vocab: int) -> ModelConfig:
    """The validated model options of ``args``; raises ValueError with a message for the user."""
    return ModelConfig(rnn=args.rnn, emb_dim=args.emb_dim, hidden_size=args.hidden_size, layers=args.layers,
                       dropout=args.dropout, attention=args.attention, slice_dim=args.slice_dim,
                       max_forget_bits=args.max_forget_bits, buffer_lanes=args.buffer_lanes,
                       buffer_backend=args.buffer_backend,
                       src_vocab=src_vocab, tgt_vocab=tgt_vocab).validate()


def eval_batch_size(args: argparse.Namespace) -> int:
    """Sentences per batch for dev loss and translation: ``--batch-size``, else the default."""
    return args.batch_size or DEFAULT_BATCH_SIZE


def resolve_data_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Check the data options and fill the defaults that depend on others (Multi30K, lowercasing)."""
    if args.train or args.valid:
        if args.data or args.data_dir:
            parser.error("give either --data/--data-dir or --train/--valid, not both")
        if not (args.train and args.valid):
            parser.error("--train and --valid go together")
    else:
        args.data = "multi30k"
    if args.lowercase is None:
        args.lowercase = args.data == "multi30k"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check train.py's options, resolving the defaults that depend on other options."""
    parser = build_parser()
    args = parser.parse_args(argv)
    resolve_data_options(parser, args)
    if args.lr is None:
        args.lr = DEFAULT_LR[args.optimizer]
    if args.memory_budget is not None and (args.batch_size or args.batch_tokens):
        parser.error("--memory-budget chooses the batch: leave out --batch-size and --batch-tokens")
    if args.batch_size is None and args.batch_tokens is None and args.memory_budget is None:
        args.batch_size = DEFAULT_BATCH_SIZE
    if args.clip < 0:
        parser.error(f"--clip must be >= 0, got {args.clip}")
    if not 0 < args.lr_decay < 1:
        parser.error(f"--lr-decay must be in (0, 1), got {args.lr_decay}")
    if args.lr < args.min_lr:
        parser.error(f"--lr {args.lr:g} is below --min-lr {args.min_lr:g}: training would stop at once")
    if args.lr_patience < 0:
        parser.error(f"--lr-patience must be >= 0, got {args.lr_patience}")
    try:
        torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device!r} is not a torch device (e.g. cpu, cuda, cuda:1)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available (use --device cpu)")
    if args.rnn.startswith("rev"):
        try:
            backends.resolve(args.buffer_backend, args.device)
        except ValueError as error:
            parser.error(f"--buffer-backend: {error}")
    if args.devices is not None:
        if not args.hogwild:
            parser.error("--devices chooses the GPUs of --hogwild workers: give --hogwild N too")
        if max(args.devices) >= torch.cuda.device_count():
            parser.error(f"--devices {','.join(map(str, args.devices))}: this machine has "
                         f"{torch.cuda.device_count()} CUDA devices")
    if args.hogwild and args.save_every:
        parser.error("--save-every cannot be used with --hogwild: Hogwild runs save at epoch ends only")
    try:
        # The vocabulary sizes are known only once the data is read; check everything else now,
        # before minutes go into reading it.
        model_config(args, len(SPECIALS) + 1, len(SPECIALS) + 1)
    except ValueError as error:
        parser.error(str(error))
    return args
