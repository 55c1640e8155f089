"""What the link probe is asked to time: a message's bytes at a wire precision, and the ``--at`` and
``--gather`` entries that name a run's own all-reduces and top-k exchanges."""

from __future__ import annotations

import re

from syncsim.schemes.spec import PRECISIONS

__all__ = ["PRECISIONS", "wire_bytes", "gather_bytes", "encode_at", "parse_at", "parse_gather", "valid_at",
           "valid_gather"]


def wire_bytes(message_bytes: float, precision: str) -> int:
    """The bytes of a tensor of ``precision`` elements holding ``message_bytes``: the size the probe times."""
    from real.wire import value_bytes

    itemsize = value_bytes(precision)
    return max(1, round(message_bytes / itemsize)) * itemsize


def gather_bytes(values: int, precision: str) -> int:
    """Bytes one rank contributes to a top-k exchange of ``values`` entries: as many int32 indices
    (syncsim.schemes.actions.INDEX_BYTES) and values at ``precision`` (SparseAllGather.nbytes)."""
    from real.wire import value_bytes
    from syncsim.schemes.actions import INDEX_BYTES

    return int(values) * (INDEX_BYTES + value_bytes(precision))


def encode_at(at) -> str:
    """``--at``'s text for (bytes, precision) entries: BYTES:PRECISION, comma-separated."""
    return ",".join(f"{size}:{precision}" for size, precision in at)


def valid_at(size: int, precision: str) -> bool:
    """Whether ``size`` bytes are a positive whole number of ``precision`` elements."""
    return precision in PRECISIONS and size >= 1 and size == wire_bytes(size, precision)


def valid_gather(values: int, precision: str) -> bool:
    """Whether ``values`` entries at ``precision`` can be exchanged with int32 indices."""
    return precision in PRECISIONS and 1 <= values <= 2**31 - 1  # int32 indices


def _parse_entries(text: str, digits: int, valid, message: str) -> list[tuple[int, str]]:
    """Comma-separated NUMBER:PRECISION entries, each checked by ``valid(number, precision)``; ValueError
    ``message`` (formatted with the entry) for the first that is malformed."""
    entries = []
    for item in filter(None, text.split(",")):
        number, _, precision = item.partition(":")
        if not re.fullmatch(f"[0-9]{{1,{digits}}}", number) or not valid(int(number), precision):
            raise ValueError(message.format(item=repr(item)))
        entries.append((int(number), precision))
    return entries


def parse_gather(text: str) -> list[tuple[int, str]]:
    """``--gather``'s entries, VALUES:PRECISION; ValueError naming the option and the entry when one is
    malformed."""
    return _parse_entries(text, 10, valid_gather,
                          f"--gather: each entry must be VALUES:PRECISION with PRECISION one of {sorted(PRECISIONS)} "
                          f"and VALUES a positive number of int32-indexed values, got {{item}}")


def parse_at(text: str) -> list[tuple[int, str]]:
    """``--at``'s entries; ValueError naming the option and the entry when one is malformed."""
    return _parse_entries(text, 12, valid_at,
                          f"--at: each entry must be BYTES:PRECISION with PRECISION one of {sorted(PRECISIONS)} "
                          f"and BYTES a positive multiple of its element size, got {{item}}")
