"""Where the buffer's arithmetic runs: one seam, three interchangeable backends.

Every backend does the same integer arithmetic on the same :class:`~buffers.words.WordStack`
tensors, bit for bit (the tests compare them), and differs only in how it is dispatched:

- ``"numba"``: compiled CPU loops, one call per update (:mod:`.numba_loops`). CPU only.
- ``"torch"``: tensor ops, the readable reference (:mod:`.tensor_ops`). Any device, but about
  twenty small ops per chunk of lanes, each a kernel launch on CUDA.
- ``"triton"``: one Triton kernel per update (:mod:`.triton_kernels`). CUDA, or CPU tensors
  under ``TRITON_INTERPRET=1`` (how the tests run it without a GPU).

``"auto"`` picks numba on CPU, and on CUDA triton where it is importable, else torch.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from .base import BufferBackend

BACKENDS = ("auto", "numba", "torch", "triton")

__all__ = ["BACKENDS", "BufferBackend", "create", "resolve", "triton_available", "triton_interpreted"]


def triton_available() -> bool:
    """Whether the triton package can be imported (it ships with CUDA builds of torch)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreted() -> bool:
    """Whether Triton kernels run in its interpreter (``TRITON_INTERPRET=1``), on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def resolve(name: str, device: torch.device | str) -> str:
    """The backend ``name`` stands for on ``device`` (``"auto"`` resolved), or ValueError if it cannot run there."""
    device = torch.device(device)
    if name not in BACKENDS:
        raise ValueError(f"unknown buffer backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name == "auto":
        if device.type == "cpu":
            return "numba"
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if name == "numba" and device.type != "cpu":
        raise ValueError(f"the numba buffer backend runs on CPU only, not on {device}; use triton or torch")
    if name == "triton":
        if not triton_available():
            raise ValueError("the triton buffer backend needs the triton package (pip install 'triton')")
        if device.type != "cuda" and not (device.type == "cpu" and triton_interpreted()):
            raise ValueError(f"the triton buffer backend runs on CUDA (or on CPU with TRITON_INTERPRET=1), "
                             f"not on {device}")
    return name


def create(name: str, device: torch.device | str) -> BufferBackend:
    """The backend ``name`` (or ``"auto"``) for a buffer on ``device``."""
    name = resolve(name, device)
    # Imported on demand: numba compiles, and triton is absent from CPU installs without the gpu extra.
    if name == "numba":
        from .numba_loops import NumbaBackend

        return NumbaBackend()
    if name == "triton":
        from .triton_kernels import TritonBackend

        return TritonBackend()
    from .tensor_ops import TorchBackend

    return TorchBackend()
