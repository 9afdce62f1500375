"""The attention encoder-decoder, its families and its options.

``build_model(cfg)`` returns the family for ``cfg.rnn``: :class:`ReversibleSeq2Seq` (trained by
reversal) or :class:`OrdinarySeq2Seq` (trained by autograd; :class:`RecomputedSeq2Seq` with
``cfg.checkpoint_steps``), all :class:`Seq2Seq`.
"""

from .config import ATTENTION_TYPES, ENCODER_TYPES, RNN_TYPES, ModelConfig
from .factory import build_model, model_from_checkpoint_state
from .ordinary import OrdinarySeq2Seq
from .recomputed import RecomputedSeq2Seq
from .reversible import ReversibleSeq2Seq
from .seq2seq import Encoded, Seq2Seq, StepResult

__all__ = ["ATTENTION_TYPES", "ENCODER_TYPES", "RecomputedSeq2Seq", "Encoded", "ModelConfig", "OrdinarySeq2Seq",
           "RNN_TYPES", "ReversibleSeq2Seq", "Seq2Seq", "StepResult", "build_model", "model_from_checkpoint_state"]
