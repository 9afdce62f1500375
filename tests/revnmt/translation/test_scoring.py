import pytest

from revnmt.translation.scoring import BleuResult, corpus_bleu, tokenized_bleu

REFERENCES = ["A man is riding a bicycle down the street.", "Two dogs play in the snow."]


def test_identical_hypotheses_score_100() -> None:
    assert corpus_bleu(REFERENCES, REFERENCES).score == pytest.approx(100.0)
    assert tokenized_bleu(REFERENCES, REFERENCES, "en") == pytest.approx(100.0)


def test_partial_match_scores_between_0_and_100() -> None:
    hypotheses = ["A man rides a bicycle down the street.", "Two dogs are playing in the snow."]
    assert 0.0 < corpus_bleu(hypotheses, REFERENCES).score < 100.0
    assert 0.0 < tokenized_bleu(hypotheses, REFERENCES, "en") < 100.0


def test_signature_and_report_line() -> None:
    result = corpus_bleu(REFERENCES, REFERENCES)
    assert "nrefs:1" in result.signature
    assert "tok:13a" in result.signature
    assert str(result) == f"BLEU = 100.00 (signature: {result.signature})"
    assert str(BleuResult(score=35.123, signature="nrefs:1")) == "BLEU = 35.12 (signature: nrefs:1)"


def test_tokenized_bleu_ignores_case_but_sacrebleu_does_not() -> None:
    hypotheses = [line.upper() for line in REFERENCES]
    assert tokenized_bleu(hypotheses, REFERENCES, "en") == pytest.approx(100.0)
    assert corpus_bleu(hypotheses, REFERENCES).score < 10.0


def test_tokenized_bleu_does_not_smooth_like_multi_bleu() -> None:
    # No 4-gram in common: multi-bleu.perl gives 0, where sacreBLEU's default smoothing would not.
    hypotheses = ["a man the street rides", "dogs snow the two play"]
    assert tokenized_bleu(hypotheses, REFERENCES, "en") == 0.0
    assert corpus_bleu(hypotheses, REFERENCES).score > 0.0


@pytest.mark.parametrize("score", [corpus_bleu, lambda hyps, refs: tokenized_bleu(hyps, refs, "en")])
def test_mismatched_counts_raise_naming_both(score) -> None:
    with pytest.raises(ValueError, match="3 hypotheses but 2 references"):
        score(REFERENCES + ["extra"], REFERENCES)
    with pytest.raises(ValueError, match="no hypotheses"):
        score([], [])
