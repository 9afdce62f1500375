"""What a training run reads: the corpora named by a :class:`DataConfig`, how their text becomes tokens
(:class:`DataOptions`, with the SentencePiece models of a subword run), their vocabularies, and the encoded
datasets (:func:`load_data`)."""

from __future__ import annotations

import functools
import itertools
import logging
import tempfile
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from revnmt.options import RUN_DEFINING, RUN_TIME, check_options, option, positive

from .batching import EncodedDataset
from .corpus import ParallelCorpus, load_parallel, read_pairs
from .encoding import WordRule, encode_corpus
from .fingerprint import corpus_fingerprint, file_fingerprint
from .multi30k import MULTI30K_SPLITS, find_multi30k
from .prepared import MANIFEST, MODEL_FILES, DamagedData, Preparation, load_prepared, read_manifest, read_models
from .subword import (
    DEFAULT_VOCAB_SIZE,
    SUBWORD_TYPES,
    SubwordTokenizer,
    read_subword_model,
    sample_indices,
    train_subword_model,
)
from .tokenization import Detokenizer, SentenceDetokenizer, SentenceTokenizer, Tokenizer
from .vocab import SPECIALS, Vocabulary

SUBWORDS = "subwords (SentencePiece)"  # the --help section of the subword options

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataOptions:
    """How a model's text was prepared; stored in checkpoints as ``"data"`` and used by translation.

    Without SentencePiece models the text is Moses-tokenized into words; with them (``src_spm`` and
    ``tgt_spm``, the serialized models, the same bytes for a joint vocabulary) raw text is split into
    pieces. ``max_len`` counts the tokens of either kind.
    """

    src: str
    tgt: str
    lowercase: bool
    max_len: int | None
    src_spm: bytes | None = field(default=None, repr=False)
    tgt_spm: bytes | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, options: dict, name: str = "checkpoint") -> DataOptions:
        """The options of a checkpoint (``to_dict``; checkpoints from before subwords have no models);
        ValueError naming ``name`` if its SentencePiece models are corrupt."""
        data = cls(**{f.name: options[f.name] for f in fields(cls) if f.name in options})
        if data.subwords:
            try:
                data.source_tokenizer(), data.target_tokenizer()
            except ValueError as error:
                raise ValueError(f"{name}: {error}") from None
        return data

    @property
    def subwords(self) -> bool:
        return self.src_spm is not None

    def source_tokenizer(self) -> SentenceTokenizer:
        """What splits a raw source sentence into the tokens of the source vocabulary."""
        if self.src_spm is not None:
            return SubwordTokenizer(self.src_spm, self.lowercase, name=f"the {self.src} SentencePiece model")
        return Tokenizer(self.src, self.lowercase)

    def target_tokenizer(self) -> SentenceTokenizer:
        """What splits a raw target sentence into the tokens of the target vocabulary."""
        if self.tgt_spm is not None:
            return SubwordTokenizer(self.tgt_spm, self.lowercase, name=f"the {self.tgt} SentencePiece model")
        return Tokenizer(self.tgt, self.lowercase)

    def detokenizer(self) -> SentenceDetokenizer:
        """What joins target tokens into raw text."""
        if self.tgt_spm is not None:
            return SubwordTokenizer(self.tgt_spm, self.lowercase, name=f"the {self.tgt} SentencePiece model")
        return Detokenizer(self.tgt)


