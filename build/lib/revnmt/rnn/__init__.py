"""Recurrent layers: reversible (trained by reversal) and ordinary (cuDNN) ones."""

from .cells import REV_CELLS, RevGRUCell, RevLSTMCell
from .reversible import DEFAULT_LANES, ReversalError, ReversibleRNN, SequenceInput, Tape, TensorInput

__all__ = ["DEFAULT_LANES", "REV_CELLS", "ReversalError", "ReversibleRNN", "RevGRUCell", "RevLSTMCell",
           "SequenceInput", "Tape", "TensorInput"]
