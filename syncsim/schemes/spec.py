"""The base of every scheme spec, and the one string grammar that names them.

``NAME[:key=value,...]``, e.g. ``allreduce:algorithm=tree,precision=fp16``,
``ps:mode=async``, ``ps:staleness=2``, ``localsgd:period=8``. ``str(spec)``
writes the canonical form (defaults omitted) and ``parse`` reads it back, so
the same text names a scheme in CLIs, studies and CSV columns.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from syncsim.config import check_bool, check_choice
from syncsim.units import parse_size

__all__ = ["Scheme", "parse", "GRAMMAR", "register", "SCHEMES", "PRECISIONS", "WIRE_BYTES_PER_VALUE"]

# Bytes per gradient/parameter value on the wire for each precision.
WIRE_BYTES_PER_VALUE = {"fp32": 4, "fp16": 2, "bf16": 2}
PRECISIONS = tuple(WIRE_BYTES_PER_VALUE)

SCHEMES: dict[str, type[Scheme]] = {}


def register(cls: type[Scheme]) -> type[Scheme]:
    SCHEMES[cls.name] = cls
    return cls


@dataclass(frozen=True)
class Scheme:
    """Knobs shared by every scheme.

    ``precision`` is the format of what crosses the wire (fp32 master weights
    stay on the workers); ``amp`` means forward/backward under autocast, which
    changes compute time (measure it with ``real.calibrate --amp``), not bytes.
    """

    name: ClassVar[str] = "scheme"
    precision: str = "fp32"
    amp: bool = False

    def __post_init__(self) -> None:
        check_choice(type(self).__name__, "precision", self.precision, PRECISIONS)
        object.__setattr__(self, "amp", check_bool(type(self).__name__, "amp", self.amp))

    @property
    def wire_ratio(self) -> float:
        """Bytes on the wire per fp32 byte."""
        return WIRE_BYTES_PER_VALUE[self.precision] / 4

    @property
    def value_bytes(self) -> int:
        """Bytes on the wire per value."""
        return WIRE_BYTES_PER_VALUE[self.precision]

    def policy(self, param_bytes: float, layers: Any = None, backward_fraction: float = 2 / 3,
               shapes: Any = None) -> Any:  # pragma: no cover - abstract
        """The scheme's plan for a model of ``param_bytes`` (per-layer ``layers``, per-tensor ``shapes``),
        as a ``Policy``."""
        raise NotImplementedError

    def fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def canonical_fields(self) -> dict[str, Any]:
        """Fields that differ from their defaults: what ``str`` writes."""
        # the scheme's own knobs first, then the shared precision/amp
        base = {f.name for f in dataclasses.fields(Scheme)}
        ordered = sorted(dataclasses.fields(self), key=lambda f: f.name in base)
        return {f.name: getattr(self, f.name) for f in ordered if getattr(self, f.name) != f.default}

    def __str__(self) -> str:
        fields = self.canonical_fields()
        if not fields:
            return self.name
        return self.name + ":" + ",".join(f"{k}={_format(k, v)}" for k, v in fields.items())


def _format(key: str, value: Any) -> str:
    if "bytes" in key and isinstance(value, float):
        for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if value >= scale and (value / scale).is_integer():
                return f"{int(value / scale)}{unit}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# The grammar, exactly: NAME [":" KEY "=" VALUE {"," KEY "=" VALUE}], ASCII only. Names are case-
# insensitive and blanks around a token are ignored; nothing else is: no empty option list after
# ":", no empty option (a stray or trailing comma), no value without a key or key without a value.
GRAMMAR = "NAME[:key=value,...]"
_VALUE = re.compile(r"[A-Za-z0-9_.+-]+", re.ASCII)
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_BOOLS = {"true": True, "false": False}


def _convert(scheme: str, key: str, text: str, annotation: str) -> Any:
    # No field documents a "none" value, so "none"/"null" are refused like any other bad word.
    if "bool" in annotation:
        if text.lower() not in _BOOLS:
            raise ValueError(f"scheme {scheme!r}: {key} must be true or false, got {text!r}")
        return _BOOLS[text.lower()]
    if "bytes" in key:
        return parse_size(text, f"{scheme}.{key}")
    if "int" in annotation:
        if not _INT.fullmatch(text):
            raise ValueError(f"scheme {scheme!r}: {key} must be an integer, got {text!r}")
        return int(text)
    if "float" in annotation:
        if not _FLOAT.fullmatch(text):
            raise ValueError(f"scheme {scheme!r}: {key} must be a number, got {text!r}")
        return float(text)
    return text


def parse(text: str | Scheme) -> Scheme:
    """A scheme from its string form, e.g. ``parse("ps:staleness=2")``; see GRAMMAR."""
    if isinstance(text, Scheme):
        return text
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a scheme is written {GRAMMAR} with NAME in {', '.join(SCHEMES)}; got {text!r}")
    name, colon, rest = text.strip().partition(":")
    name = name.strip().lower()
    if name not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r} in {text!r}; choose one of {', '.join(SCHEMES)}")
    if colon and not rest.strip():
        raise ValueError(f"scheme {text!r}: nothing after ':'; write {name} alone or {name}:key=value,...")
    cls = SCHEMES[name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for item in rest.split(",") if colon else ():
        key, eq, value = (part.strip() for part in item.partition("="))
        if not item.strip():
            raise ValueError(f"scheme {text!r}: empty option (a stray comma); write {GRAMMAR}")
        if not eq or not key:
            raise ValueError(f"scheme {name!r}: expected key=value, got {item.strip()!r}")
        if key not in fields:
            raise ValueError(f"scheme {name!r} has no option {key!r}; options: {', '.join(fields)}")
        if key in kwargs:
            raise ValueError(f"scheme {name!r}: option {key!r} given twice")
        if not _VALUE.fullmatch(value):
            raise ValueError(f"scheme {name!r}: {key} needs a value of ASCII letters, digits, '.', '+', '-' "
                             f"or '_', got {value!r}")
        kwargs[key] = _convert(name, key, value, str(fields[key].type))
    return cls(**kwargs)
