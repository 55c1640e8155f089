"""Validation helpers shared by the configuration dataclasses.

Every config validates on construction and names the field, the value and what
is allowed, so a bad study grid fails before any simulation starts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def check_int(owner: str, field: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int,)) and not (
        isinstance(value, float) and value.is_integer()
    ):
        raise ValueError(f"{owner}.{field} must be an integer >= {minimum}, got {value!r}")
    value = int(value)  # type: ignore[arg-type]
    if value < minimum:
        raise ValueError(f"{owner}.{field} must be an integer >= {minimum}, got {value}")
    return value


def check_float(owner: str, field: str, value: object, *, low: float = -math.inf, high: float = math.inf,
                low_open: bool = False, high_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{owner}.{field} must be a finite number, got {value!r}")
    value = float(value)
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise ValueError(f"{owner}.{field} must be in {lo}{low:g}, {high:g}{hi}, got {value:g}")
    return value


def check_choice(owner: str, field: str, value: object, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{owner}.{field} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value  # type: ignore[return-value]


def check_positive(owner: str, field: str, value: float) -> float:
    return check_float(owner, field, value, low=0.0, low_open=True)


def from_dict(cls: type, data: dict, key: str, tuple_fields: tuple[str, ...] = ()) -> object:
    """Build a config dataclass from ``data``, or from ``data[key]`` when it is a larger document."""
    data = dict(data)
    if isinstance(data.get(key), dict):
        data = dict(data[key])
    for name in tuple_fields:
        if data.get(name) is not None:
            data[name] = tuple(data[name])
    known = set(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {sorted(unknown)}; allowed: {sorted(known)}")
    return cls(**data)
