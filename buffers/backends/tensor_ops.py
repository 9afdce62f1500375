"""The torch backend: the buffer's arithmetic as tensor ops, on any device.

This is the readable reference the compiled backends are checked against. Each push of a chunk of
lanes is a dozen or so small ops (on CUDA, as many kernel launches), and a 300-unit half on 16 lanes
a row is 19 chunks: correct everywhere, fast nowhere. No op reads the device on the host. Every tile
is handled at once: its overflow decision is an OR over its rows, and its rows index its own stack.
"""

from __future__ import annotations

import torch

from ..fixed import FORGET_ONE, FORGET_RADIX, INT32_MAX, INT32_MIN, outside_int32, round_fixed
from ..multiply import div_exact, mul_exact
from ..words import OUT_OF_RANGE, STATE_OVERFLOW, TERM_OVERFLOW, WORD_LIMIT, WordStack, flag_position
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
            active = rows.expand(-1, h.shape[1] - stored)
            out[:, stored:], lost = self.push_mul(words, h[:, stored:], zq[:, stored:], active, first_flag)
        return _checked(words, out + ui), lost

    def pop_update(self, words, h, z, u, mask, stored, first_flag):
        zq, ui = _terms(words, z, u, mask)
        before = _checked(words, h.long() - ui)
        out = before.clone()
        if stored < h.shape[1]:
            active = mask[:, None].expand(-1, h.shape[1] - stored)
            out[:, stored:] = self.pop_div(words, before[:, stored:], zq[:, stored:], active, first_flag)
        return out

    @staticmethod
    def _push(words: WordStack, h: torch.Tensor, zl: torch.Tensor, active: torch.Tensor | None,
              flag: int) -> torch.Tensor:
        live = words.curr[:, : h.shape[1]]
        full = live >= WORD_LIMIT
        if active is not None:
            full &= active
        # A tile overflows when any active lane of its rows could: an OR over each tile's rows.
        rows, tile_of_row = words.rows_and_tiles()
        overflow = torch.zeros(words.tiles, dtype=torch.int64, device=h.device).index_add_(
            0, tile_of_row, full.any(1).long()) > 0
        row_overflow = overflow[tile_of_row, None]
        # Save every row's live words into the slot above its tile's stack; the flag decides whether they
        # count (the tile's ``top`` advances) and whether its live words restart from zero. A full fixed room
        # stores them in the spare level above it instead, and the height still counts (buffers.words).
        words.stack[words.top.clamp(max=words.capacity)[tile_of_row], rows] = words.curr
        words.curr.masked_fill_(row_overflow, 0)
        words.top += overflow
        row, bit = flag_position(flag)
        words.flags[row] = (words.flags[row] & ~(1 << bit)) | (overflow.to(torch.uint8) << bit)

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
        row, bit = flag_position(flag)
        overflow = ((words.flags[row] >> bit) & 1).bool()
        rows, tile_of_row = words.rows_and_tiles()
        below = words.stack[(words.top - 1).clamp(min=0)[tile_of_row], rows]
        words.curr.copy_(torch.where(overflow[tile_of_row, None], below, words.curr))
        words.top -= overflow.long()
        return h_new


def _chunks(words: WordStack, width: int) -> list[slice]:
    """The columns of a group that each push takes, one per lane."""
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
