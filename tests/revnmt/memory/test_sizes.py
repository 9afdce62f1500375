import pytest
from hypothesis import given
from hypothesis import strategies as st

from revnmt.memory import format_bytes, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("64KiB", 64 * 1024),
        ("1.5GiB", 1536 * 1024**2),
        ("1024", 1024),
        ("0", 0),
        ("2GB", 2_000_000_000),
        ("500MB", 500_000_000),
        ("1.1GB", 1_100_000_000),
        ("2gib", 2 * 1024**3),
        (" 3 KIB ", 3072),
        ("12B", 12),
        ("1TiB", 1024**4),
        ("0.1KiB", 102),  # fractional bytes round down
    ],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("two gigs", "cannot read 'two gigs' as a size"),
        ("", "cannot read"),
        ("1.2.3GB", "cannot read"),
        ("-1GiB", "negative"),
        ("5 gigs", "unknown unit 'gigs'"),
        ("5K", "unknown unit 'K'"),
    ],
)
def test_parse_bytes_rejects_garbage(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_bytes(text)


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0 B"),
        (12, "12 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (512 * 1024**2, "512.00 MiB"),
        (1536 * 1024**2, "1.50 GiB"),
        (1024**4, "1.00 TiB"),
        (-3 * 1024**3, "-3.00 GiB"),
    ],
)
def test_format_bytes(n: int, expected: str) -> None:
    assert format_bytes(n) == expected


@given(st.integers(min_value=0, max_value=2**52))
def test_format_then_parse_is_within_rounding(n: int) -> None:
    text = format_bytes(n)
    unit = 1024 ** ("B KiB MiB GiB TiB PiB".split().index(text.split()[1]))
    assert abs(parse_bytes(text) - n) <= unit * 0.005 + 1
