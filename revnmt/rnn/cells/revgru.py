"""RevGRU (MacKay et al. 2018): per half, h_i ← z_i·h_i + (1 − z_i)·g_i, from the other half h_j."""

from __future__ import annotations

import torch
from torch import nn

from buffers import ForgetLimit, restrict_forget, to_float

from .. import products
from .base import RevCell, Reversal
from .weights import SweepWeights


class RevGRUCell(RevCell):
    """h_i ← z_i·h_i + (1 − z_i)·g_i, with [z_i | r_i] = σ(W[x; h_j]), g_i = tanh(V[x; r_i·h_j])."""

    def __init__(self, input_size: int, hidden_size: int, limit: ForgetLimit) -> None:
        super().__init__(input_size, hidden_size, limit)
        self.zr = nn.ModuleList(nn.Linear(input_size + self.half, 2 * self.half) for _ in range(2))
        self.g = nn.ModuleList(nn.Linear(input_size + self.half, self.half) for _ in range(2))

    def linears(self) -> list[nn.Linear]:
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
        z = restrict_forget(z, self.limit)
        return z, (1 - z) * g

    def _gates(self, i: int, p: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._terms(self._activations(i, p, other))

    def _forward_reference(self, p, state, mask, sweep):
        h = self._split(state)
        update = self._update(sweep.buffer, mask, sweep.guard)
        for i in (0, 1):
            h[i] = update.push(h[i], *self._gates(i, p, to_float(h[1 - i])), self._stored(i, sweep.stored))
        return torch.cat(h, 1)

    def _forward_fused(self, p, state, mask, sweep, weights):
        """Per half the gates kernel (with the z, r product), the g product and the update kernel (which also
        makes the float copy the next half reads)."""
        kernels = sweep.kernels
        h, out = self._split(state), torch.empty_like(state)
        read = h[1]  # the int state: the gates kernel converts it
        for i, new in zip((0, 1), self._split(out)):
            col = self._half_start(i)
            rh = torch.empty(read.shape, device=read.device)
            s = kernels.gru_gates(read, weights.recurrent[2 * i], p, col, rh)
            read = kernels.gru_push(sweep.buffer, h[i], products.linear(rh, weights.recurrent[2 * i + 1]), p,
                                    col + 2 * self.half, s, mask, self._stored(i, sweep.stored),
                                    self.limit, new)
        return out

    def _reverse_half_reference(self, i: int, step: Reversal, restore: torch.Tensor | None) -> None:
        ints, prevs, grads, slot = step.ints, step.prevs, step.grads, step.slot
        read = to_float(ints[1 - i])
        acts = self._activations(i, step.p, read)
        sz, r, rh, g = acts
        z, u = self._terms(acts)
        update = self._update(step.sweep.buffer if step.pop else None, step.mask, None)
        if step.pop:
            prevs[i].copy_(update.pop(ints[i], z, u, restore))
        ints[i] = prevs[i]
        if grads is None:
            return
        slot[1][2 * i].copy_(read)
        slot[1][2 * i + 1].copy_(rh)
        grad_prev, grad_z, grad_u = update.backward(to_float(ints[i]), z, grads[i])
        grads[i].copy_(grad_prev)
        grad_pre = self._half_projection(slot[0], i)
        grad_pre_z, grad_pre_r, grad_pre_g = grad_pre.split(self.half, 1)
        torch.mul(grad_u * (1 - z), 1 - g * g, out=grad_pre_g)
        grad_rh = torch.mm(grad_pre_g, self.recurrent_weight(self.g[i]))
        torch.mul((grad_z - grad_u * g) * self.limit.slope * sz, 1 - sz, out=grad_pre_z)
        torch.mul(grad_rh * read * r, 1 - r, out=grad_pre_r)
        grads[1 - i].add_(torch.mm(grad_pre[:, : 2 * self.half], self.recurrent_weight(self.zr[i]))).add_(grad_rh * r)

    def _reverse_half_fused(self, i: int, step: Reversal, restore: torch.Tensor | None, weights: SweepWeights,
                            read: torch.Tensor | None, grad_out: torch.Tensor | None) -> torch.Tensor | None:
        """The gates kernel and g's product (or the gates kept in ``step.gates``), the reverse kernel and, with
        gradients, the read-gradient kernel."""
        kernels, ints, grads, gates = step.sweep.kernels, step.ints, step.grads, step.gates
        read = ints[1 - i] if read is None else read
        col = self._half_start(i)
        if gates is not None and i in gates:
            s, pre_g = gates[i]
        else:
            rh = torch.empty(read.shape, device=read.device)
            s = kernels.gru_gates(read, weights.recurrent[2 * i], step.p, col, rh)
            pre_g = products.linear(rh, weights.recurrent[2 * i + 1])
            if gates is not None:
                gates[i] = s, pre_g
        grad_pre = None if grads is None else self._half_projection(step.slot[0], i)
        grad_z, _, grad_g = (None,) * 3 if grads is None else grad_pre.split(self.half, 1)
        prev_float = torch.empty(read.shape, device=read.device) if i == 1 else None
        kernels.gru_reverse(step.sweep.buffer if step.pop else None, ints[i], pre_g, step.p, col + 2 * self.half, s,
                            step.mask, self.limit, restore, step.prevs[i],
                            None if grads is None else grads[i], grad_z, grad_g, prev_float, grad_out)
        ints[i] = step.prevs[i]
        if grads is not None:
            kernels.gru_read_grad(grad_pre, weights.recurrent[2 * i], weights.recurrent[2 * i + 1], read, s,
                                  grads[1 - i], step.slot[1][2 * i: 2 * i + 2])
        return prev_float

    def forward_diff(self, p, prev_f, new_state, mask):
        h = list(prev_f.split(self.half, 1))
        exact = self._split(new_state)
        update = self._update(None, mask, None)
        for i in (0, 1):
            h[i] = update.diff(h[i], *self._gates(i, p, h[1 - i]), exact[i])
        return torch.cat(h, 1)
