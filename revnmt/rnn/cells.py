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
  (``restore``), as in the paper. It is two operations in one pass, each also available alone:
  ``reverse_int`` (pop only, no gradients) and ``backward_step`` (the derivative given both exact
  states, no buffer), for a caller that pops a chunk of steps before differentiating them.
- ``forward_diff``: with grad, from float leaves of the previous state; its value is the exact
  next state and its gradient the real-valued derivative of z·h + u (with dz* treated as dz),
  the gradient ``reverse_diff`` computes by hand. Ordinary backprop (the reference that the
  hand-written derivatives are tested against) runs all steps of it through autograd.

States are int32 tensors [B, state_size]: GRU [h1 | h2], LSTM [h1 | h2 | c1 | c2].

With a buffer whose backend has fused kernels (numba on CPU, triton on CUDA: :mod:`revnmt.rnn.kernels`),
``forward_int`` and the reverse steps run each half as its matrix products (:func:`.products.linear`, with
the sweep's copies of the weights, :class:`SweepWeights`) and one compiled loop (or Triton kernel) per
elementwise stretch; the torch code here is the reference they implement (and what the torch backend and
inference run, multiplying with ``torch.mm``).
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

from . import products
from .kernels import StepKernels, step_kernels

#: The gate values a fused reverse half computed before its kernel, by half: RevGRU's σ of [z | r] and g's
#: product, RevLSTM's gates' product (``project_width`` floats per row for both halves). ``reverse_int`` fills
#: it and ``backward_step`` of the same step takes it: the same values, so the same bits, without the
#: products again. The torch reference recomputes and ignores it.
HalfGates = dict[int, tuple[torch.Tensor, ...]]


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
    #: set, which autograd never sees since the step is differentiated by hand. The bound covers the
    #: torch reference's peak and the fused kernels' (their numpy scratch included);
    #: tests/revnmt/rnn/test_saved_memory.py checks it for both.
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
        """The float output [h1 | h2] of an int state [..., state_size] (what the next layer and attention see)."""
        return to_float(state[..., : self.hidden_size])

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

    def input_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every Linear's input columns and bias, concatenated in :meth:`_linears` order: the weight
        [gate columns, input] and bias [gate columns] of :meth:`project` (differentiable copies)."""
        linears = self._linears()
        return (torch.cat([lin.weight[:, : self.input_size] for lin in linears]),
                torch.cat([lin.bias for lin in linears]))

    def project(self, x: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The input's part of every gate pre-activation of both halves, biases included:
        [..., input] -> [..., gate columns of half 1 | of half 2], one product with
        :meth:`input_weights` (or ``weights``, the same concatenated once for a sweep: :class:`SweepWeights`).

        The step functions take this instead of x: the recurrent part is all that must be
        computed step by step, and ``ReversibleRNN`` projects known inputs for several steps in
        one matrix product. Forward and reverse must use the same projection values (the same
        call on the same data), or a gate could differ by an ulp and the reverse go wrong.
        """
        return products.linear(x, *(self.input_weights() if weights is None else weights))

    def _recurrent(self, lin: nn.Linear, p: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The pre-activation of ``lin`` on [x; h], from x's projection ``p``."""
        # mm, then add: addmm would first copy ``p``, a column slice of the projection.
        return torch.mm(h, lin.weight[:, self.input_size:].t()) + p

    def _half_projection(self, p: torch.Tensor, i: int) -> torch.Tensor:
        return p.chunk(2, 1)[i]

    def _half_start(self, i: int) -> int:
        """The first column of half i's gates in a projection (:meth:`_half_projection`)."""
        return i * self.project_width // 2

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

    def _recurrent_weight(self, lin: nn.Linear) -> torch.Tensor:
        """The recurrent columns of ``lin``'s weight, [out, half] (a view)."""
        return lin.weight[:, self.input_size:]

    def forward_int(self, p: torch.Tensor, state: torch.Tensor, buf: InformationBuffer | None, mask: torch.Tensor,
                    guard: OverflowGuard | None = None, stored: int = 0, weights: SweepWeights | None = None
                    ) -> torch.Tensor:
        """One step on the int ``state`` from the projection ``p``: with a buffer, pushing what it forgets
        (training); without, dropping it (inference, range errors to ``guard``). The first ``stored``
        output columns skip the buffer. ``weights``: the sweep's (:class:`SweepWeights`; made here if None)."""
        kernels = None if buf is None else step_kernels(buf.backend.name)
        if kernels is None:
            return self._forward_reference(p, state, buf, mask, guard, stored)
        with torch.no_grad():
            return self._forward_fused(kernels, SweepWeights(self) if weights is None else weights, p, state, buf,
                                       mask, stored)

    @torch.no_grad()
    def reverse_diff(self, p: torch.Tensor, state: torch.Tensor, grad: torch.Tensor, buf: InformationBuffer,
                     mask: torch.Tensor, restore: torch.Tensor | None = None, weights: SweepWeights | None = None,
                     collect: RecurrentGrads | None = None, grad_out: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of training by reversal: undo the step that produced ``state`` and backpropagate it.

        ``grad`` is d loss / d ``state`` (real values), updated in place into d loss / d previous state (a
        copy per step would be one more launch on a GPU); ``grad_out``, d loss / d the step's output
        (:meth:`output`) from outside the layer, is added to it (by the fused kernels as they read it).
        Returns the exact previous int state, d loss / d previous state (``grad``) and d loss / d ``p``;
        recurrent weight gradients accumulate in
        ``.grad`` (through ``collect``, a chunk of steps per product, else at once; d loss / d ``p`` is
        then a view into the chunk, overwritten a chunk of steps later). ``weights``: the sweep's
        (:class:`SweepWeights`), those of the forward sweep's :meth:`forward_int`. The gates that
        decode the buffer are computed once and differentiated by hand (the derivative of
        :meth:`_Group.surrogate` through the gates, what ``forward_diff`` gives autograd): a per-step
        autograd graph cost more than the step's arithmetic. Half 2 is undone first, from the new
        h1; its gradient on h1 joins ``grad`` before half 1 is backpropagated. It is
        :meth:`reverse_int` and :meth:`backward_step` in one pass, with the gates computed once.
        """
        return self._reverse(p, state, buf, mask, restore, None, grad, weights, collect, buf.backend.name,
                             grad_out=grad_out)

    @torch.no_grad()
    def reverse_int(self, p: torch.Tensor, state: torch.Tensor, buf: InformationBuffer, mask: torch.Tensor,
                    restore: torch.Tensor | None = None, weights: SweepWeights | None = None,
                    gates: HalfGates | None = None) -> torch.Tensor:
        """Undo the step that produced ``state``: pop the buffer to the exact previous int state, no gradients.
        ``gates``: filled with the fused kernels' gate values, for :meth:`backward_step` of the same step."""
        return self._reverse(p, state, buf, mask, restore, None, None, weights, None, buf.backend.name, gates)[0]

    @torch.no_grad()
    def backward_step(self, p: torch.Tensor, prev: torch.Tensor, state: torch.Tensor, grad: torch.Tensor,
                      mask: torch.Tensor, backend: str = "torch", weights: SweepWeights | None = None,
                      collect: RecurrentGrads | None = None, gates: HalfGates | None = None,
                      grad_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Backpropagate the step ``prev`` → ``state`` (both exact int states; no buffer): returns
        d loss / d ``prev`` (``grad``, updated in place as in :meth:`reverse_diff`) and d loss / d ``p`` from
        ``grad`` = d loss / d ``state`` (and ``grad_out``), recurrent weight gradients accumulating as in
        :meth:`reverse_diff`.
        ``backend`` (a resolved buffer backend name, ``buf.backend.name``) picks the gate code, so that the
        gradients are those of :meth:`reverse_diff`; ``gates``, those :meth:`reverse_int` kept of this step,
        spare recomputing them."""
        _, grad_prev, grad_p = self._reverse(p, state, None, mask, None, prev, grad, weights, collect, backend, gates,
                                             grad_out)
        return grad_prev, grad_p

    def _reverse(self, p, state, buf, mask, restore, prev, grad, weights, collect, backend, gates=None,
                 grad_out=None):
        """The reverse step: pop from ``buf`` (``prev`` None) or take ``prev``, and backpropagate (``grad`` given).

        The halves are popped into the views of one new state and their gradients updated in place in
        views of ``grad`` (on a GPU every concatenation would be a launch). With fused kernels, the first
        half's kernel also writes the float copy of its previous h, which the second half reads."""
        kernels = step_kernels(backend)
        ints = self._split(state)
        popped = torch.empty_like(state) if prev is None else None
        prevs = self._split(prev if popped is None else popped)
        grads = None if grad is None else self._split(grad)
        if grads is not None and collect is None:
            collect = RecurrentGrads(self, p.shape[0], 1, p.device)
        slot = None if grads is None else collect.next_step()
        if kernels is not None and weights is None:
            weights = SweepWeights(self)
        if kernels is None and grad_out is not None:
            grad[:, : self.hidden_size].add_(grad_out)
        read = None
        for i in (1, 0):
            if kernels is None:
                self._reverse_half(i, p, ints, grads, self._group(buf, mask, None), self._restore(i, restore),
                                   prevs, slot)
            else:
                extra = None if grad_out is None else grad_out[:, i * self.half: (i + 1) * self.half]
                read = self._reverse_half_fused(kernels, weights, i, p, ints, grads, buf, mask,
                                                self._restore(i, restore), prevs, slot, read, gates, extra)
        if grads is not None:
            collect.step_done()
        return popped, grad, None if slot is None else slot[0]


class SweepWeights:
    """A cell's weights for the length of one sweep, laid out once for its products (:mod:`.products`).

    A sweep multiplies by the same weights at every step, so they are copied into the layouts the
    products want once per sweep, not sliced per step: the Linears' input columns and biases
    concatenated (a projection, :meth:`project`, is one product) and each Linear's recurrent columns
    contiguous (``recurrent``, in :meth:`RevCell._linears` order: oneDNN is far slower on a column
    slice, not on a transpose, which the backward's products use). In a backward sweep (``grads``) the
    gradients of the input columns and biases collect in one weight-sized tensor per sweep: a
    projection's backward is then three products, not four per Linear, and the Linears' ``.grad``
    get the sum once, at :meth:`flush`. Held memory: :meth:`held_bytes`.

    Forward and reverse multiply by copies of the same values, so their products are the same bits.
    """

    def __init__(self, cell: RevCell, grads: bool = False) -> None:
        self.cell = cell
        with torch.no_grad():
            self.weight, self.bias = cell.input_weights()
            self.recurrent = [cell._recurrent_weight(lin).contiguous() for lin in cell._linears()]
        self.grad_weight = torch.zeros_like(self.weight) if grads else None
        self.grad_bias = torch.zeros_like(self.bias) if grads else None
        self._ones: torch.Tensor | None = None  # the bias gradient is grad^T · ones: one product, no sum + add

    @staticmethod
    def held_bytes(cell: RevCell, grads: bool) -> int:
        """Bytes of the copies (and the input gradients, with ``grads``): memory accounting."""
        width = cell.project_width
        return ((1 + grads) * width * (cell.input_size + 1) + width * cell.half) * 4

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """``cell.project(x)`` with the sweep's weights: the same values, bit for bit."""
        return self.cell.project(x, (self.weight, self.bias))

    @torch.no_grad()
    def backward(self, x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """Backpropagate :meth:`project` by hand: collect the weights' gradients and return d loss / d x.
        (Autograd through the weight views would build a zero gradient of every whole weight, per call.)"""
        x2, grad2 = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        if self._ones is None or len(self._ones) < len(grad2):
            self._ones = torch.ones(len(grad2), device=grad2.device)
        products.accumulate(self.grad_weight, grad2.t(), x2.t())
        self.grad_bias.addmv_(grad2.t(), self._ones[: len(grad2)])
        return products.linear(grad2, self.weight.t()).view_as(x)

    @torch.no_grad()
    def flush(self) -> None:
        """Add the collected gradients to the Linears' ``.grad``."""
        start = 0
        for lin in self.cell._linears():
            stop = start + lin.out_features
            _grad_of(lin.weight)[:, : self.cell.input_size].add_(self.grad_weight[start:stop])
            _grad_of(lin.bias).add_(self.grad_bias[start:stop])
            start = stop


class RecurrentGrads:
    """The recurrent weight gradients of a cell's reverse steps, a chunk of steps per product.

    Per step and Linear, the weight gradient is grad_pre^T · input (input = h_j, or r·h_j for RevGRU's
    g): a [gates, B] x [B, half] product per step is small (on a GPU, launch-bound). The steps' pre-activation
    gradients (which are also d loss / d projection) and inputs are written into slots of two
    [steps, B, ...] tensors instead, and every ``steps`` steps (and at :meth:`flush`) each weight gets
    one product over all of them, as layer 0's input projections do. Held memory: :meth:`held_bytes`.
    """

    def __init__(self, cell: RevCell, batch: int, steps: int, device: torch.device) -> None:
        self.cell, self.steps, self.count = cell, steps, 0
        self.grad_pre = torch.empty(steps, batch, cell.project_width, device=device)
        # Linear-major, so that a step's input slot and a Linear's chunk of steps are both contiguous.
        self.inputs = torch.empty(len(cell._linears()), steps, batch, cell.half, device=device)

    @staticmethod
    def held_bytes(cell: RevCell, batch: int, steps: int) -> int:
        """Bytes of the two chunk tensors (memory accounting)."""
        return steps * batch * (cell.project_width + len(cell._linears()) * cell.half) * 4

    def next_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next step's slots: d loss / d projection [B, gate columns] and the recurrent inputs
        [linears, B, half], one per Linear in :meth:`RevCell._linears` order.

        The reverse step's products read fresh tensors, copied here after (by the fused kernels, as they
        go): a slot lies inside the chunk tensor, not aligned as a fresh allocation is, and a CPU BLAS may
        round a product of misaligned data differently. The gates decoded from it would then not be the
        forward's, and the reverse would fail (a budget probe with an odd batch size did)."""
        return self.grad_pre[self.count], self.inputs[:, self.count]

    def step_done(self) -> None:
        """The slots of :meth:`next_step` are filled; a full chunk goes to the weights."""
        self.count += 1
        if self.count == self.steps:
            self.flush()

    @torch.no_grad()
    def flush(self) -> None:
        """Accumulate the collected steps into the recurrent weights' ``.grad``."""
        if not self.count:
            return
        cell, n = self.cell, self.count
        start = 0
        for k, lin in enumerate(cell._linears()):
            g = self.grad_pre[:n, :, start: start + lin.out_features].reshape(-1, lin.out_features)
            x = self.inputs[k, :n].reshape(-1, cell.half)
            products.accumulate(_grad_of(lin.weight)[:, cell.input_size:], g.t(), x.t())
            start += lin.out_features
        self.count = 0


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

    def _forward_reference(self, p, state, buf, mask, guard, stored) -> torch.Tensor:
        h = self._split(state)
        grp = self._group(buf, mask, guard)
        for i in (0, 1):
            h[i] = grp.push(h[i], *self._gates(i, p, to_float(h[1 - i])), self._stored(i, stored))
        return torch.cat(h, 1)

    def _forward_fused(self, kernels: StepKernels, weights: SweepWeights, p, state, buf, mask, stored) -> torch.Tensor:
        """Per half the gates kernel (with the z, r product), the g product and the update kernel (which also
        makes the float copy the next half reads)."""
        h, out = self._split(state), torch.empty_like(state)
        read = h[1]  # the int state: the gates kernel converts it
        for i, new in zip((0, 1), self._split(out)):
            col = self._half_start(i)
            rh = torch.empty(read.shape, device=read.device)
            s = kernels.gru_gates(read, weights.recurrent[2 * i], p, col, rh)
            read = kernels.gru_push(buf, h[i], products.linear(rh, weights.recurrent[2 * i + 1]), p,
                                    col + 2 * self.half, s, mask, self._stored(i, stored), self.max_forget_bits, new)
        return out

    def _reverse_half(self, i, p, ints, grads, grp, restore, prevs, slot):
        """Undo h_i in ``ints``: pop it into ``prevs[i]`` (with a buffer; without, ``prevs[i]`` is given);
        with ``grads``, turn ``grads[i]`` into its gradient, add d loss / d h_j into ``grads[1 - i]`` (both
        in place) and fill the step's slots (:meth:`RecurrentGrads.next_step`) with half i's gate
        gradients and inputs."""
        read = to_float(ints[1 - i])
        acts = self._activations(i, p, read)
        sz, r, rh, g = acts
        z, u = self._terms(acts)
        if grp.buf is not None:
            prevs[i].copy_(grp.pop(ints[i], z, u, restore))
        ints[i] = prevs[i]
        if grads is None:
            return
        slot[1][2 * i].copy_(read)
        slot[1][2 * i + 1].copy_(rh)
        grad_prev, grad_z, grad_u = grp.backward(to_float(ints[i]), z, grads[i])
        grads[i].copy_(grad_prev)
        grad_pre = self._half_projection(slot[0], i)
        grad_pre_z, grad_pre_r, grad_pre_g = grad_pre.split(self.half, 1)
        torch.mul(grad_u * (1 - z), 1 - g * g, out=grad_pre_g)
        grad_rh = torch.mm(grad_pre_g, self._recurrent_weight(self.g[i]))
        torch.mul((grad_z - grad_u * g) * self._slope * sz, 1 - sz, out=grad_pre_z)
        torch.mul(grad_rh * read * r, 1 - r, out=grad_pre_r)
        grads[1 - i].add_(torch.mm(grad_pre[:, : 2 * self.half], self._recurrent_weight(self.zr[i]))).add_(grad_rh * r)

    def _reverse_half_fused(self, kernels: StepKernels, weights: SweepWeights, i, p, ints, grads, buf, mask,
                            restore, prevs, slot, read, gates, extra):
        """:meth:`_reverse_half` by fused kernels, from ``read`` (the float h_j, or None: the int state, which the
        kernels convert); the gates come from ``gates`` where it has them (and go there where it lacks them);
        ``extra``: d loss / d the new h_i from outside, or None. Returns the float copy of the previous h_i for
        half 1, which half 0 reads."""
        read = ints[1 - i] if read is None else read
        col = self._half_start(i)
        if gates is not None and i in gates:
            s, pre_g = gates[i]
        else:
            rh = torch.empty(read.shape, device=read.device)
            s = kernels.gru_gates(read, weights.recurrent[2 * i], p, col, rh)
            pre_g = products.linear(rh, weights.recurrent[2 * i + 1])
            if gates is not None:
                gates[i] = s, pre_g
        grad_pre = None if grads is None else self._half_projection(slot[0], i)
        grad_z, _, grad_g = (None,) * 3 if grads is None else grad_pre.split(self.half, 1)
        prev_float = torch.empty(read.shape, device=read.device) if i == 1 else None
        kernels.gru_reverse(buf, ints[i], pre_g, p, col + 2 * self.half, s, mask, self.max_forget_bits, restore,
                            prevs[i], None if grads is None else grads[i], grad_z, grad_g, prev_float, extra)
        ints[i] = prevs[i]
        if grads is not None:
            kernels.gru_read_grad(grad_pre, weights.recurrent[2 * i], weights.recurrent[2 * i + 1], read, s,
                                  grads[1 - i], slot[1][2 * i: 2 * i + 2])
        return prev_float

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

    def _forward_reference(self, proj, state, buf, mask, guard, stored) -> torch.Tensor:
        h1, h2, c1, c2 = self._split(state)
        h, c = [h1, h2], [c1, c2]
        grp = self._group(buf, mask, guard)
        for i in (0, 1):
            f, ig, o, p = self._gates(i, proj, to_float(h[1 - i]))
            c[i] = grp.push(c[i], f, ig)
            h[i] = grp.push(h[i], p, o * torch.tanh(to_float(c[i])), self._stored(i, stored))
        return torch.cat(h + c, 1)

    def _forward_fused(self, kernels: StepKernels, weights: SweepWeights, proj, state, buf, mask, stored
                       ) -> torch.Tensor:
        """Per half one product and one kernel."""
        ints, out = self._split(state), torch.empty_like(state)
        new = self._split(out)
        read = to_float(ints[1])
        for i in (0, 1):
            pre = products.linear(read, weights.recurrent[i])
            read = kernels.lstm_push(buf, ints[i], ints[2 + i], pre, proj, self._half_start(i), mask,
                                     self._stored(i, stored), self.max_forget_bits, new[i], new[2 + i])
        return out

    def _reverse_half(self, i, proj, ints, grads, grp, restore, prevs, slot):
        """Pop h_i, then c_i, in ``ints`` (state columns [h1 | h2 | c1 | c2]) and turn their gradients
        into the previous values'; see RevGRUCell."""
        h, c = i, 2 + i
        read = to_float(ints[1 - i])
        acts = self._activations(i, proj, read)
        sf, g, ig, o, sp = acts
        f, u_c, _, p = self._terms(acts)
        tc = torch.tanh(to_float(ints[c]))  # of the new cell, which the new h_i was made from
        if grp.buf is not None:
            prevs[h].copy_(grp.pop(ints[h], p, o * tc, restore))
            prevs[c].copy_(grp.pop(ints[c], f, u_c))
        ints[h], ints[c] = prevs[h], prevs[c]
        if grads is None:
            return
        slot[1][i].copy_(read)
        grad_pre = self._half_projection(slot[0], i)
        grad_h, grad_p, grad_uh = grp.backward(to_float(ints[h]), p, grads[h])
        grad_c, grad_f, grad_uc = grp.backward(to_float(ints[c]), f, grads[c] + grad_uh * o * (1 - tc * tc))
        grads[h].copy_(grad_h)
        grads[c].copy_(grad_c)
        out_f, out_g, out_i, out_o, out_p = grad_pre.chunk(5, 1)
        torch.mul(grad_f * self._slope * sf, 1 - sf, out=out_f)
        torch.mul(grad_uc * ig, 1 - g * g, out=out_g)
        torch.mul(grad_uc * g * ig, 1 - ig, out=out_i)
        torch.mul(grad_uh * tc * o, 1 - o, out=out_o)
        torch.mul(grad_p * self._slope * sp, 1 - sp, out=out_p)
        grads[1 - i].add_(torch.mm(grad_pre, self._recurrent_weight(self.gates[i])))

    def _reverse_half_fused(self, kernels: StepKernels, weights: SweepWeights, i, proj, ints, grads, buf, mask,
                            restore, prevs, slot, read, gates, extra):
        """:meth:`_reverse_half` by one product and one fused kernel (see RevGRUCell; the gates kept are the
        product)."""
        h, c = i, 2 + i
        read = to_float(ints[1 - i]) if read is None else read
        if gates is not None and i in gates:
            (pre,) = gates[i]
        else:
            pre = products.linear(read, weights.recurrent[i])
            if gates is not None:
                gates[i] = (pre,)
        grad = None if grads is None else (grads[h], grads[c])
        grad_pre = None if grads is None else self._half_projection(slot[0], i)
        prev_float = torch.empty_like(read) if i == 1 else None
        kernels.lstm_reverse(buf, ints[h], ints[c], pre, proj, self._half_start(i), mask, self.max_forget_bits, restore,
                             (prevs[h], prevs[c]), grad, grad_pre, read, None if slot is None else slot[1][i],
                             prev_float, extra)
        ints[h], ints[c] = prevs[h], prevs[c]
        if grads is not None:
            products.accumulate(grads[1 - i], grad_pre, weights.recurrent[i].t())
        return prev_float

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
