"""Byte sizes as people write them ("2GiB", "500MB") and as we print them ("1.50 GiB")."""

from __future__ import annotations

import re
from fractions import Fraction

# Binary units are what memory is sized in; decimal SI units are what disks and some GPU
# spec sheets use. Bare "K"/"M"/"G" are refused as ambiguous between the two.
_BINARY_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")
_DECIMAL_UNITS = ("KB", "MB", "GB", "TB", "PB")
_FACTORS = {
    "b": 1,
    **{unit.lower(): 1024 ** (power + 1) for power, unit in enumerate(_BINARY_UNITS)},
    **{unit.lower(): 1000 ** (power + 1) for power, unit in enumerate(_DECIMAL_UNITS)},
}
_SIZE = re.compile(r"(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[a-z]*)", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """Parse "1024", "64KiB", "1.5 GiB" or "500MB" (units case-insensitive) into bytes.

    A fractional result is rounded down to whole bytes.
    """
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        if text.strip().startswith("-"):
            raise ValueError(f"size {text!r} is negative")
        raise ValueError(f"cannot read {text!r} as a size: expected a number with an optional unit, e.g. '2GiB'")
    unit = match["unit"].lower() or "b"
    if unit not in _FACTORS:
        units = ", ".join(("B", *_BINARY_UNITS, *_DECIMAL_UNITS))
        raise ValueError(f"unknown unit {match['unit']!r} in size {text!r}; expected one of {units}")
    # Fraction, not float: "1.1GB" must be exactly 1_100_000_000.
    return int(Fraction(match["number"]) * _FACTORS[unit])


def format_bytes(n: int) -> str:
    """"12 B" below 1 KiB, else two decimals in the largest binary unit that fits: "1.50 GiB"."""
    if abs(n) < 1024:
        return f"{n} B"
    # Each binary unit is 10 more bits; integer arithmetic avoids log() rounding at 1024**k.
    power = min((abs(n).bit_length() - 1) // 10, len(_BINARY_UNITS))
    return f"{n / 1024**power:.2f} {_BINARY_UNITS[power - 1]}"
