"""Shared pytest fixtures: the devices and buffer backends every exactness test runs on.

Without a GPU the Triton kernels run in Triton's interpreter on CPU tensors (slow, exact): the
variable must be set before the kernels are first imported, which happens lazily on first use.
"""

import importlib.util
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

_NO_CUDA = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
_NO_TRITON = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install -e .[dev])")

DEVICES = ["cpu", pytest.param("cuda", marks=_NO_CUDA)]

#: (device, backend) pairs that run everywhere fast: every test over the buffer runs on them.
FAST_BACKENDS = [
    pytest.param(("cpu", "numba"), id="cpu-numba"),
    pytest.param(("cpu", "torch"), id="cpu-torch"),
    pytest.param(("cuda", "torch"), id="cuda-torch", marks=_NO_CUDA),
    pytest.param(("cuda", "triton"), id="cuda-triton", marks=[_NO_CUDA, _NO_TRITON]),
]
#: The Triton kernels in the interpreter (about 20 ms a launch): for tests of a few dozen launches.
INTERPRETED_TRITON = pytest.param(("cpu", "triton"), id="cpu-triton-interpreted",
                                  marks=[_NO_TRITON, pytest.mark.skipif(HAS_CUDA, reason="CUDA runs the real kernels")])
ALL_BACKENDS = FAST_BACKENDS + [INTERPRETED_TRITON]


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """CPU always; CUDA where a GPU is present (skipped cleanly elsewhere)."""
    return torch.device(request.param)
