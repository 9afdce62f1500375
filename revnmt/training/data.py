"""The corpora, vocabularies and encoded datasets of a training run."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass

from revnmt.data import (MULTI30K_SPLITS, SPECIALS, EncodedDataset, ParallelCorpus, Tokenizer, Vocabulary,
                         find_multi30k, load_parallel)
from revnmt.translator import DataOptions

logger = logging.getLogger(__name__)


@dataclass
class TrainingData:
    """Everything a run reads, encoded once."""

    options: DataOptions
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    train: EncodedDataset
    valid: EncodedDataset  # for the dev loss
    valid_text: ParallelCorpus  # raw dev text, for dev BLEU on detokenized output
    test_text: ParallelCorpus | None


def resolve_data_paths(args: argparse.Namespace) -> None:
    """For ``--data multi30k`` set ``args.train``/``valid``/``test`` to its file prefixes
    (locating or downloading it); an explicit ``--test`` is kept."""
    if args.data != "multi30k":
        return
    folder = find_multi30k(args.data_dir)
    args.train = str(folder / MULTI30K_SPLITS["train"])
    args.valid = str(folder / MULTI30K_SPLITS["valid"])
    args.test = args.test or str(folder / MULTI30K_SPLITS["test"])


def load_data(args: argparse.Namespace, vocab_tokens: tuple[list[str], list[str]] | None = None) -> TrainingData:
    """Read and encode the corpora of ``args``.

    ``vocab_tokens`` (the token lists of a checkpoint, specials included) are reused when
    resuming; otherwise the vocabularies are built from the training corpus.
    Raises FileNotFoundError / ValueError with messages meant for the user.
    """
    resolve_data_paths(args)
    options = DataOptions(args.src, args.tgt, args.lowercase, args.max_len)
    train = load_parallel(args.train, args.src, args.tgt)
    if args.train_limit is not None and args.train_limit < len(train):
        train = ParallelCorpus(train.src[: args.train_limit], train.tgt[: args.train_limit], train.name)
    valid = load_parallel(args.valid, args.src, args.tgt)
    test = load_parallel(args.test, args.src, args.tgt) if args.test else None  # missing files fail now

    src_tok, tgt_tok = Tokenizer(args.src, args.lowercase), Tokenizer(args.tgt, args.lowercase)
    if vocab_tokens is None:
        src_vocab, tgt_vocab = (Vocabulary.build((tok.tokenize(line) for line in lines), args.min_freq, args.max_vocab)
                                for tok, lines in ((src_tok, train.src), (tgt_tok, train.tgt)))
        for lang, vocab in ((args.src, src_vocab), (args.tgt, tgt_vocab)):
            if len(vocab) == len(SPECIALS):
                raise ValueError(f"{args.train}: no {lang} token occurs --min-freq {args.min_freq} times")
    else:
        src_vocab, tgt_vocab = (Vocabulary(tokens[len(SPECIALS):]) for tokens in vocab_tokens)

    train_set = EncodedDataset.from_corpus(train, src_tok, tgt_tok, src_vocab, tgt_vocab, max_len=args.max_len)
    if len(train_set) == 0:
        raise ValueError(f"{args.train}: no training pair has at most --max-len {args.max_len} tokens per side")
    valid_set = EncodedDataset.from_corpus(valid, src_tok, tgt_tok, src_vocab, tgt_vocab)
    if len(valid_set) == 0:
        raise ValueError(f"{args.valid}: no dev pair has a source with tokens")
    logger.info("data: %d training pairs (%d filtered), %d dev pairs%s; vocabularies: %s %d, %s %d tokens",
                len(train_set), train_set.n_filtered, len(valid_set),
                f", {len(test)} test pairs" if test else "", args.src, len(src_vocab), args.tgt, len(tgt_vocab))
    return TrainingData(options, src_vocab, tgt_vocab, train_set, valid_set, valid, test)
