"""The reverse step's gate products must read fresh tensors, not the slots of the weight-gradient chunk.

A reverse step recomputes the forward's gates to decode the buffer, so every product that feeds a gate must
round as the forward's did. The forward multiplies fresh tensors, which torch aligns to 64 bytes. The reverse
also files each step's recurrent inputs (h_j, and r·h_j for RevGRU) into the slots of the recurrent weight
gradients' chunk (``RecurrentGrads.next_step``), and with an odd batch size a slot lies off the 64-byte grid. A
CPU BLAS may round a product of such data differently (Intel's MKL user guide, "Aligning Data for Consistent
Results"), so a build whose reverse products read the slots fails its exactness check. The products read fresh
tensors, which the fused kernels (``lstm_reverse``, ``gru_read_grad``) copy into the slots as they go. These tests
fail if that is undone (docs/reliability.md, "Alignment").

On most machines the BLAS as it is hides the hazard: oneDNN's linear (``products.linear``) never depended on
alignment here, nor MKL on its AVX2/AVX-512 code; MKL held to its SSE4.2 code does, for matrix-vector products
(one row). Hence two tests:

- :func:`test_reversal_is_exact_when_misaligned_products_round_differently` (any machine, in process): the products
  run under :class:`_MisalignedRowsRoundUp`, a BLAS that rounds a product of misaligned rows up; the reversal must
  stay exact. Every gate of a build that multiplies a slot is then off, so such a build fails at once.
- :func:`test_reversal_is_exact_on_mkls_sse_code` (where MKL is the BLAS): in a subprocess, MKL held to its SSE4.2
  code, batch 1 and oneDNN off; skipped, with the reason, where a product of a slot rounds as a fresh one there.
  Only some gates can differ, so it runs several sequences to catch a broken build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from revnmt.rnn import ReversibleRNN, TensorInput, products
from revnmt.rnn.cells import RecurrentGrads

_STEP_BACKENDS = ["numba", "torch"]  # the numba kernels' products are oneDNN's, the torch reference's torch.mm
_ALIGN = 64  # bytes: torch's CPU allocations start on this grid

_PRODUCTS = {  # the products a sweep calls, with the position of the rows operand (the step's input)
    torch.ops.aten.mm.default: 0,
    torch.ops.aten.addmm.default: 1,
    torch.ops.aten.addmm_.default: 1,
}
if hasattr(torch.ops.mkldnn, "_linear_pointwise"):
    _PRODUCTS[torch.ops.mkldnn._linear_pointwise.default] = 0


class _MisalignedRowsRoundUp(TorchDispatchMode):
    """A BLAS whose result depends on where the data lies: a product whose rows do not start on the 64-byte grid
    comes out a little larger, as a real one may round such a product differently. By 2^-16 of itself, more than a
    real one's ulp or so: then every gate computed from it is off the forward's, not only those that happen to
    round across a step of the fixed point, and a build that multiplies a slot fails with any data (20 seeds tried).
    Deterministic: the same product of the same data gives the same bits every time, as exact reversal needs."""

    def __init__(self) -> None:
        super().__init__()
        self.misaligned = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        rows = _PRODUCTS.get(func)
        if rows is not None and args[rows].data_ptr() % _ALIGN:
            self.misaligned += 1
            out.mul_(1 + 2 ** -16)
        return out


def _misaligned_slots(cell: str, batch: int, hidden: int, steps: int) -> list[torch.Tensor]:
    """The recurrent-input slots of a weight-gradient chunk of ``steps`` steps that are off the 64-byte grid."""
    collect = RecurrentGrads(ReversibleRNN(cell, 4, hidden).cells[0], batch, steps, torch.device("cpu"))
    slots = [collect.inputs[k, s] for k in range(collect.inputs.shape[0]) for s in range(steps)]
    return [slot for slot in slots if slot.data_ptr() % _ALIGN]


@pytest.mark.parametrize("backend", _STEP_BACKENDS)
def test_emulated_blas_rounds_a_slot_product_differently(backend: str) -> None:
    # The premise, for the products each backend's gates use: under the emulated BLAS a product of a misaligned
    # slot differs from the same product of a fresh copy (else the reversal test below would have no teeth).
    torch.manual_seed(0)
    slot = _misaligned_slots("revgru", 3, 10, 4)[0]
    slot.copy_(torch.randn(slot.shape))
    weight = torch.randn(10, 5)
    product = (lambda x: products.linear(x, weight)) if backend == "numba" else (lambda x: torch.mm(x, weight.t()))
    with _MisalignedRowsRoundUp():
        assert torch.equal(product(slot.clone()), product(slot.clone()))  # deterministic
        assert not torch.equal(product(slot), product(slot.clone()))


@pytest.mark.parametrize("batch", [3, 5])  # odd: the chunk's slots fall off the 64-byte grid
@pytest.mark.parametrize("backend", _STEP_BACKENDS)
@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_reversal_is_exact_when_misaligned_products_round_differently(cell: str, backend: str, batch: int) -> None:
    """Forward and backward sweep under a BLAS that rounds misaligned rows differently: the reverse's gate products
    read fresh tensors, as the forward's did, so the reconstruction stays exact. A build whose reverse multiplies
    the weight-gradient slots (misaligned for these sizes) raises ReversalError here."""
    hidden, steps = 10, 12
    torch.manual_seed(0)
    rnn = ReversibleRNN(cell, 6, hidden, num_layers=2, slice_dim=3, buffer_lanes=2, buffer_backend=backend)
    chunk = rnn.backend_on(torch.device("cpu")).weight_grad_steps
    assert _misaligned_slots(cell, batch, hidden, chunk)  # a build that multiplied the slots would be caught
    x = torch.randn(steps, batch, 6)
    mask = torch.arange(steps)[:, None] < torch.tensor([steps] + [steps - 4] * (batch - 1))[None]
    start = [torch.randint(-(1 << 22), 1 << 22, (batch, rnn.state_size), dtype=torch.int32) for _ in range(2)]
    inputs = TensorInput(x)
    with _MisalignedRowsRoundUp() as blas:
        tape = rnn.forward_sweep(inputs, mask, initial=start)
        rnn.backward_sweep(tape, inputs, grad_final=[torch.randn(batch, rnn.state_size) for _ in range(2)],
                           slice_grad=torch.randn(steps, batch, 3))  # raises ReversalError unless exact
    assert blas.misaligned  # the emulation was in play (the backward's gradient products read the slots)
    assert all(torch.equal(s, i) for s, i in zip(tape.states, start)) and tape.buffer.is_empty()


# In a subprocess: MKL reads MKL_ENABLE_INSTRUCTIONS when it loads. Prints a JSON object: "premise" (a product of a
# misaligned slot differs from the same product of a fresh copy), "errors" by cell and backend (None: exact).
_MKL_SSE = r"""
import json
import torch
from revnmt.rnn import ReversalError, ReversibleRNN, TensorInput, products
from revnmt.rnn.cells import RecurrentGrads

