"""The attention encoder-decoder: what every model family shares, and what each must provide.

Embeddings → RNN encoder (one direction, or two: ``cfg.encoder``) → RNN decoder (initialised with the
encoder's final state, or with the :class:`~revnmt.model.bridge.Bridge` of both directions' final states;
no input feeding) → Luong general attention over a memory of source embeddings and/or stored encoder units
→ output layer over the target vocabulary (its weights the target embeddings with ``cfg.tie_embeddings``).
Only the recurrent layers, and hence how a training step gets its gradients, differ between the families:

- :class:`~revnmt.model.reversible.ReversibleSeq2Seq` (``revgru``/``revlstm``) trains by reversal;
- :class:`~revnmt.model.ordinary.OrdinarySeq2Seq` (``gru``/``lstm``) by autograd.

:class:`Seq2Seq` holds the shared parts (embeddings, attention, output layer, the batch's dropout
masks, the attention memory, the loss of decoder outputs, search and alignment on top of a
decoder step) and declares what a family provides: its recurrent layers, a training step, the
forward pass with its graph (the autograd reference and validation), the encoder's outputs for
decoding, one decoder step and the reordering of decoder states. :func:`revnmt.model.build_model`
picks the family for a configuration.

The loss never sees the logits of a whole batch: over the target vocabulary they would dwarf
every other activation. Every family computes it a few decoder steps at a time
(:meth:`Seq2Seq.chunked_loss_backward`), and within a step a vocabulary chunk at a time
(:mod:`revnmt.model.loss`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

from revnmt.data.vocab import BOS, PAD

from .attention import GeneralAttention
from .bridge import Bridge
from .config import ExecutionConfig, ModelConfig
from .loss import LossSums, linear_cross_entropy, logit_block, logit_work_bytes

LOSS_CHUNK_STEPS = 8  # decoder steps whose logits exist at once in training by autograd and validation

DecoderState = object  # what a family's decoder carries from step to step (see Encoded.state)


@dataclass
class DropoutMasks:
    """Every dropout mask of one batch, drawn once and reused by the reverse sweeps."""

    src: torch.Tensor | None  # [B, E] on source embeddings (also the "emb" attention memory)
    tgt: torch.Tensor | None  # [B, E] on target embeddings
    out: torch.Tensor | None  # [B, H] on the decoder output (the attention query)
    slice: torch.Tensor | None  # [B, k] on the stored encoder slices
    encoder: list | None  # between-layer masks of a reversible encoder
    decoder: list | None


@dataclass
class Encoded:
    """What decoding needs from the source: attention memory, its padding, the initial state."""

    memory: torch.Tensor  # [B, S, M]
    pad_mask: torch.Tensor  # [B, S] True on padding
    state: DecoderState  # reversible: list of int states; ordinary: h or (h, c)


@dataclass(frozen=True)
class StepResult:
    """What one training step measured.

    ``held_bytes`` is the step's own account of the memory it held outside autograd's saved
    tensors at its peak (buffers, stored slices, gradients of detached leaves, working sets): a
    different level from the bytes autograd saves, which a :class:`revnmt.memory.SavedTensorMeter`
    measures, and not to be added to them.
    """

    # summed negative log-likelihood of the batch, unsmoothed even when the step trains a label-smoothed loss
    # (device scalar, not divided by the normalizer)
    loss: torch.Tensor
    held_bytes: int


def nbytes(t: torch.Tensor | None) -> int:
    """Bytes of a tensor's elements (0 for None)."""
    return 0 if t is None else t.numel() * t.element_size()


def _chunks(steps: int) -> list[slice]:
    """Time slices of LOSS_CHUNK_STEPS decoder steps: the logits that exist at once."""
    return [slice(start, start + LOSS_CHUNK_STEPS) for start in range(0, steps, LOSS_CHUNK_STEPS)]


