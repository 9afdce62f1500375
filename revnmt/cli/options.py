"""The options the commands share (data and model), the argparse types they use, and the step from a
parsed command line to typed configs. Checked before any data is read."""

from __future__ import annotations

import argparse

import torch

from revnmt.data import DEFAULT_VOCAB_SIZE, SPECIALS, SUBWORD_TYPES, DataConfig
from revnmt.memory.sizes import parse_bytes
from revnmt.model import ATTENTION_TYPES, ENCODER_TYPES, RNN_TYPES, ModelConfig
from revnmt.rnn import backends


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a float > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite float >= 0."""
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def share(text: str) -> float:
    """argparse type: a fraction in [0, 1]."""
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def byte_size(text: str) -> int:
    """argparse type for sizes such as 2GiB."""
    try:
        return parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def device_ids(text: str) -> tuple[int, ...]:
    """argparse type: GPU numbers separated by commas."""
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be GPU numbers separated by commas, e.g. 0,1, got {text}") from None
    if min(ids) < 0:
        raise argparse.ArgumentTypeError(f"GPU numbers must be >= 0, got {text}")
    return tuple(ids)


def _checkpoint_steps(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return positive_int(text)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"must be a positive number of steps or auto, got {text}") from None


def _forget_bits(text: str) -> int | None:
    # The choices themselves are checked by ModelConfig, so its message is the one users see.
    return None if text.lower() == "none" else int(text)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except unset ones (their help says what happens then)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def add_data_options(parser: argparse.ArgumentParser, test_set: bool = True) -> None:
    """The data options (``revnmt-train``; ``revnmt-memory`` reads no test set)."""
    data = parser.add_argument_group("data")
    data.add_argument("--data", choices=["multi30k"], help="a known data set (the default without --train)")
    data.add_argument("--data-dir", help="folder holding Multi30K (default: searched for, else downloaded)")
    data.add_argument("--train", metavar="PREFIX", help="training corpus PREFIX.SRC / PREFIX.TGT (plain or .gz)")
    data.add_argument("--valid", metavar="PREFIX", help="dev corpus, for loss, BLEU and early stopping")
    if test_set:
        data.add_argument("--test", metavar="PREFIX", help="test corpus translated with best.pt after training "
                          "(Multi30K: test2016 by default)")
    data.add_argument("--src", default="en", help="source language (file suffix and Moses rules)")
    data.add_argument("--tgt", default="de", help="target language")
    data.add_argument("--lowercase", action=argparse.BooleanOptionalAction,
                      help="lowercase the text, and so the output (default: on for Multi30K, off otherwise)")
    data.add_argument("--max-len", type=positive_int, default=50,
                      help="drop training pairs with more tokens (pieces with subwords) on a side; translation "
                      "truncates longer inputs")
    data.add_argument("--min-freq", type=positive_int, default=2, help="word vocabulary: minimum token count")
    data.add_argument("--max-vocab", type=positive_int, help="word vocabulary: most frequent tokens kept (no limit)")
    data.add_argument("--train-limit", type=positive_int, metavar="N", help="train on the first N pairs only")
    data.add_argument("--prepared", metavar="DIR",
                      help="the corpora's token ids, prepared once and read memory-mapped: reused while the corpora "
                      "and the text options are the same, prepared anew otherwise (revnmt-train: default "
                      "SAVE_DIR/data; revnmt-memory reads it if it serves, else encodes in memory)")
    subword = parser.add_argument_group("subwords (SentencePiece)")
    subword.add_argument("--subword", choices=["none", *SUBWORD_TYPES],
                         help="split raw text into the pieces of a SentencePiece model of this type, trained on the "
                         "training corpus before training starts and kept in the run (default: none, Moses-tokenized "
                         "words, the paper's setup)")
    subword.add_argument("--vocab-size", type=positive_int,
                         help=f"--subword: pieces per model, specials and 256 byte pieces included (default: "
                         f"{DEFAULT_VOCAB_SIZE})")
    subword.add_argument("--joint-vocab", action=argparse.BooleanOptionalAction,
                         help="--subword: one model for both languages (default), or one per language")
    subword.add_argument("--spm-model", nargs="+", metavar="PATH",
                         help="use trained SentencePiece models instead of --subword: one PATH for both languages, or "
                         "two, the source's and the target's")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The model options (``revnmt-train`` and ``revnmt-memory``)."""
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
    model.add_argument("--encoder", choices=ENCODER_TYPES, default=defaults.encoder,
                       help="bidirectional: a second encoder stack reads the source backwards (reversible too, with a "
                       "buffer of its own); attention keeps both directions' units, and the decoder starts from a "
                       "learned projection of both final states (default: %(default)s)")
    model.add_argument("--tie-embeddings", action="store_true",
                       help="the output layer's weights are the target embeddings (needs --emb-dim = --hidden-size)")
    model.add_argument("--share-embeddings", action="store_true",
                       help="one embedding matrix for source and target (needs --subword with --joint-vocab)")
    model.add_argument("--dropout", type=float, default=defaults.dropout, help="locked dropout probability")
    model.add_argument("--label-smoothing", type=float, default=defaults.label_smoothing, metavar="EPS",
                       help="train against a target distribution of 1 - EPS on the reference token and EPS spread "
                       "evenly over the target vocabulary (losses and perplexities are still reported unsmoothed). "
                       "0.1 is the usual value; 0 is plain cross-entropy")
    model.add_argument("--checkpoint-steps", type=_checkpoint_steps, metavar="{K,auto}",
                       help="ordinary RNNs (gru, lstm): gradient checkpointing, keeping the state every K steps for "
                       "backward and recomputing the steps between (auto: K = ceil(sqrt(T)) per batch); default: none")
    model.add_argument("--buffer-lanes", type=int, default=defaults.buffer_lanes,
                       help="information-buffer lanes per sentence, shared by the batch (reversible RNNs; default: "
                       + ", ".join(f"{b.lanes} with {b.name}" for b in backends.BACKENDS.values()) + ")")
    model.add_argument("--decoder-chunk-steps", type=int, default=defaults.decoder_chunk_steps,
                       help="reversible RNNs: decoder steps undone before their attention and loss are "
                       "backpropagated in one batched call; more is faster and holds more memory per sentence")
    model.add_argument("--buffer-backend", choices=backends.CHOICES, default=defaults.buffer_backend,
                       help="where the information buffer's arithmetic runs (reversible RNNs): compiled CPU loops "
                       "(numba), one Triton kernel per update (triton, CUDA), or tensor ops (torch, any device; "
                       "slow); auto: numba on CPU, triton on CUDA. All give the same results bit for bit")


