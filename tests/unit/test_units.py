import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from syncsim.units import parse_bandwidth, parse_size, parse_time


@pytest.mark.parametrize("text, expected", [
    ("25Gbit/s", 25e9 / 8), ("900GB/s", 900e9), ("12.5GB/s", 12.5e9), ("100Gbps", 100e9 / 8),
    ("1GiB/s", 2**30), ("200Mbit/s", 25e6),
])
def test_bandwidth_strings(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("text, expected", [("5us", 5e-6), ("120ms", 0.12), ("2s", 2.0), ("3ns", 3e-9),
                                            ("1min", 60.0)])
def test_time_strings(text, expected):
    assert parse_time(text) == expected


@pytest.mark.parametrize("text, expected", [("97MiB", 97 * 2**20), ("1.5GB", 1.5e9), ("800Mbit", 100e6),
                                            ("4096", 4096.0), ("1KiB", 1024.0)])
def test_size_strings(text, expected):
    assert parse_size(text) == expected


def test_plain_numbers_are_si_base_units():
    assert parse_size(1024) == 1024.0 and parse_time(0.5) == 0.5 and parse_bandwidth(1e9) == 1e9


def test_only_ascii_whitespace_may_surround_a_number():
    # float() strips ASCII whitespace only; str.strip() would also take the information separators
    # U+001C..U+001F (str.isspace is true for them), and float("0\x1f") then failed naming no field
    assert parse_time(" 0\t") == 0.0 and parse_size("12\n") == 12.0 and parse_bandwidth("\x0b5MB/s ") == 5e6
    for bad in ("0\x1f", "\x1c12", "5\x1dms"):
        with pytest.raises(ValueError, match="latency .* is not understood"):
            parse_time(bad, "latency")


@pytest.mark.parametrize("parser, bad, units", [
    (parse_bandwidth, "25Gbit", "Gbit/s"), (parse_bandwidth, "fast", "GB/s"), (parse_time, "5 parsecs", "ms"),
    (parse_size, "97MiBs", "MiB"), (parse_size, "", "MiB"),
])
def test_bad_strings_name_value_and_units(parser, bad, units):
    with pytest.raises(ValueError) as err:
        parser(bad)
    assert repr(bad) in str(err.value) and units in str(err.value)


@pytest.mark.parametrize("parser", [parse_size, parse_time, parse_bandwidth])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), True, None, [1]])
def test_non_numbers_rejected(parser, bad):
    with pytest.raises(ValueError):
        parser(bad)


# Basis: a decimal prefix is an exact power of ten and a binary one a power of two,
# so the parsed value is the number times that factor (to float rounding).
@given(st.floats(0.001, 1e6), st.sampled_from([("k", 1e3), ("M", 1e6), ("G", 1e9), ("Ki", 2**10), ("Gi", 2**30)]))
def test_prefixes_scale_exactly(number, prefix):
    name, factor = prefix
    assert math.isclose(parse_size(f"{number!r}{name}B"), number * factor, rel_tol=1e-12)
    assert math.isclose(parse_bandwidth(f"{number!r}{name}bit/s"), number * factor / 8, rel_tol=1e-12)
