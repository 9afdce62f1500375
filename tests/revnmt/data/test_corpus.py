import gzip
import io
import logging
import os
import threading
from pathlib import Path

import pytest

from revnmt.data import ParallelCorpus, decode_lines, decode_stream, load_parallel, read_lines
from revnmt.data.corpus import read_pairs


def write(path: Path, data: bytes) -> Path:
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


# Windows line ends, a line separator inside a line, an empty line, and no final newline.
TRICKY = "first line\r\nsecond\u2028still second\n\nlast".encode()
TRICKY_LINES = ["first line", "second\u2028still second", "", "last"]


@pytest.mark.parametrize("name", ["text.txt", "text.txt.gz"])
def test_read_lines_plain_and_gzip(tmp_path, name):
    assert read_lines(write(tmp_path / name, TRICKY)) == TRICKY_LINES


def test_read_lines_keeps_trailing_spaces_and_final_empty_line(tmp_path):
    assert read_lines(write(tmp_path / "t", b"a  \n\n")) == ["a  ", ""]
    assert read_lines(write(tmp_path / "e", b"")) == []


def test_read_lines_invalid_utf8_is_replaced_and_reported(tmp_path, caplog):
    path = write(tmp_path / "bad.en.gz", b"fine\ncaf\xe9\nok\n\xff\xfe\n")
    with caplog.at_level(logging.WARNING):
        lines = read_lines(path)
    assert lines == ["fine", "caf\ufffd", "ok", "\ufffd\ufffd"]
    message = caplog.text
    assert "bad.en.gz" in message
    assert "2, 4" in message  # 1-based numbers of the damaged lines


def test_read_lines_reports_only_the_first_few_bad_lines(tmp_path, caplog):
    path = write(tmp_path / "bad.txt", b"\xff\n" * 8)
    with caplog.at_level(logging.WARNING):
        read_lines(path)
    assert "1, 2, 3, 4, 5 and 3 more" in caplog.text


@pytest.mark.parametrize("data", [TRICKY, b"fine\ncaf\xe9\r\n\n\xff\xfe\n", b"a  \n\n", b"\n", b""])
def test_decode_stream_splits_and_decodes_as_decode_lines(data):
    assert list(decode_stream(io.BytesIO(data), "stdin")) == decode_lines(data, "stdin")


def test_decode_stream_reports_a_bad_line_once_it_is_read(caplog):
    lines = decode_stream(io.BytesIO(b"fine\ncaf\xe9\nok\n"), "stdin")
    with caplog.at_level(logging.WARNING):
        assert next(lines) == "fine" and not caplog.text
        assert next(lines) == "caf\ufffd"
        assert "stdin: invalid UTF-8 replaced by U+FFFD on 1 line(s): 2" in caplog.text


def test_read_lines_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.txt"):
        read_lines(tmp_path / "nothere.txt")


