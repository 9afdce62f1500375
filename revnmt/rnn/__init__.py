"""Recurrent layers: reversible (trained by reversal) and ordinary (cuDNN) ones."""

from .backends import BACKENDS, Backend
from .cells import REV_CELLS, RevCell, RevGRUCell, RevLSTMCell
from .inputs import SequenceInput, TensorInput
from .reversible import ReversalError, ReversibleRNN, Tape

__all__ = ["BACKENDS", "REV_CELLS", "Backend", "ReversalError", "ReversibleRNN", "RevCell", "RevGRUCell",
           "RevLSTMCell", "SequenceInput", "Tape", "TensorInput"]
