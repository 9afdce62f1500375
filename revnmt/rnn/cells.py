"""RevGRU and RevLSTM cells (MacKay et al. 2018) in three modes that share one gate computation.

The hidden state is split into halves h = [h1 | h2] with separate weights: h1 is updated from the
*old* h2, then h2 from the *new* h1. Each half update is "forget, then add", done on int32 fixed
point: h ← z·h + u, where z·h goes through the information buffer (exact, invertible) and u is
rounded to fixed point first (integer addition is exact). Given h at time t, the gates of half 2
depend only on h1(t), so h2(t−1) can be recovered; then half 1 likewise.

Every mode takes the layer input as its projection ``p = cell.project(x)`` (see :meth:`RevCell.project`).
Modes (every one calls the same ``_gates`` code on the same float values, which is what makes
the reverse bit-exact: a gate one ulp off would decode the buffer with the wrong divisor):
- ``forward_int``: no grad, pushes onto the buffer (training forward; with ``buf=None``, inference,
  where range errors go to ``guard``; a buffer keeps its own).
- ``reverse_diff``: pops to the exact previous state and backpropagates the step by hand, with
  the same gates (training by reversal). Output columns stored exactly elsewhere (the top encoder layer's
  attention slice, ``stored``) skip the buffer and are restored from the stored copy
  (``restore``), as in the paper.
- ``forward_diff``: with grad, from float leaves of the previous state; its value is the exact
  next state and its gradient the real-valued derivative of z·h + u (with dz* treated as dz),
  the gradient ``reverse_diff`` computes by hand. Ordinary backprop (the reference that the
  hand-written derivatives are tested against) runs all steps of it through autograd.

States are int32 tensors [B, state_size]: GRU [h1 | h2], LSTM [h1 | h2 | c1 | c2].
"""

from __future__ import annotations

import torch
from torch import nn

from buffers import (
    FORGET_ONE,
    InformationBuffer,
    OverflowGuard,
    forget_multiplier,
    lossy_update,
    quantize_forget,
    restrict_forget,
    straight_through,
    to_float,
)


def _grad_of(param: nn.Parameter) -> torch.Tensor:
    """``param.grad``, created as zeros on first use: the backward sweep accumulates into it by hand."""
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    return param.grad


