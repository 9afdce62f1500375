"""Raw text in, raw text out: tokenization (Moses words or SentencePiece pieces), vocabularies, batched search
(with one model or an ensemble) and detokenization."""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from queue import Empty, Queue
from typing import NamedTuple, TypeVar

import torch
from tqdm import tqdm

from revnmt.checkpoints.compatibility import text_differences
from revnmt.checkpoints.files import resolve_checkpoint
from revnmt.checkpoints.record import Checkpoint
from revnmt.data import PAD, SPECIALS, UNK, DataOptions, Vocabulary, sorted_batches
from revnmt.model import Seq2Seq
from revnmt.translation.ensemble import Ensemble
from revnmt.translation.length_penalty import AVERAGE, LengthPenalty
from revnmt.translation.search import Hypothesis, beam_search_nbest, check_nbest, greedy

logger = logging.getLogger(__name__)

DEFAULT_MAX_INPUT_LEN = 100  # for checkpoints whose data options set no length limit
_MAX_REPORTED_LINES = 5  # line numbers a truncation warning lists before it only counts


class Translation(NamedTuple):
    """One translation of a line: its detokenized text and the score beam search ranked it by (the
    log-probability / lp(length)); nan where nothing scored it (greedy search, an input without tokens,
    a model that scored every hypothesis NaN or -inf)."""

    text: str
    score: float


_UNSCORED_EMPTY = Translation("", math.nan)  # what a line without a scored hypothesis gets


