"""Kernel launches counted without a GPU: the ATen ops a piece of code dispatches and the Triton kernels it runs
(:class:`LaunchCounter`), and a reversible layer's launches per time step (:func:`count_kernels`).

On a GPU every launch costs the host a few microseconds whatever its size, so the launches per time step bound
how fast a sweep can be at small batches; counted on CPU tensors (Triton's interpreter), they are the same
numbers the CUDA path makes, and tests can hold them.
"""

from __future__ import annotations

from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import buffers
from revnmt.rnn import ReversibleRNN, TensorInput


class LaunchCounter(TorchDispatchMode):
    """Counts the launches of what runs inside it: the ATen ops dispatched, but views (which launch nothing)
    and ``empty*`` (allocations), and the Triton kernels run, each by its name in ``names``.

    Triton's launches do not go through torch's dispatcher, so the counter wraps ``run`` of Triton's kernel
    classes (the compiled ``JITFunction`` and the interpreter's ``InterpretedFunction``) while it is active;
    the ops the interpreter dispatches inside a run are part of that one launch."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self._in_kernel = False
        kinds = []
        if buffers.backends.triton_available():
            from triton.runtime.interpreter import InterpretedFunction
            from triton.runtime.jit import JITFunction
            kinds = [JITFunction, InterpretedFunction]
        self._patches = [mock.patch.object(kind, "run", self._counted(kind.run)) for kind in kinds]

    @property
    def count(self) -> int:
        return len(self.names)

    def _counted(self, run):
        def counted_run(kernel, *args, warmup=False, **kwargs):
            if warmup or self._in_kernel:
                return run(kernel, *args, warmup=warmup, **kwargs)
            self.names.append(kernel.fn.__name__)
            self._in_kernel = True
            try:
                return run(kernel, *args, warmup=warmup, **kwargs)
            finally:
                self._in_kernel = False
        return counted_run

    def __enter__(self):
        for patch in self._patches:
            patch.start()
        return super().__enter__()

    def __exit__(self, *exc):
        for patch in self._patches:
            patch.stop()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        returns = func._schema.returns
        view = bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
        if not (self._in_kernel or view or func.__name__.startswith("empty")):
            self.names.append(func.name())
        return func(*args, **(kwargs or {}))


def count_kernels(cell: str, backend: str, device: torch.device, batch: int = 64, hidden: int = 300,
                  steps: int = 20) -> dict:
    """Ops dispatched per time step by a forward and a reverse sweep of one reversible layer: the reverse
    as a decoder's (a gradient on every output, reversed by chunks) and as an encoder's (no output
    gradients: each step undone and backpropagated at once). The products are counted as on CUDA
    (torch's, oneDNN switched off)."""
    torch.manual_seed(0)
    x = torch.randn(steps, batch, hidden, device=device)
    w = torch.randn(steps, batch, hidden, device=device)
    mask = torch.ones(steps, batch, dtype=torch.bool, device=device)
    rev = ReversibleRNN("rev" + cell, hidden, hidden, max_forget_bits=3, buffer_backend=backend).to(device)
    new_buffer = rev.new_buffer

    def checked_as_on_cuda(*args, **kwargs):  # bad input kept on the device: no host read after every call
        buffer = new_buffer(*args, **kwargs)
        buffer.words.eager_checks = False
        return buffer

    rev.new_buffer = checked_as_on_cuda
    inputs = TensorInput(x)
    with torch.backends.mkldnn.flags(enabled=False):
        rev.backward_sweep(rev.forward_sweep(inputs, mask), inputs, output_grads=lambda s, out: w[s])  # warm-up
        with LaunchCounter() as forward:
            tape = rev.forward_sweep(inputs, mask)
        with LaunchCounter() as reverse:
            rev.backward_sweep(tape, inputs, output_grads=lambda s, out: w[s])
        tape = rev.forward_sweep(inputs, mask)
        with LaunchCounter() as encoder:
            rev.backward_sweep(tape, inputs, grad_final=[torch.randn(batch, rev.state_size, device=device)])
    return {"cell": "rev" + cell, "backend": backend, "buffer_lanes": rev.lanes_on(device),
            "forward_per_step": forward.count / steps, "reverse_per_step": reverse.count / steps,
            "reverse_encoder_per_step": encoder.count / steps}
