"""Recurrent layers: reversible (trained by reversal) and ordinary (cuDNN) ones."""

from .backends import BACKENDS, Backend
from .bidirectional import BidirectionalReversibleRNN, BidirectionalRNN, BidirectionalTape
from .cells import REV_CELLS, RevCell, RevGRUCell, RevLSTMCell
from .inputs import ReversedInput, SequenceInput, TensorInput
from .reversible import ReversalError, ReversibleRNN, Tape

__all__ = ["BACKENDS", "REV_CELLS", "Backend", "BidirectionalRNN", "BidirectionalReversibleRNN", "BidirectionalTape",
           "ReversalError", "ReversedInput", "ReversibleRNN", "RevCell", "RevGRUCell", "RevLSTMCell", "SequenceInput",
           "Tape", "TensorInput"]
