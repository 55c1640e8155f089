"""The calibration's cache: a probe's result kept as JSON under the calibration folder, so that a resumed
study measures nothing twice.

Every file records the SCHEMA_VERSION of the code that wrote it; a file of another version (or none) is
measured again, since what a probe records changes with the code that runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

from syncsim.files import write_atomic

__all__ = ["SCHEMA_VERSION", "cached", "store", "slug"]

SCHEMA_VERSION = 3  # raise it when a probe records something new or measures differently


def slug(text: str) -> str:
    """A file-name-safe form of a bandwidth or scheme string."""
    return "".join(c if c.isalnum() else "-" for c in str(text)).strip("-")


def cached(path: Path, measure) -> dict:
    """The result cached at ``path`` when that file is of this SCHEMA_VERSION, else ``measure()``'s,
    stored there."""
    if path.exists():
        kept = json.loads(path.read_text())
        if isinstance(kept, dict) and kept.get("schema_version") == SCHEMA_VERSION and "result" in kept:
            return kept["result"]
    result = measure()
    store(path, result)
    return result


def store(path: Path, result: dict) -> None:
    """Write ``result`` to ``path`` with this SCHEMA_VERSION (atomically: a reader sees the old or the new)."""
    write_atomic(path, json.dumps({"schema_version": SCHEMA_VERSION, "result": result}, indent=1))
