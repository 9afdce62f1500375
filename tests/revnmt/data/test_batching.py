import logging

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from revnmt.data import (
    BOS,
    EOS,
    PAD,
    BatchSampler,
    EncodedDataset,
    ParallelCorpus,
    Tokenizer,
    Vocabulary,
    find_multi30k,
    load_parallel,
    make_batch,
    multi30k_prefix,
    sorted_batches,
)

SRC = [[5, 6], [7, 8, 9, 10], [11], [12, 13, 14]]
TGT = [[20, 21, 22], [23], [24, 25], [26, 27, 28, 29, 30]]


@pytest.fixture
def dataset() -> EncodedDataset:
    return EncodedDataset(SRC, TGT)


def test_dataset_storage(dataset):
    assert len(dataset) == 4
    assert dataset[1].src.tolist() == [7, 8, 9, 10]
    assert dataset[3].tgt.tolist() == [26, 27, 28, 29, 30]
    assert dataset.src_lengths.tolist() == [2, 4, 1, 3]
    assert dataset.lengths.tolist() == [4, 4, 3, 6]  # max(src, tgt + 1)


def test_make_batch_pads_and_shifts(dataset):
    batch = make_batch(dataset, [0, 1, 2])
    # Rows sorted by decreasing source length; indices say which example each row is.
    assert batch.indices == [1, 0, 2]
    assert batch.src.tolist() == [[7, 8, 9, 10], [5, 6, PAD, PAD], [11, PAD, PAD, PAD]]
    assert batch.src_len.tolist() == [4, 2, 1]
    assert batch.tgt_in.tolist() == [[BOS, 23, PAD, PAD], [BOS, 20, 21, 22], [BOS, 24, 25, PAD]]
    assert batch.tgt_out.tolist() == [[23, EOS, PAD, PAD], [20, 21, 22, EOS], [24, 25, EOS, PAD]]
    assert batch.tgt_len.tolist() == [2, 4, 3]
    assert batch.n_tokens == 9 == int((batch.tgt_out != PAD).sum())
    assert len(batch) == 3
    for tensor in (batch.src, batch.src_len, batch.tgt_in, batch.tgt_out, batch.tgt_len):
        assert tensor.dtype == torch.long
    # Teacher forcing: the decoder input is the output shifted right by one, behind BOS.
    assert torch.equal(batch.tgt_in[:, 1:], torch.where(batch.tgt_out == EOS, PAD, batch.tgt_out)[:, :-1])


def test_make_batch_rejects_empty(dataset):
    with pytest.raises(ValueError):
        make_batch(dataset, [])


def test_batch_to_device(dataset):
    batch = make_batch(dataset, [3, 2])
    moved = batch.to("meta")
    assert moved.src.device.type == "meta" and moved.tgt_len.device.type == "meta"
    assert moved.indices == batch.indices and moved.n_tokens == batch.n_tokens
    assert batch.src.device.type == "cpu"  # the original is unchanged


def test_from_corpus_filters_long_pairs(caplog):
    corpus = ParallelCorpus(
        src=["a b", "a b c d", "b", "a"],
        tgt=["x", "y", "x y z w", "x y"],
        name="toy",
    )
    tok = Tokenizer("en")
    src_vocab = Vocabulary.build(tok.tokenize(s) for s in corpus.src)
    tgt_vocab = Vocabulary.build(tok.tokenize(t) for t in corpus.tgt)
    with caplog.at_level(logging.INFO):
        data = EncodedDataset.from_corpus(corpus, tok, tok, src_vocab, tgt_vocab, max_len=3)
    assert data.n_filtered == 2
    assert "filtered 2 of 4 pairs longer than 3 tokens" in caplog.text
    assert data.corpus_indices.tolist() == [0, 3]
    assert src_vocab.decode(data[1].src) == ["a"]
    assert tgt_vocab.decode(data[1].tgt) == ["x", "y"]
    unfiltered = EncodedDataset.from_corpus(corpus, tok, tok, src_vocab, tgt_vocab)
    assert len(unfiltered) == 4 and unfiltered.n_filtered == 0


def test_from_corpus_drops_sources_without_tokens(caplog):
    corpus = ParallelCorpus(src=["\x00", "a"], tgt=["x", "y"], name="toy")
    tok = Tokenizer("en")
    vocab = Vocabulary(["a", "x", "y"])
    with caplog.at_level(logging.WARNING):
        data = EncodedDataset.from_corpus(corpus, tok, tok, vocab, vocab)
    assert len(data) == 1 and data.n_filtered == 1
    assert "no tokens" in caplog.text


def padded_size(batch: list[int], lengths: np.ndarray) -> int:
    return len(batch) * int(lengths[batch].max())


