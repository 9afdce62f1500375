"""RevLSTM (MacKay et al. 2018): per half, c_i ← f_i·c_i + i_i·g_i, then h_i ← p_i·h_i + o_i·tanh(c_i)."""

from __future__ import annotations

import torch
from torch import nn

from buffers import ForgetLimit, restrict_forget, to_float

from .. import products
from .base import RevCell, Reversal
from .weights import SweepWeights


class RevLSTMCell(RevCell):
    """Per half: c_i ← f_i·c_i + i_i·g_i, then h_i ← p_i·h_i + o_i·tanh(c_i) (new c_i).

    Both forget gates (f of the cell, p of the hidden state; ``p_gate`` in the code, where ``p`` is the
    input projection) are limited and buffered; the input and output gates only enter the additive
    terms. Gates come from one Linear on [x; h_j], columns [f | g | i | o | p].
    """

    groups_per_half = 2
    reverse_temporaries = 42

    def __init__(self, input_size: int, hidden_size: int, limit: ForgetLimit) -> None:
        super().__init__(input_size, hidden_size, limit)
        self.gates = nn.ModuleList(nn.Linear(input_size + self.half, 5 * self.half) for _ in range(2))

    def linears(self) -> list[nn.Linear]:
        return list(self.gates)

    def _activations(self, i: int, p: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """σ(f), tanh(g), σ(i), σ(o), σ(p) of half i (forget gates before their limit)."""
        f, g, ig, o, p_gate = self._recurrent(self.gates[i], self._half_projection(p, i), other).chunk(5, 1)
        return torch.sigmoid(f), torch.tanh(g), torch.sigmoid(ig), torch.sigmoid(o), torch.sigmoid(p_gate)

    def _terms(self, acts: tuple[torch.Tensor, ...]):
        """(f, i·g, o, p) from :meth:`_activations`: the cell's and the hidden state's update terms."""
        f, g, ig, o, p_gate = acts
        return (restrict_forget(f, self.limit), ig * g, o, restrict_forget(p_gate, self.limit))

    def _gates(self, i: int, p: torch.Tensor, other: torch.Tensor):
        return self._terms(self._activations(i, p, other))

    def _forward_reference(self, p, state, mask, sweep):
        h1, h2, c1, c2 = self._split(state)
        h, c = [h1, h2], [c1, c2]
        update = self._update(sweep.buffer, mask, sweep.guard)
        for i in (0, 1):
            f, ig, o, p_gate = self._gates(i, p, to_float(h[1 - i]))
            c[i] = update.push(c[i], f, ig)
            h[i] = update.push(h[i], p_gate, o * torch.tanh(to_float(c[i])), self._stored(i, sweep.stored))
        return torch.cat(h + c, 1)

    def _forward_fused(self, p, state, mask, sweep, weights):
        """Per half one product and one kernel."""
        ints, out = self._split(state), torch.empty_like(state)
        new = self._split(out)
        read = to_float(ints[1])
        for i in (0, 1):
            pre = products.linear(read, weights.recurrent[i])
            read = sweep.kernels.lstm_push(sweep.buffer, ints[i], ints[2 + i], pre, p, self._half_start(i), mask,
                                           self._stored(i, sweep.stored), self.limit, new[i], new[2 + i])
        return out

    def _reverse_half_reference(self, i: int, step: Reversal, restore: torch.Tensor | None) -> None:
        """Pop h_i, then c_i (state columns [h1 | h2 | c1 | c2]); see :class:`~.base.RevCell`."""
        ints, prevs, grads, slot = step.ints, step.prevs, step.grads, step.slot
        h, c = i, 2 + i
        read = to_float(ints[1 - i])
        acts = self._activations(i, step.p, read)
        sf, g, ig, o, sp = acts
        f, u_c, _, p_gate = self._terms(acts)
        tc = torch.tanh(to_float(ints[c]))  # of the new cell, which the new h_i was made from
        update = self._update(step.sweep.buffer if step.pop else None, step.mask, None)
        if step.pop:
            prevs[h].copy_(update.pop(ints[h], p_gate, o * tc, restore))
            prevs[c].copy_(update.pop(ints[c], f, u_c))
        ints[h], ints[c] = prevs[h], prevs[c]
        if grads is None:
            return
        slot[1][i].copy_(read)
        grad_pre = self._half_projection(slot[0], i)
        grad_h, grad_p, grad_uh = update.backward(to_float(ints[h]), p_gate, grads[h])
        grad_c, grad_f, grad_uc = update.backward(to_float(ints[c]), f, grads[c] + grad_uh * o * (1 - tc * tc))
        grads[h].copy_(grad_h)
        grads[c].copy_(grad_c)
        out_f, out_g, out_i, out_o, out_p = grad_pre.chunk(5, 1)
        torch.mul(grad_f * self.limit.slope * sf, 1 - sf, out=out_f)
        torch.mul(grad_uc * ig, 1 - g * g, out=out_g)
        torch.mul(grad_uc * g * ig, 1 - ig, out=out_i)
        torch.mul(grad_uh * tc * o, 1 - o, out=out_o)
        torch.mul(grad_p * self.limit.slope * sp, 1 - sp, out=out_p)
        grads[1 - i].add_(torch.mm(grad_pre, self.recurrent_weight(self.gates[i])))

    def _reverse_half_fused(self, i: int, step: Reversal, restore: torch.Tensor | None, weights: SweepWeights,
                            read: torch.Tensor | None, grad_out: torch.Tensor | None) -> torch.Tensor | None:
        """One product (or the one kept in ``step.gates``) and one fused kernel."""
        ints, prevs, grads, gates = step.ints, step.prevs, step.grads, step.gates
        h, c = i, 2 + i
        read = to_float(ints[1 - i]) if read is None else read
        if gates is not None and i in gates:
            (pre,) = gates[i]
        else:
            pre = products.linear(read, weights.recurrent[i])
            if gates is not None:
                gates[i] = (pre,)
        grad = None if grads is None else (grads[h], grads[c])
        grad_pre = None if grads is None else self._half_projection(step.slot[0], i)
        prev_float = torch.empty_like(read) if i == 1 else None
        step.sweep.kernels.lstm_reverse(step.sweep.buffer if step.pop else None, ints[h], ints[c], pre, step.p,
                                        self._half_start(i), step.mask, self.limit, restore,
                                        (prevs[h], prevs[c]), grad, grad_pre, read,
                                        None if step.slot is None else step.slot[1][i], prev_float, grad_out)
        ints[h], ints[c] = prevs[h], prevs[c]
        if grads is not None:
            products.accumulate(grads[1 - i], grad_pre, weights.recurrent[i].t())
        return prev_float

    def forward_diff(self, p, prev_f, new_state, mask):
        h1, h2, c1, c2 = prev_f.split(self.half, 1)
        h, c = [h1, h2], [c1, c2]
        eh1, eh2, ec1, ec2 = self._split(new_state)
        eh, ec = [eh1, eh2], [ec1, ec2]
        update = self._update(None, mask, None)
        for i in (0, 1):
            f, ig, o, p_gate = self._gates(i, p, h[1 - i])
            c[i] = update.diff(c[i], f, ig, ec[i])
            h[i] = update.diff(h[i], p_gate, o * torch.tanh(c[i]), eh[i])
        return torch.cat(h + c, 1)
