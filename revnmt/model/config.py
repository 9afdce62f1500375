"""Model options, declared once (:mod:`revnmt.options`) and checked when built; shared by the commands that build
models."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

from buffers import MAX_FORGET_CHOICES, TILE_ROWS
from revnmt.options import RUN_DEFINING, RUN_TIME, check_options, option, positive, probability_below_one
from revnmt.rnn import backends

RNN_TYPES = ("revgru", "revlstm", "gru", "lstm")
ATTENTION_TYPES = ("hidden", "emb", "slice", "emb+slice")
ENCODER_TYPES = ("unidirectional", "bidirectional")


def parse_forget_bits(text: str) -> int | None:
    """Command-line type of ``--max-forget-bits``: a number, or ``none``."""
    return None if text.lower() == "none" else int(text)


def parse_checkpoint_steps(text: str) -> int | str:
    """Command-line type of ``--checkpoint-steps``: a number of steps, or ``auto``."""
    try:
        return text if text == "auto" else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number of steps or auto, got {text}") from None


def _forget_limit(bits: int | None) -> str | None:
    return None if bits in MAX_FORGET_CHOICES else "one of 1, 2, 3, 5 or none"


def _steps_or_auto(steps: int | str) -> str | None:
    return None if steps == "auto" or (isinstance(steps, int) and steps >= 1) else "a positive number of steps or auto"


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of an attention encoder-decoder (the options of ``revnmt-train --help``), checked when built."""

    rnn: str = option("revgru", choices=RNN_TYPES, role=RUN_DEFINING, help="reversible or ordinary cells")
    emb_dim: int = option(300, check=positive, role=RUN_DEFINING, help="word embedding size")
    hidden_size: int = option(300, check=positive, role=RUN_DEFINING, help="RNN units per layer")
    layers: int = option(1, check=positive, role=RUN_DEFINING, help="encoder and decoder layers")
    encoder: str = option("unidirectional", choices=ENCODER_TYPES, role=RUN_DEFINING,
                          help="bidirectional: a second encoder stack reads the source backwards (reversible too, "
                          "with a buffer of its own); attention keeps both directions' units, and the decoder starts "
                          "from a learned projection of both final states (revnmt.model.bridge)")
    tie_embeddings: bool = option(False, flag="store_true", role=RUN_DEFINING,
                                  help="the output layer's weights are the target embeddings (needs --emb-dim = "
                                  "--hidden-size)")
    share_embeddings: bool = option(False, flag="store_true", role=RUN_DEFINING,
                                    help="one embedding matrix for source and target (needs --subword with "
                                    "--joint-vocab)")
    dropout: float = option(0.4, check=probability_below_one, role=RUN_DEFINING, help="locked dropout probability")
    label_smoothing: float = option(0.0, check=probability_below_one, metavar="EPS", role=RUN_DEFINING,
                                    help="train against a target distribution of 1 - EPS on the reference token and "
                                    "EPS spread evenly over the target vocabulary (losses and perplexities are still "
                                    "reported unsmoothed). 0.1 is the usual value; 0 is plain cross-entropy")
    attention: str = option("emb+slice", choices=ATTENTION_TYPES, role=RUN_DEFINING,
                            help="attention memory: full encoder states, source embeddings, stored slices, or both")
    slice_dim: int = option(20, role=RUN_DEFINING, help="encoder units per source position kept for slice attention")
    max_forget_bits: int | None = option(3, type=parse_forget_bits, check=_forget_limit, metavar="{1,2,3,5,none}",
                                         role=RUN_DEFINING, help="bits a reversible unit may forget per step")
    src_vocab: int = 0  # known from the data, not options
    tgt_vocab: int = 0

    def __post_init__(self) -> None:
        """Raise ValueError with a clear message for any inconsistent option."""
        check_options(self)
        if self.src_vocab < 5 or self.tgt_vocab < 5:
            raise ValueError("vocabularies must be set (at least the 4 specials and one token)")
        if self.tie_embeddings and self.emb_dim != self.hidden_size:
            raise ValueError(f"--tie-embeddings shares the target embeddings with the output layer, whose inputs have "
                             f"--hidden-size units: --emb-dim must equal it, got {self.emb_dim} and {self.hidden_size}")
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(f"--share-embeddings needs one vocabulary for both languages (--joint-vocab), got "
                             f"{self.src_vocab} source and {self.tgt_vocab} target tokens")
        if self.reversible and self.hidden_size % 2:
            raise ValueError(f"reversible RNNs split the state in halves: --hidden-size must be even, "
                             f"got {self.hidden_size}")
        if self.attention in ("slice", "emb+slice") and not 1 <= self.slice_dim <= self.hidden_size // 2:
            raise ValueError(f"--slice-dim must be in [1, hidden_size/2 = {self.hidden_size // 2}] for "
                             f"{self.attention!r} attention, got {self.slice_dim}")

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

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ExecutionConfig:
    """How a model computes, not what its weights mean: where the information buffer's arithmetic runs and how
    its lanes are laid out, how many decoder steps the reverse sweep undoes at once, and whether an ordinary
    RNN recomputes its states in backward. Memory and speed depend on it; a checkpoint's weights do not, so it
    is no part of :class:`ModelConfig` (the layout, which moves the low bits of a run, is run-defining)."""

    buffer_lanes: int | None = option(None, type=int, check=positive, role=RUN_DEFINING,
                                      help="information-buffer lanes per sentence (reversible RNNs; default: "
                                      + ", ".join(f"{b.lanes} with {b.name}" for b in backends.BACKENDS.values())
                                      + ")")
    buffer_tile: int = option(TILE_ROWS, check=positive, role=RUN_DEFINING,
                              help="sentences per information-buffer tile (reversible RNNs): a tile's lanes fill a "
                              "stack of its own, so its sentences never depend on the rest of the batch, and on a GPU "
                              "each tile is one program's work")
    buffer_backend: str = option("auto", choices=backends.CHOICES, role=RUN_TIME,
                                 help="where the information buffer's arithmetic runs (reversible RNNs): compiled CPU "
                                 "loops (numba), one Triton kernel per update (triton, CUDA), or tensor ops (torch, "
                                 "any device; slow); auto: numba on CPU, triton on CUDA. All give the same results "
                                 "bit for bit")
    checkpoint_steps: int | str | None = option(None, type=parse_checkpoint_steps, check=_steps_or_auto,
                                                metavar="{K,auto}", role=RUN_TIME,
                                                help="ordinary RNNs (gru, lstm): gradient checkpointing, keeping the "
                                                "state every K steps for backward and recomputing the steps between "
                                                "(auto: K = ceil(sqrt(T)) per batch); default: none")
    logit_block: int | None = option(None, type=int, check=positive, role=RUN_TIME,
                                     help="elements of the logits the loss computes at once: it takes the output "
                                     "layer's vocabulary in chunks of 256 to 2,048 columns, as wide as keep rows x "
                                     "columns within this (default: 131,072 on CPU, 16,777,216 on a GPU, where each "
                                     "chunk is kernel launches the host pays for)")
    decoder_chunk_steps: int = option(2, check=positive, role=RUN_DEFINING,
                                      help="reversible RNNs: decoder steps undone before their attention and loss "
                                      "are backpropagated in one batched call; more is faster and holds more memory "
                                      "per sentence")
    sweep_kernels: str = option("steps", choices=backends.SWEEP_KERNELS, role=RUN_DEFINING,
                                help="reversible RNNs on the triton backend: what runs a stack's sweeps. steps: fused "
                                "kernels a few launches a layer and time step (default; the faster on an H200 at "
                                "every batch measured); persistent: one launch a forward sweep and one a chunk of the "
                                "reverse, where the kernels support the stack (RevGRU, RevLSTM; tiles of up to 32 "
                                "sentences, up to 16 lanes), else steps (docs/gpu.md#persistent-sweeps-measured)")

    cuda_graphs: str = option("off", choices=("on", "off"), role=RUN_TIME,
                              help="reversible RNNs on a GPU: capture each batch shape's training step in two CUDA "
                              "graphs after a warm-up and replay them for its later batches, one launch for the "
                              "thousands of kernels a step launches; the results are the eager step's bit for bit "
                              "(docs/gpu.md#cuda-graphs)")
    cuda_graph_shapes: int = option(64, check=positive, role=RUN_TIME,
                                    help="with --cuda-graphs on: batch shapes whose graphs are kept at once, the least "
                                    "recently used dropped first (each keeps its buffers' memory, which "
                                    "--memory-budget counts)")

    def check_for(self, model: ModelConfig) -> ExecutionConfig:
        """Raise ValueError if this does not apply to ``model``'s family; return self."""
        if self.cuda_graphs == "on" and not model.reversible:
            raise ValueError("--cuda-graphs on captures the reversible training step (revgru, revlstm); an ordinary "
                             "RNN's cuDNN step reads the host for its lengths and cannot be captured")
        if self.checkpoint_steps is not None and model.reversible:
            raise ValueError("--checkpoint-steps is for ordinary RNNs (gru, lstm): reversible ones keep no "
                             "states to checkpoint")
        if self.sweep_kernels == "persistent" and self.buffer_backend not in ("auto", "triton"):
            raise ValueError(f"--sweep-kernels persistent runs on the triton backend, not "
                             f"--buffer-backend {self.buffer_backend}")
        return self

    def __post_init__(self) -> None:
        check_options(self)
