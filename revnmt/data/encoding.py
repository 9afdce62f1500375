"""Encoding a training corpus of any size: streamed from its files, tokenized on every core, written as arrays.

A million sentence pairs held as Python strings and lists of ids take gigabytes, and Moses tokenization in one
process takes minutes. Here the corpus is read in chunks (:data:`revnmt.data.corpus.CHUNK_PAIRS` pairs; plain or
gzipped files, never whole), and each chunk is tokenized where it is cheapest: Moses words in a pool of worker
processes (one per core: sacremoses is pure Python), SentencePiece pieces by the library's own batched,
multi-threaded encoding. Nothing of a chunk's text outlives it.

Words need the whole corpus's counts before their vocabulary exists, so encoding takes two passes, over ids
rather than text:

1. each chunk's tokens get *provisional* ids (the order in which this pass first meets them); these go to a
   scratch file beside the output, with each pair's two lengths and the provisional tokens' counts;
2. the vocabulary is built from the counts (:meth:`Vocabulary.from_counts`, as :meth:`Vocabulary.build` does
   from text), and the scratch ids are mapped to it through one table into the output arrays, less the
   filtered pairs.

Pieces have their ids from the SentencePiece model at once; the same passes run with the model's ids as the
provisional ones. The result is the arrays of :meth:`EncodedDataset.arrays`, the same as encoding the corpus in
memory gives (:meth:`EncodedDataset.from_corpus`), whatever the number of workers.
"""

from __future__ import annotations

import collections
import itertools
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .corpus import CHUNK_PAIRS, language_file, read_pairs
from .subword import SubwordTokenizer
from .tokenization import SentenceTokenizer
from .vocab import UNK, Vocabulary

logger = logging.getLogger(__name__)

#: Below this size of the source file the corpus is tokenized in the calling process: starting workers (each
#: imports torch) costs more than they save on a small corpus.
POOL_MIN_BYTES = 2 << 20
#: Pairs between two progress lines in the log.
PROGRESS_PAIRS = 250_000
#: Pairs per block of the second pass (bounds what it holds at once).
_BLOCK_PAIRS = 1 << 16

#: One side of an encoded chunk: the chunk's distinct tokens (None for pieces: the ids are the model's), each
#: token's index in them (or piece id), and each sentence's length.
SideChunk = tuple["list[str] | None", np.ndarray, np.ndarray]


@dataclass(frozen=True)
class WordRule:
    """How a word vocabulary is built from the training corpus (``--min-freq``, ``--max-vocab``)."""

    min_freq: int = 1
    max_size: int | None = None


@dataclass
class EncodedCorpus:
    """What :func:`encode_corpus` wrote, and the vocabularies it encoded with."""

    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    pairs: int  # kept
    too_long: int
    empty_source: int

    @property
    def filtered(self) -> int:
        return self.too_long + self.empty_source


#: ``write(part, dtype, length, blocks)`` stores one part of a dataset's arrays, ``length`` values of ``dtype``
#: that arrive in ``blocks`` (so that no part need be whole in memory).
ArrayWriter = Callable[[str, np.dtype, int, Iterable[np.ndarray]], None]