torch.set_num_threads(2)  # MKL splits the columns into a panel per thread: each panel's last columns can differ
HIDDEN = {"revgru": 30, "revlstm": 300}
# Sequences per cell and backend: enough to catch a broken build with a margin, as a broken build fails some
# sequences only (few of RevLSTM's gates can differ; RevGRU on the torch backend reads only h_j from a slot).
SEQUENCES = {("revgru", "numba"): 3, ("revgru", "torch"): 10, ("revlstm", "numba"): 12, ("revlstm", "torch"): 5}
STEPS, BATCH = 100, 1  # one row: MKL's matrix-vector product, the one its SSE code rounds by alignment


def premise(cell, hidden):
    torch.manual_seed(0)
    rnn = ReversibleRNN(cell, 8, hidden)
    lin = rnn.cells[0].linears()[-1]
    weight = lin.weight[:, 8:].contiguous()
    slot = RecurrentGrads(rnn.cells[0], BATCH, 1, torch.device("cpu")).inputs[1, 0]  # the second Linear's:
    assert slot.data_ptr() % 16  # hidden / 2 floats past the start, off MKL's 16-byte grid for these sizes
    for _ in range(20):
        x = torch.randn(slot.shape) / 2
        slot.copy_(x)
        if not (torch.equal(products.linear(slot, weight), products.linear(x, weight))
                and torch.equal(torch.mm(slot, lin.weight[:, 8:].t()), torch.mm(x, lin.weight[:, 8:].t()))):
            return True
    return False


def reversal(cell, backend, hidden, sequences):
    for seed in range(sequences):
        torch.manual_seed(seed)
        rnn = ReversibleRNN(cell, 8, hidden, buffer_backend=backend)
        inputs = TensorInput(torch.randn(STEPS, BATCH, 8))
        tape = rnn.forward_sweep(inputs, torch.ones(STEPS, BATCH, dtype=torch.bool))
        try:
            rnn.backward_sweep(tape, inputs, grad_final=[torch.randn(BATCH, rnn.state_size)])
        except ReversalError as err:
            return f"sequence {seed}: {err}"
    return None


with torch.backends.mkldnn.flags(enabled=False):  # the numba backend's products on MKL too
    result = {"premise": all(premise(cell, hidden) for cell, hidden in HIDDEN.items()), "errors": {}}
    if result["premise"]:
        for (cell, backend), sequences in SEQUENCES.items():
            result["errors"][f"{cell}-{backend}"] = reversal(cell, backend, HIDDEN[cell], sequences)
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def mkl_sse() -> dict:
    """The subprocess's result (see ``_MKL_SSE``)."""
    env = dict(os.environ, MKL_ENABLE_INSTRUCTIONS="SSE4_2")
    root = str(Path(__file__).resolve().parents[3])  # where the revnmt and buffers packages are
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", _MKL_SSE], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("backend", _STEP_BACKENDS)
@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_reversal_is_exact_on_mkls_sse_code(mkl_sse: dict, cell: str, backend: str) -> None:
    """Batch 1 on MKL's SSE4.2 code, which rounds a product of a misaligned row differently: the reversal stays
    exact (each backend, oneDNN off). Skipped where that code rounds a slot's product as a fresh one's."""
    if not mkl_sse["premise"]:
        pytest.skip("a product of a misaligned slot rounds as one of a fresh tensor on this BLAS (MKL held to "
                    "SSE4.2, batch 1): nothing to catch here; the emulated test still runs")
    assert mkl_sse["errors"][f"{cell}-{backend}"] is None
