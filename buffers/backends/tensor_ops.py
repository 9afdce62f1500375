"""The torch backend: the buffer's arithmetic as tensor ops, on any device.

This is the readable reference the compiled backends are checked against. Each push of a chunk of
lanes is a dozen or so small ops (on CUDA, as many kernel launches), and a 300-unit half folded onto
16 lanes is ten chunks: correct everywhere, fast nowhere. No op reads the device on the host.
"""

from __future__ import annotations

import torch

from ..fixed import FORGET_ONE, FORGET_RADIX, INT32_MAX, INT32_MIN, outside_int32, round_fixed
from ..multiply import div_exact, mul_exact
from ..words import OUT_OF_RANGE, STATE_OVERFLOW, TERM_OVERFLOW, WORD_LIMIT, WordStack
from .base import BufferBackend


class TorchBackend(BufferBackend):
    name = "torch"

    def check_device(self, device):
        """Tensor ops run on any device."""

    def push_mul(self, words, h, zl, active, first_flag):
        hl = h.long()
        chunks = [self._push(words, hl[:, c], zl[:, c], None if active is None else active[:, c], first_flag + i)
                  for i, c in enumerate(_chunks(words, h.shape[1]))]
        # Information destroyed by the whole group, kept per group: pops come in the same groups.
        lost = FORGET_RADIX - torch.log2(zl.double())
        lost = (lost if active is None else lost * active).sum()
        out = torch.cat(chunks, 1) if len(chunks) > 1 else chunks[0]
        return out.to(torch.int32), lost  # |h·z/2^R| ≤ |h| + 1: no int32 overflow possible

    def pop_div(self, words, h, zl, active, first_flag):
        hl = h.long()
        chunks = _chunks(words, h.shape[1])
        out = [self._pop(words, hl[:, c], zl[:, c], None if active is None else active[:, c], first_flag + i)
               for i, c in reversed(list(enumerate(chunks)))]
        h_new = torch.cat(out[::-1], 1) if len(out) > 1 else out[0]
        words.record_error((h_new < INT32_MIN) | (h_new > INT32_MAX), OUT_OF_RANGE)
        return h_new.to(torch.int32)

    def push_update(self, words, h, z, u, mask, stored, first_flag):
        zq, ui = _terms(words, z, u, mask)
        rows = mask[:, None]
        h64 = h.long()
        # The stored columns are kept exactly elsewhere: the plain floor product, no buffer.
        out = torch.where(rows, (h64 >> FORGET_RADIX) * zq, h64)
        lost = 0.0
        if stored < h.shape[1]:
            active = words.fold(rows.expand(-1, h.shape[1] - stored))
            pushed, lost = self.push_mul(words, words.fold(h[:, stored:]), words.fold(zq[:, stored:]), active,
                                         first_flag)
            out[:, stored:] = pushed.reshape(h.shape[0], -1)
        return _checked(words, out + ui), lost

    def pop_update(self, words, h, z, u, mask, stored, first_flag):
        zq, ui = _terms(words, z, u, mask)
        before = _checked(words, h.long() - ui)
        out = before.clone()
        if stored < h.shape[1]:
            active = words.fold(mask[:, None].expand(-1, h.shape[1] - stored))
            popped = self.pop_div(words, words.fold(before[:, stored:]), words.fold(zq[:, stored:]), active,
                                  first_flag)
            out[:, stored:] = popped.reshape(h.shape[0], -1)
        return out

    @staticmethod
    def _push(words: WordStack, h: torch.Tensor, zl: torch.Tensor, active: torch.Tensor | None,
              flag: int) -> torch.Tensor:
        live = words.curr[:, : h.shape[1]]
        overflow = live >= WORD_LIMIT
        if active is not None:
            overflow &= active
        overflow = overflow.any()
        # Save the live slab into the slot above the stack; the flag decides whether it counts
        # (``top`` advances) and whether the live words restart from zero.
        words.stack.index_copy_(0, words.top, words.curr.unsqueeze(0))
        words.curr.masked_fill_(overflow, 0)
        words.top += overflow
        words.flags[flag] = overflow

        h_new, buf_new = mul_exact(h, live, zl)
        if active is not None:
            h_new = torch.where(active, h_new, h)
            buf_new = torch.where(active, buf_new, live)
        live.copy_(buf_new)
        return h_new

    @staticmethod
    def _pop(words: WordStack, h: torch.Tensor, zl: torch.Tensor, active: torch.Tensor | None,
             flag: int) -> torch.Tensor:
        live = words.curr[:, : h.shape[1]]
        h_new, buf_new = div_exact(h, live, zl)
        if active is not None:
            h_new = torch.where(active, h_new, h)
            buf_new = torch.where(active, buf_new, live)
        live.copy_(buf_new)
        overflow = words.flags[flag]
        below = words.stack.index_select(0, (words.top - 1).clamp(min=0)).squeeze(0)
        words.curr.copy_(torch.where(overflow, below, words.curr))
        words.top -= overflow.long()
        return h_new


def _chunks(words: WordStack, width: int) -> list[slice]:
    """The columns of a folded group that each push takes, one per lane."""
    return [slice(start, start + w) for start, w in zip(range(0, width, words.lanes), words.chunk_widths(width))]


def _terms(words: WordStack, z: torch.Tensor, u: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The numerators round(z·2^R_Z), clamped to the buffer's range, and to_fixed(u) on live rows (0 on
    padding, and where it left the int32 range: that error is recorded, and not repeated by the sum)."""
    zq = torch.round(z.detach() * FORGET_ONE).long().clamp(words.limit.min_numerator, FORGET_ONE)
    ui, bad = round_fixed(u)
    words.record_error(bad, TERM_OVERFLOW)
    return zq, ui * (mask[:, None] & ~bad)


def _checked(words: WordStack, s: torch.Tensor) -> torch.Tensor:
    """int64 ``s`` as int32, a value outside its range recorded and clamped."""
    words.record_error(outside_int32(s), STATE_OVERFLOW)
    return s.clamp(INT32_MIN, INT32_MAX).to(torch.int32)
