"""The attention encoder-decoder, its families and its options.

``build_model(cfg, execution)`` returns the family for ``cfg.rnn``: :class:`ReversibleSeq2Seq` (trained by
reversal) or :class:`OrdinarySeq2Seq` (trained by autograd; :class:`RecomputedSeq2Seq` with
``execution.checkpoint_steps``), all :class:`Seq2Seq`. :class:`ModelConfig` is the architecture,
:class:`ExecutionConfig` how it computes.
"""

from .config import ATTENTION_TYPES, ENCODER_TYPES, RNN_TYPES, ExecutionConfig, ModelConfig
from .factory import build_model
from .ordinary import OrdinarySeq2Seq
from .recomputed import RecomputedSeq2Seq
from .reversible import ReversibleSeq2Seq
from .seq2seq import Encoded, Seq2Seq, StepResult

__all__ = ["ATTENTION_TYPES", "ENCODER_TYPES", "RecomputedSeq2Seq", "Encoded", "ExecutionConfig", "ModelConfig",
           "OrdinarySeq2Seq", "RNN_TYPES", "ReversibleSeq2Seq", "Seq2Seq", "StepResult", "build_model"]
