"""Training runs: options, data, the resumable training loop and its progress reports (train.py)."""

from .main import main

__all__ = ["main"]