class Translator:
    """Translates raw sentences with a model (or an ensemble), its vocabularies and its data options."""

    def __init__(self, model: Seq2Seq | Ensemble, src_vocab: Vocabulary, tgt_vocab: Vocabulary, data: DataOptions,
                 max_input_len: int | None = None) -> None:
        """``max_input_len`` (tokens, or pieces for a subword model; default: the data's ``max_len``, else
        100) truncates longer inputs."""
        self.model, self.src_vocab, self.tgt_vocab, self.data = model, src_vocab, tgt_vocab, data
        self.max_input_len = max_input_len or data.max_len or DEFAULT_MAX_INPUT_LEN
        self.tokenizer = data.source_tokenizer()
        self.detokenizer = data.detokenizer()

    @classmethod
    def from_checkpoint(cls, path_or_dir: str | os.PathLike[str], device: str | torch.device = "cpu",
                        max_input_len: int | None = None) -> Translator:
        """Rebuild model, vocabularies and tokenizers (SentencePiece models included: the checkpoint holds
        them) from a checkpoint file or a run directory (its ``best.pt``, else ``last.pt``)."""
        return cls.from_checkpoints([path_or_dir], device, max_input_len)

    @classmethod
    def from_checkpoints(cls, paths_or_dirs: Sequence[str | os.PathLike[str]], device: str | torch.device = "cpu",
                         max_input_len: int | None = None) -> Translator:
        """:meth:`from_checkpoint` for one checkpoint; for several, a translator decoding with their
        :class:`Ensemble`. Its members must share vocabularies and tokenization (ValueError naming the
        files otherwise); the first one's data options apply (its input length limit included)."""
        if not paths_or_dirs:
            raise ValueError("no checkpoint given")
        models, paths, first = [], [], None
        for path_or_dir in paths_or_dirs:
            paths.append(resolve_checkpoint(path_or_dir))
            checkpoint = Checkpoint.load(paths[-1], map_location="cpu")
            if first is None:  # its vocabularies and data options: its weights go into its model
                first = replace(checkpoint, weights={}, training=None)
            elif differences := text_differences(first, checkpoint):
                raise ValueError(f"cannot ensemble {paths[0]} and {paths[-1]}: {'; '.join(differences)}")
            models.append(checkpoint.trained_model().to(device).eval())
            logger.info("loaded %s%s", paths[-1], _provenance(checkpoint))
        vocabs = [Vocabulary(vocab[len(SPECIALS):]) for vocab in (first.src_vocab, first.tgt_vocab)]
        model = models[0] if len(models) == 1 else Ensemble(models)
        return cls(model, *vocabs, first.data, max_input_len)

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Source ids of each line, truncated to ``max_input_len`` tokens (with one warning)."""
        return [self.src_vocab.encode(tokens) for tokens in self._source_tokens(lines)]

    def _source_tokens(self, lines: Sequence[str], first_number: int = 1) -> list[list[str]]:
        """Tokens of each line; the truncation warning numbers lines from ``first_number``."""
        tokenized, truncated = [], []
        for number, line in enumerate(lines, start=first_number):
            tokens = self.tokenizer.tokenize(line)
            if len(tokens) > self.max_input_len:
                truncated.append(number)
                tokens = tokens[: self.max_input_len]
            tokenized.append(tokens)
        if truncated:
            shown = ", ".join(map(str, truncated[:_MAX_REPORTED_LINES]))
            more = f" and {len(truncated) - _MAX_REPORTED_LINES} more" if len(truncated) > _MAX_REPORTED_LINES else ""
            logger.warning("truncated %d input line(s) longer than %d tokens: line %s%s",
                           len(truncated), self.max_input_len, shown, more)
        return tokenized

    def translate(self, lines: Sequence[str], beam: int = 5, batch_size: int = 32, progress: bool = False,
                  replace_unk: bool = False, length_penalty: LengthPenalty = AVERAGE) -> list[str]:
        """One detokenized translation per line, in input order (lines without tokens give "").

        With ``replace_unk`` every ``<unk>`` of an output becomes the source word the attention weighed
        most when it was predicted (OpenNMT's ``-replace_unk``, which the paper's BLEU used): names and
        numbers outside the target vocabulary come through; an ensemble follows its first model's
        attention. Word models only (:meth:`check_replace_unk`). ``length_penalty`` ranks beam search's
        finished translations (:mod:`revnmt.translation.length_penalty`)."""
        translated = self.translate_nbest(lines, None, beam, batch_size, progress, replace_unk, length_penalty)
        return [best.text for best, *_ in translated]

    def translate_nbest(self, lines: Sequence[str], nbest: int | None, beam: int = 5, batch_size: int = 32,
                        progress: bool = False, replace_unk: bool = False,
                        length_penalty: LengthPenalty = AVERAGE) -> list[list[Translation]]:
        """:meth:`translate` with each line's ``nbest`` best translations, best first, and their scores
        (ValueError unless 1 <= ``nbest`` <= ``beam``); the first is :meth:`translate`'s. Beam search finds them
        even for ``beam = 1``, where it scores greedy search's translation (the same, scores being finite). A
        line has fewer only where the search finished fewer (:func:`~revnmt.translation.search.beam_search_nbest`),
        and never none: a line without tokens, or whose hypotheses all scored NaN or -inf, has the empty
        translation, unscored.

        ``nbest`` None gives the one translation per line that :meth:`translate` gives: found by greedy search,
        unscored, for ``beam = 1``."""
        self._check_options(replace_unk, nbest, beam)
        source_words = self._source_tokens(lines)
        outputs: list[list[Translation]] = [[] for _ in lines]  # every line is in a batch
        with tqdm(total=len(lines), desc="translating", unit="sent", disable=not progress, leave=False) as bar:
            for batch in sorted_batches([len(words) for words in source_words], batch_size):
                translated = self._translate_batch([source_words[i] for i in batch], beam, nbest, replace_unk,
                                                   length_penalty)
                for i, output in zip(batch, translated):
                    outputs[i] = output
                bar.update(len(batch))
        return outputs

    def translate_stream(self, lines: Iterable[str], beam: int = 5, batch_size: int = 32,
                         replace_unk: bool = False, length_penalty: LengthPenalty = AVERAGE) -> Iterator[str]:
        """:meth:`translate` for lines that arrive one by one (a pipe, a user typing): each translation
        is yielded once its batch is done, in input order.

        A batch is up to ``batch_size`` lines, but never waits for more input once it holds a line and
        no further line is there yet: a user who types one line sees its translation without typing
        more, and a fast pipe still fills whole batches (lines queue up while one batch translates).
        Batches are not sorted by length, so a whole file translates faster with :meth:`translate`;
        outputs are the same, a sentence's translation not depending on its batch mates.

        A daemon thread reads ``lines`` (see ``_ready_batches``). To read stdin, give it a stream of
        its own (``open(sys.stdin.fileno(), "rb", closefd=False)``), not ``sys.stdin``: Python aborts at
        shutdown if a daemon thread is blocked in a read of ``sys.stdin.buffer`` then.
        """
        for best, *_ in self.translate_stream_nbest(lines, None, beam, batch_size, replace_unk, length_penalty):
            yield best.text

    def translate_stream_nbest(self, lines: Iterable[str], nbest: int | None, beam: int = 5, batch_size: int = 32,
                               replace_unk: bool = False,
                               length_penalty: LengthPenalty = AVERAGE) -> Iterator[list[Translation]]:
        """:meth:`translate_stream` of :meth:`translate_nbest`'s lists."""
        self._check_options(replace_unk, nbest, beam)
        done = 0
        for batch in _ready_batches(lines, batch_size):
            yield from self._translate_batch(self._source_tokens(batch, first_number=done + 1), beam, nbest,
                                             replace_unk, length_penalty)
            done += len(batch)

    def check_replace_unk(self, replace_unk: bool = True) -> None:
        """ValueError if ``replace_unk`` is asked of a subword model: it spells rare words in pieces (and
        unseen characters in bytes) instead of ``<unk>``, so there is nothing to replace, and a copied
        source piece would not be a word anyway."""
        if replace_unk and self.data.subwords:
            raise ValueError("--replace-unk is for word vocabularies: this model uses SentencePiece subwords, "
                             "which spell rare words in pieces and leave no <unk> to replace")

    def _check_options(self, replace_unk: bool, nbest: int | None, beam: int) -> None:
        """ValueError for options that cannot go together, before any translating."""
        self.check_replace_unk(replace_unk)
        if nbest is not None:
            check_nbest(nbest, beam)

    def _translate_batch(self, source_words: list[list[str]], beam: int, nbest: int | None, replace_unk: bool,
                         length_penalty: LengthPenalty) -> list[list[Translation]]:
        """:meth:`translate_nbest`'s lists for one batch of tokenized sources."""
        todo = [i for i, words in enumerate(source_words) if words]  # an encoder cannot run on no tokens
        outputs = [[_UNSCORED_EMPTY] for _ in source_words]
        if not todo:
            return outputs
        was_training = self.model.training
        self.model.eval()
        try:
            src, src_len = _pad([self.src_vocab.encode(source_words[i]) for i in todo],
                                next(self.model.parameters()).device)
            if nbest is None and beam == 1:  # greedy search: a beam of 1's translation, faster, but unscored
                found = [[Hypothesis(math.nan, ids)] for ids in greedy(self.model, src, src_len)]
            else:
                found = beam_search_nbest(self.model, src, src_len, beam, nbest or 1, length_penalty=length_penalty)
                found = [hyps or [Hypothesis(math.nan, [])] for hyps in found]
            # The hypotheses in one list, each with the row of its source.
            rows = [row for row, hyps in enumerate(found) for _ in hyps]
            hyps = [hyp.ids for row_hyps in found for hyp in row_hyps]
            hyp_words = [self.tgt_vocab.decode(ids) for ids in hyps]
            if replace_unk:
                self._replace_unknown(src, src_len, rows, hyps, hyp_words, [source_words[i] for i in todo])
        finally:
            self.model.train(was_training)
        texts = iter([self.detokenizer.detokenize(tokens) for tokens in hyp_words])
        for i, row_hyps in zip(todo, found):
            outputs[i] = [Translation(next(texts), hyp.score) for hyp in row_hyps]
        return outputs

    def _replace_unknown(self, src: torch.Tensor, src_len: torch.Tensor, rows: list[int], hyps: list[list[int]],
                         outputs: list[list[str]], source_words: list[list[str]]) -> None:
        """Put into ``outputs`` (the hypotheses' tokens) the source word aligned to each ``<unk>``; hypothesis
        ``i`` translates row ``rows[i]`` of the sources."""
        todo = [i for i, ids in enumerate(hyps) if UNK in ids]
        if not todo:
            return
        index = torch.tensor([rows[i] for i in todo], device=src.device)
        tgt, _ = _pad([hyps[i] for i in todo], src.device)
        for i, positions in zip(todo, self.model.align(src[index], src_len[index], tgt).tolist()):
            words = source_words[rows[i]]
            outputs[i] = [words[p] if token == UNK else word for token, word, p in zip(hyps[i], outputs[i], positions)]


