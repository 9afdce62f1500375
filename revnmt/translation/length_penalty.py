"""How beam search compares finished translations of different lengths: it ranks them by
``score / lp(|Y|)``, ``score`` being the summed log-probability and ``|Y|`` the number of predicted
tokens, EOS included.

- ``average``: lp = |Y|**alpha (fairseq's ``--lenpen``). alpha = 1, revnmt's default, compares mean
  log-probabilities per token.
- ``gnmt``: lp = ((5 + |Y|) / 6)**alpha (Wu et al. 2016, Google's NMT system), a milder normalization:
  lp(1) = 1 and it grows slowly; values of alpha between 0.6 and 1 are usual.

alpha = 0 gives lp = 1 with either: the raw scores, which favour short translations. Larger alphas
favour longer ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LENGTH_PENALTY_TYPES = ("average", "gnmt")


@dataclass(frozen=True)
class LengthPenalty:
    """lp(|Y|) of one type and exponent (module docstring); the default is the average log-probability."""

    alpha: float = 1.0
    type: str = "average"

    def __post_init__(self) -> None:
        if self.type not in LENGTH_PENALTY_TYPES:
            raise ValueError(f"unknown length penalty type {self.type!r}; choose one of "
                             f"{', '.join(LENGTH_PENALTY_TYPES)}")
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"the length penalty's alpha must be a number >= 0, got {self.alpha}")

    def __call__(self, length: int) -> float:
        """lp(``length``), the divisor of a translation's score."""
        base = length if self.type == "average" else (5 + length) / 6
        return base**self.alpha

    def normalize(self, score: float, length: int) -> float:
        """The score beam search ranks a finished translation by: ``score / lp(length)``."""
        return score / self(length)


AVERAGE = LengthPenalty()  # the default: the mean log-probability per token
