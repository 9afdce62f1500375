"""Reading raw parallel text (plain or gzipped, one sentence per line) and writing files safely."""

from __future__ import annotations

import gzip
import itertools
import logging
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# How many offending line numbers a decoding warning lists before it only gives the count.
_MAX_REPORTED_LINES = 5
#: Pairs per chunk of :func:`read_pairs`: what one tokenizing worker takes at a time.
CHUNK_PAIRS = 4096


def read_lines(path: str | os.PathLike[str]) -> list[str]:
    """Read a UTF-8 text file (gzipped if its name ends in ``.gz``) as a list of lines.

    Only the line terminator ("\\n" or "\\r\\n") is removed. Invalid UTF-8 is replaced by U+FFFD
    and logged as a warning naming the file and the affected 1-based line numbers. Besides regular
    files, anything that can be read is (``/dev/stdin``, a FIFO). A truncated or corrupt gzip file is
    a ValueError naming it.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"text file not found: {path}")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, not a text file")
    if path.suffix != ".gz":
        return decode_lines(path.read_bytes(), str(path))
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    # EOFError: cut short (a download or a copy that stopped); the others: not gzip, or damaged.
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise ValueError(f"{path}: truncated or corrupt gzip file ({error})") from error
    return decode_lines(data, str(path))


def decode_lines(data: bytes, name: str) -> list[str]:
    """Split UTF-8 bytes into lines; invalid UTF-8 becomes U+FFFD and is logged with the line
    numbers (``name`` says where the bytes came from: a file, or stdin)."""
    # Split the bytes on b"\n" only: str.splitlines() would also break on U+2028, U+0085, "\r",
    # etc., which occur in web text and would silently misalign the two sides of a corpus.
    raw_lines = data.split(b"\n")
    if raw_lines[-1] == b"":
        raw_lines.pop()  # the final newline terminates the last line, it does not start one

    lines: list[str] = []
    bad_lines: list[int] = []
    for number, raw in enumerate(raw_lines, start=1):
        line, valid = decode_line(raw)
        lines.append(line)
        if not valid:
            bad_lines.append(number)
    report_invalid(name, bad_lines)
    return lines


def decode_stream(stream: Iterable[bytes], name: str) -> Iterator[str]:
    """:func:`decode_lines` line by line, for input that arrives over time (stdin): each line of a
    binary stream (which splits on b"\\n" only) is decoded as soon as it is read, and invalid UTF-8
    is logged at once, in a warning for that line."""
    for number, raw in enumerate(stream, start=1):
        line, valid = decode_line(raw.removesuffix(b"\n"))
        if not valid:
            report_invalid(name, [number])
        yield line


def decode_line(raw: bytes) -> tuple[str, bool]:
    """A line (without its b"\\n") decoded without a final "\\r", and False if it held invalid UTF-8
    (replaced by U+FFFD)."""
    raw = raw.removesuffix(b"\r")
    try:
        return raw.decode("utf-8"), True
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="replace"), False


def report_invalid(name: str, bad_lines: list[int]) -> None:
    """One warning for the lines of ``name`` (1-based numbers) that held invalid UTF-8, if any."""
    if bad_lines:
        shown = ", ".join(map(str, bad_lines[:_MAX_REPORTED_LINES]))
        more = f" and {len(bad_lines) - _MAX_REPORTED_LINES} more" if len(bad_lines) > _MAX_REPORTED_LINES else ""
        logger.warning(
            "%s: invalid UTF-8 replaced by U+FFFD on %d line(s): %s%s", name, len(bad_lines), shown, more
        )


@dataclass
class ParallelCorpus:
    """Sentence-aligned raw text: ``src[i]`` translates to ``tgt[i]``."""

    src: list[str]
    tgt: list[str]
    name: str

    def __post_init__(self) -> None:
        if len(self.src) != len(self.tgt):
            raise ValueError(f"corpus {self.name!r}: {len(self.src)} source but {len(self.tgt)} target lines")

    def __len__(self) -> int:
        return len(self.src)


def language_file(prefix: str, lang: str) -> Path:
    """Return ``PREFIX.LANG`` if it exists, else ``PREFIX.LANG.gz``."""
    candidates = [Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no {lang!r} side of corpus {prefix!r}: neither {candidates[0]} nor {candidates[1]} exists"
    )


def load_parallel(prefix: str | os.PathLike[str], src_lang: str, tgt_lang: str) -> ParallelCorpus:
    """Load the parallel corpus ``PREFIX.SRC_LANG`` / ``PREFIX.TGT_LANG`` (each plain or ``.gz``) whole: the pairs of
    :func:`read_pairs` (those with an empty side dropped, with a warning)."""
    pairs = [pair for chunk in read_pairs(os.fspath(prefix), src_lang, tgt_lang) for pair in chunk]
    return ParallelCorpus(src=[src for src, _ in pairs], tgt=[tgt for _, tgt in pairs], name=Path(prefix).name)


def read_pairs(prefix: str, src_lang: str, tgt_lang: str, limit: int | None = None,
               chunk: int = CHUNK_PAIRS) -> Iterator[list[tuple[str, str]]]:
    """The sentence pairs of ``PREFIX.SRC`` / ``PREFIX.TGT`` (each plain or gzipped), ``chunk`` at a time.

    Pairs with an empty side are dropped with a warning and ``limit`` keeps the first that many of the others,
    as :func:`revnmt.data.load_parallel` and ``--train-limit`` do. Invalid UTF-8 becomes U+FFFD, logged with
    its lines. ValueError naming the files if their lengths differ, one is empty, no pair has text on both
    sides, or a gzip file is damaged. Past ``limit`` the rest of both files is still read, counted and not decoded:
    files of different lengths do not pair line by line, however far in they part, and a damaged gzip end shows.
    """
    src_path, tgt_path = language_file(prefix, src_lang), language_file(prefix, tgt_lang)
    bad: dict[Path, list[int]] = {src_path: [], tgt_path: []}
    read = kept = 0
    pairs: list[tuple[str, str]] = []
    src_file, tgt_file = _raw_lines(src_path), _raw_lines(tgt_path)
    for src_raw, tgt_raw in itertools.zip_longest(src_file, tgt_file):
        if src_raw is None or tgt_raw is None:
            if read == 0:
                raise ValueError(f"corpus file is empty: {src_path if src_raw is None else tgt_path}")
            # One file ended before the other, so the counts differ and this raises: the loop never goes on with None.
            _same_length(src_path, read + (src_raw is not None) + sum(1 for _ in src_file),
                         tgt_path, read + (tgt_raw is not None) + sum(1 for _ in tgt_file))
        read += 1
        src, src_ok = decode_line(src_raw.removesuffix(b"\n"))
        tgt, tgt_ok = decode_line(tgt_raw.removesuffix(b"\n"))
        if not src_ok:
            bad[src_path].append(read)
        if not tgt_ok:
            bad[tgt_path].append(read)
        if not (src.strip() and tgt.strip()):
            continue
        pairs.append((src, tgt))
        kept += 1
        if len(pairs) == chunk:
            yield pairs
            pairs = []
        if kept == limit:
            logger.info("%s / %s: the first %d pairs kept; counting the lines past them", src_path, tgt_path, kept)
            _same_length(src_path, read + sum(1 for _ in src_file), tgt_path, read + sum(1 for _ in tgt_file))
            break
    for path, lines in bad.items():
        report_invalid(str(path), lines)
    if read == 0:
        raise ValueError(f"corpus file is empty: {src_path}")
    if kept == 0:
        raise ValueError(f"corpus {src_path} / {tgt_path} has no pair with text on both sides")
    if kept < read:
        logger.warning("%s / %s: dropped %d of %d pairs with an empty side", src_path, tgt_path, read - kept, read)
    if pairs:
        yield pairs


def _same_length(src_path: Path, src_lines: int, tgt_path: Path, tgt_lines: int) -> None:
    """ValueError naming both files if their line counts differ."""
    if src_lines != tgt_lines:
        raise ValueError(f"parallel files differ in length: {src_path} has {src_lines} lines, {tgt_path} has "
                         f"{tgt_lines} lines")


def _raw_lines(path: Path) -> Iterator[bytes]:
    """The lines of a plain or gzipped file as bytes, read as they are needed; a damaged gzip file is a ValueError
    naming it."""
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as file:
            yield from file
    # EOFError: cut short (a download or a copy that stopped); the others: not gzip, or damaged.
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise ValueError(f"{path}: truncated or corrupt gzip file ({error})") from error
