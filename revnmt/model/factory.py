"""Which model family a configuration builds: the one place an ``--rnn`` (and ``--checkpoint-steps``)
choice becomes a class.

Everything else works with :class:`~revnmt.model.seq2seq.Seq2Seq`, whatever the family.
"""

from __future__ import annotations

from .config import ModelConfig
from .ordinary import OrdinarySeq2Seq
from .recomputed import RecomputedSeq2Seq
from .reversible import ReversibleSeq2Seq
from .seq2seq import Seq2Seq


def build_model(cfg: ModelConfig) -> Seq2Seq:
    """A freshly initialised model of ``cfg`` (on CPU), of the family its ``rnn`` belongs to."""
    if cfg.validate().reversible:  # validated first: no unknown rnn falls through
        return ReversibleSeq2Seq(cfg)
    return RecomputedSeq2Seq(cfg) if cfg.checkpoint_steps is not None else OrdinarySeq2Seq(cfg)


def model_from_checkpoint_state(state: dict) -> Seq2Seq:
    """The trained model of a checkpoint dict (keys ``model_config`` and ``model``), on CPU."""
    model = build_model(ModelConfig(**state["model_config"]))
    model.load_state_dict(state["model"])
    return model
