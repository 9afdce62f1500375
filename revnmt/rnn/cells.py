"""RevGRU and RevLSTM cells (MacKay et al. 2018) in three modes that share one gate computation.

The hidden state is split into halves h = [h1 | h2] with separate weights: h1 is updated from the
*old* h2, then h2 from the *new* h1. Each half update is "forget, then add", done on int32 fixed
point: h ← z·h + u, where z·h goes through the information buffer (exact, invertible) and u is
rounded to fixed point first (integer addition is exact). Given h at time t, the gates of half 2
depend only on h1(t), so h2(t−1) can be recovered; then half 1 likewise.

Every mode takes the layer input as its projection ``p = cell.project(x)`` (see :meth:`RevCell.project`).
Modes (every one calls the same ``_gates`` code on the same float values, which is what makes
the reverse bit-exact: a gate one ulp off would decode the buffer with the wrong divisor):
- ``forward_int``: no grad, pushes onto the buffer (training forward; with ``buf=None``, inference).
- ``reverse_diff``: pops to the exact previous state and backpropagates the step, with the same
  gates (training by reversal). Output columns stored exactly elsewhere (the top encoder layer's
  attention slice, ``stored``) skip the buffer and are restored from the stored copy
  (``restore``), as in the paper.
- ``forward_diff``: with grad, from float leaves of the previous state; its value is the exact
  next state and its gradient the real-valued derivative of z·h + u (with dz* treated as dz),
  the gradient ``reverse_diff`` computes too. Ordinary backprop (the reference) runs all steps of it.

States are int32 tensors [B, state_size]: GRU [h1 | h2], LSTM [h1 | h2 | c1 | c2].
"""

from __future__ import annotations

import torch
from torch import nn

from buffers import (
    FORGET_ONE,
    FORGET_RADIX,
    InformationBuffer,
    OverflowGuard,
    checked_add,
    checked_sub,
    forget_multiplier,
    quantize_forget,
    restrict_forget,
    straight_through,
    to_fixed,
    to_float,
)


