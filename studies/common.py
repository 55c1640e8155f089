"""What every study shares: its command-line options and atomic CSVs (the runner is studies.sweep)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd

from studies.sweep import default_jobs
from syncsim.arguments import ArgumentParser, check_count, fail, integer
from syncsim.files import check_out_dir, shown, write_atomic
from syncsim.limits import check_memory

__all__ = ["write_csv", "parse_args", "run_main"]


def write_csv(rows: Iterable[dict] | pd.DataFrame, path: Path) -> pd.DataFrame:
    """Write atomically (temp file, then rename): a reader never sees half a CSV."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    write_atomic(path, frame.to_csv(index=False))
    return frame


# [PROTOCOL://]HOST:PORT, as Dask's distributed.Client takes it
SCHEDULER = re.compile(r"(?:[a-z]+://)?[^\s/:]+:[0-9]{1,5}", re.ASCII)
# What one worker process of a study holds (Python, NumPy, pandas, SimPy and a simulation): a --jobs
# that many of these cannot fit in this machine's memory is refused.
JOB_BYTES = 256 * 2**20


def parse_args(prog: str, doc: str, default_out: str, argv: list[str] | None,
               options: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The options every study takes: ``--out DIR``, ``--quick``, ``--jobs N``, ``--scheduler ADDRESS``,
    and the study's own, which ``options(parser)`` adds.

    Checked before any work: the output folder must be writable now, not after the study has run.
    """
    parser = ArgumentParser(prog=prog, description=doc.splitlines()[0])
    parser.add_argument("--out", default=default_out, help="output folder")
    parser.add_argument("--quick", action="store_true", help="a small grid for tests (seconds)")
    parser.add_argument("--jobs", type=integer, default=default_jobs(),
                        help="worker processes on this machine (default: every core)")
    parser.add_argument("--scheduler", help="run on a Dask cluster: its scheduler's address, tcp://HOST:8786")
    if options is not None:
        options(parser)
    args = parser.parse_args(argv)
    try:
        args.out = check_out_dir(args.out)
        check_count("--jobs", args.jobs, 1)
        check_memory("--jobs", args.jobs, "worker processes", JOB_BYTES, "lower --jobs")
        if args.scheduler is not None and not SCHEDULER.fullmatch(args.scheduler):
            raise ValueError(f"--scheduler must be a Dask scheduler's address, [PROTOCOL://]HOST:PORT as in "
                             f"tcp://HOST:8786, got {shown(args.scheduler)}")
    except ValueError as err:
        parser.error(str(err))
    return args


def run_main(main: Callable[[], int], prog: str) -> int:
    """A study's ``__main__``: a ValueError (bad input found once running, e.g. no Dask scheduler at the
    address) or Ctrl-C ends in one line, not a traceback. Finished runs are kept either way (studies.sweep)."""
    try:
        return main()
    except ValueError as err:
        return fail(prog, err)
    except KeyboardInterrupt:
        print(f"{prog.removeprefix('python -m ')}: interrupted; finished runs are kept, a rerun resumes",
              file=sys.stderr)
        return 130
