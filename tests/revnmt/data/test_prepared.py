"""Tests of revnmt.data.prepared: ids prepared once, read memory-mapped, reused only for the same data."""

import pickle

import numpy as np
import pytest

from revnmt.data import DataConfig, load_data, loading, make_batch, prepared_options
from revnmt.data.prepared import MANIFEST, DamagedData


def _config(toy, **options) -> DataConfig:
    return DataConfig(train=toy["train"], valid=toy["valid"], **({"min_freq": 1} | options))


def _same_datasets(a, b) -> None:
    assert len(a) == len(b) and a.n_filtered == b.n_filtered
    for part, array in a.arrays().items():
        assert np.array_equal(array, b.arrays()[part]), part
    batch_a, batch_b = make_batch(a, range(len(a))), make_batch(b, range(len(b)))
    for field in ("src", "src_len", "tgt_in", "tgt_out", "tgt_len"):
        assert getattr(batch_a, field).equal(getattr(batch_b, field)), field


def test_prepared_ids_are_the_encoded_ones_and_memory_mapped(toy, tmp_path):
    config = _config(toy)
    encoded = load_data(config)
    prepared = load_data(config, prepared=tmp_path / "data")
    assert (tmp_path / "data" / MANIFEST).is_file()
    for name in ("train", "valid"):
        _same_datasets(getattr(encoded, name), getattr(prepared, name))
    assert isinstance(prepared.train.arrays()["src"], np.memmap)
    assert prepared.train.arrays()["src"].dtype == np.int16  # a small vocabulary: two bytes an id
    assert prepared.src_vocab.itos == encoded.src_vocab.itos and prepared.options == encoded.options


def test_a_second_run_reads_the_prepared_ids_without_the_training_text(toy, tmp_path, monkeypatch):
    config, folder = _config(toy), tmp_path / "data"
    first = load_data(config, prepared=folder)
    assert prepared_options(config, config.fingerprint(), folder) == first.options

    def unread(*_args, **_kwargs):
        raise AssertionError("the training corpus was read again")

    for reader in ("read_pairs", "encode_corpus"):
        monkeypatch.setattr(loading, reader, unread)
    again = load_data(config, first.options, (first.src_vocab.itos, first.tgt_vocab.itos), prepared=folder)
    _same_datasets(first.train, again.train)


@pytest.mark.parametrize("change", [dict(max_len=3), dict(lowercase=True), dict(min_freq=2)])
def test_other_text_options_prepare_anew(toy, tmp_path, change):
    folder = tmp_path / "data"
    load_data(_config(toy), prepared=folder)
    config = _config(toy, **change)
    assert prepared_options(config, config.fingerprint(), folder) is None
    fresh = load_data(config, prepared=folder)
    _same_datasets(load_data(config).train, fresh.train)
    assert prepared_options(config, config.fingerprint(), folder) == fresh.options  # the folder now serves it


def test_a_changed_corpus_prepares_anew(toy, tmp_path):
    folder, config = tmp_path / "data", _config(toy)
    load_data(config, prepared=folder)
    with open(toy["train"] + ".en", "a", encoding="utf-8") as f:
        f.write("one more sentence\n")
    with open(toy["train"] + ".de", "a", encoding="utf-8") as f:
        f.write("noch ein satz\n")
    assert prepared_options(config, config.fingerprint(), folder) is None
    assert len(load_data(config, prepared=folder).train) == len(load_data(config).train)


def test_a_mapped_dataset_is_pickled_as_its_files(toy, tmp_path):
    # Hogwild! workers receive the dataset: they map the same files rather than getting a copy of the ids.
    data = load_data(_config(toy), prepared=tmp_path / "data")
    pickled = pickle.dumps(data.train)
    assert len(pickled) < 1000 < data.train.arrays()["src"].nbytes + data.train.arrays()["tgt"].nbytes
    _same_datasets(data.train, pickle.loads(pickled))
    in_memory = load_data(_config(toy)).train
    _same_datasets(in_memory, pickle.loads(pickle.dumps(in_memory)))


def test_a_worker_refuses_a_folder_prepared_again_with_other_options(toy, tmp_path):
    # A Hogwild! worker reopens the folder by path: another run may have prepared it anew meanwhile.
    folder = tmp_path / "data"
    pickled = pickle.dumps(load_data(_config(toy), prepared=folder).train)
    load_data(_config(toy, lowercase=True), prepared=folder)
    with pytest.raises(DamagedData, match="prepared again with other corpora or options"):
        pickle.loads(pickled)


def test_damaged_data_is_one_error_naming_the_file_where_it_may_not_be_prepared_anew(toy, tmp_path):
    config, folder = _config(toy), tmp_path / "data"
    load_data(config, prepared=folder)
    ids = np.load(folder / "valid.tgt.npy", mmap_mode="r+")
    ids[0] = -1
    ids.flush()
    with pytest.raises(DamagedData, match=r"valid\.tgt\.npy: damaged prepared data \(ids outside the vocabulary"):
        load_data(config, prepared=folder, write=False)
    load_data(config, prepared=folder)  # the main process prepares its own folder anew
    load_data(config, prepared=folder, write=False)
