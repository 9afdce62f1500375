"""Encoded datasets, padded batches, and length-bucketed, resumable batch order."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import overload

import numpy as np
import torch

from revnmt.data.corpus import ParallelCorpus
from revnmt.data.tokenization import SentenceTokenizer
from revnmt.data.vocab import BOS, EOS, PAD, Vocabulary

logger = logging.getLogger(__name__)

# Length bucketing sorts pools of this many batches' worth of examples: large enough that each
# batch holds sentences of nearly equal length, small enough that batches still vary across epochs.
POOL_BATCHES = 100


@dataclass(frozen=True)
class Example:
    """One encoded sentence pair: token ids without BOS/EOS."""

    src: np.ndarray
    tgt: np.ndarray


def _pack(sequences: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate id sequences into one flat array plus offsets (``offsets[i]:offsets[i+1]``)."""
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter((i for s in sequences for i in s), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


class EncodedDataset:
    """Sentence pairs as token ids, stored as two flat int32 arrays (one Python list per token
    would take ~10x the memory and make batching slow)."""

    def __init__(
        self,
        src: Sequence[Sequence[int]],
        tgt: Sequence[Sequence[int]],
        n_filtered: int = 0,
        corpus_indices: Sequence[int] | None = None,
    ) -> None:
        """``corpus_indices[i]`` is the corpus line of pair ``i`` (default: ``i``), so that
        outputs can be matched to references after filtering."""
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} source but {len(tgt)} target sequences")
        self._set(*_pack(src), *_pack(tgt), n_filtered,
                  np.arange(len(src)) if corpus_indices is None else np.asarray(corpus_indices))

    def _set(self, src: np.ndarray, src_offsets: np.ndarray, tgt: np.ndarray, tgt_offsets: np.ndarray,
             n_filtered: int, corpus_indices: np.ndarray) -> None:
        self._src, self._src_offsets, self._tgt, self._tgt_offsets = src, src_offsets, tgt, tgt_offsets
        # Padded size of each pair in a batch: max(source length, target length + 1), the +1 being the BOS/EOS
        # that ``tgt_in``/``tgt_out`` add. The one per-pair array held besides the ids, as int32 (a sentence's
        # length fits): 4 bytes a pair, where int64 source and target lengths took 16 and these padded sizes
        # 8 more each time they were asked for.
        self.lengths = np.maximum(self.src_lengths, self.tgt_lengths + 1).astype(np.int32)
        self.n_filtered = n_filtered
        self.corpus_indices = corpus_indices
        self._reopen: tuple | None = None  # how a memory-mapped dataset is pickled (from_arrays)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], n_filtered: int, reopen: tuple | None = None
                    ) -> EncodedDataset:
        """A dataset over the arrays of :meth:`arrays` (memory-mapped ones are read only where batches touch).
        ``reopen``, (function, arguments) that make the same dataset again, is how it is pickled: a worker
        process maps the same files instead of receiving a copy of the arrays."""
        dataset = cls.__new__(cls)
        dataset._set(arrays["src"], arrays["src_offsets"], arrays["tgt"], arrays["tgt_offsets"], n_filtered,
                     arrays["lines"])
        dataset._reopen = reopen
        return dataset

    def __reduce__(self):
        if self._reopen is not None:
            return self._reopen
        return EncodedDataset.from_arrays, (self.arrays(), self.n_filtered)

    def mapped_bytes(self) -> int:
        """Bytes of the dataset's arrays that are memory-mapped files (pages the process reads in as batches
        touch them), 0 for a dataset held in memory."""
        return sum(array.nbytes for array in self.arrays().values() if isinstance(array, np.memmap))

    def arrays(self) -> dict[str, np.ndarray]:
        """The flat arrays the dataset is made of: ids and offsets of each side, and each pair's corpus line."""
        return {"src": self._src, "src_offsets": self._src_offsets, "tgt": self._tgt, "tgt_offsets": self._tgt_offsets,
                "lines": self.corpus_indices}

    @classmethod
    def from_corpus(
        cls,
        corpus: ParallelCorpus,
        src_tok: SentenceTokenizer,
        tgt_tok: SentenceTokenizer,
        src_vocab: Vocabulary,
        tgt_vocab: Vocabulary,
        max_len: int | None = None,
    ) -> EncodedDataset:
        """Tokenize and encode ``corpus``, dropping pairs with more than ``max_len`` tokens on a side.

        Pairs whose source has no tokens at all are dropped too: an encoder cannot run on them.
        """
        src, tgt, kept = [], [], []
        n_too_long = n_empty = 0
        for i, (src_line, tgt_line) in enumerate(zip(corpus.src, corpus.tgt)):
            src_ids = src_vocab.encode(src_tok.tokenize(src_line))
            tgt_ids = tgt_vocab.encode(tgt_tok.tokenize(tgt_line))
            if not src_ids:
                n_empty += 1
            elif max_len is not None and max(len(src_ids), len(tgt_ids)) > max_len:
                n_too_long += 1
            else:
                src.append(src_ids)
                tgt.append(tgt_ids)
                kept.append(i)
        if max_len is not None:
            logger.info(
                "%s: filtered %d of %d pairs longer than %d tokens", corpus.name, n_too_long, len(corpus), max_len
            )
        if n_empty:
            logger.warning("%s: dropped %d pairs whose source has no tokens", corpus.name, n_empty)
        return cls(src, tgt, n_filtered=n_too_long + n_empty, corpus_indices=kept)

    def __len__(self) -> int:
        return len(self._src_offsets) - 1

    @property
    def src_lengths(self) -> np.ndarray:
        """Each pair's source length, computed from the offsets when asked."""
        return np.diff(self._src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        """Each pair's target length, computed from the offsets when asked."""
        return np.diff(self._tgt_offsets)

    def pair_lengths(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The source and the target lengths of the pairs ``indices``."""
        return (self._src_offsets[indices + 1] - self._src_offsets[indices],
                self._tgt_offsets[indices + 1] - self._tgt_offsets[indices])

    def subset(self, keep: np.ndarray) -> EncodedDataset:
        """The pairs where the boolean array ``keep`` is True (the others count as filtered)."""
        index = np.flatnonzero(keep)
        arrays = {"lines": np.asarray(self.corpus_indices)[index]}
        for side, ids, offsets in (("src", self._src, self._src_offsets), ("tgt", self._tgt, self._tgt_offsets)):
            starts, lengths = offsets[index], offsets[index + 1] - offsets[index]
            arrays[f"{side}_offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            # each kept token's position in ``ids``: its sentence's start plus its place in the sentence
            within = np.arange(arrays[f"{side}_offsets"][-1]) - np.repeat(arrays[f"{side}_offsets"][:-1], lengths)
            arrays[side] = np.asarray(ids[np.repeat(starts, lengths) + within])
        return EncodedDataset.from_arrays(arrays, self.n_filtered + len(self) - len(index))

    def __getitem__(self, i: int) -> Example:
        return Example(
            src=self._src[self._src_offsets[i] : self._src_offsets[i + 1]],
            tgt=self._tgt[self._tgt_offsets[i] : self._tgt_offsets[i + 1]],
        )


@dataclass
class Batch:
    """A padded batch; rows are sorted by decreasing source length (as ``pack_padded_sequence``
    wants), and ``indices[r]`` is the dataset index of row ``r``."""

    src: torch.Tensor  # [B, S] source ids, PAD-padded
    src_len: torch.Tensor  # [B]
    tgt_in: torch.Tensor  # [B, T] BOS + target (decoder input)
    tgt_out: torch.Tensor  # [B, T] target + EOS (what the decoder must predict)
    tgt_len: torch.Tensor  # [B] target length + 1
    n_tokens: int  # number of non-PAD entries of tgt_out, for normalising the loss
    indices: list[int]

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def length(self) -> int:
        """The longest pair's length as :class:`BatchSampler` counts it (the longer side, the target with its
        EOS): every row is padded to it, and the batch's cost there is ``len(batch) * length`` tokens."""
        return max(self.src.shape[1], self.tgt_out.shape[1])

    def to(self, device: torch.device | str) -> Batch:
        """A copy with every tensor on ``device``."""
        return replace(
            self,
            src=self.src.to(device),
            src_len=self.src_len.to(device),
            tgt_in=self.tgt_in.to(device),
            tgt_out=self.tgt_out.to(device),
            tgt_len=self.tgt_len.to(device),
        )


def make_batch(dataset: EncodedDataset, indices: Sequence[int]) -> Batch:
    """Pad the pairs ``dataset[i] for i in indices`` into a ``Batch``."""
    if len(indices) == 0:
        raise ValueError("cannot make an empty batch")
    pairs = np.fromiter((int(i) for i in indices), dtype=np.int64, count=len(indices))
    src_len, tgt_len = dataset.pair_lengths(pairs)
    rows = np.argsort(-src_len, kind="stable")  # longest source first, ties in the given order
    order, src_len, tgt_len = pairs[rows].tolist(), src_len[rows], tgt_len[rows] + 1
    src = np.full((len(order), src_len.max()), PAD, dtype=np.int64)
    tgt_in = np.full((len(order), tgt_len.max()), PAD, dtype=np.int64)
    tgt_out = np.full_like(tgt_in, PAD)
    for row, i in enumerate(order):
        example = dataset[i]
        n = len(example.tgt)
        src[row, : len(example.src)] = example.src
        tgt_in[row, 0] = BOS
        tgt_in[row, 1 : n + 1] = example.tgt
        tgt_out[row, :n] = example.tgt
        tgt_out[row, n] = EOS
    return Batch(
        src=torch.from_numpy(src),
        src_len=torch.from_numpy(src_len.astype(np.int64)),
        tgt_in=torch.from_numpy(tgt_in),
        tgt_out=torch.from_numpy(tgt_out),
        tgt_len=torch.from_numpy(tgt_len.astype(np.int64)),
        n_tokens=int(tgt_len.sum()),
        indices=order,
    )


class BatchSampler:
    """Groups example indices into batches, by a token budget and/or a number of sentences.

    A batch's cost is its padded size: the number of examples times the longest ``lengths``
    entry in it. With ``bucket`` the examples are sorted by length inside shuffled pools of
    ``POOL_BATCHES`` batches' worth, so batches hold similar lengths and little padding, and the
    batch order is then shuffled. ``batches(epoch)`` depends only on (seed, epoch), so a resumed
    run can rebuild an epoch's list and skip the batches it already trained on.
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        batch_tokens: int | None = None,
        batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        bucket: bool = True,
    ) -> None:
        if batch_tokens is None and batch_size is None:
            raise ValueError("give batch_tokens, batch_size or both")
        for name, value in (("batch_tokens", batch_tokens), ("batch_size", batch_size)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        self.lengths = np.asarray(lengths)
        if not np.issubdtype(self.lengths.dtype, np.integer):  # a dataset's int32 lengths are kept as they are
            self.lengths = self.lengths.astype(np.int64)
        if self.lengths.ndim != 1 or len(self.lengths) == 0:
            raise ValueError("lengths must be a non-empty 1-D sequence")
        self.batch_tokens = batch_tokens
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.bucket = bucket

        # Examples that alone exceed the token budget cannot be split, so each gets a batch of
        # its own; the list lets the caller decide whether to filter them out instead.
        self.oversized: list[int] = []
        if batch_tokens is not None:
            self.oversized = np.flatnonzero(self.lengths > batch_tokens).tolist()
            if self.oversized:
                logger.warning(
                    "%d examples exceed batch_tokens=%d and get batches of their own", len(self.oversized), batch_tokens
                )

        per_batch = len(self.lengths)
        if batch_tokens is not None:
            per_batch = max(1, int(batch_tokens / self.lengths.mean()))
        if batch_size is not None:
            per_batch = min(per_batch, batch_size)
        self._pool_size = POOL_BATCHES * per_batch

    def batches(self, epoch: int) -> EpochBatches:
        """The batches of one epoch, each an array of example indices; every index occurs once."""
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.lengths)) if self.shuffle else np.arange(len(self.lengths))
        order = order.astype(np.int32 if len(order) <= np.iinfo(np.int32).max else np.int64)
        if not self.bucket:
            return EpochBatches(order, self._cuts(order))
        cuts: list[int] = []
        for start in range(0, len(order), self._pool_size):
            pool = order[start : start + self._pool_size]
            pool[:] = pool[np.argsort(self.lengths[pool], kind="stable")]
            cuts += [start, *(start + cut for cut in self._cuts(pool))]
        batches = EpochBatches(order, cuts[1:])
        if self.shuffle:
            # Otherwise each pool would run from its shortest to its longest batch.
            batches = batches.reordered(rng.permutation(len(batches)))
        return batches

    def _cuts(self, order: np.ndarray) -> list[int]:
        """Where to cut ``order`` (positions in it) into consecutive batches that respect the limits, greedily."""
        cuts: list[int] = []
        size = longest = 0
        for position, length in enumerate(self.lengths[order].tolist()):
            longest_with_it = max(longest, length)
            full = (self.batch_size is not None and size + 1 > self.batch_size) or (
                self.batch_tokens is not None and (size + 1) * longest_with_it > self.batch_tokens
            )
            if size and full:
                cuts.append(position)
                size, longest_with_it = 0, length
            size += 1
            longest = longest_with_it
        return cuts


class EpochBatches(Sequence[np.ndarray]):
    """An epoch's batches as one array of example indices, batch after batch, and where each batch starts.

    One array rather than an array per batch: 4 bytes an example (int32 indices), where the arrays took 8 (int64)
    besides an array object for each of an epoch's thousands of batches.
    """

    def __init__(self, order: np.ndarray, cuts: Sequence[int]) -> None:
        """Batch ``i`` is ``order[starts[i]:starts[i + 1]]``, the starts being 0 and the ``cuts``."""
        self.order = order
        self.starts = np.array([0, *cuts, len(order)], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.starts) - 1

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, i: slice) -> list[np.ndarray]: ...

    def __getitem__(self, i: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"batch {i} of {len(self)}")
        i %= len(self)
        return self.order[self.starts[i] : self.starts[i + 1]]

    def reordered(self, permutation: np.ndarray) -> EpochBatches:
        """The same batches in the order ``permutation`` gives: its ``k``-th is batch ``permutation[k]``."""
        sizes = np.diff(self.starts)[permutation]
        order = np.concatenate([self[int(i)] for i in permutation])
        return EpochBatches(order, np.cumsum(sizes)[:-1].tolist())


def sorted_batches(lengths: Sequence[int] | np.ndarray, batch_size: int) -> list[list[int]]:
    """Batches for inference: indices sorted by decreasing length (little padding, and the
    largest batch comes first so memory problems show at once). Restore input order with
    ``Batch.indices``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable").tolist()
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