class _Group:
    """One integer update h ← z·h + u of a slice of the state, in the three modes."""

    def __init__(self, max_bits: int | None, buf: InformationBuffer | None, mask: torch.Tensor,
                 guard: OverflowGuard | None) -> None:
        self.max_bits, self.buf, self.mask, self.guard = max_bits, buf, mask, guard

    def _terms(self, z: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # A padded lane adds 0 and (inside the buffer) is not multiplied: arithmetic, no branch.
        zq = quantize_forget(z, self.max_bits)
        ui = to_fixed(u, guard=self.guard) * self.mask[:, None]
        return zq, ui

    def _lossy(self, h: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        # The plain floor product: it differs from the buffered one only in the low bits the
        # buffer would have refilled (< z* units of 2^-23). Used where nothing will be reversed.
        return torch.where(self.mask[:, None], (h.long() >> FORGET_RADIX) * zq, h.long()).to(torch.int32)

    def push(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, stored: int = 0) -> torch.Tensor:
        """h ← z·h + u. The first ``stored`` columns are kept exactly elsewhere (the attention
        slice), so they skip the buffer; without a buffer (inference) every column does."""
        if self.buf is not None and self.buf.fused:  # CPU: one compiled call instead of ~25 small ops
            return self.buf.push_update(h, z, u, self.mask, stored)
        zq, ui = self._terms(z, u)
        if self.buf is None:
            stored = h.shape[1]
        parts = []
        if stored:
            parts.append(self._lossy(h[:, :stored], zq[:, :stored]))
        if stored < h.shape[1]:
            parts.append(self.buf.push_mul(h[:, stored:], zq[:, stored:], self.mask))
        return checked_add(torch.cat(parts, 1) if len(parts) > 1 else parts[0], ui, self.guard)

    def pop(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, restore: torch.Tensor | None = None):
        """The inverse of :meth:`push`; ``restore`` gives the stored columns' previous values."""
        if self.buf.fused:
            h = self.buf.pop_update(h, z, u, self.mask, 0 if restore is None else restore.shape[1])
            if restore is not None:
                h[:, : restore.shape[1]] = restore
            return h
        zq, ui = self._terms(z, u)
        h = checked_sub(h, ui, self.guard)
        stored = 0 if restore is None else restore.shape[1]
        parts = [] if restore is None else [restore]
        if stored < h.shape[1]:
            parts.append(self.buf.pop_div(h[:, stored:], zq[:, stored:], self.mask))
        return torch.cat(parts, 1) if len(parts) > 1 else parts[0]

    def surrogate(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """where(mask, z*·h + u, h) on floats: what the update's gradient is taken from."""
        zq = straight_through(quantize_forget(z, self.max_bits) / FORGET_ONE, z)
        return torch.where(self.mask[:, None], zq * h + u, h)

    def diff(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
        """Float h(t) with value ``exact`` (int) and the gradient of :meth:`surrogate`."""
        return straight_through(to_float(exact), self.surrogate(h, z, u))


class RevCell(nn.Module):
    """Common plumbing: sizes, the forgetting limit, and the half/groups layout of the state."""

    groups_per_half = 1

    def __init__(self, input_size: int, hidden_size: int, max_forget_bits: int | None) -> None:
        super().__init__()
        if hidden_size % 2:
            raise ValueError(f"reversible cells split the state in halves: hidden size must be even, got {hidden_size}")
        self.input_size, self.hidden_size, self.half = input_size, hidden_size, hidden_size // 2
        forget_multiplier(max_forget_bits)  # validates the limit now rather than at the first step
        self.max_forget_bits = max_forget_bits
        self.state_size = hidden_size * self.groups_per_half

    def output(self, state: torch.Tensor) -> torch.Tensor:
        """The float output [h1 | h2] of an int state (what the next layer and attention see)."""
        return to_float(state[:, : self.hidden_size])

    def _linears(self) -> list[nn.Linear]:
        """Every Linear on [x; h_other], half 1's before half 2's."""
        raise NotImplementedError

    @property
    def project_width(self) -> int:
        """Columns of :meth:`project`'s output."""
        return sum(lin.out_features for lin in self._linears())

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The input's part of every gate pre-activation of both halves, biases included:
        [..., input] -> [..., gate columns of half 1 | of half 2].

        The step functions take this instead of x: the recurrent part is all that must be
        computed step by step, and ``ReversibleRNN`` projects known inputs for several steps in
        one matrix product. Forward and reverse must use the same projection values (the same
        call on the same data), or a gate could differ by an ulp and the reverse go wrong.
        """
        # One product per Linear on a view of its weight: a concatenated weight would be a
        # parameter-sized copy that autograd keeps alive with every chunk's graph.
        return torch.cat([torch.nn.functional.linear(x, lin.weight[:, : self.input_size], lin.bias)
                          for lin in self._linears()], -1)

    def _recurrent(self, lin: nn.Linear, p: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The pre-activation of ``lin`` on [x; h], from x's projection ``p``."""
        # mm, then add: addmm would first copy ``p``, a column slice of the projection.
        return torch.mm(h, lin.weight[:, self.input_size:].t()) + p

    def _half_projection(self, p: torch.Tensor, i: int) -> torch.Tensor:
        return p.chunk(2, 1)[i]

    def _group(self, buf, mask, guard) -> _Group:
        return _Group(self.max_forget_bits, buf, mask, guard)

    def _split(self, state: torch.Tensor) -> list[torch.Tensor]:
        return list(state.split(self.half, dim=1))

    def _stored(self, i: int, stored: int) -> int:
        """How many leading columns of h_i fall into the first ``stored`` output columns."""
        return min(max(stored - i * self.half, 0), self.half)

    def _restore(self, i: int, restore: torch.Tensor | None) -> torch.Tensor | None:
        n = 0 if restore is None else self._stored(i, restore.shape[1])
        return restore[:, i * self.half: i * self.half + n] if n else None

    def reverse_diff(self, p: torch.Tensor, state: torch.Tensor, grad: torch.Tensor, buf: InformationBuffer,
                     mask: torch.Tensor, guard: OverflowGuard | None = None,
                     restore: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of training by reversal: undo the step that produced ``state`` and backpropagate it.

        ``grad`` is d loss / d ``state`` (real values). Returns the exact previous int state,
        d loss / d previous state and d loss / d ``p``; parameter gradients accumulate in ``.grad``.
        The gates that decode the buffer are computed once, with autograd, and differentiated:
        reversing and then re-running the step would compute every gate twice. Half 2 is undone
        first, from the new h1; half 1 then from the recovered h2. Half 2's graph reads the new
        h1, so its gradient there joins ``grad`` before half 1 is backpropagated.
        """
        ints, grads = self._split(state), list(grad.split(self.half, 1))
        grp = self._group(buf, mask, guard)
        p = p.detach().requires_grad_()
        new_h1 = to_float(ints[0]).requires_grad_()
        olds: list[torch.Tensor | None] = [None] * len(ints)
        graphs = {}
        for i in (1, 0):
            read = new_h1 if i == 1 else olds[1]
            graphs[i] = self._reverse_half(i, p, read, ints, grp, self._restore(i, restore), olds)
        columns, outputs = graphs[1]
        torch.autograd.backward(outputs, [grads[j] for j in columns])
        grads[0] = grads[0] + new_h1.grad
        columns, outputs = graphs[0]
        torch.autograd.backward(outputs, [grads[j] for j in columns])
        return torch.cat(ints, 1), torch.cat([old.grad for old in olds], 1), p.grad


class RevGRUCell(RevCell):
    """h_i ← z_i·h_i + (1 − z_i)·g_i, with [z_i | r_i] = σ(W[x; h_j]), g_i = tanh(V[x; r_i·h_j])."""

    def __init__(self, input_size: int, hidden_size: int, max_forget_bits: int | None = 3) -> None:
        super().__init__(input_size, hidden_size, max_forget_bits)
        self.zr = nn.ModuleList(nn.Linear(input_size + self.half, 2 * self.half) for _ in range(2))
        self.g = nn.ModuleList(nn.Linear(input_size + self.half, self.half) for _ in range(2))

    def _linears(self) -> list[nn.Linear]:
        return [self.zr[0], self.g[0], self.zr[1], self.g[1]]

    def _gates(self, i: int, p: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p_zr, p_g = self._half_projection(p, i).split([2 * self.half, self.half], 1)
        z, r = torch.sigmoid(self._recurrent(self.zr[i], p_zr, other)).chunk(2, 1)
        z = restrict_forget(z, self.max_forget_bits)
        g = torch.tanh(self._recurrent(self.g[i], p_g, r * other))
        return z, (1 - z) * g

    def forward_int(self, p, state, buf, mask, guard=None, stored: int = 0) -> torch.Tensor:
        h = self._split(state)
        grp = self._group(buf, mask, guard)
        for i in (0, 1):
            h[i] = grp.push(h[i], *self._gates(i, p, to_float(h[1 - i])), self._stored(i, stored))
        return torch.cat(h, 1)

    def _reverse_half(self, i, p, read, ints, grp, restore, olds):
        """Pop h_i in ``ints`` back to its previous value (a float leaf in ``olds``); return the
        state columns it updates and their graphs (see :meth:`RevCell.reverse_diff`)."""
        z, u = self._gates(i, p, read)
        ints[i] = grp.pop(ints[i], z, u, restore)
        olds[i] = to_float(ints[i]).requires_grad_()
        return [i], [grp.surrogate(olds[i], z, u)]

    def forward_diff(self, p, prev_f, new_state, mask) -> torch.Tensor:
        h = list(prev_f.split(self.half, 1))
        exact = self._split(new_state)
        grp = self._group(None, mask, None)
        for i in (0, 1):
            h[i] = grp.diff(h[i], *self._gates(i, p, h[1 - i]), exact[i])
        return torch.cat(h, 1)


class RevLSTMCell(RevCell):
    """Per half: c_i ← f_i·c_i + i_i·g_i, then h_i ← p_i·h_i + o_i·tanh(c_i) (new c_i).

    Both forget gates (f of the cell, p of the hidden state) are limited and buffered; the input and
    output gates only enter the additive terms. Gates come from one Linear on [x; h_j].
    """

    groups_per_half = 2

    def __init__(self, input_size: int, hidden_size: int, max_forget_bits: int | None = 3) -> None:
        super().__init__(input_size, hidden_size, max_forget_bits)
        self.gates = nn.ModuleList(nn.Linear(input_size + self.half, 5 * self.half) for _ in range(2))

    def _linears(self) -> list[nn.Linear]:
        return list(self.gates)

    def _gates(self, i: int, proj: torch.Tensor, other: torch.Tensor):
        f, g, ig, o, p = self._recurrent(self.gates[i], self._half_projection(proj, i), other).chunk(5, 1)
        f = restrict_forget(torch.sigmoid(f), self.max_forget_bits)
        p = restrict_forget(torch.sigmoid(p), self.max_forget_bits)
        return f, torch.sigmoid(ig) * torch.tanh(g), torch.sigmoid(o), p

    def forward_int(self, proj, state, buf, mask, guard=None, stored: int = 0) -> torch.Tensor:
        h1, h2, c1, c2 = self._split(state)
        h, c = [h1, h2], [c1, c2]
        grp = self._group(buf, mask, guard)
        for i in (0, 1):
            f, ig, o, p = self._gates(i, proj, to_float(h[1 - i]))
            c[i] = grp.push(c[i], f, ig)
            h[i] = grp.push(h[i], p, o * torch.tanh(to_float(c[i])), self._stored(i, stored))
        return torch.cat(h + c, 1)

    def _reverse_half(self, i, proj, read, ints, grp, restore, olds):
        """Pop h_i, then c_i, in ``ints`` (state columns [h1 | h2 | c1 | c2]); see RevGRUCell."""
        h, c = i, 2 + i
        f, ig, o, p = self._gates(i, proj, read)
        new_c = to_float(ints[c])  # the new cell, which the new h_i was made from
        ints[h] = grp.pop(ints[h], p, o * torch.tanh(new_c), restore)
        ints[c] = grp.pop(ints[c], f, ig)
        olds[h], olds[c] = to_float(ints[h]).requires_grad_(), to_float(ints[c]).requires_grad_()
        new_c = straight_through(new_c, grp.surrogate(olds[c], f, ig))
        return [h, c], [grp.surrogate(olds[h], p, o * torch.tanh(new_c)), new_c]

    def forward_diff(self, proj, prev_f, new_state, mask) -> torch.Tensor:
        h1, h2, c1, c2 = prev_f.split(self.half, 1)
        h, c = [h1, h2], [c1, c2]
        eh1, eh2, ec1, ec2 = self._split(new_state)
        eh, ec = [eh1, eh2], [ec1, ec2]
        grp = self._group(None, mask, None)
        for i in (0, 1):
            f, ig, o, p = self._gates(i, proj, h[1 - i])
            c[i] = grp.diff(c[i], f, ig, ec[i])
            h[i] = grp.diff(h[i], p, o * torch.tanh(c[i]), eh[i])
        return torch.cat(h + c, 1)


REV_CELLS = {"revgru": RevGRUCell, "revlstm": RevLSTMCell}
