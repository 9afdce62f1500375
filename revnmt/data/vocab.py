"""Token <-> id mapping with fixed special symbols, saved as one token per line."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from revnmt.atomic import atomic_write_bytes

PAD, UNK, BOS, EOS = 0, 1, 2, 3
SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")


class Vocabulary:
    """A list of tokens whose first four entries are the specials ``<pad> <unk> <s> </s>``."""

    def __init__(self, tokens: Iterable[str]) -> None:
        """Build from the ordinary (non-special) tokens; the specials are put in front."""
        self.itos: list[str] = [*SPECIALS, *tokens]
        self.stoi: dict[str, int] = {token: i for i, token in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            duplicates = sorted(token for token, n in Counter(self.itos).items() if n > 1)
            raise ValueError(f"duplicate vocabulary entries (specials are implicit): {duplicates[:10]}")
        # The file format is one token per line, so a token may not contain a line break or be empty.
        bad = [token for token in self.itos if not token or "\n" in token or "\r" in token]
        if bad:
            raise ValueError(f"vocabulary tokens must be non-empty and on one line: {bad[:10]!r}")

    @classmethod
    def build(
        cls, token_lists: Iterable[Iterable[str]], min_freq: int = 1, max_size: int | None = None
    ) -> Vocabulary:
        """Count tokens and keep those seen at least ``min_freq`` times, most frequent first.

        Ties are broken by the token string, so the result does not depend on corpus order.
        ``max_size`` caps the number of ordinary tokens; the four specials come on top.
        """
        return cls.from_counts(Counter(token for tokens in token_lists for token in tokens), min_freq, max_size)

    @classmethod
    def from_counts(cls, counts: dict[str, int], min_freq: int = 1, max_size: int | None = None) -> Vocabulary:
        """:meth:`build` from each token's count."""
        counts = {t: n for t, n in counts.items() if t not in SPECIALS}  # a literal "<unk>" is the special anyway
        kept = sorted((t for t, n in counts.items() if n >= min_freq), key=lambda t: (-counts[t], t))
        if max_size is not None:
            kept = kept[:max_size]
        return cls(kept)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.itos == other.itos

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Map tokens to ids; unknown tokens become ``UNK``. No BOS/EOS is added."""
        return [self.stoi.get(token, UNK) for token in tokens]

    def decode(self, ids: Iterable[int], strip_specials: bool = True) -> list[str]:
        """Map ids to tokens.

        With ``strip_specials`` the output ends before the first ``EOS`` and omits ``PAD`` and
        ``BOS`` (``<unk>`` is kept: it is part of the hypothesis). Without it every id is
        rendered, which shows exactly what a model produced.
        """
        tokens: list[str] = []
        for i in map(int, ids):  # int() also accepts 0-d tensors and numpy integers
            if strip_specials:
                if i == EOS:
                    break
                if i in (PAD, BOS):
                    continue
            tokens.append(self.itos[i])
        return tokens

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the vocabulary, specials included, as UTF-8 text with one token per line."""
        atomic_write_bytes(path, "".join(f"{token}\n" for token in self.itos).encode("utf-8"))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Vocabulary:
        """Read a vocabulary written by ``save``."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"vocabulary file not found: {path}")
        # Split on "\n" only (not str.splitlines): tokens may contain U+2028 and similar.
        lines = path.read_bytes().decode("utf-8").split("\n")
        if lines[-1] == "":
            lines.pop()
        if tuple(lines[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"{path}: not a vocabulary file, it must start with the lines {' '.join(SPECIALS)}")
        return cls(lines[len(SPECIALS) :])
