"""Reversible RNN cells: the contract (:mod:`.base`), the families (:mod:`.revgru`, :mod:`.revlstm`) and
the per-sweep weight layouts and gradients they share (:mod:`.weights`).

A new family subclasses :class:`RevCell`, implements its abstract half-steps (a torch reference and,
where a backend has fused kernels, the fused version) and registers here; the parametrized tests of
tests/revnmt/rnn/test_cell_contract.py then check it on every backend.
"""

from .base import HalfGates, RevCell, Reversal, Sweep, Update
from .revgru import RevGRUCell
from .revlstm import RevLSTMCell
from .weights import RecurrentGrads, SweepWeights

#: The reversible families by ``--rnn`` name.
REV_CELLS: dict[str, type[RevCell]] = {"revgru": RevGRUCell, "revlstm": RevLSTMCell}

__all__ = ["REV_CELLS", "HalfGates", "RecurrentGrads", "RevCell", "RevGRUCell", "RevLSTMCell", "Reversal",
           "Sweep", "SweepWeights", "Update"]