def encode_corpus(prefix: str, src_lang: str, tgt_lang: str, tokenizers: tuple[SentenceTokenizer, SentenceTokenizer],
                  write: ArrayWriter, vocabs: tuple[Vocabulary, Vocabulary] | None = None,
                  rule: WordRule = WordRule(), max_len: int | None = None, limit: int | None = None,
                  workers: int | None = None, scratch: Path | None = None, chunk: int = CHUNK_PAIRS) -> EncodedCorpus:
    """Tokenize and encode the corpus ``PREFIX.SRC`` / ``PREFIX.TGT`` (see :func:`read_pairs`) into arrays.

    ``write`` stores each part of :meth:`EncodedDataset.arrays` (``src``, ``src_offsets``, ``tgt``,
    ``tgt_offsets``, ``lines``), the ids block by block; ids are int16 where the vocabulary allows. ``vocabs``
    are the vocabularies to encode with (a resumed run's); without them words get vocabularies built by
    ``rule`` and pieces their model's. Pairs with more than ``max_len`` tokens on a side, or none in the
    source, are dropped and counted.

    ``workers`` processes tokenize words (default: one per core where the corpus is at least
    :data:`POOL_MIN_BYTES`, else none); ``scratch`` is the folder of the provisional ids (default: a temporary
    one), deleted on return; ``chunk`` is the pairs tokenized at a time.
    """
    started = time.monotonic()
    chunks = _PieceChunks(*tokenizers) if isinstance(tokenizers[0], SubwordTokenizer) else _WordChunks(*tokenizers)
    if workers is None:
        big = language_file(prefix, src_lang).stat().st_size >= POOL_MIN_BYTES
        workers = (os.cpu_count() or 1) if big and isinstance(chunks, _WordChunks) else 0
    scratch_dir = Path(tempfile.mkdtemp(prefix="revnmt-encoding-", dir=scratch))
    try:
        # closed by _Side.close
        sides = tuple(_Side(open(scratch_dir / f"{name}.ids", "wb")) for name in ("src", "tgt"))  # noqa: SIM115
        pairs = 0
        for src, tgt in _in_order(chunks, read_pairs(prefix, src_lang, tgt_lang, limit, chunk), workers):
            sides[0].add(*src)
            sides[1].add(*tgt)
            before, pairs = pairs, pairs + len(src[2])
            if pairs // PROGRESS_PAIRS > before // PROGRESS_PAIRS:
                logger.info("data: %s: %d pairs tokenized (%.0f pairs/s)", prefix, pairs,
                            pairs / (time.monotonic() - started))
        for side in sides:
            side.close()
        src_len, tgt_len = (side.lengths() for side in sides)
        empty = src_len == 0
        too_long = ~empty & (np.maximum(src_len, tgt_len) > max_len) if max_len is not None else np.zeros_like(empty)
        keep = ~(empty | too_long)
        lines = np.flatnonzero(keep)
        write("lines", np.dtype(np.int64), len(lines), [lines])
        if vocabs is None:
            vocabs = tuple(chunks.vocabulary(side, tok, rule) for side, tok in zip(sides, tokenizers))
        for name, side, tokenizer, vocab in zip(("src", "tgt"), sides, tokenizers, vocabs):
            side.write_ids(name, keep, chunks.table(side, tokenizer, vocab), id_dtype(len(vocab)), write)
    finally:
        shutil.rmtree(scratch_dir, ignore_errors=True)
    logger.info("data: %s: %d pairs encoded in %.1f s%s", prefix, pairs, time.monotonic() - started,
                f" by {workers} processes" if workers else "")
    return EncodedCorpus(vocabs[0], vocabs[1], len(lines), int(too_long.sum()), int(empty.sum()))


def id_dtype(vocab_size: int) -> np.dtype:
    """The dtype of token ids: int16 where the vocabulary allows (half the bytes of int32)."""
    return np.dtype(np.int16 if vocab_size <= np.iinfo(np.int16).max + 1 else np.int32)


# ---------------------------------------------------------------------------- tokenizing chunks


class _WordChunks:
    """Moses words: each side of a chunk as its distinct tokens, indices into them, and lengths."""

    def __init__(self, src: SentenceTokenizer, tgt: SentenceTokenizer) -> None:
        self.tokenizers = (src, tgt)

    def __call__(self, pairs: list[tuple[str, str]]) -> tuple[SideChunk, SideChunk]:
        return tuple(_words(tok, lines) for tok, lines in zip(self.tokenizers, zip(*pairs)))

    @staticmethod
    def vocabulary(side: _Side, tokenizer: SentenceTokenizer, rule: WordRule) -> Vocabulary:
        return Vocabulary.from_counts(dict(zip(side.tokens, side.counts.tolist())), rule.min_freq, rule.max_size)

    @staticmethod
    def table(side: _Side, tokenizer: SentenceTokenizer, vocab: Vocabulary) -> np.ndarray:
        """The vocabulary id of each provisional id."""
        return np.fromiter((vocab.stoi.get(token, UNK) for token in side.tokens), np.int64, len(side.tokens))


def _words(tokenizer: SentenceTokenizer, lines: Iterable[str]) -> SideChunk:
    index: dict[str, int] = {}
    sentences = [tokenizer.tokenize(line) for line in lines]
    ids = np.fromiter((index.setdefault(token, len(index)) for tokens in sentences for token in tokens), np.int32)
    return list(index), ids, np.fromiter(map(len, sentences), np.int32, len(sentences))


