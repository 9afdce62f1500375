"""Corpus BLEU: sacreBLEU for reporting, and the paper's tokenized lowercased BLEU for comparison; both at once
for a model's translations (:func:`evaluate`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU

from revnmt.data import DataOptions
from revnmt.data.tokenization import Tokenizer


@dataclass(frozen=True)
class BleuResult:
    """A sacreBLEU score together with the signature that makes it reproducible."""

    score: float
    signature: str

    def __str__(self) -> str:
        return f"BLEU = {self.score:.2f} (signature: {self.signature})"


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], lowercase: bool = False) -> BleuResult:
    """sacreBLEU (13a tokenization) on detokenized text; ``lowercase`` for lowercasing models,
    which then shows in the signature as ``case:lc``.

    This is the number to report: sacreBLEU tokenizes both sides itself, so scores computed by
    different systems with the same signature are comparable.
    """
    _check_counts(hypotheses, references)
    bleu = BLEU(lowercase=lowercase)
    score = bleu.corpus_score(list(hypotheses), [list(references)]).score
    return BleuResult(score=score, signature=str(bleu.get_signature()))


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> float:
    """BLEU on Moses-tokenized, lowercased text, as ``multi-bleu.perl -lc`` computes it.

    This is the metric of the reversible-RNN paper (MacKay et al. 2018), kept so our numbers
    can be set beside theirs. Unlike sacreBLEU it depends on the tokenization: the same
    translations score differently under another tokenizer (or other Moses options), so compare
    it only with scores computed by this function.
    """
    _check_counts(hypotheses, references)
    tokenizer = Tokenizer(lang, lowercase=True)
    hyps = [" ".join(tokenizer.tokenize(line)) for line in hypotheses]
    refs = [" ".join(tokenizer.tokenize(line)) for line in references]
    # multi-bleu.perl neither re-tokenizes nor smooths: one n-gram order without a match gives 0.
    bleu = BLEU(tokenize="none", smooth_method="none", force=True)  # tokenized on purpose
    return bleu.corpus_score(hyps, [refs]).score


def _check_counts(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    # sacreBLEU would silently zip a misaligned pair of files, or fail with an IndexError on
    # empty ones.
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise ValueError("no hypotheses to score")


@dataclass(frozen=True)
class Evaluation:
    """Scores of translations against references."""

    sacrebleu: BleuResult
    tokenized_bleu: float  # the paper's metric: Moses-tokenized, lowercased, multi-bleu.perl style

    def to_dict(self) -> dict:
        """Both scores and sacreBLEU's signature (what test.json and ``translate.py --json`` hold)."""
        return {"sacrebleu": self.sacrebleu.score, "signature": self.sacrebleu.signature,
                "tokenized_bleu": self.tokenized_bleu}

    def lines(self) -> list[str]:
        """Both scores as printable lines, each saying what it is."""
        return [f"sacreBLEU: {self.sacrebleu}", f"tokenized lowercased BLEU (paper): {self.tokenized_bleu:.2f}"]


def evaluate(hypotheses: Sequence[str], references: Sequence[str], data: DataOptions) -> Evaluation:
    """sacreBLEU with its signature, and the paper's tokenized lowercased BLEU.

    A lowercasing model cannot produce capitals, so for it sacreBLEU is case-insensitive
    (``case:lc`` in the signature).
    """
    return Evaluation(corpus_bleu(hypotheses, references, lowercase=data.lowercase),
                      tokenized_bleu(hypotheses, references, data.tgt))
