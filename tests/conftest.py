"""Shared pytest fixtures: the devices every exactness test runs on."""

import pytest
import torch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))]


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """CPU always; CUDA where a GPU is present (skipped cleanly elsewhere)."""
    return torch.device(request.param)
