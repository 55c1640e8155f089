"""Atomic file writes: a reader (or a crash) never sees half a file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_atomic", "check_out_dir", "check_out_file"]


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes files private; results are for reading
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def check_out_dir(path: str | Path, what: str = "--out") -> Path:
    """``path`` as an output folder that can be written, checked before any work starts.

    Refuses an empty path (it would write into the current folder unasked), a path that is a
    file, and one whose nearest existing folder cannot be written (permissions, a read-only
    file system): the probe is a temporary file created and removed there, so nothing is left.
    """
    folder = _path(path, what, "folder")
    if _exists(folder, what) and not folder.is_dir():
        raise ValueError(f"{what} {shown(str(path))} is a file, not a folder")
    _check_writable(folder, what, str(path))
    return folder


def check_out_file(path: str | Path, what: str = "--out") -> Path:
    """``path`` as an output file that can be written (atomically, beside it), checked before any work."""
    file = _path(path, what, "file")
    if _exists(file, what) and file.is_dir():
        raise ValueError(f"{what} {shown(str(path))} is a folder; give a file name")
    _check_writable(file.parent, what, str(path))
    return file


def shown(text: object, limit: int = 100) -> str:
    """``repr`` of a value for a message: one line, and cut short when long."""
    text = repr(text)
    return text if len(text) <= limit else text[:limit - 5] + "...'"


def _path(path: str | Path, what: str, kind: str) -> Path:
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ValueError(f"{what} must name a {kind}, got {shown(path)}")
    if "\0" in str(path):
        raise ValueError(f"{what} {shown(str(path))} contains a NUL character")
    return Path(path)


def _exists(path: Path, what: str) -> bool:
    try:
        return path.exists()
    except OSError as err:  # a name too long, a loop of links
        raise ValueError(f"{what} {shown(str(path))} is not a usable path: {err.strerror}") from None


def _check_writable(folder: Path, what: str, given: str) -> None:
    existing = folder
    while not _exists(existing, what):
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{what} {shown(given)}: {shown(str(existing))} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".syncsim-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(f"{what} {shown(given)}: cannot write in {shown(str(existing))} ({err.strerror})") from None
