"""Kernel launches counted without a GPU: the ATen ops a piece of code dispatches and the Triton kernels it runs,
each Triton launch with its grid (:class:`LaunchCounter`), and a reversible layer's launches per time step
(:func:`count_kernels`).

On a GPU every launch costs the host a few microseconds whatever its size, so the launches per time step bound
how fast a sweep can be at small batches; counted on CPU tensors (Triton's interpreter), they are the same
numbers the CUDA path makes, and tests can hold them. A launch's grid (its programs) bounds how much of the GPU it
can use: one program runs on one streaming multiprocessor, so at large batches the smallest grids bound the step.
The grids depend on the shapes only, so they can be recorded without running the kernels
(``LaunchCounter(run_kernels=False)``), at batch sizes the interpreter would take hours over.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Iterator
from dataclasses import dataclass
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import buffers
from revnmt.rnn import ReversibleRNN, TensorInput

#: The ATen ops that bring a tensor's value to the host (``.item()``, ``bool()``, ``int()`` and ``torch.equal``
#: end in one of them), and those whose output's size depends on the data: on CUDA each waits for the device.
HOST_READS = frozenset({"aten::_local_scalar_dense", "aten::equal", "aten::nonzero", "aten::masked_select"})
#: Indexing ops that read the host when an index is a mask (``x[mask]``: they find its true elements first, a
#: ``nonzero`` that the dispatcher does not show).
_MASKED_INDEXING = frozenset({"aten::index.Tensor", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_"})


@dataclass(frozen=True)
class Launch:
    """One launch: a dispatched ATen op, or a Triton kernel's run with its grid (programs along each axis)."""

    name: str
    grid: tuple[int, ...] | None = None  # None: an ATen op
    reads_host: bool = False  # an op that waits for the device's value (see reads_host())
    # with LaunchCounter(arguments=True): what a CUDA graph bakes into the launch, :func:`arguments` of its inputs
    arguments: tuple | None = None

    @property
    def programs(self) -> int | None:
        """The programs a Triton launch runs (None for an ATen op)."""
        return None if self.grid is None else math.prod(self.grid)


@dataclass(frozen=True)
class Section:
    """A labelled stretch of a :class:`LaunchCounter`'s launches, ``launches[start:end]``."""

    label: str
    start: int
    end: int


