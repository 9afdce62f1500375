"""A cell's weights for one sweep, and the recurrent weight gradients of its reverse steps.

Both exist because a sweep multiplies by the same weights at every step: :class:`SweepWeights` lays
them out once for the products (:mod:`revnmt.rnn.products`), :class:`RecurrentGrads` turns a chunk of
steps' small weight-gradient products into one. Neither is seen by autograd: their bytes are
counted by the memory accounting (``held_bytes``).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from .. import products


class CellLayout(Protocol):
    """What the sweep's weights need of a cell: its sizes and Linears (:class:`~.base.RevCell` has them)."""

    input_size: int
    half: int

    @property
    def project_width(self) -> int: ...

    def linears(self) -> list[nn.Linear]: ...

    def recurrent_weight(self, lin: nn.Linear) -> torch.Tensor: ...

    def input_weights(self) -> tuple[torch.Tensor, torch.Tensor]: ...

    def project(self, x: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor: ...


def _grad_of(param: nn.Parameter) -> torch.Tensor:
    """``param.grad``, created as zeros on first use: the backward sweep accumulates into it by hand."""
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    return param.grad


class SweepWeights:
    """A cell's weights for the length of one sweep, laid out once for its products (:mod:`.products`).

    A sweep multiplies by the same weights at every step, so they are copied into the layouts the
    products want once per sweep, not sliced per step: the Linears' input columns and biases
    concatenated (a projection, :meth:`project`, is one product) and each Linear's recurrent columns
    contiguous (``recurrent``, in :meth:`RevCell.linears` order: oneDNN is far slower on a column
    slice, not on a transpose, which the backward's products use). In a backward sweep (``grads``) the
    gradients of the input columns and biases collect in one weight-sized tensor per sweep: a
    projection's backward is then three products, not four per Linear, and the Linears' ``.grad``
    get the sum once, at :meth:`flush`. Held memory: :meth:`held_bytes`.

    Forward and reverse multiply by copies of the same values, so their products are the same bits.
    """

    def __init__(self, cell: CellLayout, grads: bool = False) -> None:
        self.cell = cell
        with torch.no_grad():
            self.weight, self.bias = cell.input_weights()
            self.recurrent = [cell.recurrent_weight(lin).contiguous() for lin in cell.linears()]
        self.grad_weight = torch.zeros_like(self.weight) if grads else None
        self.grad_bias = torch.zeros_like(self.bias) if grads else None
        self._ones: torch.Tensor | None = None  # the bias gradient is grad^T · ones: one product, no sum + add

    @staticmethod
    def held_bytes(cell: CellLayout, grads: bool) -> int:
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
        for lin in self.cell.linears():
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

    def __init__(self, cell: CellLayout, batch: int, steps: int, device: torch.device,
                 shared: RecurrentGrads | None = None) -> None:
        self.cell, self.steps, self.count = cell, steps, 0
        if shared is not None:  # another layer's chunk tensors (see for_layers)
            self.grad_pre, self.inputs = shared.grad_pre, shared.inputs
            return
        self.grad_pre = torch.empty(steps, batch, cell.project_width, device=device)
        # Linear-major, so that a step's input slot and a Linear's chunk of steps are both contiguous.
        self.inputs = torch.empty(len(cell.linears()), steps, batch, cell.half, device=device)

    @classmethod
    def for_layers(cls, cells: list[CellLayout], batch: int, steps: int, device: torch.device) -> list[RecurrentGrads]:
        """One collector per layer of a stack. With chunks of one step a layer's slots go to its weights at the end
        of each of its reverse steps, before another layer's step fills them, so the layers share one pair of chunk
        tensors (their shapes do not depend on a layer's input size): one layer's bytes per sentence, not one per
        layer. Longer chunks hold several steps of every layer at once, each its own."""
        first = cls(cells[0], batch, steps, device)
        return [first] + [cls(cell, batch, steps, device, first if steps == 1 else None) for cell in cells[1:]]

    @staticmethod
    def held_bytes(cell: CellLayout, batch: int, steps: int, layers: int = 1) -> int:
        """Bytes of the chunk tensors of ``layers`` layers' collectors made by :meth:`for_layers` (memory
        accounting)."""
        chunks = 1 if steps == 1 else layers
        return chunks * steps * batch * (cell.project_width + len(cell.linears()) * cell.half) * 4

    def next_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next step's slots: d loss / d projection [B, gate columns] and the recurrent inputs
        [linears, B, half], one per Linear in :meth:`RevCell.linears` order.

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
        for k, lin in enumerate(cell.linears()):
            g = self.grad_pre[:n, :, start: start + lin.out_features].reshape(-1, lin.out_features)
            x = self.inputs[k, :n].reshape(-1, cell.half)
            products.accumulate(_grad_of(lin.weight)[:, cell.input_size:], g.t(), x.t())
            start += lin.out_features
        self.count = 0