def test_read_lines_a_directory_is_not_missing(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory") as raised:
        read_lines(tmp_path)
    assert "not found" not in str(raised.value)


@pytest.mark.parametrize("damage, reason", [
    (lambda data: data[: len(data) // 2], "truncated or corrupt gzip file"),  # a download cut short
    (lambda data: b"plain text, named .gz\n", "Not a gzipped file"),
    (lambda data: data[:10] + b"\xff" * (len(data) - 10), "truncated or corrupt gzip file"),  # a damaged stream
])
def test_read_lines_a_damaged_gzip_file_is_a_value_error_naming_it(tmp_path, damage, reason):
    path = write(tmp_path / "text.en.gz", b"a line of text\n" * 100)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=reason) as raised:
        read_lines(path)
    assert str(raised.value).startswith(f"{path}: truncated or corrupt gzip file (")


def test_read_lines_reads_a_fifo(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    threading.Thread(target=lambda: fifo.write_bytes(b"through\na pipe\n"), daemon=True).start()
    assert read_lines(fifo) == ["through", "a pipe"]


def test_load_parallel_mixes_plain_and_gzip_and_prefers_plain(tmp_path):
    write(tmp_path / "train.en", b"a b\nc\n")
    write(tmp_path / "train.en.gz", b"ignored\nignored\n")
    write(tmp_path / "train.de.gz", b"x y\nz\n")
    corpus = load_parallel(tmp_path / "train", "en", "de")
    assert corpus == ParallelCorpus(src=["a b", "c"], tgt=["x y", "z"], name="train")
    assert len(corpus) == 2


def test_load_parallel_mismatched_counts_names_both_files(tmp_path):
    write(tmp_path / "c.en", b"1\n2\n3\n")
    write(tmp_path / "c.de", b"1\n2\n")
    with pytest.raises(ValueError) as err:
        load_parallel(tmp_path / "c", "en", "de")
    message = str(err.value)
    assert "c.en" in message and "c.de" in message
    assert "3 lines" in message and "2 lines" in message


@pytest.mark.parametrize("src, tgt, lines", [
    (b"1\n2\n3\n4\n5\n", b"1\n2\n3\n4\n", "5 lines, .* 4 lines"),  # the source runs on past the limit
    (b"1\n2\n3\n", b"1\n2\n3\n4\n", "3 lines, .* 4 lines"),  # the target does
], ids=["source-longer", "target-longer"])
def test_a_limit_still_counts_both_files_to_their_end(tmp_path, src, tgt, lines):
    # --train-limit keeps the first pairs; files that part further on are not pairs line by line all the same
    write(tmp_path / "c.en", src)
    write(tmp_path / "c.de", tgt)
    with pytest.raises(ValueError, match=f"parallel files differ in length: .*c.en has {lines}"):
        list(read_pairs(str(tmp_path / "c"), "en", "de", limit=2))


def test_a_limit_keeps_the_first_pairs_of_files_that_pair_up(tmp_path):
    write(tmp_path / "c.en", b"a\n\nb\nc\nd\n")
    write(tmp_path / "c.de", b"x\ny\nz\nw\nv\n")
    assert [pair for chunk in read_pairs(str(tmp_path / "c"), "en", "de", limit=2) for pair in chunk] == [
        ("a", "x"), ("b", "z")]  # the empty pair dropped, not counted


def test_a_limit_does_not_hide_a_damaged_gzip_end(tmp_path):
    write(tmp_path / "c.en", b"a line\n" * 2000)
    data = write(tmp_path / "c.de.gz", b"eine Zeile\n" * 2000).read_bytes()
    (tmp_path / "c.de.gz").write_bytes(data[: len(data) - 8])  # cut short: the gzip trailer is gone
    with pytest.raises(ValueError, match=r"c\.de\.gz: truncated or corrupt gzip file"):
        list(read_pairs(str(tmp_path / "c"), "en", "de", limit=2))


def test_load_parallel_empty_file_is_an_error(tmp_path):
    write(tmp_path / "c.en", b"1\n")
    write(tmp_path / "c.de.gz", b"")
    with pytest.raises(ValueError, match=r"empty.*c\.de\.gz"):
        load_parallel(tmp_path / "c", "en", "de")


def test_load_parallel_missing_side_names_both_candidates(tmp_path):
    write(tmp_path / "c.en", b"1\n")
    with pytest.raises(FileNotFoundError) as err:
        load_parallel(tmp_path / "c", "en", "de")
    assert "c.de" in str(err.value) and "c.de.gz" in str(err.value)


def test_load_parallel_drops_pairs_with_an_empty_side(tmp_path, caplog):
    write(tmp_path / "c.en", b"one\n\nthree\nfour\n")
    write(tmp_path / "c.de", b"eins\nzwei\n  \nvier\n")
    with caplog.at_level(logging.WARNING):
        corpus = load_parallel(tmp_path / "c", "en", "de")
    assert corpus.src == ["one", "four"]
    assert corpus.tgt == ["eins", "vier"]
    assert "dropped 2 of 4" in caplog.text


def test_load_parallel_with_only_empty_pairs_is_an_error(tmp_path):
    write(tmp_path / "c.en", b"\n\n")
    write(tmp_path / "c.de", b"a\n\n")
    with pytest.raises(ValueError, match="no pair"):
        load_parallel(tmp_path / "c", "en", "de")


def test_parallel_corpus_checks_alignment():
    with pytest.raises(ValueError):
        ParallelCorpus(src=["a"], tgt=[], name="x")
