"""SentencePiece subwords: training a model on a corpus, reading one from a file, and splitting raw text
into pieces and joining pieces back into raw text.

A subword model replaces Moses tokenization and the word vocabulary together: SentencePiece reads raw
text (it normalizes Unicode and treats spaces as part of the pieces, "▁"), so no tokenizer runs before
it, and its output decodes to detokenized text. Rare words are spelled in several pieces instead of
becoming ``<unk>``.

A model is kept as its serialized bytes (the ``.model`` file's content): that is what a run directory
and a checkpoint store, so a checkpoint alone can translate.
"""

from __future__ import annotations

import io
import logging
import os
import random
import re
import time
from collections.abc import Sequence
from pathlib import Path

import sentencepiece as spm

from .vocab import BOS, EOS, PAD, SPECIALS, UNK, Vocabulary

logger = logging.getLogger(__name__)

SUBWORD_TYPES = ("bpe", "unigram")
DEFAULT_VOCAB_SIZE = 8000
# Training reads a random sample of at most this many sentences, so that a large corpus trains in minutes.
SAMPLE_SENTENCES = 1_000_000
SEED = 1  # of the sample: the same corpus gives the same model on every run
# SentencePiece's messages go to stderr from C++, around our logging; its errors still raise.
_QUIET = 2


class SubwordTokenizer:
    """Splits raw sentences into the pieces of a SentencePiece model, and joins pieces back into text.

    With ``lowercase`` the text is lowercased before it is split (the model then was trained on
    lowercased text), as :class:`revnmt.data.Tokenizer` lowercases Moses tokens.
    """

    def __init__(self, model: bytes, lowercase: bool = False, name: str = "SentencePiece model") -> None:
        """``model``: the serialized model (a ``.model`` file's bytes). ValueError, with ``name`` (where the
        bytes came from) in its message, if they are not a SentencePiece model."""
        if not model:
            raise ValueError(f"{name}: empty, not a SentencePiece model")
        self.model, self.lowercase = model, lowercase
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(model)
        except RuntimeError:
            raise ValueError(f"{name}: not a SentencePiece model (corrupt, truncated or another file)") from None
        if self._sp.get_piece_size() <= 1:
            raise ValueError(f"{name}: a SentencePiece model without pieces")

    def tokenize(self, line: str) -> list[str]:
        """The pieces of one raw sentence."""
        return self._sp.encode(line.lower() if self.lowercase else line, out_type=str)

    def encode_ids(self, lines: list[str]) -> list[list[int]]:
        """The model's piece ids of many raw sentences at once (SentencePiece encodes them on every core)."""
        if self.lowercase:
            lines = [line.lower() for line in lines]
        return self._sp.encode(lines, out_type=int, num_threads=os.cpu_count() or 1)

    def pieces(self) -> list[str]:
        """The piece of each of the model's ids."""
        return [self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size())]

    def detokenize(self, pieces: Sequence[str]) -> str:
        """The text of pieces: "▁" becomes a space, byte pieces become their characters, and the model's
        normalization is undone where it can be."""
        return self._sp.decode_pieces(list(pieces))

    def vocabulary(self) -> Vocabulary:
        """The model's pieces as a vocabulary.

        revnmt's specials come first and the model's own control and unknown pieces are left out (a model
        trained by :func:`train_subword_model` puts the same specials at the same ids, so there ids agree
        with the model's; a model trained elsewhere may number them otherwise). Every piece the model
        produces is in the vocabulary; a character the model does not know comes out as itself, which
        the vocabulary maps to ``<unk>``.
        """
        sp = self._sp
        return Vocabulary(sp.id_to_piece(i) for i in range(sp.get_piece_size())
                          if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i)))


def read_subword_model(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a SentencePiece ``.model`` file, checked; FileNotFoundError or ValueError with a message
    for the user."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SentencePiece model not found: {path}")
    model = path.read_bytes()
    SubwordTokenizer(model, name=str(path))
    return model


def train_subword_model(sentences: Sequence[str], kind: str, vocab_size: int, name: str) -> bytes:
    """Train a SentencePiece model of ``kind`` ("bpe" or "unigram") with ``vocab_size`` pieces (specials
    included) on raw ``sentences``; its serialized bytes. ``name`` says what the sentences are, for
    the log and errors. ValueError with a message for the user if the data cannot give such a model.

    The settings:

    - revnmt's specials ``<pad> <unk> <s> </s>`` at revnmt's ids 0-3, so the model's ids are the
      vocabulary's (:meth:`SubwordTokenizer.vocabulary`);
    - every character of the data gets a piece (``character_coverage`` 1.0: the alphabets of European
      languages are small), and ``byte_fallback``: a character the data never showed (an emoji, a
      name in another script) is spelled as its UTF-8 bytes instead of ``<unk>``, so no input is lost
      and every output decodes. The 256 byte pieces count in ``vocab_size``;
    - at most :data:`SAMPLE_SENTENCES` sentences, a random sample drawn with a fixed seed. Drawn here:
      SentencePiece's own sampling (``input_sentence_size``) differs from process to process, even
      with its random seed set, while its training on the same sentences gives the same model.
    """
    if kind not in SUBWORD_TYPES:
        raise ValueError(f"unknown subword model type {kind!r}; expected one of {', '.join(SUBWORD_TYPES)}")
    if not sentences:
        raise ValueError(f"{name}: no text to train a SentencePiece model on")
    if len(sentences) > SAMPLE_SENTENCES:
        sentences = [sentences[i] for i in sample_indices(len(sentences), name)]
    writer = io.BytesIO()
    start = time.monotonic()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=writer, model_type=kind, vocab_size=vocab_size,
            character_coverage=1.0, byte_fallback=True,
            pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS,
            pad_piece=SPECIALS[PAD], unk_piece=SPECIALS[UNK], bos_piece=SPECIALS[BOS], eos_piece=SPECIALS[EOS],
            num_threads=os.cpu_count() or 1, minloglevel=_QUIET)
    except RuntimeError as error:
        raise ValueError(f"{name}: {_training_error(str(error), vocab_size)}") from None
    logger.info("trained a SentencePiece %s model of %d pieces on %s (%d sentences) in %.1f s", kind, vocab_size,
                name, len(sentences), time.monotonic() - start)
    return writer.getvalue()


def sample_indices(n: int, name: str) -> Sequence[int]:
    """Which of ``n`` sentences a model is trained on, in order: all, or a sample of :data:`SAMPLE_SENTENCES`
    drawn with a fixed seed (logged, with ``name``)."""
    if n <= SAMPLE_SENTENCES:
        return range(n)
    logger.info("%s: training the SentencePiece model on a random sample of %d of its %d sentences", name,
                SAMPLE_SENTENCES, n)
    return sorted(random.Random(SEED).sample(range(n), SAMPLE_SENTENCES))


def _training_error(message: str, vocab_size: int) -> str:
    """What SentencePiece's error means for the user, in revnmt's option names."""
    if match := re.search(r"Vocabulary size too high .*<= (\d+)", message):
        return (f"--vocab-size {vocab_size} is more pieces than this training data can give: it allows at "
                f"most {match[1]}")
    if match := re.search(r"smaller than required_chars\. \d+ vs (\d+)", message):
        return (f"--vocab-size {vocab_size} is too small: the characters of the training data, the 256 byte "
                f"pieces and the specials need at least {match[1]}")
    # Otherwise the message after SentencePiece's source position and check ("INTERNAL: src/x.cc(12) [check] "),
    # or the check itself when that is all there is.
    return "SentencePiece training failed: " + (re.sub(r"^.*?\] ", "", message).strip() or message)
