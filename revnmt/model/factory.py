"""Which model family a configuration builds: the one place an ``--rnn`` (and ``--checkpoint-steps``)
choice becomes a class.

Everything else works with :class:`~revnmt.model.seq2seq.Seq2Seq`, whatever the family.
"""

from __future__ import annotations

from .config import ExecutionConfig, ModelConfig
from .ordinary import OrdinarySeq2Seq
from .recomputed import RecomputedSeq2Seq
from .reversible import ReversibleSeq2Seq
from .seq2seq import Seq2Seq


def build_model(cfg: ModelConfig, execution: ExecutionConfig | None = None) -> Seq2Seq:
    """A freshly initialised model of ``cfg`` (on CPU), of the family its ``rnn`` belongs to, computing as
    ``execution`` says (default: :class:`ExecutionConfig`'s defaults); ValueError if that does not apply."""
    execution = execution or ExecutionConfig()
    if cfg.reversible:
        return ReversibleSeq2Seq(cfg, execution)
    return (RecomputedSeq2Seq if execution.checkpoint_steps is not None else OrdinarySeq2Seq)(cfg, execution)

