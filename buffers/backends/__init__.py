"""Where the buffer's arithmetic runs: one seam, three interchangeable backends, and the one list of them.

Every backend does the same integer arithmetic on the same :class:`~buffers.words.WordStack`
tensors, bit for bit (the tests compare them), and differs only in how it is dispatched:

- ``"numba"``: compiled CPU loops, one call per update (:mod:`.numba_loops`). CPU only.
- ``"torch"``: tensor ops, the readable reference (:mod:`.tensor_ops`). Any device, but about
  twenty small ops per chunk of lanes, each a kernel launch on CUDA.
- ``"triton"``: one Triton kernel per update (:mod:`.triton_kernels`). CUDA, or CPU tensors
  under ``TRITON_INTERPRET=1`` (how the tests run it without a GPU).

``"auto"`` picks numba on CPU, and on CUDA triton where it is importable, else torch. :func:`resolve`
turns a name and a device into the backend object a buffer takes; a caller that makes a buffer per
batch resolves once and passes the object on. Backends hold no state: there is one object per backend.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os

import torch

from .base import BufferBackend

#: Every backend: its name and the ``module:class`` that implements it, imported on first use (numba
#: compiles, and triton is absent from CPU installs without the gpu extra).
_IMPLEMENTATIONS = {
    "numba": ".numba_loops:NumbaBackend",
    "torch": ".tensor_ops:TorchBackend",
    "triton": ".triton_kernels:TritonBackend",
}
#: The backends' names.
NAMES: tuple[str, ...] = tuple(_IMPLEMENTATIONS)
#: The names :func:`resolve` takes: ``"auto"`` and every backend's.
CHOICES: tuple[str, ...] = ("auto", *NAMES)

__all__ = ["CHOICES", "NAMES", "BufferBackend", "by_name", "check_name", "resolve", "triton_available",
           "triton_interpreted"]


def triton_available() -> bool:
    """Whether the triton package can be imported (it ships with CUDA builds of torch)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreted() -> bool:
    """Whether Triton kernels run in its interpreter (``TRITON_INTERPRET=1``), on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_name(name: str) -> str:
    """``name`` if it is a backend's or ``"auto"``, else ValueError naming the choices."""
    if name not in CHOICES:
        raise ValueError(f"unknown buffer backend {name!r}; choose one of {', '.join(CHOICES)}")
    return name


@functools.cache
def by_name(name: str) -> BufferBackend:
    """The backend called ``name`` (not ``"auto"``), wherever it runs: its one object, made on first use."""
    if name not in NAMES:
        raise ValueError(f"unknown buffer backend {name!r}; choose one of {', '.join(NAMES)}")
    if name == "triton" and not triton_available():
        raise ValueError("the triton buffer backend needs the triton package (pip install 'triton')")
    module, cls = _IMPLEMENTATIONS[name].split(":")
    return getattr(importlib.import_module(module, __package__), cls)()


def resolve(name: str, device: torch.device | str) -> BufferBackend:
    """The backend ``name`` stands for on ``device`` (``"auto"`` chosen there), or ValueError if it cannot run
    there."""
    device = torch.device(device)
    if check_name(name) == "auto":
        if device.type == "cpu":
            name = "numba"
        else:
            name = "triton" if device.type == "cuda" and triton_available() else "torch"
    backend = by_name(name)
    backend.check_device(device)
    return backend
