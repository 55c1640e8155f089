"""The calibration's cache: a probe's result kept as JSON under the calibration folder, so that a resumed
study measures nothing twice.

Every file records the SCHEMA_VERSION of the code that wrote it; a file of another version (or none) is
measured again, since what a probe records changes with the code that runs it. Inside ``offline()``
nothing is measured: a result not cached raises NotCached (a finished study predicted again from its
calibration, real.validation.repredict). A timing of the moment (``recorded``: a run's own collectives,
timed just before it) is measured afresh at every call online and only kept, for offline() to read.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from syncsim.files import write_atomic

__all__ = ["SCHEMA_VERSION", "NotCached", "cached", "recorded", "store", "slug", "offline", "check_online"]

SCHEMA_VERSION = 6  # raise it when a probe records something new or measures differently


_OFFLINE = [False]  # inside offline(): nothing may be measured


class NotCached(RuntimeError):
    """A probe's result that offline() needed and the calibration folder does not hold."""


@contextmanager
def offline():
    """Within it, a probe whose result is not cached raises NotCached instead of measuring."""
    was, _OFFLINE[0] = _OFFLINE[0], True
    try:
        yield
    finally:
        _OFFLINE[0] = was


def check_online(what: str) -> None:
    """Raise NotCached naming ``what`` when a probe would measure inside offline()."""
    if _OFFLINE[0]:
        raise NotCached(f"{what} is not cached, and nothing is measured offline")


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
    check_online(str(path))
    result = measure()
    store(path, result)
    return result


def recorded(path: Path, measure) -> dict:
    """``measure()``'s result, measured afresh at every call and stored at ``path``; inside offline(), what
    the last call stored there instead (NotCached when nothing of this SCHEMA_VERSION is). For timings of
    the moment, which a resumed study must not take from minutes before, but a re-prediction needs."""
    if _OFFLINE[0]:
        return cached(path, measure)  # offline, cached() reads the stored result or raises NotCached
    result = measure()
    store(path, result)
    return result


def store(path: Path, result: dict) -> None:
    """Write ``result`` to ``path`` with this SCHEMA_VERSION (atomically: a reader sees the old or the new)."""
    write_atomic(path, json.dumps({"schema_version": SCHEMA_VERSION, "result": result}, indent=1))
