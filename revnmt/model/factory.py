"""Which model family a configuration builds: the one place an ``--rnn`` choice becomes a class.

Everything else works with :class:`~revnmt.model.seq2seq.Seq2Seq`, whatever the family.
"""

from __future__ import annotations

from .config import ModelConfig
from .ordinary import OrdinarySeq2Seq
from .reversible import ReversibleSeq2Seq
from .seq2seq import Seq2Seq


def build_model(cfg: ModelConfig) -> Seq2Seq:
    """A freshly initialised model of ``cfg`` (on CPU), of the family its ``rnn`` belongs to."""
    family = ReversibleSeq2Seq if cfg.validate().reversible else OrdinarySeq2Seq  # no unknown rnn falls through
    return family(cfg)


def model_from_checkpoint_state(state: dict) -> Seq2Seq:
    """The trained model of a checkpoint dict (keys ``model_config`` and ``model``), on CPU."""
    model = build_model(ModelConfig(**state["model_config"]))
    model.load_state_dict(state["model"])
    return model