def _locked_dropout(p: float, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.bernoulli(torch.full(shape, 1 - p, device=device)) / (1 - p)


class Seq2Seq(nn.Module, ABC):
    """The shared parts of an attention encoder-decoder; a family subclass adds its recurrent layers.

    Build one with :func:`revnmt.model.build_model` (or a family class directly). Every method
    taking a batch takes batch-major ids: ``src`` [B, S], ``src_len`` [B], ``tgt_in`` [B, T] (BOS
    first), ``tgt_out`` [B, T] (EOS last, then padding).
    """

    def __init__(self, cfg: ModelConfig, execution: ExecutionConfig | None = None) -> None:
        super().__init__()
        self.cfg, self.execution = cfg, (execution or ExecutionConfig()).check_for(cfg)
        # The order of construction is the order of the parameters: it fixes the state_dict's keys'
        # order and which random numbers initialise which weight.
        self.src_emb = nn.Embedding(cfg.src_vocab, cfg.emb_dim, padding_idx=PAD)
        self.tgt_emb = (self.src_emb if cfg.share_embeddings
                        else nn.Embedding(cfg.tgt_vocab, cfg.emb_dim, padding_idx=PAD))
        self.encoder, self.decoder = self.make_rnns(cfg)
        self.attention = GeneralAttention(cfg.hidden_size, cfg.memory_dim)
        self.generator = nn.Linear(cfg.hidden_size, cfg.tgt_vocab)
        if cfg.tie_embeddings:  # one matrix: a token's embedding is also its output weights (Press & Wolf 2017)
            self.generator.weight = self.tgt_emb.weight
        self.bridge = Bridge(cfg.state_size, cfg.layers) if cfg.bidirectional else None
        for p in self.parameters():  # the paper's initialisation, U(±0.1) everywhere
            nn.init.uniform_(p, -0.1, 0.1)
        with torch.no_grad():
            self.src_emb.weight[PAD].zero_()
            self.tgt_emb.weight[PAD].zero_()

    # ------------------------------------------------------------------ what a family provides

    @abstractmethod
    def make_rnns(self, cfg: ModelConfig) -> tuple[nn.Module, nn.Module]:
        """The recurrent encoder and decoder (stored as ``encoder`` and ``decoder``)."""

    def draw_rnn_dropout(self, batch: int, device: torch.device) -> tuple[list | None, list | None]:
        """Between-layer dropout masks of the encoder and the decoder, drawn after the shared masks;
        (None, None) for layers that draw their own."""
        return None, None

    @abstractmethod
    def train_step(self, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                   normalizer: float) -> StepResult:
        """Compute the loss of a batch and accumulate the gradients of loss / ``normalizer`` into
        ``.grad``, the family's way (the loss label-smoothed by ``cfg.label_smoothing``); return the
        summed unsmoothed loss and what the step held."""

    @abstractmethod
    def forward_graph(self, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                      masks: DropoutMasks) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder outputs [T, B, H] and attention memory [B, S, M] of time-major ids, both with their
        graphs (when grad mode is on): the forward pass of ordinary backpropagation."""

    @abstractmethod
    def encoder_outputs(self, src: torch.Tensor, src_len: torch.Tensor) -> tuple[torch.Tensor | None, DecoderState]:
        """For decoding time-major ``src`` (no gradients): the stored top-layer units [S, B, k] for
        the attention memory (None if the memory has none) and the decoder's initial state."""

    @abstractmethod
    def decoder_step(self, state: DecoderState, prev: torch.Tensor) -> tuple[torch.Tensor, DecoderState]:
        """The decoder's output [N, H] after reading ``prev`` [N] (the attention query), and its new state."""

    @abstractmethod
    def reorder_state(self, state: DecoderState, index: torch.Tensor) -> DecoderState:
        """Select rows ``index`` of a decoder state (beam search)."""

    # ------------------------------------------------------------------ shared pieces

    def draw_masks(self, batch: int, device: torch.device) -> DropoutMasks:
        """Locked dropout masks for one batch (None everywhere in eval mode)."""
        cfg = self.cfg
        if not self.training or cfg.dropout == 0:
            return DropoutMasks(None, None, None, None, None, None)
        drop = lambda *shape: _locked_dropout(cfg.dropout, shape, device)  # noqa: E731
        masks = DropoutMasks(drop(batch, cfg.emb_dim), drop(batch, cfg.emb_dim), drop(batch, cfg.hidden_size),
                             drop(batch, cfg.stored_units) if cfg.stored_units else None, None, None)
        masks.encoder, masks.decoder = self.draw_rnn_dropout(batch, device)
        return masks

    def embed(self, src: torch.Tensor, tgt_in: torch.Tensor, masks: DropoutMasks) -> tuple[torch.Tensor, torch.Tensor]:
        """Source [S, B, E] and target [T, B, E] embeddings of time-major ids, with the batch's dropout."""
        x_src, x_tgt = self.src_emb(src), self.tgt_emb(tgt_in)
        if masks.src is not None:
            x_src, x_tgt = x_src * masks.src, x_tgt * masks.tgt
        return x_src, x_tgt

    def build_memory(self, src: torch.Tensor, masks: DropoutMasks, stored: torch.Tensor | None) -> torch.Tensor:
        """Attention memory [B, S, M] from time-major source ids and the stored top-layer units."""
        parts = []
        if "emb" in self.cfg.attention:
            emb = self.src_emb(src)
            parts.append(emb if masks.src is None else emb * masks.src)
        if stored is not None:
            parts.append(stored if masks.slice is None else stored * masks.slice)
        return torch.cat(parts, dim=-1).transpose(0, 1)

    def step_loss(self, out: torch.Tensor, memory: torch.Tensor, pad_mask: torch.Tensor, masks: DropoutMasks,
                  target: torch.Tensor, memory_grad: torch.Tensor | None = None) -> LossSums:
        """Summed cross-entropy of decoder outputs ([B, H] or [B, t, H]) against ``target``: the training
        objective (label-smoothed by ``cfg.label_smoothing``) and the unsmoothed negative log-likelihood.
        ``memory_grad``: where backward adds d objective / d memory, in place (``GeneralAttention.forward``)."""
        query = out if masks.out is None else out * (masks.out if out.dim() == 2 else masks.out[:, None])
        attended = self.attention(query, memory, pad_mask, memory_grad)
        return linear_cross_entropy(attended.reshape(-1, attended.shape[-1]), self.generator.weight,
                                    self.generator.bias, target.reshape(-1), ignore_index=PAD,
                                    label_smoothing=self.cfg.label_smoothing, block=self.logit_block)

    @property
    def logit_block(self) -> int:
        """Elements of the loss's logit block on the model's device (``--logit-block``, or the device's default)."""
        return logit_block(self.generator.weight.device, self.execution.logit_block)

    def logit_work_bytes(self, rows: int) -> int:
        """The block of logits the loss's backward works on over ``rows`` rows, which autograd does not save."""
        return logit_work_bytes(rows, self.cfg.tgt_vocab, self.generator.weight.element_size(), self.logit_block)

    def chunked_loss_backward(self, dec_out: torch.Tensor, memory: torch.Tensor, src: torch.Tensor,
                              tgt_out: torch.Tensor, masks: DropoutMasks, normalizer: float) -> StepResult:
        """Backpropagate the loss / ``normalizer`` of decoder outputs [T, B, H] and attention memory
        (with their graphs; time-major ids) through those graphs."""
        # Logits for all target tokens at once ([T, B, V]) would dwarf the hidden states; the loss
        # runs on detached leaves a few steps at a time, then the leaves' gradients flow back once.
        out_leaf, memory_leaf = dec_out.detach().requires_grad_(), memory.detach().requires_grad_()
        # held: the leaves' gradients (the leaves themselves are saved by the loss and counted there)
        held = (nbytes(dec_out) + nbytes(memory)
                + self.logit_work_bytes(src.shape[1] * min(LOSS_CHUNK_STEPS, dec_out.shape[0])))
        pad_mask = (src == PAD).t()
        total = torch.zeros((), device=src.device)
        for chunk in _chunks(dec_out.shape[0]):
            loss = self.step_loss(out_leaf[chunk].transpose(0, 1), memory_leaf, pad_mask, masks,
                                  tgt_out[chunk].t())
            (loss.objective / normalizer).backward()
            total = total + loss.nll
        torch.autograd.backward([dec_out, memory], [out_leaf.grad, memory_leaf.grad])
        return StepResult(total, held)

    # ------------------------------------------------------------------ training and validation

    def train_step_autograd(self, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor,
                            tgt_out: torch.Tensor, normalizer: float) -> StepResult:
        """Ordinary backpropagation through :meth:`forward_graph`, the loss in chunks of steps: the
        reference for a family that trains otherwise (as :meth:`train_step`, with the same masks)."""
        masks = self.draw_masks(src.shape[0], src.device)
        src, tgt_out = src.t(), tgt_out.t()
        dec_out, memory = self.forward_graph(src, src_len, tgt_in.t(), tgt_out, masks)
        return self.chunked_loss_backward(dec_out, memory, src, tgt_out, masks, normalizer)

    @torch.no_grad()
    def loss(self, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor,
             tgt_out: torch.Tensor) -> torch.Tensor:
        """Summed negative log-likelihood of a batch, never label-smoothed, no gradients (validation), a few
        steps' logits at a time."""
        masks = self.draw_masks(src.shape[0], src.device)
        dec_out, memory = self.forward_graph(src.t(), src_len, tgt_in.t(), tgt_out.t(), masks)
        pad_mask = src == PAD
        return sum(self.step_loss(dec_out[c].transpose(0, 1), memory, pad_mask, masks, tgt_out[:, c]).nll
                   for c in _chunks(dec_out.shape[0]))

    # ------------------------------------------------------------------ inference

    @torch.no_grad()
    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> Encoded:
        """Encode batch-major source ids for decoding."""
        src_t = src.t()
        masks = self.draw_masks(src.shape[0], src.device)
        stored, state = self.encoder_outputs(src_t, src_len)
        return Encoded(self.build_memory(src_t, masks, stored), src == PAD, state)

    @torch.no_grad()
    def decode_step(self, enc: Encoded, state: DecoderState,
                    prev: torch.Tensor) -> tuple[torch.Tensor, DecoderState]:
        """Log-probabilities [N, V] of the next token after ``prev`` [N], and the new state."""
        out, state = self.decoder_step(state, prev)
        logits = self.generator(self.attention(out, enc.memory, enc.pad_mask))
        return torch.log_softmax(logits, dim=-1), state

    @torch.no_grad()
    def align(self, src: torch.Tensor, src_len: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """For each token of the batch-major outputs ``tgt`` [B, T] (no BOS; padding after the end is
        ignored), the source position the attention weighed most when the token was predicted: [B, T].
        Computed by feeding ``tgt`` to the decoder, as the search did."""
        enc = self.encode(src, src_len)
        state, prev = enc.state, torch.full((len(tgt),), BOS, dtype=torch.long, device=tgt.device)
        positions = []
        for t in range(tgt.shape[1]):
            out, state = self.decoder_step(state, prev)
            positions.append(self.attention.weights(out, enc.memory, enc.pad_mask).argmax(-1))
            prev = tgt[:, t]
        return torch.stack(positions, 1) if positions else torch.zeros_like(tgt)
