"""Where a reversible layer runs: its backend, chosen once per device.

A backend is everything that depends on where the buffer's arithmetic runs: the buffer's operations
(a :class:`buffers.backends.BufferBackend`: numba loops, torch ops or Triton kernels, bit-identical words),
the cells' fused half-steps (:mod:`revnmt.rnn.kernels`; none for torch, whose steps are the cells' reference),
and the defaults tuned for it. The backends, their names and how a name (``"auto"`` included) is resolved on
a device are :mod:`buffers.backends`' (:func:`resolve`, :data:`CHOICES` and :func:`check_name` are re-exported
here); this module adds to each what a layer needs. :func:`on_device` turns a name and a device into a
:class:`Backend` once, when a layer first runs on the device; the sweeps pass that object down, and its
buffers take its operations as they are, so nothing is looked up per batch.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from buffers import ForgetLimit, InformationBuffer, backends
from buffers.backends import CHOICES, BufferBackend, check_name, resolve

from .kernels import StepKernels

__all__ = ["BACKENDS", "CHOICES", "Backend", "check_name", "on_device", "resolve"]


@dataclass(frozen=True)
class Backend:
    """A buffer backend with what a layer adds to it (see the module docstring); one object per backend,
    compared by identity."""

    name: str
    #: Buffer lanes per batch row when a layer asks for none. The numba loops walk any lane count in one
    #: call, and few lanes fill their 64-bit words best (docs/memory.md#buffer-lanes); the torch backend
    #: loops over a half's ⌈(H/2) / lanes⌉ chunks, each a few kernel launches, and a Triton program over the
    #: same chunks of its tile, so there more lanes are faster.
    lanes: int
    #: Reverse steps whose recurrent weight gradients go into one product (:class:`~.cells.RecurrentGrads`).
    #: A chunk is held memory; on a CPU a per-step product is already compute-bound, where small products
    #: are launch-bound (CUDA) four steps share one (docs/performance.md#recurrent-weight-gradients).
    weight_grad_steps: int
    #: ``module:attribute`` of the fused half-steps, imported on first use (numba compiles, and triton is
    #: absent from CPU installs without the gpu extra); None: the cells' torch reference.
    kernels: str | None
    #: ``module:attribute`` of persistent sweep kernels (a stack's forward sweep in one launch, its reverse in one per
    #: chunk of steps), which run the sweeps they support in place of the half-steps; None: none.
    sweeps: str | None = None

    @functools.cached_property
    def steps(self) -> StepKernels | None:
        """The fused half-steps, or None: the cells' torch reference."""
        return _imported(self.kernels)

    def persistent(self, rnn, lanes: int, tile_rows: int):
        """The persistent sweep kernels that run ``rnn``'s trained sweeps on this backend over a buffer of ``lanes``
        lanes a row in tiles of ``tile_rows`` rows, or None (the half-steps run them): the one place a stack asks,
        for its forward sweep, again for its backward sweep, which must be the same kernels' (the states' low bits
        are their products'), and for what its sweeps hold (:meth:`~revnmt.rnn.ReversibleRNN.work_bytes`). Only a
        stack built with ``sweep_kernels="persistent"`` gets them (:data:`SWEEP_KERNELS`)."""
        if rnn.sweep_kernels != "persistent":
            return None
        sweeps = _imported(self.sweeps)
        return sweeps if sweeps is not None and sweeps.supports(rnn, lanes, tile_rows) else None

    @functools.cached_property
    def buffer(self) -> BufferBackend:
        """The buffer's operations (made on first use: :func:`on_device` has checked the device)."""
        return backends.by_name(self.name)

    def new_buffer(self, batch: int, lanes: int, device: torch.device, limit: ForgetLimit, tile_rows: int,
                   levels: int | None = None) -> InformationBuffer:
        """An information buffer of this backend: ``lanes`` lanes a row, tiles of ``tile_rows`` rows, a fixed room
        of ``levels`` stack levels (None: growing as it fills)."""
        return InformationBuffer(batch, lanes, device, limit, backend=self.buffer, tile_rows=tile_rows, levels=levels)

    def __reduce__(self):
        return _registered, (self.name,)  # pickled by name: one object per backend in every process


def _imported(name: str | None):
    """The object ``module:attribute`` names (a module of this package's), or None for None."""
    if name is None:
        return None
    module, attribute = name.split(":")
    return getattr(importlib.import_module(module, __package__), attribute)


# What a layer adds to each backend of buffers.backends.NAMES, the one list of them.
_ADDED = {
    "numba": dict(lanes=3, weight_grad_steps=1, kernels=".kernels.numba_steps:NUMBA_STEPS"),
    "torch": dict(lanes=16, weight_grad_steps=4, kernels=None),
    "triton": dict(lanes=16, weight_grad_steps=4, kernels=".kernels.triton_steps:TRITON_STEPS",
                   sweeps=".kernels.triton_sweeps:TRITON_SWEEPS"),
}
_REGISTRY = {name: Backend(name, **_ADDED[name]) for name in backends.NAMES}

#: Every backend by name (read-only).
BACKENDS: Mapping[str, Backend] = MappingProxyType(_REGISTRY)


#: The kernels that can run a stack's trained sweeps. ``steps``: the backend's fused half-steps, a few launches a layer,
#: half and time step (the default: the faster on an H200 at every batch measured, docs/gpu.md#persistent-sweeps-
#: measured). ``persistent``: one launch a forward sweep and one a chunk of the reverse, where the backend has such
#: kernels and they support the stack (:attr:`Backend.sweeps`; else the half-steps run it).
SWEEP_KERNELS: tuple[str, ...] = ("steps", "persistent")


def _registered(name: str) -> Backend:
    return _REGISTRY[name]


def on_device(name: str, device: torch.device | str) -> Backend:
    """The backend ``name`` stands for on ``device`` (``"auto"`` chosen there), or ValueError if it cannot run
    there (:func:`buffers.backends.resolve` checks)."""
    return _REGISTRY[backends.resolve(name, device).name]
