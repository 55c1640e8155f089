"""What every study shares: its command-line options and atomic CSVs (the runner is studies.sweep)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from studies.sweep import default_jobs
from syncsim.files import write_atomic

__all__ = ["write_csv", "parse_args"]


def write_csv(rows: Iterable[dict] | pd.DataFrame, path: Path) -> pd.DataFrame:
    """Write atomically (temp file, then rename): a reader never sees half a CSV."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    write_atomic(path, frame.to_csv(index=False))
    return frame


def parse_args(prog: str, doc: str, default_out: str, argv: list[str] | None) -> argparse.Namespace:
    """The options every study takes: ``--out DIR``, ``--quick``, ``--jobs N``, ``--scheduler ADDRESS``."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(default_out), help="output folder")
    parser.add_argument("--quick", action="store_true", help="a small grid for tests (seconds)")
    parser.add_argument("--jobs", type=int, default=default_jobs(),
                        help="worker processes on this machine (default: every core)")
    parser.add_argument("--scheduler", help="run on a Dask cluster: its scheduler's address, tcp://HOST:8786")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    return args
