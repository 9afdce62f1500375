"""Where a reversible layer runs: the registry of backends, the one place a backend is chosen.

A backend is everything that depends on where the buffer's arithmetic runs: the buffer's operations
(:mod:`buffers.backends`: numba loops, torch ops or Triton kernels, bit-identical words), the cells'
fused half-steps (:mod:`revnmt.rnn.kernels`; none for torch, whose steps are the cells' reference),
and the defaults tuned for it. :func:`resolve` turns a name (``"auto"`` included) and a device into
a :class:`Backend` once, when a layer first runs on the device; the sweeps pass that object down.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from buffers import InformationBuffer, backends

from .kernels import StepKernels

#: The names ``--buffer-backend`` takes: ``"auto"`` (numba on CPU; triton on CUDA where importable, else
#: torch) and every registered backend.
CHOICES: tuple[str, ...] = backends.BACKENDS


@dataclass(frozen=True)
class Backend:
    """A registered backend (see the module docstring); one object per name, compared by identity."""

    name: str
    #: Buffer lanes per batch row when a layer asks for none. The numba loops walk any lane count in one
    #: call, and few lanes fill their 64-bit words best (docs/memory.md#buffer-lanes); the torch backend
    #: loops over a half's ⌈(H/2) / lanes⌉ chunks, each a few kernel launches, and the Triton kernel over the
    #: same chunks inside one program, so there more lanes are faster.
    lanes: int
    #: Reverse steps whose recurrent weight gradients go into one product (:class:`~.cells.RecurrentGrads`).
    #: A chunk is held memory; on a CPU a per-step product is already compute-bound, where small products
    #: are launch-bound (CUDA) four steps share one (docs/performance.md#recurrent-weight-gradients).
    weight_grad_steps: int
    #: ``module:attribute`` of the fused half-steps, imported on first use (numba compiles, and triton is
    #: absent from CPU installs without the gpu extra); None: the cells' torch reference.
    kernels: str | None

    @functools.cached_property
    def steps(self) -> StepKernels | None:
        """The fused half-steps, or None: the cells' torch reference."""
        if self.kernels is None:
            return None
        module, attribute = self.kernels.split(":")
        return getattr(importlib.import_module(module, __package__), attribute)

    def new_buffer(self, batch: int, lanes: int, device: torch.device, max_bits: int | None) -> InformationBuffer:
        """An information buffer of this backend whose rows share ``lanes`` lanes each (see ``ReversibleRNN``)."""
        return InformationBuffer(batch, lanes, device, max_bits, backend=self.name, share_rows=True)

    def __reduce__(self):
        return _registered, (self.name,)  # pickled by name: one object per backend in every process


_REGISTRY = {backend.name: backend for backend in (
    Backend("numba", lanes=3, weight_grad_steps=1, kernels=".kernels.numba_steps:NUMBA_STEPS"),
    Backend("torch", lanes=16, weight_grad_steps=4, kernels=None),
    Backend("triton", lanes=16, weight_grad_steps=4, kernels=".kernels.triton_steps:TRITON_STEPS"),
)}


#: The registered backends by name (read-only).
BACKENDS: Mapping[str, Backend] = MappingProxyType(_REGISTRY)


def _registered(name: str) -> Backend:
    return _REGISTRY[name]


def check_name(name: str) -> str:
    """``name`` if it is a backend or ``"auto"``, else ValueError naming the choices."""
    if name not in CHOICES:
        raise ValueError(f"unknown buffer backend {name!r}; choose one of {', '.join(CHOICES)}")
    return name


def resolve(name: str, device: torch.device | str) -> Backend:
    """The backend ``name`` stands for on ``device`` (``"auto"`` chosen there), or ValueError if it cannot run
    there (:func:`buffers.backends.resolve` checks the device)."""
    return _REGISTRY[backends.resolve(check_name(name), device)]


