"""Exact fixed-point arithmetic and vectorized 64-bit information buffers.

This package knows nothing of NMT: it provides int32 fixed-point conversions, exactly reversible
multiplication by quantized gates (Algorithm 1 of Maclaurin et al. 2015, as used by MacKay et al.
2018), and :class:`InformationBuffer`, which stores the bits those multiplications destroy.
"""

from .buffer import WORD_LIMIT, BufferError, InformationBuffer
from .fixed import (
    FORGET_ONE,
    FORGET_RADIX,
    HIDDEN_RADIX,
    MAX_FORGET_CHOICES,
    FixedPointOverflowError,
    OverflowGuard,
    checked_add,
    checked_sub,
    forget_multiplier,
    min_forget_numerator,
    quantize_forget,
    restrict_forget,
    straight_through,
    to_fixed,
    to_float,
)
from .multiply import div_exact, mul_exact

__all__ = [
    "BufferError", "FORGET_ONE", "FORGET_RADIX", "FixedPointOverflowError", "HIDDEN_RADIX", "InformationBuffer",
    "MAX_FORGET_CHOICES", "OverflowGuard", "WORD_LIMIT", "checked_add", "checked_sub", "div_exact",
    "forget_multiplier", "min_forget_numerator", "mul_exact", "quantize_forget", "restrict_forget",
    "straight_through", "to_fixed", "to_float",
]