class _Group:
    """One integer update h ← z·h + u of a slice of the state, in the three modes."""

    def __init__(self, max_bits: int | None, buf: InformationBuffer | None, mask: torch.Tensor,
                 guard: OverflowGuard | None) -> None:
        self.max_bits, self.buf, self.mask, self.guard = max_bits, buf, mask, guard

    def push(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, stored: int = 0) -> torch.Tensor:
        """h ← z·h + u. The first ``stored`` columns are kept exactly elsewhere (the attention
        slice), so they skip the buffer; without a buffer (inference) every column does."""
        if self.buf is None:
            return lossy_update(h, z, u, self.mask, self.max_bits, self.guard)
        return self.buf.push_update(h, z, u, self.mask, stored)

    def pop(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, restore: torch.Tensor | None = None):
        """The inverse of :meth:`push`; ``restore`` gives the stored columns' previous values."""
        h = self.buf.pop_update(h, z, u, self.mask, 0 if restore is None else restore.shape[1])
        if restore is not None:
            h[:, : restore.shape[1]] = restore
        return h

    def _factor(self, z: torch.Tensor) -> torch.Tensor:
        """The factor z*/2^R_Z the update really multiplies by, as a float."""
        return quantize_forget(z, self.max_bits) / FORGET_ONE

    def surrogate(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """where(mask, z*·h + u, h) on floats: what the update's gradient is taken from."""
        zq = straight_through(self._factor(z), z)
        return torch.where(self.mask[:, None], zq * h + u, h)

    def backward(self, h: torch.Tensor, z: torch.Tensor, grad: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The gradients of :meth:`surrogate` w.r.t. h, z and u, from the gradient ``grad`` of its output."""
        zq = self._factor(z)
        live = self.mask[:, None]
        grad_u = grad * live  # a padded row passed h through: its z and u got no gradient
        return torch.where(live, grad * zq, grad), grad_u * h, grad_u

    def diff(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
        """Float h(t) with value ``exact`` (int) and the gradient of :meth:`surrogate`."""
        return straight_through(to_float(exact), self.surrogate(h, z, u))


class RevCell(nn.Module):
    """Common plumbing: sizes, the forgetting limit, and the half/groups layout of the state."""

    groups_per_half = 1
    #: [B, half]-sized float32 temporaries alive at once in :meth:`reverse_diff`: the step's working
    #: set, which autograd never sees since the step is differentiated by hand. Measured peaks at 300
    #: units are 24 (GRU) and 36 (LSTM), plus about 5 for the scratch of the buffer's compiled pops;
    #: tests/revnmt/rnn/test_saved_memory.py checks the bound.
    reverse_temporaries = 30

    def __init__(self, input_size: int, hidden_size: int, max_forget_bits: int | None) -> None:
        super().__init__()
        if hidden_size % 2:
            raise ValueError(f"reversible cells split the state in halves: hidden size must be even, got {hidden_size}")
        self.input_size, self.hidden_size, self.half = input_size, hidden_size, hidden_size // 2
        # d restrict_forget(σ) / dσ, the factor m of buffers.restrict_forget; it also validates the limit
        # now rather than at the first step.
        self._slope = forget_multiplier(max_forget_bits)
        self.max_forget_bits = max_forget_bits
        self.state_size = hidden_size * self.groups_per_half

    def output(self, state: torch.Tensor) -> torch.Tensor:
        """The float output [h1 | h2] of an int state (what the next layer and attention see)."""
        return to_float(state[:, : self.hidden_size])

    def _linears(self) -> list[nn.Linear]:
        """Every Linear on [x; h_other], half 1's before half 2's."""
        raise NotImplementedError

    def reverse_work_bytes(self, batch: int) -> int:
        """Bytes of one :meth:`reverse_diff`'s temporaries over ``batch`` rows (memory accounting)."""
        return self.reverse_temporaries * batch * self.half * 4

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

    @torch.no_grad()
    def project_backward(self, x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """Backpropagate :meth:`project` by hand: accumulate the gradients of the weights' input
        columns and of the biases, and return d loss / d x. (Autograd through the weight views
        would first build a zero gradient of every whole weight, per call.)"""
        x2, grad2 = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        linears = self._linears()
        grad_x = torch.zeros_like(x2)
        for lin, g in zip(linears, grad2.split([lin.out_features for lin in linears], 1)):
            _grad_of(lin.weight)[:, : self.input_size].addmm_(g.t(), x2)
            _grad_of(lin.bias).add_(g.sum(0))
            grad_x.addmm_(g, lin.weight[:, : self.input_size])
        return grad_x.view_as(x)

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

    def _backward_recurrent(self, lin: nn.Linear, grad_pre: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Backpropagate :meth:`_recurrent`: accumulate ``lin``'s recurrent weight gradient and return
        d loss / d h. (The input columns and the bias are :meth:`project_backward`'s.)"""
        _grad_of(lin.weight)[:, self.input_size:].addmm_(grad_pre.t(), h)
        return torch.mm(grad_pre, lin.weight[:, self.input_size:])

    @torch.no_grad()
    def reverse_diff(self, p: torch.Tensor, state: torch.Tensor, grad: torch.Tensor, buf: InformationBuffer,
                     mask: torch.Tensor, restore: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of training by reversal: undo the step that produced ``state`` and backpropagate it.

        ``grad`` is d loss / d ``state`` (real values). Returns the exact previous int state,
        d loss / d previous state and d loss / d ``p``; recurrent weight gradients accumulate in
        ``.grad``. The gates that decode the buffer are computed once and differentiated by hand
        (the derivative of :meth:`_Group.surrogate` through the gates, what ``forward_diff`` gives
        autograd): a per-step autograd graph cost more than the step's arithmetic. Half 2 is undone
        first, from the new h1; its gradient on h1 joins ``grad`` before half 1 is backpropagated.
        """
        ints, grads = self._split(state), list(grad.split(self.half, 1))
        grp = self._group(buf, mask, None)
        # Each half writes its gate gradients into its columns of one tensor: concatenating them
        # would double the step's largest temporaries (memory accounting counts this working set).
        grad_p = torch.empty_like(p)
        for i in (1, 0):
            grad_read = self._reverse_half(i, p, to_float(ints[1 - i]), ints, grads, grp,
                                           self._restore(i, restore), self._half_projection(grad_p, i))
            grads[1 - i] = grads[1 - i] + grad_read
        return torch.cat(ints, 1), torch.cat(grads, 1), grad_p

    @torch.no_grad()
    def reverse_int(self, p: torch.Tensor, state: torch.Tensor, buf: InformationBuffer, mask: torch.Tensor,
                    restore: torch.Tensor | None = None) -> torch.Tensor:
        """Undo the step that produced ``state``: the exact previous int state, and no gradients.

        The first half of :meth:`reverse_diff`, for a sweep that reconstructs several steps' states
        before it backpropagates them (:meth:`backward_step`): the decoder, whose attention and loss
        then run for those steps in one batched call.
        """
        ints = self._split(state)
        grp = self._group(buf, mask, None)
        for i in (1, 0):
            self._pop_half(i, p, to_float(ints[1 - i]), ints, grp, self._restore(i, restore))
        return torch.cat(ints, 1)

    @torch.no_grad()
    def backward_step(self, p: torch.Tensor, prev: torch.Tensor, state: torch.Tensor, grad: torch.Tensor,
                      mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Backpropagate the step from ``prev`` to ``state`` (both exact, from :meth:`reverse_int`):
        the second half of :meth:`reverse_diff`, which needs no buffer. Returns d loss / d ``prev``
        and d loss / d ``p``; recurrent weight gradients accumulate in ``.grad``."""
        ints, grads = self._split(state), list(grad.split(self.half, 1))
        grp = self._group(None, mask, None)
        grad_p = torch.empty_like(p)
        for i in (1, 0):
            grad_read = self._reverse_half(i, p, to_float(ints[1 - i]), ints, grads, grp, None,
                                           self._half_projection(grad_p, i), self._split(prev))
            grads[1 - i] = grads[1 - i] + grad_read
        return torch.cat(grads, 1), grad_p


class RevGRUCell(RevCell):
    """h_i ← z_i·h_i + (1 − z_i)·g_i, with [z_i | r_i] = σ(W[x; h_j]), g_i = tanh(V[x; r_i·h_j])."""

    def __init__(self, input_size: int, hidden_size: int, max_forget_bits: int | None = 3) -> None:
        super().__init__(input_size, hidden_size, max_forget_bits)
        self.zr = nn.ModuleList(nn.Linear(input_size + self.half, 2 * self.half) for _ in range(2))
        self.g = nn.ModuleList(nn.Linear(input_size + self.half, self.half) for _ in range(2))

    def _linears(self) -> list[nn.Linear]:
        return [self.zr[0], self.g[0], self.zr[1], self.g[1]]

    def _activations(self, i: int, p: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """σ of z (before the limit), r, r·h_j and g of half i: what the gates and their derivatives need."""
        p_zr, p_g = self._half_projection(p, i).split([2 * self.half, self.half], 1)
        z, r = torch.sigmoid(self._recurrent(self.zr[i], p_zr, other)).chunk(2, 1)
        rh = r * other
        return z, r, rh, torch.tanh(self._recurrent(self.g[i], p_g, rh))

    def _terms(self, acts: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The update's (z, u) from :meth:`_activations`."""
        z, _, _, g = acts
        z = restrict_forget(z, self.max_forget_bits)
        return z, (1 - z) * g

    def _gates(self, i: int, p: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._terms(self._activations(i, p, other))

    def forward_int(self, p, state, buf, mask, guard=None, stored: int = 0) -> torch.Tensor:
        h = self._split(state)
        grp = self._group(buf, mask, guard)
        for i in (0, 1):
            h[i] = grp.push(h[i], *self._gates(i, p, to_float(h[1 - i])), self._stored(i, stored))
        return torch.cat(h, 1)

    def _pop_half(self, i, p, read, ints, grp, restore):
        """Pop h_i in ``ints`` back to its previous value (``read`` is h_j as the gates read it)."""
        ints[i] = grp.pop(ints[i], *self._gates(i, p, read), restore)

    def _reverse_half(self, i, p, read, ints, grads, grp, restore, grad_pre, prev=None):
        """Pop h_i in ``ints`` back to its previous value (or take it from the exact ``prev`` state's
        halves), turn ``grads[i]`` into its gradient, write d loss / d half i's projection into
        ``grad_pre`` and return d loss / d ``read`` (h_j)."""
        acts = self._activations(i, p, read)
        sz, r, rh, g = acts
        z, u = self._terms(acts)
        ints[i] = grp.pop(ints[i], z, u, restore) if prev is None else prev[i]
        grads[i], grad_z, grad_u = grp.backward(to_float(ints[i]), z, grads[i])
        grad_pre_z, grad_pre_r, grad_pre_g = grad_pre.split(self.half, 1)
        torch.mul(grad_u * (1 - z), 1 - g * g, out=grad_pre_g)
        grad_rh = self._backward_recurrent(self.g[i], grad_pre_g, rh)
        torch.mul((grad_z - grad_u * g) * self._slope * sz, 1 - sz, out=grad_pre_z)
        torch.mul(grad_rh * read * r, 1 - r, out=grad_pre_r)
        return self._backward_recurrent(self.zr[i], grad_pre[:, : 2 * self.half], read) + grad_rh * r

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
    reverse_temporaries = 42

    def __init__(self, input_size: int, hidden_size: int, max_forget_bits: int | None = 3) -> None:
        super().__init__(input_size, hidden_size, max_forget_bits)
        self.gates = nn.ModuleList(nn.Linear(input_size + self.half, 5 * self.half) for _ in range(2))

    def _linears(self) -> list[nn.Linear]:
        return list(self.gates)

    def _activations(self, i: int, proj: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """σ(f), tanh(g), σ(i), σ(o), σ(p) of half i (forget gates before their limit)."""
        f, g, ig, o, p = self._recurrent(self.gates[i], self._half_projection(proj, i), other).chunk(5, 1)
        return torch.sigmoid(f), torch.tanh(g), torch.sigmoid(ig), torch.sigmoid(o), torch.sigmoid(p)

    def _terms(self, acts: tuple[torch.Tensor, ...]):
        """(f, i·g, o, p) from :meth:`_activations`: the cell's and the hidden state's update terms."""
        f, g, ig, o, p = acts
        return (restrict_forget(f, self.max_forget_bits), ig * g, o, restrict_forget(p, self.max_forget_bits))

    def _gates(self, i: int, proj: torch.Tensor, other: torch.Tensor):
        return self._terms(self._activations(i, proj, other))

    def forward_int(self, proj, state, buf, mask, guard=None, stored: int = 0) -> torch.Tensor:
        h1, h2, c1, c2 = self._split(state)
        h, c = [h1, h2], [c1, c2]
        grp = self._group(buf, mask, guard)
        for i in (0, 1):
            f, ig, o, p = self._gates(i, proj, to_float(h[1 - i]))
            c[i] = grp.push(c[i], f, ig)
            h[i] = grp.push(h[i], p, o * torch.tanh(to_float(c[i])), self._stored(i, stored))
        return torch.cat(h + c, 1)

    def _pop_half(self, i, proj, read, ints, grp, restore):
        """Pop h_i, then c_i, in ``ints`` (state columns [h1 | h2 | c1 | c2]) back to their previous values."""
        h, c = i, 2 + i
        f, u_c, o, p = self._gates(i, proj, read)
        ints[h] = grp.pop(ints[h], p, o * torch.tanh(to_float(ints[c])), restore)
        ints[c] = grp.pop(ints[c], f, u_c)

    def _reverse_half(self, i, proj, read, ints, grads, grp, restore, grad_pre, prev=None):
        """Pop h_i, then c_i, in ``ints`` (or take them from ``prev``'s columns) and turn their
        gradients into the previous values'; see RevGRUCell."""
        h, c = i, 2 + i
        acts = self._activations(i, proj, read)
        sf, g, ig, o, sp = acts
        f, u_c, _, p = self._terms(acts)
        tc = torch.tanh(to_float(ints[c]))  # of the new cell, which the new h_i was made from
        if prev is None:
            ints[h] = grp.pop(ints[h], p, o * tc, restore)
            ints[c] = grp.pop(ints[c], f, u_c)
        else:
            ints[h], ints[c] = prev[h], prev[c]
        grads[h], grad_p, grad_uh = grp.backward(to_float(ints[h]), p, grads[h])
        grads[c], grad_f, grad_uc = grp.backward(to_float(ints[c]), f, grads[c] + grad_uh * o * (1 - tc * tc))
        out_f, out_g, out_i, out_o, out_p = grad_pre.chunk(5, 1)
        torch.mul(grad_f * self._slope * sf, 1 - sf, out=out_f)
        torch.mul(grad_uc * ig, 1 - g * g, out=out_g)
        torch.mul(grad_uc * g * ig, 1 - ig, out=out_i)
        torch.mul(grad_uh * tc * o, 1 - o, out=out_o)
        torch.mul(grad_p * self._slope * sp, 1 - sp, out=out_p)
        return self._backward_recurrent(self.gates[i], grad_pre, read)

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
