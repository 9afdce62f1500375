"""Fixed-point numbers for reversible recurrent states.

Hidden (and cell) states are int32 with ``HIDDEN_RADIX`` fractional bits: h = h* · 2^-23, so the
representable range is [-256, 256) at a resolution of about 1.2e-7 (float32's resolution near 1).
Forget gates are quantized to ``FORGET_RADIX`` bits: z = z* · 2^-10 with an integer numerator
z* in [1, 2^10]. Integer state makes the recurrence exactly invertible; the float copies of the same
numbers carry gradients (see :func:`straight_through`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

HIDDEN_RADIX = 23
FORGET_RADIX = 10
FORGET_ONE = 1 << FORGET_RADIX  # the numerator of z = 1 (nothing forgotten)

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1

#: The forget limits there are (bits per unit per step, :class:`ForgetLimit`); ``None`` means "no limit",
#: which the quantization still caps at FORGET_RADIX bits because z* is never 0.
MAX_FORGET_CHOICES = (1, 2, 3, 5, None)


@dataclass(frozen=True)
class ForgetLimit:
    """At most ``bits`` bits forgotten per unit and update (``None``: no limit), and the numbers that follow.

    A forget gate σ is mapped to z = m·σ + (1 − m) with the ``slope`` m = 1 − 2^-bits, so z ≥ 2^-bits, and
    quantized to a numerator z* of at least ``min_numerator`` = 2^(R_Z − bits). One value is made per
    layer and shared by its cells, its buffers and the kernels: the gates' slope and the buffer's smallest
    numerator then come from the same limit, and the stack is sized by the limit the gates obey.
    """

    bits: int | None = None
    slope: float = field(init=False, repr=False, compare=False)
    min_numerator: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (self.bits is None or (type(self.bits) is int and self.bits in MAX_FORGET_CHOICES)):
            raise ValueError(f"max forgotten bits must be one of {', '.join(map(str, MAX_FORGET_CHOICES))}, "
                             f"got {self.bits!r}")
        # frozen: the derived numbers are set once, here
        object.__setattr__(self, "slope", 1.0 if self.bits is None else 1.0 - 2.0 ** -self.bits)
        object.__setattr__(self, "min_numerator", 1 if self.bits is None else FORGET_ONE >> self.bits)


#: No limit but the quantization's (a buffer's default).
NO_FORGET_LIMIT = ForgetLimit()


class FixedPointOverflowError(ArithmeticError):
    """A fixed-point value left the int32 range; int32 arithmetic would have wrapped silently."""


class OverflowGuard:
    """Collects range violations on the device and raises them later, in one host sync.

    Checking every step with ``.item()`` would force a device-to-host sync per time step on CUDA.
    A guard ORs violations into one device flag; :meth:`check` raises if any was recorded. On CPU
    a sync costs nothing, so callers may simply check eagerly (``guard=None``).
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self._bad = torch.zeros((), dtype=torch.bool, device=device)
        self._what: set[str] = set()

    def record(self, bad: torch.Tensor, what: str) -> None:
        """OR ``bad.any()`` into the flag without syncing."""
        self._bad |= bad.any()
        self._what.add(what)

    def check(self) -> None:
        """Raise :class:`FixedPointOverflowError` if any recorded value was out of range (one host read)."""
        self.conclude([int(self._bad)])

    def flag(self) -> torch.Tensor:
        """Whether a violation was recorded, as an int64 device scalar: for a caller that reads it together with other
        values (no host read here) and passes it back to :meth:`conclude`."""
        return self._bad.long()

    def conclude(self, values: list[int]) -> None:
        """:meth:`check` from the value of :meth:`flag`, read."""
        if values[0]:
            raise FixedPointOverflowError(
                f"fixed-point overflow in {', '.join(sorted(self._what))}: a value left the int32 range "
                f"(|value| >= {2 ** (31 - HIDDEN_RADIX)} for hidden states); lower the learning rate, "
                "clip gradients, or shorten sequences"
            )
        self._what.clear()


def _report(bad: torch.Tensor, what: str, guard: OverflowGuard | None) -> None:
    if guard is None:
        if bool(bad.any()):
            raise FixedPointOverflowError(f"fixed-point overflow in {what}: a value left the int32 range")
    else:
        guard.record(bad, what)


