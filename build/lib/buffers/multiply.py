"""Exactly reversible fixed-point multiplication (Maclaurin et al. 2015, Algorithm 1).

Multiplying h* by z = z*/2^R_Z destroys up to R_Z − log2 z* bits of h*. Algorithm 1 moves the low
bits of h* into an integer buffer word B (arithmetic coding of what is forgotten) and moves some of
B back into the freed low bits of the product, so that (h*, B) can be restored exactly:

    forward                             inverse
    B1 = B·2^R + (h* mod 2^R)           B1 = B'·z* + (h' mod z*)
    h' = ⌊h*/2^R⌋·z* + (B1 mod z*)      h* = ⌊h'/z*⌋·2^R + (B1 mod 2^R)
    B' = ⌊B1/z*⌋                        B  = ⌊B1/2^R⌋

Every division is a *floor* division and every mod is non-negative: h' mod z* equals the stored
remainder for negative quotients only under floor semantics (truncation would break negatives).
B grows by log2(2^R/z*) bits per call, exactly the information the multiplication destroys.
All arguments are int64 tensors of one shape; the caller keeps B < 2^(63−R) before a forward call.
"""

from __future__ import annotations

import torch

from .fixed import FORGET_RADIX

_LOW_MASK = (1 << FORGET_RADIX) - 1


def mul_exact(h: torch.Tensor, buf: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, B) → (h·z*/2^R rounded into the buffer, B'): the forward half of Algorithm 1."""
    # `& mask` and `>> R` are mod and floor division by 2^R for two's-complement integers,
    # negative h included; they are cheaper than remainder/floor_divide.
    b1 = buf * (1 << FORGET_RADIX) + (h & _LOW_MASK)
    h_out = (h >> FORGET_RADIX) * z + torch.remainder(b1, z)
    return h_out, torch.div(b1, z, rounding_mode="floor")


def div_exact(h: torch.Tensor, buf: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact inverse of :func:`mul_exact`."""
    b1 = buf * z + torch.remainder(h, z)
    h_out = torch.div(h, z, rounding_mode="floor") * (1 << FORGET_RADIX) + (b1 & _LOW_MASK)
    return h_out, b1 >> FORGET_RADIX
