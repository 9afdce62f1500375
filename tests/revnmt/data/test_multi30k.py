import gzip
import io
import logging
import os
import urllib.error
from pathlib import Path

import pytest

from revnmt.data import MULTI30K_SPLITS, find_multi30k, load_parallel, multi30k_prefix
from revnmt.data import multi30k as m30k


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A working directory under tmp_path with no data anywhere and no $REVNMT_DATA."""
    monkeypatch.delenv("REVNMT_DATA", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path


def make_dataset(folder: Path, gz: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    name = "train.en.gz" if gz else "train.en"
    (folder / name).write_bytes(b"")
    return folder


def test_explicit_data_dir_wins(isolated, monkeypatch):
    explicit = make_dataset(isolated / "mine", gz=False)
    monkeypatch.setenv("REVNMT_DATA", str(make_dataset(isolated / "env")))
    make_dataset(isolated / "work" / "data" / "multi30k")
    assert find_multi30k(explicit) == explicit


def test_explicit_data_dir_may_contain_multi30k(isolated):
    inner = make_dataset(isolated / "parent" / "multi30k")
    assert find_multi30k(isolated / "parent") == inner


def test_explicit_data_dir_without_data_is_an_error(isolated):
    make_dataset(isolated / "work" / "data" / "multi30k")
    with pytest.raises(FileNotFoundError, match="empty_dir"):
        find_multi30k(isolated / "empty_dir")


@pytest.mark.parametrize("inner", [True, False])
def test_env_var_is_the_folder_or_its_parent(isolated, monkeypatch, inner):
    folder = make_dataset(isolated / "envdata" / "multi30k")
    monkeypatch.setenv("REVNMT_DATA", str(folder.parent if inner else folder))
    make_dataset(isolated / "work" / "data" / "multi30k")  # lower in the search order
    assert find_multi30k(download=False) == folder


def test_env_var_without_data_falls_through_with_warning(isolated, monkeypatch, caplog):
    monkeypatch.setenv("REVNMT_DATA", str(isolated / "wrong"))
    local = make_dataset(isolated / "work" / "data" / "multi30k")
    with caplog.at_level(logging.WARNING):
        assert find_multi30k(download=False) == local
    assert "REVNMT_DATA" in caplog.text and "wrong" in caplog.text


def test_local_data_folder_is_found(isolated):
    local = make_dataset(isolated / "work" / "data" / "multi30k", gz=False)
    assert find_multi30k(download=False) == local


def test_only_the_env_var_and_the_local_folder_are_searched(isolated):
    # A copy beside the working directory or the checkout (CI's layout) is not looked for: CI points
    # $REVNMT_DATA at it (.ci/run). Where the checkout has one, this also checks it is not found.
    make_dataset(isolated / "shared" / "data" / "multi30k")  # ../shared/data/multi30k from the working directory
    with pytest.raises(FileNotFoundError, match="not found"):
        find_multi30k(download=False)


def test_nothing_found_without_download(isolated):
    with pytest.raises(FileNotFoundError, match="not found"):
        find_multi30k(download=False)


def gzipped(text: str) -> bytes:
    return gzip.compress(text.encode())


class FakeResponse(io.BytesIO):
    """What urlopen returns: a readable context manager."""


def test_download_writes_all_files(isolated, monkeypatch):
    requested = []

    def fake_urlopen(url, timeout):
        requested.append((url, timeout))
        name = url.rsplit("/", 1)[1]
        lang = "en" if ".en." in name else "de"
        return FakeResponse(gzipped(f"{name} {lang} 1\n{name} {lang} 2\n"))

    monkeypatch.setattr("urllib.request.urlopen", fake_urlopen)
    folder = find_multi30k()
    assert folder == isolated / "work" / "data" / "multi30k"
    assert sorted(url for url, _ in requested) == sorted(m30k.MULTI30K_URL + name for name in m30k.MULTI30K_FILES)
    assert all(timeout == 30 for _, timeout in requested)
    assert sorted(os.listdir(folder)) == sorted(m30k.MULTI30K_FILES)  # no temporary files left
    corpus = load_parallel(multi30k_prefix("valid"), "en", "de")
    assert corpus.src == ["val.en.gz en 1", "val.en.gz en 2"]
    assert corpus.tgt == ["val.de.gz de 1", "val.de.gz de 2"]
    # Found locally now: no second download.
    requested.clear()
    assert find_multi30k() == folder and requested == []


def test_download_failure_is_explained_and_resumable(isolated, monkeypatch):
    calls = []

    def failing_urlopen(url, timeout):
        calls.append(url)
        if len(calls) == 3:
            raise urllib.error.URLError("no route to host")
        return FakeResponse(gzipped("x\n"))

    monkeypatch.setattr("urllib.request.urlopen", failing_urlopen)
    with pytest.raises(RuntimeError) as err:
        find_multi30k()
    message = str(err.value)
    assert calls[2] in message  # the URL that failed
    assert "no route to host" in message
    assert "--data-dir" in message and "REVNMT_DATA" in message
    assert str(isolated / "work" / "data" / "multi30k") in message  # where it looked
    folder = isolated / "work" / "data" / "multi30k"
    assert len(os.listdir(folder)) == 2  # the two finished files, nothing partial
    assert not (folder / "train.en.gz").exists()  # so the folder does not pass as complete
    with pytest.raises(FileNotFoundError):
        find_multi30k(download=False)

    resumed = []

    def working_urlopen(url, timeout):
        resumed.append(url)
        return FakeResponse(gzipped("x\n"))

    monkeypatch.setattr("urllib.request.urlopen", working_urlopen)
    assert find_multi30k() == folder
    assert resumed[0] == calls[2] and len(resumed) == 4  # only the missing files
    assert sorted(os.listdir(folder)) == sorted(m30k.MULTI30K_FILES)


def test_download_rejects_a_non_gzip_answer(isolated, monkeypatch):
    monkeypatch.setattr("urllib.request.urlopen", lambda url, timeout: FakeResponse(b"<html>login</html>"))
    with pytest.raises(RuntimeError, match="not a gzip file"):
        find_multi30k()
    assert os.listdir(isolated / "work" / "data" / "multi30k") == []


def test_prefix_of_each_split(isolated):
    folder = make_dataset(isolated / "m")
    assert multi30k_prefix("train", folder) == str(folder / "train")
    assert multi30k_prefix("valid", folder) == str(folder / "val")
    assert multi30k_prefix("test", folder) == str(folder / "test_2016_flickr")
    assert set(MULTI30K_SPLITS) == {"train", "valid", "test"}
    with pytest.raises(ValueError, match="unknown Multi30K split"):
        multi30k_prefix("dev", folder)


def test_real_multi30k_validation_split():
    try:
        folder = find_multi30k(download=False)
    except FileNotFoundError:
        pytest.skip("Multi30K not available locally")
    corpus = load_parallel(multi30k_prefix("valid", folder), "en", "de")
    assert len(corpus) == 1014
    assert corpus.src[0] == "A group of men are loading cotton onto a truck"
    assert corpus.tgt[0] == "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen"