lengths_strategy = st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=300)


@settings(max_examples=40, deadline=None)
@given(lengths=lengths_strategy, batch_tokens=st.integers(10, 400), seed=st.integers(0, 5), bucket=st.booleans())
def test_token_batches_cover_every_index_once_within_budget(lengths, batch_tokens, seed, bucket):
    lengths = np.array(lengths)
    sampler = BatchSampler(lengths, batch_tokens=batch_tokens, seed=seed, bucket=bucket)
    batches = sampler.batches(epoch=seed)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch)
        if padded_size(batch, lengths) > batch_tokens:
            assert len(batch) == 1 and batch[0] in sampler.oversized
    assert sampler.oversized == [i for i, n in enumerate(lengths) if n > batch_tokens]


@settings(max_examples=20, deadline=None)
@given(lengths=lengths_strategy, batch_size=st.integers(1, 50), shuffle=st.booleans())
def test_sentence_batches(lengths, batch_size, shuffle):
    batches = BatchSampler(lengths, batch_size=batch_size, shuffle=shuffle).batches(0)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(1 <= len(b) <= batch_size for b in batches)
    # Within one bucketing pool every batch is full except the last.
    assert sum(len(b) < batch_size for b in batches) <= -(-len(lengths) // (100 * batch_size))


def test_both_limits_apply():
    lengths = [2] * 50
    batches = BatchSampler(lengths, batch_tokens=40, batch_size=7).batches(0)
    assert max(len(b) for b in batches) == 7


def test_oversized_example_gets_its_own_batch():
    sampler = BatchSampler([3, 50, 3, 3], batch_tokens=10, shuffle=False)
    assert sampler.oversized == [1]
    assert [1] in [batch.tolist() for batch in sampler.batches(0)]


def test_batches_are_a_function_of_seed_and_epoch():
    lengths = np.random.default_rng(1).integers(1, 40, size=2000)
    def epoch(sampler, number):
        return [batch.tolist() for batch in sampler.batches(number)]

    sampler = BatchSampler(lengths, batch_tokens=500, seed=7)
    epoch3 = epoch(sampler, 3)
    assert epoch(sampler, 3) == epoch3
    assert epoch(BatchSampler(lengths, batch_tokens=500, seed=7), 3) == epoch3  # e.g. after a restart
    assert epoch(sampler, 4) != epoch3
    assert epoch(BatchSampler(lengths, batch_tokens=500, seed=8), 3) != epoch3


def test_bucketing_reduces_padding():
    lengths = np.random.default_rng(2).integers(1, 50, size=5000)

    def padding(bucket: bool) -> int:
        batches = BatchSampler(lengths, batch_tokens=1000, bucket=bucket).batches(0)
        return sum(padded_size(b, lengths) for b in batches) - int(lengths.sum())

    assert padding(bucket=True) < 0.1 * padding(bucket=False)


def test_unshuffled_unbucketed_batches_keep_order():
    batches = BatchSampler([1] * 10, batch_size=4, shuffle=False, bucket=False).batches(0)
    assert [batch.tolist() for batch in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("kwargs", [{}, {"batch_tokens": 0}, {"batch_size": -1}])
def test_sampler_rejects_bad_limits(kwargs):
    with pytest.raises(ValueError):
        BatchSampler([1, 2], **kwargs)


def test_sorted_batches_for_inference(dataset):
    batches = sorted_batches(dataset.src_lengths, batch_size=3)
    assert batches == [[1, 3, 0], [2]]
    # Putting each row's output back at its index restores the input order.
    restored = [None] * len(dataset)
    for indices in batches:
        batch = make_batch(dataset, indices)
        for row, i in enumerate(batch.indices):
            restored[i] = batch.src[row, : batch.src_len[row]].tolist()
    assert restored == SRC


def test_real_multi30k_validation_pipeline():
    try:
        folder = find_multi30k(download=False)
    except FileNotFoundError:
        pytest.skip("Multi30K not available locally")
    corpus = load_parallel(multi30k_prefix("valid", folder), "en", "de")
    en, de = Tokenizer("en", lowercase=True), Tokenizer("de", lowercase=True)
    src_vocab = Vocabulary.build((en.tokenize(s) for s in corpus.src), min_freq=2)
    tgt_vocab = Vocabulary.build((de.tokenize(t) for t in corpus.tgt), min_freq=2)
    data = EncodedDataset.from_corpus(corpus, en, de, src_vocab, tgt_vocab, max_len=50)
    assert len(data) + data.n_filtered == len(corpus) == 1014
    sampler = BatchSampler(data.lengths, batch_tokens=2000)
    batches = sampler.batches(0)
    assert sorted(i for b in batches for i in b) == list(range(len(data)))
    batch = make_batch(data, batches[0])
    assert batch.src.shape[0] == batch.tgt_in.shape[0] == len(batches[0])
    assert batch.src.numel() <= 2000 and batch.tgt_out.numel() <= 2000


def test_subset_keeps_the_chosen_pairs_and_counts_the_others_as_filtered():
    rng = np.random.default_rng(0)
    src = [list(rng.integers(4, 50, rng.integers(1, 9))) for _ in range(100)]
    tgt = [list(rng.integers(4, 50, rng.integers(1, 9))) for _ in range(100)]
    dataset = EncodedDataset(src, tgt, n_filtered=3, corpus_indices=range(5, 105))
    keep = rng.random(100) < 0.6
    kept, index = dataset.subset(keep), np.flatnonzero(keep)
    assert len(kept) == len(index) and kept.n_filtered == 3 + 100 - len(index)
    for j, i in enumerate(index):
        assert list(kept[j].src) == src[i] and list(kept[j].tgt) == tgt[i]
    assert list(kept.corpus_indices) == list(index + 5)
    assert len(dataset.subset(np.zeros(100, dtype=bool))) == 0


def _batches_as_lists_of_arrays(sampler: BatchSampler, epoch: int) -> list[list[int]]:
    """The batch order as revnmt made it before EpochBatches (an array per batch): the reference the batches of
    a resumed or earlier run must still equal."""
    rng = np.random.default_rng([sampler.seed, epoch])
    lengths = np.asarray(sampler.lengths, dtype=np.int64)
    order = rng.permutation(len(lengths)) if sampler.shuffle else np.arange(len(lengths))

    def fill(order):
        return np.split(order, sampler._cuts(order))

    if not sampler.bucket:
        batches = fill(order)
    else:
        batches = []
        for start in range(0, len(order), sampler._pool_size):
            pool = order[start: start + sampler._pool_size]
            batches += fill(pool[np.argsort(lengths[pool], kind="stable")])
        if sampler.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
    return [batch.tolist() for batch in batches]


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=3000),
       batch_tokens=st.one_of(st.none(), st.integers(10, 400)), batch_size=st.integers(1, 50), seed=st.integers(0, 5),
       shuffle=st.booleans(), bucket=st.booleans())