def model_config(args: argparse.Namespace, src_vocab: int, tgt_vocab: int) -> ModelConfig:
    """The validated model options of ``args``; raises ValueError with a message for the user."""
    return ModelConfig(rnn=args.rnn, emb_dim=args.emb_dim, hidden_size=args.hidden_size, layers=args.layers,
                       dropout=args.dropout, attention=args.attention, slice_dim=args.slice_dim,
                       max_forget_bits=args.max_forget_bits, buffer_lanes=args.buffer_lanes,
                       buffer_backend=args.buffer_backend, checkpoint_steps=args.checkpoint_steps,
                       decoder_chunk_steps=args.decoder_chunk_steps, label_smoothing=args.label_smoothing,
                       encoder=args.encoder, tie_embeddings=args.tie_embeddings, share_embeddings=args.share_embeddings,
                       src_vocab=src_vocab, tgt_vocab=tgt_vocab).validate()


def checked_model_config(parser: argparse.ArgumentParser, args: argparse.Namespace, device: str) -> ModelConfig:
    """The model options of ``args``, checked now, before minutes go into reading the data: the
    vocabulary sizes are known only then, so they are placeholders here (the smallest valid ones)."""
    try:
        config = model_config(args, len(SPECIALS) + 1, len(SPECIALS) + 1)
    except ValueError as error:
        parser.error(str(error))
    if config.reversible:
        try:
            backends.resolve(config.buffer_backend, device)
        except ValueError as error:
            parser.error(f"--buffer-backend: {error}")
    return config


def data_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> DataConfig:
    """The data options of ``args``, checked, with the defaults that depend on others filled in
    (Multi30K without --train, lowercasing for Multi30K)."""
    data = args.data
    if args.train or args.valid:
        if args.data or args.data_dir:
            parser.error("give either --data/--data-dir or --train/--valid, not both")
        if not (args.train and args.valid):
            parser.error("--train and --valid go together")
    else:
        data = "multi30k"
    lowercase = data == "multi30k" if args.lowercase is None else args.lowercase
    spm_model = tuple(args.spm_model or ())
    subword_options = [name for name, value in (("--subword", args.subword), ("--vocab-size", args.vocab_size),
                                                ("--joint-vocab", args.joint_vocab)) if value is not None]
    if spm_model:
        if len(spm_model) > 2:
            parser.error(f"--spm-model takes one model for both languages, or two (source, target): got "
                         f"{len(spm_model)}")
        if subword_options:
            parser.error(f"--spm-model brings its own SentencePiece models: leave out {', '.join(subword_options)}")
    elif args.subword in (None, "none") and (args.vocab_size is not None or args.joint_vocab is not None):
        parser.error("--vocab-size and --joint-vocab shape the SentencePiece models --subword trains: give "
                     "--subword bpe or unigram")
    return DataConfig(data=data, data_dir=args.data_dir, train=args.train, valid=args.valid,
                      test=getattr(args, "test", None), src=args.src, tgt=args.tgt, lowercase=lowercase,
                      max_len=args.max_len, min_freq=args.min_freq, max_vocab=args.max_vocab,
                      train_limit=args.train_limit, subword=args.subword or "none",
                      vocab_size=args.vocab_size or DEFAULT_VOCAB_SIZE,
                      joint_vocab=len(spm_model) < 2 if spm_model else args.joint_vocab is not False,
                      spm_model=spm_model, prepared=args.prepared)


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