def _provenance(checkpoint: Checkpoint) -> str:
    """What the log says of a loaded checkpoint: its step, or the steps an average was made of."""
    averaged = checkpoint.averaged_from
    if averaged is not None:
        steps = ", ".join(str(step) for step in averaged.steps)
        return f" (average of {len(averaged.steps)} checkpoints, steps {steps})"
    return "" if checkpoint.step is None else f" (step {checkpoint.step})"


def _pad(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch-major padded ids and lengths."""
    src = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
    for i, ids in enumerate(rows):
        src[i, : len(ids)] = torch.tensor(ids)
    return src.to(device), torch.tensor([len(ids) for ids in rows], device=device)


T = TypeVar("T")


@dataclass(frozen=True)
class _Failed:
    """What the reader thread of :func:`_ready_batches` queues when reading raised."""

    error: BaseException


_END = object()  # queued after the last item


def _ready_batches(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in order, in lists of 1 to ``size``: each list as soon as it holds an item and no
    further item is there yet, or it is full.

    A thread reads ``items`` into a queue, and a batch takes what is queued. Reading may block (a
    terminal waits for its user; a pipe for its writer, perhaps in mid-line) without holding back
    the lines already read. Unlike ``select`` on a file descriptor this works for any iterable
    (generators in tests, text streams, platforms without ``select`` on pipes), and it knows whether
    a whole line is there, not just some bytes. The queue holds one batch, so reading keeps one
    batch ahead of translation and no more (memory stays bounded on a long input). Errors raised
    while reading are raised here. The thread is a daemon: a read that blocks forever (the consumer
    stopped early and the input stays open) must not keep the process alive.
    """
    if size < 1:
        raise ValueError(f"batch size must be positive, got {size}")
    queue: Queue = Queue(maxsize=size)
    stopped = threading.Event()

    def read() -> None:
        try:
            for item in items:
                queue.put(item)
                if stopped.is_set():
                    return
            queue.put(_END)
        except BaseException as error:  # handed to the consumer, which raises it
            queue.put(_Failed(error))

    threading.Thread(target=read, name="revnmt-input", daemon=True).start()
    batch: list[T] = []
    try:
        while True:
            try:
                item = queue.get(block=not batch)  # only a batch's first item is waited for
            except Empty:
                yield batch
                batch = []
                continue
            if item is _END:
                break
            if isinstance(item, _Failed):
                raise item.error
            batch.append(item)
            if len(batch) == size:
                yield batch
                batch = []
        if batch:
            yield batch
    finally:
        # Stopped early: make room for the reader's pending put, after which it sees `stopped` and ends.
        stopped.set()
        while not queue.empty():
            queue.get_nowait()