class LaunchCounter(TorchDispatchMode):
    """Records the launches of what runs inside it (:attr:`launches`): the ATen ops dispatched, but views (which
    launch nothing) and ``empty*`` (allocations), and the Triton kernels run, each with its grid.

    Triton's launches do not go through torch's dispatcher, so the counter wraps ``run`` of Triton's kernel
    classes (the compiled ``JITFunction`` and the interpreter's ``InterpretedFunction``) while it is active;
    the ops the interpreter dispatches inside a run are part of that one launch. ``Tensor.tolist`` does not go
    through it either on a CPU tensor: it is wrapped too, and recorded as a host read.

    With ``arguments=True`` each launch also records what a CUDA graph would bake into it (:func:`arguments`): its
    scalars and its tensors' layouts, not their values. With ``run_kernels=False`` the Triton kernels are recorded and
    not run (their grids depend on the shapes
    only), and every allocation comes back zero-filled: what a kernel would have written reads as zeros, the
    same in every run, instead of whatever memory held. Zero states give zero states, so a reversal rebuilds
    its (zero) initial states, the buffer's words and height stay zero and no error code is set: the exactness
    guard and the overflow checks pass and read the host as often as in a run whose words never overflow.
    The ATen ops run for real."""

    def __init__(self, run_kernels: bool = True, arguments: bool = False) -> None:
        super().__init__()
        self.run_kernels, self.arguments = run_kernels, arguments
        self.launches: list[Launch] = []
        self.sections: list[Section] = []
        self._in_kernel = False
        kinds = []
        if buffers.backends.triton_available():
            from triton.runtime.interpreter import InterpretedFunction
            from triton.runtime.jit import JITFunction
            kinds = [JITFunction, InterpretedFunction]
        self._patches = [mock.patch.object(kind, "run", self._counted(kind.run)) for kind in kinds]
        # A CPU tensor's tolist() reads its memory without dispatching an op (on CUDA it copies to the host first,
        # a sync): counted here as the one read it is on every device.
        self._patches.append(mock.patch.object(torch.Tensor, "tolist", self._read(torch.Tensor.tolist)))

    @property
    def names(self) -> list[str]:
        """Every launch's name: the ATen op's (``aten::mm``) or the Triton kernel's."""
        return [launch.name for launch in self.launches]

    @property
    def count(self) -> int:
        return len(self.launches)

    @property
    def host_reads(self) -> int:
        """Launches that read a value on the host (:func:`reads_host`)."""
        return sum(launch.reads_host for launch in self.launches)

    @contextlib.contextmanager
    def section(self, label: str) -> Iterator[None]:
        """Note the launches made inside as a :class:`Section` called ``label`` (in :attr:`sections`)."""
        start = self.count
        try:
            yield
        finally:
            self.sections.append(Section(label, start, self.count))

    def _counted(self, run):
        def counted_run(kernel, *args, grid, warmup=False, **kwargs):
            if warmup or self._in_kernel:
                return run(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            self.launches.append(Launch(kernel.fn.__name__, _grid(kernel, grid, args, kwargs),
                                        arguments=arguments(args, kwargs) if self.arguments else None))
            if not self.run_kernels:
                return None
            self._in_kernel = True
            try:
                return run(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                self._in_kernel = False
        return counted_run

    def _read(self, tolist):
        def read(tensor):
            if not self._in_kernel:
                self.launches.append(Launch("Tensor.tolist", reads_host=True))
            return tolist(tensor)
        return read

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
        allocation = func.__name__.startswith("empty")
        if not (self._in_kernel or view or allocation):
            self.launches.append(Launch(func.name(), reads_host=reads_host(func.name(), args),
                                        arguments=arguments(args, kwargs or {}) if self.arguments else None))
        out = func(*args, **(kwargs or {}))
        if allocation and not self.run_kernels:
            out.zero_()  # (this mode is off inside its own handler: not recorded)
        return out


def reads_host(name: str, args: tuple) -> bool:
    """Whether the ATen op ``name`` on ``args`` waits for a value of the device on the host: one of
    :data:`HOST_READS`, or indexing with a mask."""
    if name in _MASKED_INDEXING:
        return any(index is not None and index.dtype in (torch.bool, torch.uint8) for index in args[1])
    return name in HOST_READS


def arguments(*values) -> tuple:
    """What a launch on ``values`` fixes for a CUDA graph that captures it: every scalar, and each tensor's dtype,
    shape, strides and offset (its memory is the graph's; its values are what a replay brings). Other objects (a
    ``triton.jit`` function passed as an argument) by their name."""
    def summary(value):
        if isinstance(value, torch.Tensor):
            return "tensor", str(value.dtype), tuple(value.shape), value.stride(), value.storage_offset()
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return str(value)
        if isinstance(value, (list, tuple)):
            return tuple(summary(v) for v in value)
        if isinstance(value, dict):
            return tuple((k, summary(v)) for k, v in sorted(value.items()))
        if isinstance(value, slice):
            return "slice", value.start, value.stop, value.step
        return getattr(value, "__name__", type(value).__name__)
    return summary(values)


def _grid(kernel, grid, args: tuple, kwargs: dict) -> tuple[int, ...]:
    """A launch's grid as programs along each axis. A callable grid gets the launch's arguments by name, the
    meta-parameters among them, as Triton's launcher gives them."""
    if callable(grid):
        signature = inspect.signature(kernel.fn)
        bound = signature.bind(*args, **{k: v for k, v in kwargs.items() if k in signature.parameters})
        bound.apply_defaults()
        grid = grid(bound.arguments)
    return tuple(int(n) for n in grid)


def check_lazily(rnn: ReversibleRNN) -> None:
    """Make the buffers ``rnn`` makes keep bad input on the device, as on CUDA (a CPU buffer checks eagerly, since
    a read costs nothing there): no host read after every call."""
    new_buffer = rnn.new_buffer

    def checked_as_on_cuda(*args, **kwargs):
        buffer = new_buffer(*args, **kwargs)
        buffer.words.eager_checks = False
        return buffer

    rnn.new_buffer = checked_as_on_cuda


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
    check_lazily(rev)
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