def round_fixed(x: torch.Tensor, radix: int = HIDDEN_RADIX) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` rounded (half to even) to fixed point with ``radix`` fractional bits, as int64 clamped
    to the int32 range, and where it left that range (NaN included)."""
    scaled = torch.round(x.detach().double() * (1 << radix))
    # scaled is an integer, so it fits int32 exactly when |scaled + 0.5| <= 2^31 − 0.5;
    # written as "not <=" so that NaN counts as out of range
    bad = ~((scaled + 0.5).abs() <= INT32_MAX + 0.5)
    return scaled.clamp(INT32_MIN, INT32_MAX).long(), bad


def to_fixed(x: torch.Tensor, radix: int = HIDDEN_RADIX, guard: OverflowGuard | None = None) -> torch.Tensor:
    """Round a float tensor to int32 fixed point with ``radix`` fractional bits.

    Out-of-range values (and NaN) raise, now or at ``guard.check()`` when a guard is given;
    meanwhile they are clamped, so no undefined float-to-int cast happens.
    """
    fixed, bad = round_fixed(x, radix)
    _report(bad, "to_fixed", guard)
    return fixed.to(torch.int32)


def to_float(h: torch.Tensor, radix: int = HIDDEN_RADIX, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The real value of an integer fixed-point tensor, as ``dtype``."""
    if dtype == torch.get_default_dtype():
        # One op instead of two (on CUDA, one kernel launch): an integer tensor times a Python float
        # converts to the default dtype as .to() does, and the power-of-two factor is exact.
        return h * (2.0 ** -radix)
    return h.to(dtype) * (2.0 ** -radix)


def outside_int32(s: torch.Tensor) -> torch.Tensor:
    """Where an int64 tensor holds a value outside the int32 range."""
    # s fits int32 exactly when s − INT32_MIN lies in [0, 2^32), i.e. has no bits above bit 31
    return ((s - INT32_MIN) >> 32) != 0


def checked_add(a: torch.Tensor, b: torch.Tensor, guard: OverflowGuard | None = None) -> torch.Tensor:
    """int32 a + b, computed in int64 so that leaving the int32 range is detected, not wrapped."""
    s = a.long() + b
    _report(outside_int32(s), "state update", guard)
    return s.clamp(INT32_MIN, INT32_MAX).to(torch.int32)


def restrict_forget(gate: torch.Tensor, limit: ForgetLimit) -> torch.Tensor:
    """Map a sigmoid output into [2^-k, 1] (differentiable, factor ``limit.slope``)."""
    m = limit.slope
    return gate if m == 1.0 else m * gate + (1.0 - m)


def quantize_forget(z: torch.Tensor, limit: ForgetLimit) -> torch.Tensor:
    """Integer numerators z* = round(z · 2^R_Z) (int64), clamped to the legal range under ``limit``.

    The clamp matters only at the edges: without a limit z* = 0 would destroy the state, so it
    becomes 1 (at most R_Z bits forgotten); with a limit it absorbs float rounding below 2^-k.
    """
    zq = torch.round(z.detach() * FORGET_ONE).long()
    return zq.clamp(limit.min_numerator, FORGET_ONE)


def lossy_update(h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, mask: torch.Tensor, limit: ForgetLimit,
                 guard: OverflowGuard | None = None) -> torch.Tensor:
    """h ← z·h + u on rows where ``mask``, with the plain floor product and no buffer: where nothing
    will be reversed (inference). It differs from the buffered update only in the low bits the
    buffer would have refilled (< z* units of 2^-23)."""
    zq = quantize_forget(z, limit)
    ui = to_fixed(u, guard=guard) * mask[:, None]  # a padded row adds 0 and is not multiplied
    product = torch.where(mask[:, None], (h.long() >> FORGET_RADIX) * zq, h.long())
    return checked_add(product, ui, guard)


def straight_through(exact: torch.Tensor, surrogate: torch.Tensor) -> torch.Tensor:
    """A tensor whose value is ``exact`` and whose gradient is that of ``surrogate``.

    This is how the fixed-point model is differentiated: the forward value is the (rounded,
    buffered) integer result, the backward is the real-valued derivative of the same expression.
    """
    # exact + (s − s) rather than s + (exact − s): the latter rounds, the former is bit-exact.
    return exact.to(surrogate.dtype).detach() + (surrogate - surrogate.detach())