@dataclass(frozen=True)
class DataConfig:
    """The corpora of a run and how their text becomes ids.

    Either ``data="multi30k"`` (found in ``data_dir`` or the usual places, else downloaded) or the
    file prefixes ``train``/``valid`` (``PREFIX.SRC`` and ``PREFIX.TGT``, plain or .gz); ``test`` is
    optional (Multi30K: test2016 by default).

    Text becomes Moses-tokenized words (``subword="none"``, the paper's setup) or SentencePiece pieces:
    ``subword="bpe"`` or ``"unigram"`` trains a model of ``vocab_size`` pieces on the training corpus
    before training starts (one for both languages with ``joint_vocab``, else one per language), or
    ``spm_model`` names ready models (one path for both languages, or the source's and the target's).
    """

    data: str | None = option(None, choices=("multi30k",), role=RUN_TIME,
                              help="a known data set (the default without --train)")
    data_dir: str | None = option(None, role=RUN_TIME,
                                  help="folder holding Multi30K (default: searched for, else downloaded)")
    train: str | None = option(None, metavar="PREFIX", role=RUN_TIME,
                               help="training corpus PREFIX.SRC / PREFIX.TGT (plain or .gz)")
    valid: str | None = option(None, metavar="PREFIX", role=RUN_TIME,
                               help="dev corpus, for loss, BLEU and early stopping")
    test: str | None = option(None, metavar="PREFIX", role=RUN_TIME,
                              help="test corpus translated with best.pt after training (Multi30K: test2016 by default)")
    src: str = option("en", role=RUN_DEFINING, help="source language (file suffix and Moses rules)")
    tgt: str = option("de", role=RUN_DEFINING, help="target language")
    lowercase: bool = option(False, flag="optional", unset_default=True, role=RUN_DEFINING,
                             help="lowercase the text, and so the output (default: on for Multi30K, off otherwise)")
    max_len: int = option(50, check=positive, role=RUN_DEFINING,
                          help="drop training pairs with more tokens (pieces with subwords) on a side; translation "
                          "truncates longer inputs")
    min_freq: int = option(2, check=positive, role=RUN_DEFINING, help="word vocabulary: minimum token count")
    max_vocab: int | None = option(None, type=int, check=positive, role=RUN_DEFINING,
                                   help="word vocabulary: most frequent tokens kept (no limit)")
    train_limit: int | None = option(None, type=int, check=positive, metavar="N", role=RUN_DEFINING,
                                     help="train on the first N pairs only")
    subword: str = option("none", choices=("none", *SUBWORD_TYPES), unset_default=True, role=RUN_DEFINING,
                          group=SUBWORDS,
                          help="split raw text into the pieces of a SentencePiece model of this type, trained on the "
                          "training corpus before training starts and kept in the run (default: none, Moses-tokenized "
                          "words, the paper's setup)")
    vocab_size: int = option(DEFAULT_VOCAB_SIZE, check=positive, unset_default=True, role=RUN_DEFINING,
                             group=SUBWORDS,
                             help=f"--subword: pieces per model, specials and 256 byte pieces included (default: "
                             f"{DEFAULT_VOCAB_SIZE})")
    joint_vocab: bool = option(True, flag="optional", unset_default=True, role=RUN_DEFINING, group=SUBWORDS,
                               help="--subword: one model for both languages (default), or one per language")
    spm_model: tuple[str, ...] = option((), nargs="+", type=str, metavar="PATH", unset_default=True, role=RUN_DEFINING,
                                        group=SUBWORDS,
                                        help="use trained SentencePiece models instead of --subword: one PATH for "
                                        "both languages, or two, the source's and the target's")
    prepared: str | None = option(None, metavar="DIR", role=RUN_TIME,
                                  help="the corpora's token ids, prepared once and read memory-mapped: reused while "
                                  "the corpora and the text options are the same, prepared anew otherwise "
                                  "(revnmt-train: default SAVE_DIR/data; revnmt-memory reads it if it serves, else "
                                  "encodes in memory)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "spm_model", tuple(self.spm_model))  # a list from the command line or JSON
        check_options(self)
        if len(self.spm_model) > 2:
            raise ValueError(f"--spm-model takes one model for both languages, or two (source, target): got "
                             f"{len(self.spm_model)}")
        if self.spm_model and self.subword != "none":
            raise ValueError("either train a SentencePiece model (--subword) or use one (--spm-model), not both")

    def resolved(self) -> DataConfig:
        """The same config with Multi30K's file prefixes filled in (locating or downloading it); an
        explicit ``test`` is kept. Raises FileNotFoundError / OSError with a message for the user."""
        if self.data != "multi30k" or (self.train and self.valid):
            return self
        folder = find_multi30k(self.data_dir)
        return replace(self, train=str(folder / MULTI30K_SPLITS["train"]), valid=str(folder / MULTI30K_SPLITS["valid"]),
                       test=self.test or str(folder / MULTI30K_SPLITS["test"]))

    def fingerprint(self) -> dict[str, dict]:
        """Path, size and SHA-256 of each file of the training and dev corpora (see
        :mod:`revnmt.data.fingerprint`); a resumed run must have the same."""
        config = self.resolved()
        if not (config.train and config.valid):
            raise ValueError("no training data: give --data multi30k, or --train and --valid")
        return corpus_fingerprint(config.train, config.valid, config.src, config.tgt)

    def preparation_key(self, fingerprint: dict[str, dict]) -> dict:
        """What prepared data (:mod:`revnmt.data.prepared`) must have been made from to serve this config: the
        corpora's contents (their ``fingerprint``, paths left out) and every option that changes the ids."""
        text = {name: getattr(self, name) for name in ("src", "tgt", "lowercase", "max_len", "min_freq", "max_vocab",
                                                       "train_limit", "subword", "vocab_size", "joint_vocab")}
        inputs = {name: {"size": entry["size"], "sha256": entry["sha256"]} for name, entry in fingerprint.items()}
        # A missing model has no digest: it then matches no folder, and reading it says what is missing.
        spm = [file_fingerprint(Path(path))["sha256"] if Path(path).is_file() else None for path in self.spm_model]
        return {"format": 1, "inputs": inputs, "text": text, "spm_model": spm}


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
    fingerprint: dict[str, dict]  # of the training and dev corpora, as DataConfig.fingerprint gives it


def text_options(config: DataConfig) -> DataOptions:
    """How the text of a new run becomes tokens: the options of ``config`` (resolved), with its
    SentencePiece models read (``spm_model``) or trained on the training corpus (``subword``). A resumed
    run takes its checkpoint's options instead, and so never retrains its models. FileNotFoundError /
    ValueError with messages meant for the user."""
    config = config.resolved()
    options = DataOptions(config.src, config.tgt, config.lowercase, config.max_len)
    if config.spm_model:
        src_path, tgt_path = config.spm_model if len(config.spm_model) == 2 else config.spm_model * 2
        return replace(options, src_spm=read_subword_model(src_path), tgt_spm=read_subword_model(tgt_path))
    if config.subword == "none":
        return options

    def trained(sides: tuple[int, ...], langs: str) -> bytes:
        name = f"the training corpus {config.train} ({langs})"
        return train_subword_model(_training_sentences(config, sides, name), config.subword, config.vocab_size, name)

    if config.joint_vocab:
        model = trained((0, 1), f"{config.src} and {config.tgt}")
        return replace(options, src_spm=model, tgt_spm=model)
    return replace(options, src_spm=trained((0,), config.src), tgt_spm=trained((1,), config.tgt))


def _training_sentences(config: DataConfig, sides: tuple[int, ...], name: str) -> list[str]:
    """The sentences a SentencePiece model of ``sides`` (0: source, 1: target; the source's first) is trained
    on, as the run will split them (lowercased if it lowercases): all of the training corpus's, or the sample
    :func:`revnmt.data.subword.sample_indices` draws. Streamed: only the chosen sentences are kept."""
    if not (config.train and config.valid):
        raise ValueError("no training data: give --data multi30k, or --train and --valid")
    corpus = functools.partial(read_pairs, config.train, config.src, config.tgt, config.train_limit)
    pairs = sum(len(chunk) for chunk in corpus())
    chosen = np.zeros(len(sides) * pairs, dtype=bool)
    chosen[np.asarray(sample_indices(len(chosen), name), dtype=np.int64)] = True
    kept: list[list[str]] = [[] for _ in sides]
    for i, pair in enumerate(itertools.chain.from_iterable(corpus())):
        for k, side in enumerate(sides):
            if chosen[k * pairs + i]:
                kept[k].append(pair[side].lower() if config.lowercase else pair[side])
    return list(itertools.chain.from_iterable(kept))


def prepared_options(config: DataConfig, fingerprint: dict[str, dict], folder: Path) -> DataOptions | None:
    """The text options of the data prepared in ``folder`` for ``config`` (resolved), or None if it holds none:
    a new run then takes them, and never trains its SentencePiece models again."""
    manifest = read_manifest(folder, config.preparation_key(fingerprint))
    try:
        return None if manifest is None else _manifest_options(folder, manifest)
    except (KeyError, TypeError, ValueError):  # a damaged manifest serves no run: the folder is prepared anew
        return None


def _manifest_options(folder: Path, manifest: dict) -> DataOptions:
    return DataOptions(**manifest["options"], **read_models(folder))


def load_data(config: DataConfig, options: DataOptions | None = None,
              vocab_tokens: tuple[list[str], list[str]] | None = None,
              fingerprint: dict[str, dict] | None = None, prepared: Path | None = None,
              write: bool = True) -> TrainingData:
    """Read and encode the corpora of ``config`` (resolved first, see :meth:`DataConfig.resolved`).

    ``options`` say how text becomes tokens (default: :func:`text_options`, which trains the SentencePiece
    models of a subword config); a checkpoint's are given when resuming or measuring a trained model.
    ``vocab_tokens`` (the token lists of a checkpoint, specials included) are reused when resuming;
    otherwise the vocabularies are built from the training corpus (words) or are the SentencePiece
    models' pieces. ``fingerprint`` is :meth:`DataConfig.fingerprint`, if the caller has it already (a
    resume compares it first).

    ``prepared``: a folder of prepared data (:mod:`revnmt.data.prepared`). If it was prepared for this config,
    with these options and vocabularies, the datasets are read from it memory-mapped and the training corpus
    is not read at all; otherwise they are encoded and, with ``write``, the folder is prepared anew.
    Raises FileNotFoundError / ValueError with messages meant for the user.
    """
    config = config.resolved()
    fingerprint = fingerprint or config.fingerprint()
    valid = load_parallel(config.valid, config.src, config.tgt)
    test = load_parallel(config.test, config.src, config.tgt) if config.test else None  # missing files fail now
    key = config.preparation_key(fingerprint)
    manifest = None if prepared is None else read_manifest(prepared, key)
    if manifest is not None:
        try:
            kept = _manifest_options(prepared, manifest)
            vocabs = manifest["src_vocab"], manifest["tgt_vocab"]
            if (options is None or options == kept) and (vocab_tokens is None or tuple(vocab_tokens) == vocabs):
                datasets = load_prepared(prepared, manifest)
                logger.info("data: reading the ids prepared in %s", prepared)
                return _training_data(config, kept, *_vocabularies(manifest), datasets, valid, test, fingerprint)
        except (DamagedData, KeyError, TypeError, ValueError) as error:
            if not write:
                raise DamagedData(str(error) if isinstance(error, DamagedData) else
                                  f"{prepared / MANIFEST}: not a manifest of prepared data ({error!r})") from None
            logger.warning("%s: preparing it anew", error)  # revnmt's own folder (read_manifest found its key)
    options = options or text_options(config)
    src_tok, tgt_tok = options.source_tokenizer(), options.target_tokenizer()
    vocabs = None if vocab_tokens is None else tuple(Vocabulary(tokens[len(SPECIALS):]) for tokens in vocab_tokens)
    if prepared is not None and write:
        with Preparation(prepared, input_files(config)) as preparation:
            manifest = _prepare(config, options, (src_tok, tgt_tok), vocabs, key, valid, preparation)
        logger.info("data: ids prepared in %s", prepared)
        return _training_data(config, options, *_vocabularies(manifest), load_prepared(prepared, manifest), valid, test,
                              fingerprint)
    # Nowhere to keep them: prepared in a temporary folder all the same, and read back into memory.
    with tempfile.TemporaryDirectory(prefix="revnmt-data-") as folder, Preparation(Path(folder) / "data") as prep:
        manifest = _prepare(config, options, (src_tok, tgt_tok), vocabs, key, valid, prep)
        datasets = {name: EncodedDataset.from_arrays(
            {part: np.array(array) for part, array in dataset.arrays().items()}, dataset.n_filtered)
            for name, dataset in load_prepared(prep.folder, manifest).items()}
    return _training_data(config, options, *_vocabularies(manifest), datasets, valid, test, fingerprint)


def input_files(config: DataConfig) -> list[Path]:
    """The files a run prepares its data from, or reads beside them (resolved ``config``): the corpora's sides that
    exist, and the SentencePiece models it names."""
    prefixes = [prefix for prefix in (config.train, config.valid, config.test) if prefix]
    sides = [Path(f"{prefix}.{lang}{gz}") for prefix in prefixes for lang in (config.src, config.tgt)
             for gz in ("", ".gz")]
    return [path for path in sides if path.exists()] + [Path(path) for path in config.spm_model]


def _prepare(config: DataConfig, options: DataOptions, tokenizers: tuple[SentenceTokenizer, SentenceTokenizer],
             vocabs: tuple[Vocabulary, Vocabulary] | None, key: dict, valid: ParallelCorpus,
             preparation: Preparation) -> dict:
    """Encode the training corpus (streamed, see :mod:`revnmt.data.encoding`) and the dev set into
    ``preparation`` and commit it; its manifest."""
    unit = "pieces" if options.subwords else "tokens"
    train = encode_corpus(config.train, config.src, config.tgt, tokenizers, preparation.writer("train"), vocabs,
                          WordRule(config.min_freq, config.max_vocab), options.max_len, config.train_limit,
                          scratch=preparation.staging)
    if not options.subwords and vocabs is None:
        for lang, vocab in ((config.src, train.src_vocab), (config.tgt, train.tgt_vocab)):
            if len(vocab) == len(SPECIALS):
                raise ValueError(f"{config.train}: no {lang} token occurs --min-freq {config.min_freq} times")
    if options.max_len is not None:
        logger.info("train: filtered %d of %d pairs longer than %d %s", train.too_long,
                    train.pairs + train.filtered, options.max_len, unit)
    if train.empty_source:
        logger.warning("train: dropped %d pairs whose source has no %s", train.empty_source, unit)
    if train.pairs == 0:
        raise ValueError(f"{config.train}: no training pair has at most --max-len {options.max_len} {unit} per side")
    preparation.count("train", train.pairs, train.filtered)
    valid_set = EncodedDataset.from_corpus(valid, *tokenizers, train.src_vocab, train.tgt_vocab)
    if len(valid_set) == 0:
        raise ValueError(f"{config.valid}: no dev pair has a source with {unit}")
    preparation.add("valid", valid_set, (len(train.src_vocab), len(train.tgt_vocab)))
    text = {name: value for name, value in options.to_dict().items() if name not in MODEL_FILES}
    models = {name: getattr(options, name) for name in MODEL_FILES if getattr(options, name) is not None}
    manifest = {"key": key, "options": text, "src_vocab": train.src_vocab.itos, "tgt_vocab": train.tgt_vocab.itos}
    return preparation.commit(manifest, models)


def _vocabularies(manifest: dict) -> tuple[Vocabulary, Vocabulary]:
    return tuple(Vocabulary(manifest[f"{side}_vocab"][len(SPECIALS):]) for side in ("src", "tgt"))


def _training_data(config: DataConfig, options: DataOptions, src_vocab: Vocabulary, tgt_vocab: Vocabulary,
                   datasets: dict[str, EncodedDataset], valid: ParallelCorpus, test: ParallelCorpus | None,
                   fingerprint: dict[str, dict]) -> TrainingData:
    """The :class:`TrainingData` of encoded (or prepared) datasets, logged."""
    train_set, valid_set = datasets["train"], datasets["valid"]
    unit = "pieces" if options.subwords else "tokens"
    logger.info("data: %d training pairs (%d filtered), %d dev pairs%s; vocabularies: %s %d, %s %d %s; %s per "
                "training sentence: %s %.1f, %s %.1f", len(train_set), train_set.n_filtered, len(valid_set),
                f", {len(test)} test pairs" if test else "", config.src, len(src_vocab), config.tgt, len(tgt_vocab),
                unit, unit, config.src, train_set.src_lengths.mean(), config.tgt, train_set.tgt_lengths.mean())
    return TrainingData(options, src_vocab, tgt_vocab, train_set, valid_set, valid, test, fingerprint)
