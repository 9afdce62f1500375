"""Exact fixed-point arithmetic and vectorized 64-bit information buffers.

This package knows nothing of NMT: it provides int32 fixed-point conversions, exactly reversible
multiplication by quantized gates (Algorithm 1 of Maclaurin et al. 2015, as used by MacKay et al.
2018), and :class:`InformationBuffer`, which stores the bits those multiplications destroy.

Modules: :mod:`.fixed` (fixed point, the forget limit), :mod:`.multiply` (Algorithm 1 as tensor
ops), :mod:`.words` (the buffer's words and their bookkeeping), :mod:`.room` (how much stack a sweep gets
before it runs), :mod:`.backends` (where the arithmetic runs: numba, torch or Triton), :mod:`.buffer` (the
front that ties them together).
"""

from . import backends
from .buffer import InformationBuffer
from .fixed import (
    FORGET_ONE,
    FORGET_RADIX,
    HIDDEN_RADIX,
    MAX_FORGET_CHOICES,
    NO_FORGET_LIMIT,
    FixedPointOverflowError,
    ForgetLimit,
    OverflowGuard,
    checked_add,
    lossy_update,
    quantize_forget,
    restrict_forget,
    straight_through,
    to_fixed,
    to_float,
)
from .multiply import div_exact, mul_exact
from .room import StackRoom
from .words import TILE_ROWS, WORD_LIMIT, BufferError

__all__ = [
    "BufferError", "FORGET_ONE", "FORGET_RADIX", "FixedPointOverflowError", "ForgetLimit", "HIDDEN_RADIX",
    "InformationBuffer", "MAX_FORGET_CHOICES", "NO_FORGET_LIMIT", "OverflowGuard", "StackRoom", "TILE_ROWS",
    "WORD_LIMIT", "backends",
    "checked_add", "div_exact", "lossy_update", "mul_exact", "quantize_forget", "restrict_forget",
    "straight_through", "to_fixed", "to_float",
]
