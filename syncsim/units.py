"""Parse sizes, times and bandwidths given as SI floats or strings with units.

Plain numbers are SI base units (bytes, seconds, bytes/second). Strings follow
the usual conventions: decimal prefixes (k, M, G, T) are powers of 1000 and
binary prefixes (Ki, Mi, Gi, Ti) powers of 1024; a lower-case ``b`` or ``bit``
means bits, an upper-case ``B`` bytes. ``"25Gbit/s"`` is therefore 3.125e9
bytes/second and ``"97MiB"`` is 97 * 2**20 bytes.
"""

from __future__ import annotations

import math
import re

import numpy as np

from syncsim.config import is_number

__all__ = ["parse_size", "parse_time", "parse_bandwidth", "format_size", "format_time", "FP32_BYTES"]

FP32_BYTES = 4  # one IEEE 754 binary32 value: a parameter or gradient as a model holds it

_PREFIX = {
    "": 1.0,
    "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50,
}
# bits are written "b" or "bit"; bytes "B" or "byte(s)".
_SIZE_UNIT = {"B": 1.0, "byte": 1.0, "bytes": 1.0, "b": 0.125, "bit": 0.125, "bits": 0.125}
# Sub-second units are divisors so that "5us" parses to exactly 5e-06 (5 / 1e6),
# not 5 * 1e-6 = 4.9999999999999996e-06.
_TIME_UNIT = {
    "s": 1.0, "sec": 1.0, "ms": (1e3,), "us": (1e6,), "µs": (1e6,), "ns": (1e9,),
    "min": 60.0, "h": 3600.0,
}
# ASCII digits only: Python's float() also reads other scripts' digits ("٣"), which no unit string means.
_NUMBER = r"(?P<num>[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[ \t\n\r\f\v]*"
_SIZE_RE = re.compile(_NUMBER + r"(?P<prefix>Ki|Mi|Gi|Ti|Pi|[kKMGTP]?)(?P<unit>bytes|byte|bits|bit|B|b)$")
_BW_RE = re.compile(
    _NUMBER + r"(?P<prefix>Ki|Mi|Gi|Ti|Pi|[kKMGTP]?)(?P<unit>bytes|byte|bits|bit|B|b)(?:/s|ps)$"
)
# What may surround a number: ASCII whitespace, as float() strips it. str.strip() would also take the
# information separators U+001C..U+001F, which float() refuses with a message naming no field.
_ASCII_SPACE = " \t\n\r\f\v"
_TIME_RE = re.compile(_NUMBER + r"(?P<unit>min|sec|ms|us|µs|ns|s|h)$")

SIZE_UNITS = "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB, or bits (b, kbit, Mbit, Gbit, ...)"
TIME_UNITS = "s, ms, us, ns, min, h"
BANDWIDTH_UNITS = "B/s, MB/s, GB/s, GiB/s, Mbit/s, Gbit/s, Gbps, ..."


def _number(value: object, what: str, allowed: str, pattern: re.Pattern[str], units: dict) -> float:
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{what} {value!r} is not a number; give a float in SI base units or a string in {allowed}")
    if is_number(value):  # Python's or NumPy's
        result = float(value)  # type: ignore[arg-type]
    elif isinstance(value, str) and re.fullmatch(_NUMBER, value.strip(_ASCII_SPACE)):
        result = float(value)  # a bare number in a string is already in SI base units
    elif isinstance(value, str):
        match = pattern.fullmatch(value.strip(_ASCII_SPACE))
        if match is None:
            raise ValueError(f"{what} {value!r} is not understood; accepted units: {allowed}")
        groups = match.groupdict()
        scale = units[groups["unit"]]
        result = float(groups["num"]) * _PREFIX.get(groups.get("prefix") or "", 1.0)
        result = result / scale[0] if isinstance(scale, tuple) else result * scale
    else:
        raise ValueError(f"{what} {value!r} has type {type(value).__name__}; give a float or a string in {allowed}")
    if not math.isfinite(result):
        raise ValueError(f"{what} {value!r} is not finite")
    return result


def parse_size(value: float | int | str, what: str = "size") -> float:
    """Bytes from a float (bytes) or a string such as ``"97MiB"`` or ``"800Mbit"``."""
    return _number(value, what, SIZE_UNITS, _SIZE_RE, _SIZE_UNIT)


def parse_time(value: float | int | str, what: str = "time") -> float:
    """Seconds from a float (seconds) or a string such as ``"120ms"`` or ``"5us"``."""
    return _number(value, what, TIME_UNITS, _TIME_RE, _TIME_UNIT)


def parse_bandwidth(value: float | int | str, what: str = "bandwidth") -> float:
    """Bytes/second from a float or a string such as ``"25Gbit/s"`` or ``"900GB/s"``."""
    return _number(value, what, BANDWIDTH_UNITS, _BW_RE, _SIZE_UNIT)


def format_size(n: float) -> str:
    for unit, scale in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}B"


def format_time(t: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(t) >= scale:
            return f"{t / scale:.3g}{unit}"
    return f"{t * 1e9:.3g}ns"