class _PieceChunks:
    """SentencePiece pieces: each side of a chunk as the model's piece ids (SentencePiece's batched encoding
    uses every core itself) and lengths."""

    def __init__(self, src: SubwordTokenizer, tgt: SubwordTokenizer) -> None:
        self.tokenizers = (src, tgt)

    def __call__(self, pairs: list[tuple[str, str]]) -> tuple[SideChunk, SideChunk]:
        sides = []
        for tok, lines in zip(self.tokenizers, zip(*pairs)):
            encoded = tok.encode_ids(list(lines))
            ids = np.fromiter(itertools.chain.from_iterable(encoded), np.int32)
            sides.append((None, ids, np.fromiter(map(len, encoded), np.int32, len(encoded))))
        return tuple(sides)

    @staticmethod
    def vocabulary(side: _Side, tokenizer: SubwordTokenizer, rule: WordRule) -> Vocabulary:
        return tokenizer.vocabulary()

    @staticmethod
    def table(side: _Side, tokenizer: SubwordTokenizer, vocab: Vocabulary) -> np.ndarray:
        """The vocabulary id of each of the model's piece ids (the model's unknown piece is ``<unk>``)."""
        pieces = tokenizer.pieces()
        return np.fromiter((vocab.stoi.get(piece, UNK) for piece in pieces), np.int64, len(pieces))


def _in_order(chunks: Callable, batches: Iterator[list[tuple[str, str]]], workers: int) -> Iterator:
    """``chunks(batch)`` of every batch, in order: in this process, or in ``workers`` processes with at most two
    batches per worker in flight (so the reading never runs ahead of the tokenizing by more)."""
    if workers <= 1:
        yield from map(chunks, batches)
        return
    # spawn, not fork: the caller may hold torch's threads, which a forked child would inherit half-initialized
    with multiprocessing.get_context("spawn").Pool(workers, _start_worker, (chunks,)) as pool:
        pending: collections.deque = collections.deque()
        for batch in batches:
            pending.append(pool.apply_async(_run_worker, (batch,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


_WORKER: Callable | None = None


def _start_worker(chunks: Callable) -> None:
    global _WORKER
    _WORKER = chunks
    # Ctrl-C reaches the terminal's whole process group: the main process stops the preparation (and the pool
    # with it), while a worker's own KeyboardInterrupt would only print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_worker(batch: list[tuple[str, str]]):
    return _WORKER(batch)


# ---------------------------------------------------------------------------- the two passes


@dataclass
class _Side:
    """One language side in the first pass: provisional ids to a scratch file, lengths and counts kept."""

    file: BinaryIO
    tokens: list[str] = field(default_factory=list)  # words: the token of each provisional id
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # words: of each provisional id
    _index: dict[str, int] = field(default_factory=dict)
    _lengths: list[np.ndarray] = field(default_factory=list)

    def add(self, tokens: list[str] | None, ids: np.ndarray, lengths: np.ndarray) -> None:
        if tokens is not None:  # words: the chunk's token indices to provisional ids, and their counts
            ids = np.fromiter(map(self._provisional, tokens), np.int32, len(tokens))[ids]
            counts = np.bincount(ids, minlength=len(self.tokens))
            counts[: len(self.counts)] += self.counts
            self.counts = counts
        self.file.write(ids.astype(np.int32).tobytes())
        self._lengths.append(lengths)

    def _provisional(self, token: str) -> int:
        index = self._index.get(token)
        if index is None:
            index = self._index[token] = len(self.tokens)
            self.tokens.append(token)
        return index

    def close(self) -> None:
        self.file.close()

    def lengths(self) -> np.ndarray:
        return np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)

    def write_ids(self, name: str, keep: np.ndarray, table: np.ndarray, dtype: np.dtype, write: ArrayWriter) -> None:
        """The second pass: the kept pairs' ids through ``table`` into ``write(name)``, and their offsets. The
        scratch file is read a block at a time (mapped whole, all its pages would count as resident)."""
        lengths = self.lengths()
        starts = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=starts[1:])
        kept_lengths = lengths[keep]
        offsets = np.zeros(len(kept_lengths) + 1, np.int64)
        np.cumsum(kept_lengths, out=offsets[1:])
        write(f"{name}_offsets", offsets.dtype, len(offsets), [offsets])

        def blocks() -> Iterator[np.ndarray]:
            for first in range(0, len(lengths), _BLOCK_PAIRS):
                block = slice(first, first + _BLOCK_PAIRS)
                begin, end = starts[first], starts[min(first + _BLOCK_PAIRS, len(lengths))]
                ids = np.fromfile(self.file.name, np.int32, count=end - begin, offset=4 * begin)
                yield table[ids][np.repeat(keep[block], lengths[block])].astype(dtype)

        write(name, dtype, int(offsets[-1]), blocks())
