"""What a training run reads: the corpora named by a :class:`DataConfig`, their vocabularies, and the
encoded datasets (:func:`load_data`)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace

from .batching import EncodedDataset
from .corpus import ParallelCorpus, load_parallel
from .multi30k import MULTI30K_SPLITS, find_multi30k
from .tokenization import Tokenizer
from .vocab import SPECIALS, Vocabulary

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataOptions:
    """How a model's text was prepared; stored in checkpoints as ``"data"`` and used by translation."""

    src: str
    tgt: str
    lowercase: bool
    max_len: int | None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DataConfig:
    """The corpora of a run and how their text becomes ids.

    Either ``data="multi30k"`` (found in ``data_dir`` or the usual places, else downloaded) or the
    file prefixes ``train``/``valid`` (``PREFIX.SRC`` and ``PREFIX.TGT``, plain or .gz); ``test`` is
    optional (Multi30K: test2016 by default).
    """

    data: str | None = None
    data_dir: str | None = None
    train: str | None = None
    valid: str | None = None
    test: str | None = None
    src: str = "en"
    tgt: str = "de"
    lowercase: bool = False
    max_len: int = 50  # training pairs with more tokens on a side are dropped
    min_freq: int = 2
    max_vocab: int | None = None
    train_limit: int | None = None  # train on the first N pairs only

    @property
    def options(self) -> DataOptions:
        return DataOptions(self.src, self.tgt, self.lowercase, self.max_len)

    def resolved(self) -> DataConfig:
        """The same config with Multi30K's file prefixes filled in (locating or downloading it); an
        explicit ``test`` is kept. Raises FileNotFoundError / OSError with a message for the user."""
        if self.data != "multi30k" or (self.train and self.valid):
            return self
        folder = find_multi30k(self.data_dir)
        return replace(self, train=str(folder / MULTI30K_SPLITS["train"]), valid=str(folder / MULTI30K_SPLITS["valid"]),
                       test=self.test or str(folder / MULTI30K_SPLITS["test"]))


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


def load_data(config: DataConfig, vocab_tokens: tuple[list[str], list[str]] | None = None) -> TrainingData:
    """Read and encode the corpora of ``config`` (resolved first, see :meth:`DataConfig.resolved`).

    ``vocab_tokens`` (the token lists of a checkpoint, specials included) are reused when
    resuming; otherwise the vocabularies are built from the training corpus.
    Raises FileNotFoundError / ValueError with messages meant for the user.
    """
    config = config.resolved()
    if not (config.train and config.valid):
        raise ValueError("no training data: give --data multi30k, or --train and --valid")
    train = load_parallel(config.train, config.src, config.tgt)
    if config.train_limit is not None and config.train_limit < len(train):
        train = ParallelCorpus(train.src[: config.train_limit], train.tgt[: config.train_limit], train.name)
    valid = load_parallel(config.valid, config.src, config.tgt)
    test = load_parallel(config.test, config.src, config.tgt) if config.test else None  # missing files fail now

    src_tok, tgt_tok = Tokenizer(config.src, config.lowercase), Tokenizer(config.tgt, config.lowercase)
    if vocab_tokens is None:
        src_vocab, tgt_vocab = (Vocabulary.build((tok.tokenize(line) for line in lines), config.min_freq,
                                                 config.max_vocab)
                                for tok, lines in ((src_tok, train.src), (tgt_tok, train.tgt)))
        for lang, vocab in ((config.src, src_vocab), (config.tgt, tgt_vocab)):
            if len(vocab) == len(SPECIALS):
                raise ValueError(f"{config.train}: no {lang} token occurs --min-freq {config.min_freq} times")
    else:
        src_vocab, tgt_vocab = (Vocabulary(tokens[len(SPECIALS):]) for tokens in vocab_tokens)

    train_set = EncodedDataset.from_corpus(train, src_tok, tgt_tok, src_vocab, tgt_vocab, max_len=config.max_len)
    if len(train_set) == 0:
        raise ValueError(f"{config.train}: no training pair has at most --max-len {config.max_len} tokens per side")
    valid_set = EncodedDataset.from_corpus(valid, src_tok, tgt_tok, src_vocab, tgt_vocab)
    if len(valid_set) == 0:
        raise ValueError(f"{config.valid}: no dev pair has a source with tokens")
    logger.info("data: %d training pairs (%d filtered), %d dev pairs%s; vocabularies: %s %d, %s %d tokens",
                len(train_set), train_set.n_filtered, len(valid_set),
                f", {len(test)} test pairs" if test else "", config.src, len(src_vocab), config.tgt, len(tgt_vocab))
    return TrainingData(config.options, src_vocab, tgt_vocab, train_set, valid_set, valid, test)
