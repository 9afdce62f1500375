import pytest

from revnmt.translation.length_penalty import AVERAGE, LengthPenalty


def test_gnmt_is_wu_et_al_formula_exactly():
    assert LengthPenalty(1.0, "gnmt")(7) == 2.0  # (5 + 7) / 6
    assert LengthPenalty(2.0, "gnmt")(7) == 4.0
    assert LengthPenalty(0.5, "gnmt")(19) == 2.0  # sqrt((5 + 19) / 6)
    assert LengthPenalty(0.6, "gnmt")(1) == 1.0
    for length in range(1, 30):
        assert LengthPenalty(0.6, "gnmt")(length) == ((5 + length) / 6) ** 0.6


def test_average_is_the_length_to_the_alpha_and_the_default():
    assert AVERAGE == LengthPenalty() == LengthPenalty(1.0, "average")
    assert [AVERAGE(n) for n in (1, 2, 9)] == [1.0, 2.0, 9.0]
    assert AVERAGE.normalize(-6.0, 3) == -2.0  # the mean log-probability per token
    assert LengthPenalty(0.5)(16) == 4.0


@pytest.mark.parametrize("kind", ["average", "gnmt"])
def test_alpha_zero_leaves_scores_raw(kind):
    penalty = LengthPenalty(0.0, kind)
    for score in (-0.1, -3.7, -123.456):
        for length in (1, 2, 17, 250):
            assert penalty.normalize(score, length) == score


def test_unknown_types_and_negative_alphas_are_refused():
    with pytest.raises(ValueError, match="unknown length penalty type 'wu'"):
        LengthPenalty(1.0, "wu")
    for alpha in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="alpha must be a number >= 0"):
            LengthPenalty(alpha)
