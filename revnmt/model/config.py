"""Model options, validated once, shared by train.py, translate.py and the memory report."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from buffers import MAX_FORGET_CHOICES
from revnmt.rnn import backends

RNN_TYPES = ("revgru", "revlstm", "gru", "lstm")
ATTENTION_TYPES = ("hidden", "emb", "slice", "emb+slice")
ENCODER_TYPES = ("unidirectional", "bidirectional")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of an attention encoder-decoder (the options of ``revnmt-train --help``)."""

    rnn: str = "revgru"
    emb_dim: int = 300
    hidden_size: int = 300
    layers: int = 1
    # bidirectional: a second encoder stack reads the source backwards; attention stores both directions' units
    # and the decoder starts from a learned projection of both final states (revnmt.model.bridge)
    encoder: str = "unidirectional"
    tie_embeddings: bool = False  # the output layer's weights are the target embeddings (needs emb_dim == hidden_size)
    share_embeddings: bool = False  # source and target embeddings are one matrix (needs a joint vocabulary)
    dropout: float = 0.4
    # The training loss's target: (1 − ε)·one-hot + ε/V uniform over the target vocabulary (0: plain
    # cross-entropy). Reported losses are the unsmoothed negative log-likelihood.
    label_smoothing: float = 0.0
    attention: str = "emb+slice"
    slice_dim: int = 20
    max_forget_bits: int | None = 3
    buffer_lanes: int | None = None  # None: the backend's default (revnmt.rnn.backends)
    buffer_backend: str = "auto"  # where the buffer's arithmetic runs (revnmt.rnn.backends); same results
    # Ordinary RNNs only: recompute the recurrent layers in backward from checkpoints every K steps
    # (an int, or "auto": ⌈√T⌉ per batch); None keeps every step for backward.
    checkpoint_steps: int | str | None = None
    # Reversible RNNs only: decoder steps undone before their attention and loss run in one call. More is
    # faster and holds more per sentence (docs/performance.md#the-decoders-reverse-sweep-by-chunks); part of
    # what a run computes.
    decoder_chunk_steps: int = 2
    src_vocab: int = 0
    tgt_vocab: int = 0

    @property
    def reversible(self) -> bool:
        return self.rnn.startswith("rev")

    @property
    def bidirectional(self) -> bool:
        return self.encoder == "bidirectional"

    @property
    def directions(self) -> int:
        """Encoder stacks: 2 for a bidirectional encoder."""
        return 2 if self.bidirectional else 1

    @property
    def state_size(self) -> int:
        """Width of one layer's recurrent state: h (GRUs), or h and c (LSTMs)."""
        return 2 * self.hidden_size if self.rnn.endswith("lstm") else self.hidden_size

    @property
    def stored_per_direction(self) -> int:
        """Units of one encoder direction's top layer kept per source position for attention."""
        if self.attention == "hidden":
            return self.hidden_size
        return self.slice_dim if self.attention in ("slice", "emb+slice") else 0

    @property
    def stored_units(self) -> int:
        """Encoder units kept per source position for attention, both directions'."""
        return self.directions * self.stored_per_direction

    @property
    def memory_dim(self) -> int:
        """Feature size of the attention memory."""
        return (self.emb_dim if "emb" in self.attention else 0) + self.stored_units

    def validate(self) -> ModelConfig:
        """Raise ValueError with a clear message for any inconsistent option; return self."""
        if self.rnn not in RNN_TYPES:
            raise ValueError(f"unknown --rnn {self.rnn!r}; choose one of {', '.join(RNN_TYPES)}")
        if self.attention not in ATTENTION_TYPES:
            raise ValueError(f"unknown --attention {self.attention!r}; choose one of {', '.join(ATTENTION_TYPES)}")
        if self.encoder not in ENCODER_TYPES:
            raise ValueError(f"unknown --encoder {self.encoder!r}; choose one of {', '.join(ENCODER_TYPES)}")
        if self.tie_embeddings and self.emb_dim != self.hidden_size:
            raise ValueError(f"--tie-embeddings shares the target embeddings with the output layer, whose inputs have "
                             f"--hidden-size units: --emb-dim must equal it, got {self.emb_dim} and {self.hidden_size}")
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(f"--share-embeddings needs one vocabulary for both languages (--joint-vocab), got "
                             f"{self.src_vocab} source and {self.tgt_vocab} target tokens")
        if self.max_forget_bits not in MAX_FORGET_CHOICES:
            raise ValueError(f"--max-forget-bits must be one of 1, 2, 3, 5 or none, got {self.max_forget_bits!r}")
        for name in ("emb_dim", "hidden_size", "layers", "buffer_lanes", "decoder_chunk_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.reversible and self.hidden_size % 2:
            raise ValueError(f"reversible RNNs split the state in halves: --hidden-size must be even, "
                             f"got {self.hidden_size}")
        if self.attention in ("slice", "emb+slice"):
            if not 1 <= self.slice_dim <= self.hidden_size // 2:
                raise ValueError(f"--slice-dim must be in [1, hidden_size/2 = {self.hidden_size // 2}] for "
                                 f"{self.attention!r} attention, got {self.slice_dim}")
        backends.check_name(self.buffer_backend)
        if self.checkpoint_steps is not None:
            if self.reversible:
                raise ValueError("--checkpoint-steps is for ordinary RNNs (gru, lstm): reversible ones keep no "
                                 "states to checkpoint")
            if self.checkpoint_steps != "auto" and not (isinstance(self.checkpoint_steps, int)
                                                        and self.checkpoint_steps >= 1):
                raise ValueError(f"--checkpoint-steps must be a positive number of steps or auto, "
                                 f"got {self.checkpoint_steps!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout must be in [0, 1), got {self.dropout}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.src_vocab < 5 or self.tgt_vocab < 5:
            raise ValueError("vocabularies must be set (at least the 4 specials and one token)")
        return self

    def to_dict(self) -> dict:
        return asdict(self)
