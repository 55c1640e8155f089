"""Validation helpers shared by the configuration dataclasses.

Every config validates on construction and names the field, the value and what
is allowed, so a bad study grid fails before any simulation starts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from syncsim.files import write_atomic


def is_number(value: object) -> bool:
    """A real number, Python's or NumPy's (np.int64, np.float32, ...), and not a bool (nor np.bool_)."""
    # numbers.Real covers int, float and NumPy's integer and floating types (NumPy registers them);
    # bool is an int subclass, and a flag is never a count.
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(owner: str, field: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """``value`` as a Python int in [minimum, maximum]; integral floats (3.0) and NumPy integers count."""
    ok = is_number(value) and (isinstance(value, numbers.Integral) or (math.isfinite(value)  # type: ignore[arg-type]
                                                                      and float(value).is_integer()))
    if not ok:
        raise ValueError(f"{owner}.{field} must be an integer >= {minimum}, got {value!r}")
    value = int(value)  # type: ignore[call-overload]
    if value < minimum:
        raise ValueError(f"{owner}.{field} must be an integer >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{owner}.{field} must be at most {maximum:,}, got {value:,}")
    return value


def check_float(owner: str, field: str, value: object, *, low: float = -math.inf, high: float = math.inf,
                low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a finite Python float in the given interval; NumPy numbers count."""
    if not is_number(value) or not math.isfinite(value):  # type: ignore[arg-type]
        raise ValueError(f"{owner}.{field} must be a finite number, got {value!r}")
    value = float(value)  # type: ignore[arg-type]
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise ValueError(f"{owner}.{field} must be in {lo}{low:g}, {high:g}{hi}, got {value:g}")
    return value


def check_bool(owner: str, field: str, value: object) -> bool:
    """``value`` as a Python bool; NumPy's np.bool_ counts, numbers and strings do not."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{owner}.{field} must be true or false, got {value!r}")
    return bool(value)


def check_choice(owner: str, field: str, value: object, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{owner}.{field} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value  # type: ignore[return-value]


def check_positive(owner: str, field: str, value: float) -> float:
    return check_float(owner, field, value, low=0.0, low_open=True)


class ConfigFile:
    """Copying and JSON round trips shared by the config dataclasses.

    A subclass names the key it sits under in a larger document (a calibration
    file holds "cluster" and "workload") and the fields JSON turns into lists.
    """

    json_key: ClassVar[str]
    tuple_fields: ClassVar[tuple[str, ...]] = ()

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict) -> Any:
        """Build from ``data``, or from ``data[json_key]`` when it is a larger document."""
        data = dict(data)
        if isinstance(data.get(cls.json_key), dict):
            data = dict(data[cls.json_key])
        for name in cls.tuple_fields:
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{cls.__name__} has no field(s) {sorted(unknown)}; allowed: {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_json(cls, path: str | Path) -> Any:
        """Load a file written by ``to_json``, or the ``json_key`` entry of one (``python -m real.calibrate``)."""
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def from_file(cls, path: str | Path) -> Any:
        """Load a ``.toml`` or ``.json`` file: the fields at the top level or under ``[json_key]``.

        Every problem is a ``ValueError`` naming the file and what is wrong.
        """
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as err:
            raise ValueError(f"cannot read {cls.__name__.lower()} file {str(path)!r}: {err.strerror}") from None
        try:
            if path.suffix == ".toml":
                try:
                    import tomllib
                except ImportError:  # Python 3.10: the same parser, from PyPI
                    import tomli as tomllib  # type: ignore[no-redef]

                data = tomllib.loads(text)
            elif path.suffix == ".json":
                data = json.loads(text)
            else:
                raise ValueError(f"{cls.__name__.lower()} file {str(path)!r} must end in .toml or .json")
            return cls.from_dict(data)
        except ValueError as err:  # tomllib.TOMLDecodeError and json.JSONDecodeError are ValueErrors
            message = str(err)
            raise ValueError(message if str(path) in message else f"{path}: {message}") from None
        except TypeError as err:  # a field of the wrong kind reaching a constructor
            raise ValueError(f"{path}: {err}") from None

    def to_json(self, path: str | Path) -> None:
        write_atomic(path, json.dumps(self.to_dict(), indent=2))
