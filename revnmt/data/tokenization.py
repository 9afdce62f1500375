"""Moses tokenization (as ``tokenizer.perl -a -no-escape``) and detokenization via sacremoses, and what any
tokenizer of revnmt does (SentencePiece's is :class:`revnmt.data.subword.SubwordTokenizer`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sacremoses import MosesDetokenizer, MosesTokenizer

# What aggressive dash splitting puts between the halves of a hyphenated word ("well @-@ known").
DASH_SPLIT = "@-@"


class SentenceTokenizer(Protocol):
    """Splits a raw sentence into the tokens a vocabulary maps: Moses words, or SentencePiece pieces."""

    lowercase: bool

    def tokenize(self, line: str) -> list[str]: ...


class SentenceDetokenizer(Protocol):
    """Joins the tokens of a sentence into raw text."""

    def detokenize(self, tokens: Sequence[str]) -> str: ...


class Tokenizer:
    """Splits a raw sentence into Moses tokens, optionally lowercased."""

    def __init__(self, lang: str, lowercase: bool = False) -> None:
        self.lang = lang
        self.lowercase = lowercase
        # Built once: sacremoses compiles many regular expressions and loads the
        # nonbreaking-prefix lists for the language on construction.
        self._moses = MosesTokenizer(lang=lang)

    def tokenize(self, line: str) -> list[str]:
        """Tokenize one sentence."""
        tokens = self._moses.tokenize(line, aggressive_dash_splits=True, escape=False)
        # Lowercase after tokenizing: Moses decides on nonbreaking prefixes ("Mr." before a
        # capitalised word) from case, so lowercasing first would change the tokenization.
        if self.lowercase:
            tokens = [token.lower() for token in tokens]
        return tokens


class Detokenizer:
    """Joins Moses tokens (including ``@-@`` dash splits) back into a sentence."""

    def __init__(self, lang: str) -> None:
        self.lang = lang
        self._moses = MosesDetokenizer(lang=lang)

    def detokenize(self, tokens: Sequence[str]) -> str:
        """Detokenize one sentence."""
        return self._moses.detokenize(_join_dash_splits(tokens))


def _join_dash_splits(tokens: Sequence[str]) -> list[str]:
    """Glue every ``@-@`` to its neighbours as a plain hyphen: ["well", "@-@", "known"] -> ["well-known"].

    sacremoses only undoes ``@-@`` with a token on either side, so model output with one at the
    sentence edge or two in a row would otherwise keep the marker.
    """
    joined: list[str] = []
    glue_next = False
    for token in tokens:
        if token == DASH_SPLIT:
            if joined:
                joined[-1] += "-"
            else:
                joined.append("-")
            glue_next = True
        elif glue_next:
            joined[-1] += token
            glue_next = False
        else:
            joined.append(token)
    return joined
