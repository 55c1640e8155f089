"""Per-rank trace and update records, and the merge into the simulator's schema.

Every rank writes its own files under ``OUT/ranks/``; rank 0 (after the final
barrier) or the launcher (after a failure) merges them into ``OUT/trace.csv``,
``OUT/updates.csv`` and ``OUT/summary.json``. Every file is written to a
temporary name and moved into place with ``os.replace``, which POSIX makes
atomic: a reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

from syncsim.files import write_atomic
from syncsim.metrics import steady_state
from syncsim.recorder import TRACE_COLUMNS, UPDATE_COLUMNS  # the simulator's schema, column for column

if TYPE_CHECKING:  # imported where a merge reads the CSVs back: a rank that only records never needs it
    import pandas as pd

__all__ = ["Recorder", "TRACE_COLUMNS", "UPDATE_COLUMNS", "write_atomic", "merge", "rank_dir"]


def rank_dir(out: str | Path) -> Path:
    return Path(out) / "ranks"


def _csv_text(columns: tuple[str, ...], rows: list[tuple]) -> str:
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return buf.getvalue()


class Recorder:
    """Rows of one rank. Times are seconds since the run's common start ``t0`` (rank 0's clock)."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.trace: list[tuple] = []
        self.updates: list[tuple] = []

    def now(self) -> float:
        return time.time() - self.t0

    def span(self, worker: int, step: int, kind: str, start: float, end: float, nbytes: float = 0.0) -> None:
        self.trace.append((worker, step, kind, round(start, 6), round(end, 6), int(nbytes)))

    def update(self, worker: int, step: int, read: int, applied: int, time_applied: float) -> None:
        self.updates.append((worker, step, read, applied, applied - read, round(time_applied, 6)))

    def write(self, out: str | Path, rank: int, result: dict) -> None:
        d = rank_dir(out)
        write_atomic(d / f"trace-rank{rank}.csv", _csv_text(TRACE_COLUMNS, self.trace))
        write_atomic(d / f"updates-rank{rank}.csv", _csv_text(UPDATE_COLUMNS, self.updates))
        write_atomic(d / f"result-rank{rank}.json", json.dumps(result, indent=1))


def _read_rows(paths: list[Path]) -> list[list[str]]:
    rows = []
    for path in paths:
        with path.open() as f:
            rows += list(csv.reader(f))[1:]
    return rows


def merge(out: str | Path, config: dict, complete: bool, error: str | None = None,
          first_failure: dict | None = None) -> dict:
    """Merge the rank files under ``out`` and write trace.csv, updates.csv and summary.json.

    After a failure some result files are stand-ins the launcher wrote for ranks that could not
    (``"stand_in": true``, real.failure): they count for steps done and errors, not for metrics.
    """
    import pandas as pd

    out = Path(out)
    d = rank_dir(out)
    trace = _read_rows(sorted(d.glob("trace-rank*.csv")))
    trace.sort(key=lambda r: (int(r[0]), int(r[1]), float(r[3])))
    updates = _read_rows(sorted(d.glob("updates-rank*.csv")))
    updates.sort(key=lambda r: (float(r[5]), int(r[0]), int(r[1])))
    results = [json.loads(p.read_text()) for p in sorted(d.glob("result-rank*.json"))]
    workers = sorted((r for r in results if r["role"] == "worker"), key=lambda r: r["rank"])
    write_atomic(out / "trace.csv", _csv_text(TRACE_COLUMNS, [tuple(r) for r in trace]))
    write_atomic(out / "updates.csv", _csv_text(UPDATE_COLUMNS, [tuple(r) for r in updates]))
    # The figures come from the files just written, read back as a user would read them.
    summary = summarise(config, workers, results, complete, error, pd.read_csv(out / "trace.csv"),
                        pd.read_csv(out / "updates.csv")) | {"first_failure": first_failure}
    write_atomic(out / "summary.json", json.dumps(summary, indent=1))
    return summary


def summarise(config: dict, workers: list[dict], results: list[dict], complete: bool, error: str | None,
              trace: pd.DataFrame, updates: pd.DataFrame) -> dict:
    # Steady-state figures by the simulator's own definition (syncsim.metrics), from the merged tables.
    done = {w["rank"]: w.get("steps_done", 0) for w in workers}
    workers = [w for w in workers if not w.get("stand_in")]
    steady = steady_state(trace, updates, config["batch_size"], steps=config["steps"],
                          workers=config["world"]) if len(trace) else None
    step_time = steady.step_time if steady is not None and math.isfinite(steady.step_time) else None
    losses = [w["final_loss"] for w in workers if w.get("final_loss") is not None]
    bytes_sent = {str(w["rank"]): w.get("bytes_sent", 0) for w in workers}
    steps_done = [done[rank] for rank in sorted(done)]
    failed = [r for r in results if r.get("error")]
    return {
        "scheme": config.get("scheme"), "world": config.get("world"), "servers": config.get("servers"),
        "model": config.get("model"), "steps": config.get("steps"), "batch_size": config.get("batch_size"),
        "step_time": step_time,
        "throughput": None if step_time is None else steady.throughput,
        "worker_step_times": None if steady is None else [None if not math.isfinite(t) else float(t)
                                                          for t in steady.worker_step_times],
        "staleness_mean": None if steady is None else steady.staleness_mean,
        "staleness_max": None if steady is None else steady.staleness_max,
        "final_loss": sum(losses) / len(losses) if losses else None,
        "bytes_sent": bytes_sent,
        "bytes_per_worker_step": (sum(w.get("bytes_sent", 0) / max(1, w.get("steps_done", 0)) for w in workers)
                                  / len(workers) if workers else None),
        "param_checksums": {str(w["rank"]): w.get("checksum") for w in workers},
        "steps_done": steps_done,
        "complete": bool(complete),
        "error": error,
        "rank_errors": {str(r["rank"]): {"step": r.get("step"), "error": r["error"], "kind": r.get("error_kind"),
                                         "time": r.get("error_time")} for r in sorted(failed, key=lambda r: r["rank"])},
        "config": config,
    }