def test_epoch_batches_are_the_batches_of_arrays_before(lengths, batch_tokens, batch_size, seed, shuffle, bucket):
    sampler = BatchSampler(np.array(lengths, dtype=np.int32), batch_tokens=batch_tokens, batch_size=batch_size,
                           shuffle=shuffle, seed=seed, bucket=bucket)
    batches = sampler.batches(seed)
    assert [batch.tolist() for batch in batches] == _batches_as_lists_of_arrays(sampler, seed)
    assert [batch.tolist() for batch in batches[1:3]] == [batch.tolist() for batch in list(batches)[1:3]]
    assert batches[-1].tolist() == list(batches)[-1].tolist()
    with pytest.raises(IndexError):
        batches[len(batches)]


def test_an_epochs_batch_order_is_one_int32_array():
    batches = BatchSampler(np.random.default_rng(0).integers(1, 50, size=10_000), batch_size=64).batches(1)
    assert batches.order.dtype == np.int32 and batches.order.base is None
    assert all(batch.base is batches.order for batch in batches)


def test_padded_lengths_are_one_int32_array_held_once(dataset):
    assert dataset.lengths.dtype == np.int32 and dataset.lengths is dataset.lengths
    assert dataset.lengths.tolist() == np.maximum(dataset.src_lengths, dataset.tgt_lengths + 1).tolist()
    assert BatchSampler(dataset.lengths, batch_size=2).lengths is dataset.lengths
    assert [length.tolist() for length in dataset.pair_lengths(np.array([3, 0]))] == [
        dataset.src_lengths[[3, 0]].tolist(), dataset.tgt_lengths[[3, 0]].tolist()]


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=40), data=st.data())
def test_batch_rows_run_from_the_longest_source_ties_in_given_order(lengths, data):
    dataset = EncodedDataset([[5] * n for n, _ in lengths], [[6] * m for _, m in lengths])
    indices = data.draw(st.lists(st.integers(0, len(lengths) - 1), min_size=1, max_size=len(lengths), unique=True))
    batch = make_batch(dataset, np.array(indices, dtype=np.int32))
    assert batch.indices == sorted(indices, key=lambda i: -lengths[i][0])
    assert batch.src_len.tolist() == [lengths[i][0] for i in batch.indices]
    assert batch.tgt_len.tolist() == [lengths[i][1] + 1 for i in batch.indices]
