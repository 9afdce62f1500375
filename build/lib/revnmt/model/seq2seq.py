"""The attention encoder-decoder, trainable by reversal or by ordinary backpropagation.

Reversible models (``revgru``/``revlstm``) train by reversal end to end:

1. encoder and decoder forward sweeps without autograd (the decoder starts from the encoder's
   final state; there is no input feeding, so attention never enters the recurrence);
2. the attention memory (source embeddings and/or the encoder's stored slices) is built once per
   batch and used as a detached leaf whose gradient accumulates over decoder steps;
3. the decoder's reverse sweep computes attention, logits and loss of one step at a time (logits
   never exist for the whole batch at once) and backpropagates them;
4. the memory's gradient flows once into the embeddings and the stored slices, and the encoder is
   reversed with the gradient of its final state and of its slices.

Ordinary models (``gru``/``lstm``, cuDNN on GPU) backpropagate through autograd, with the loss
computed in chunks of time steps on detached decoder outputs for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from buffers import to_float
from revnmt.data.vocab import BOS, PAD
from revnmt.rnn import ReversibleRNN
from revnmt.rnn.ordinary import OrdinaryRNN

from .attention import GeneralAttention
from .config import ModelConfig
from .embeddings import EmbeddedTokens
from .loss import linear_cross_entropy, logit_work_bytes

LOSS_CHUNK_STEPS = 8  # decoder steps whose logits exist at once in ordinary training


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
    state: object  # reversible: list of int states; ordinary: h or (h, c)


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _chunks(steps: int) -> list[slice]:
    """Time slices of LOSS_CHUNK_STEPS decoder steps: the logits that exist at once."""
    return [slice(start, start + LOSS_CHUNK_STEPS) for start in range(0, steps, LOSS_CHUNK_STEPS)]


def _locked_dropout(p: float, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.bernoulli(torch.full(shape, 1 - p, device=device)) / (1 - p)


class Seq2Seq(nn.Module):
    """Embeddings → RNN encoder → RNN decoder (initialised with the encoder's final state) →
    Luong general attention over the chosen memory → output layer over the target vocabulary."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg.validate()
        self.src_emb = nn.Embedding(cfg.src_vocab, cfg.emb_dim, padding_idx=PAD)
        self.tgt_emb = nn.Embedding(cfg.tgt_vocab, cfg.emb_dim, padding_idx=PAD)
        if cfg.reversible:
            def make(slice_dim: int) -> ReversibleRNN:
                return ReversibleRNN(cfg.rnn, cfg.emb_dim, cfg.hidden_size, cfg.layers, cfg.dropout,
                                     cfg.max_forget_bits, slice_dim, cfg.buffer_lanes, cfg.buffer_backend)
            self.encoder, self.decoder = make(cfg.stored_units), make(0)
        else:
            self.encoder = OrdinaryRNN(cfg.rnn, cfg.emb_dim, cfg.hidden_size, cfg.layers, cfg.dropout)
            self.decoder = OrdinaryRNN(cfg.rnn, cfg.emb_dim, cfg.hidden_size, cfg.layers, cfg.dropout)
        self.attention = GeneralAttention(cfg.hidden_size, cfg.memory_dim)
        self.generator = nn.Linear(cfg.hidden_size, cfg.tgt_vocab)
        self.last_held_bytes = 0  # bytes the last train_step held outside autograd (memory accounting)
        for p in self.parameters():  # the paper's initialisation, U(±0.1) everywhere
            nn.init.uniform_(p, -0.1, 0.1)
        with torch.no_grad():
            self.src_emb.weight[PAD].zero_()
            self.tgt_emb.weight[PAD].zero_()

    @classmethod
    def from_checkpoint_state(cls, state: dict) -> Seq2Seq:
        """The trained model of a checkpoint dict (keys ``model_config`` and ``model``), on CPU."""
        model = cls(ModelConfig(**state["model_config"]))
        model.load_state_dict(state["model"])
        return model

    # ------------------------------------------------------------------ shared pieces

    def draw_masks(self, batch: int, device: torch.device) -> DropoutMasks:
        """Locked dropout masks for one batch (None everywhere in eval mode)."""
        cfg = self.cfg
        if not self.training or cfg.dropout == 0:
            return DropoutMasks(None, None, None, None, None, None)
        drop = lambda *shape: _locked_dropout(cfg.dropout, shape, device)  # noqa: E731
        masks = DropoutMasks(drop(batch, cfg.emb_dim), drop(batch, cfg.emb_dim), drop(batch, cfg.hidden_size),
                             drop(batch, cfg.stored_units) if cfg.stored_units else None, None, None)
        if cfg.reversible:
            masks.encoder = self.encoder.draw_dropout(batch, device)
            masks.decoder = self.decoder.draw_dropout(batch, device)
        return masks

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
                  target: torch.Tensor) -> torch.Tensor:
        """Summed cross-entropy of decoder outputs ([B, H] or [B, t, H]) against ``target``."""
        query = out if masks.out is None else out * (masks.out if out.dim() == 2 else masks.out[:, None])
        attended = self.attention(query, memory, pad_mask)
        return linear_cross_entropy(attended.reshape(-1, attended.shape[-1]), self.generator.weight,
                                    self.generator.bias, target.reshape(-1), ignore_index=PAD)

    # ------------------------------------------------------------------ training

    def train_step(self, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                   normalizer: float) -> torch.Tensor:
        """Compute the loss of a batch (batch-major [B, S] / [B, T] ids) and accumulate the
        gradients of loss / ``normalizer`` into ``.grad``. Returns the summed loss (device scalar).

        Reversible models train by reversal; ordinary ones by autograd.
        """
        masks = self.draw_masks(src.shape[0], src.device)
        if self.cfg.reversible:
            return self._train_by_reversal(src.t(), tgt_in.t(), tgt_out.t(), masks, normalizer)
        return self._train_by_autograd(src.t(), src_len, tgt_in.t(), tgt_out.t(), masks, normalizer)

    def forward_sweeps(self, src, tgt_in, tgt_out, masks: DropoutMasks):
        """Encoder and decoder forward sweeps of a reversible model (time-major ids): returns the
        recomputable inputs and the tapes, i.e. everything kept for the backward sweeps."""
        enc_in = EmbeddedTokens(self.src_emb, src, masks.src)
        dec_in = EmbeddedTokens(self.tgt_emb, tgt_in, masks.tgt)
        enc_tape = self.encoder.forward_sweep(enc_in, src != PAD, dropout=masks.encoder)
        dec_tape = self.decoder.forward_sweep(dec_in, tgt_out != PAD, initial=enc_tape.states, dropout=masks.decoder)
        return enc_in, dec_in, enc_tape, dec_tape

    def _train_by_reversal(self, src, tgt_in, tgt_out, masks: DropoutMasks, normalizer: float) -> torch.Tensor:
        enc_in, dec_in, enc_tape, dec_tape = self.forward_sweeps(src, tgt_in, tgt_out, masks)

        stored = None if enc_tape.slices is None else to_float(enc_tape.slices).requires_grad_()
        memory = self.build_memory(src, masks, stored)
        memory_leaf = memory.detach().requires_grad_()
        pad_mask = (src == PAD).t()
        total = torch.zeros((), device=src.device)
        # Held outside autograd's saved tensors during the backward sweeps (memory accounting):
        # the buffers, the stored slices (int and float), the gradient of the attention memory and
        # one sweep's working set (a chunk of input projections, one reverse step's temporaries).
        # The memory itself is saved by the attention and counted there.
        batch = src.shape[1]
        self.last_held_bytes = (sum(t.buffer.reserved_bits() // 8 for t in (enc_tape, dec_tape))
                                + 2 * _nbytes(enc_tape.slices) + _nbytes(memory)
                                + max(rnn.work_bytes(batch) for rnn in (self.encoder, self.decoder))
                                + self._logit_work_bytes(batch))

        def output_grad(t: int, out: torch.Tensor) -> torch.Tensor:
            nonlocal total
            with torch.enable_grad():
                query = out.detach().requires_grad_()
                loss = self.step_loss(query, memory_leaf, pad_mask, masks, tgt_out[t])
                (loss / normalizer).backward()
            total = total + loss.detach()  # stays on the device: no sync per step
            return query.grad

        enc_final_grad = self.decoder.backward_sweep(dec_tape, dec_in, output_grad=output_grad)
        memory.backward(memory_leaf.grad)
        self.encoder.backward_sweep(enc_tape, enc_in, grad_final=enc_final_grad,
                                    slice_grad=None if stored is None else stored.grad)
        return total

    def _train_by_autograd(self, src, src_len, tgt_in, tgt_out, masks: DropoutMasks, normalizer: float):
        dec_out, memory = self._forward_autograd(src, src_len, tgt_in, tgt_out, masks)
        return self._chunked_loss_backward(dec_out, memory, src, tgt_out, masks, normalizer)

    def _forward_autograd(self, src, src_len, tgt_in, tgt_out, masks: DropoutMasks):
        """Decoder outputs [T, B, H] and attention memory, both with their graphs."""
        x_src, x_tgt = self.src_emb(src), self.tgt_emb(tgt_in)
        if masks.src is not None:
            x_src, x_tgt = x_src * masks.src, x_tgt * masks.tgt
        k = self.cfg.stored_units
        if self.cfg.reversible:  # the same fixed-point model as reversal, every graph kept
            _, enc_f, slices, enc_i = self.encoder.forward_autograd(x_src, src != PAD, dropout=masks.encoder)
            dec_out, *_ = self.decoder.forward_autograd(x_tgt, tgt_out != PAD, initial=enc_i,
                                                        initial_float=enc_f, dropout=masks.decoder)
            stored = slices
        else:
            enc_out, enc_final = self.encoder(x_src, src_len)
            dec_out, _ = self.decoder(x_tgt, (tgt_out != PAD).sum(0), enc_final)
            stored = enc_out[..., :k] if k else None
        return dec_out, self.build_memory(src, masks, stored)

    def _chunked_loss_backward(self, dec_out, memory, src, tgt_out, masks, normalizer) -> torch.Tensor:
        # Logits for all target tokens at once ([T, B, V]) would dwarf the hidden states; the loss
        # runs on detached leaves a few steps at a time, then the leaves' gradients flow back once.
        out_leaf, memory_leaf = dec_out.detach().requires_grad_(), memory.detach().requires_grad_()
        # the leaves' gradients (the leaves themselves are saved by the loss and counted there)
        self.last_held_bytes = (_nbytes(dec_out) + _nbytes(memory)
                                + self._logit_work_bytes(src.shape[1] * min(LOSS_CHUNK_STEPS, dec_out.shape[0])))
        pad_mask = (src == PAD).t()
        total = torch.zeros((), device=src.device)
        for chunk in _chunks(dec_out.shape[0]):
            loss = self.step_loss(out_leaf[chunk].transpose(0, 1), memory_leaf, pad_mask, masks,
                                  tgt_out[chunk].t())
            (loss / normalizer).backward()
            total = total + loss.detach()
        torch.autograd.backward([dec_out, memory], [out_leaf.grad, memory_leaf.grad])
        return total

    def _logit_work_bytes(self, rows: int) -> int:
        # The loss's backward works on a block of logits that autograd does not save: count it.
        return logit_work_bytes(rows, self.cfg.tgt_vocab, self.generator.weight.element_size())

    def train_step_autograd(self, src, src_len, tgt_in, tgt_out, normalizer: float) -> torch.Tensor:
        """Ordinary backpropagation for any model (for reversible ones: through the same
        fixed-point, buffered model that reversal trains). The reference for reversal's gradients."""
        masks = self.draw_masks(src.shape[0], src.device)
        return self._train_by_autograd(src.t(), src_len, tgt_in.t(), tgt_out.t(), masks, normalizer)

    @torch.no_grad()
    def loss(self, src, src_len, tgt_in, tgt_out) -> torch.Tensor:
        """Summed cross-entropy of a batch, no gradients (validation), a few steps' logits at a time."""
        masks = self.draw_masks(src.shape[0], src.device)
        dec_out, memory = self._forward_autograd(src.t(), src_len, tgt_in.t(), tgt_out.t(), masks)
        pad_mask = src == PAD
        return sum(self.step_loss(dec_out[c].transpose(0, 1), memory, pad_mask, masks, tgt_out[:, c])
                   for c in _chunks(dec_out.shape[0]))

    # ------------------------------------------------------------------ inference

    @torch.no_grad()
    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> Encoded:
        """Encode batch-major source ids for decoding."""
        src_t = src.t()
        masks = self.draw_masks(src.shape[0], src.device)
        k = self.cfg.stored_units
        if self.cfg.reversible:
            tape = self.encoder.forward_sweep(EmbeddedTokens(self.src_emb, src_t, None), src_t != PAD,
                                               reversible=False)
            stored, state = None if tape.slices is None else to_float(tape.slices), tape.states
        else:
            enc_out, state = self.encoder(self.src_emb(src_t), src_len)
            stored = enc_out[..., :k] if k else None
        return Encoded(self.build_memory(src_t, masks, stored), src == PAD, state)

    @torch.no_grad()
    def decode_step(self, enc: Encoded, state, prev: torch.Tensor):
        """Log-probabilities [N, V] of the next token after ``prev`` [N], and the new state."""
        out, state = self._decoder_step(state, prev)
        logits = self.generator(self.attention(out, enc.memory, enc.pad_mask))
        return torch.log_softmax(logits, dim=-1), state

    def _decoder_step(self, state, prev: torch.Tensor):
        """The decoder's output [N, H] after reading ``prev`` [N] (the attention query), and its new state."""
        x = self.tgt_emb(prev)
        if self.cfg.reversible:
            state = self.decoder.step(x, state)
            return self.decoder.cells[-1].output(state[-1]), state
        out, state = self.decoder(x.unsqueeze(0), None, state)
        return out[0], state

    @torch.no_grad()
    def align(self, src: torch.Tensor, src_len: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """For each token of the batch-major outputs ``tgt`` [B, T] (no BOS; padding after the end is
        ignored), the source position the attention weighed most when the token was predicted: [B, T].
        Computed by feeding ``tgt`` to the decoder, as the search did."""
        enc = self.encode(src, src_len)
        state, prev = enc.state, torch.full((len(tgt),), BOS, dtype=torch.long, device=tgt.device)
        positions = []
        for t in range(tgt.shape[1]):
            out, state = self._decoder_step(state, prev)
            positions.append(self.attention.weights(out, enc.memory, enc.pad_mask).argmax(-1))
            prev = tgt[:, t]
        return torch.stack(positions, 1) if positions else torch.zeros_like(tgt)

    def reorder_state(self, state, index: torch.Tensor):
        """Select rows ``index`` of a decoder state (beam search)."""
        if self.cfg.reversible:
            return [s.index_select(0, index) for s in state]
        if isinstance(state, tuple):
            return tuple(s.index_select(1, index) for s in state)
        return state.index_select(1, index)
