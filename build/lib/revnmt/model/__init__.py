"""The attention encoder-decoder and its options."""

from .config import ATTENTION_TYPES, RNN_TYPES, ModelConfig
from .seq2seq import Encoded, Seq2Seq

__all__ = ["ATTENTION_TYPES", "Encoded", "ModelConfig", "RNN_TYPES", "Seq2Seq"]
