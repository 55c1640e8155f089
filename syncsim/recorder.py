"""Column-wise recording of the trace and the applied updates.

Rows arrive one at a time (asynchronous schemes) or as whole blocks, one row
per worker (collectives); both are kept as columns and become DataFrames only
when a result is read, so recording costs little inside the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Recorder", "KINDS", "TRACE_COLUMNS", "UPDATE_COLUMNS", "COLLECTIVE_COLUMNS"]

# Kinds of trace rows: the actions that take time or move bytes.
KINDS = ("compute", "allreduce", "average", "push", "wait", "pull", "allgather", "outer", "reducescatter")
KIND_CODE = {kind: code for code, kind in enumerate(KINDS)}
TRACE_COLUMNS = ("worker", "step", "kind", "start", "end", "bytes")
UPDATE_COLUMNS = ("worker", "step", "version_read", "version_applied", "staleness", "time_applied")
# One row per bucket of every collective (shared by all workers): which algorithm ran and when.
COLLECTIVE_COLUMNS = ("step", "kind", "bucket", "bytes", "algorithm", "start", "end")


class Recorder:
    def __init__(self) -> None:
        self.trace_rows: tuple[list, ...] = ([], [], [], [], [], [])
        self.trace_blocks: list[tuple[np.ndarray, ...]] = []
        self.update_rows: tuple[list, ...] = ([], [], [], [], [])
        self.update_blocks: list[tuple[np.ndarray, ...]] = []
        self.collective_rows: list[tuple] = []

    # -- trace ------------------------------------------------------------------------
    def event(self, worker: int, step: int, kind: int, start: float, end: float, nbytes: float) -> None:
        w, s, k, a, b, n = self.trace_rows
        w.append(worker)
        s.append(step)
        k.append(kind)
        a.append(start)
        b.append(end)
        n.append(nbytes)

    def events(self, workers: np.ndarray, step: int | np.ndarray, kind: int, start: np.ndarray | float,
               end: np.ndarray | float, nbytes: float) -> None:
        count = len(workers)
        self.trace_blocks.append((
            np.asarray(workers, dtype=np.int64),
            np.broadcast_to(np.asarray(step, dtype=np.int64), (count,)),
            np.full(count, kind, dtype=np.int8),
            np.broadcast_to(np.asarray(start, dtype=float), (count,)),
            np.broadcast_to(np.asarray(end, dtype=float), (count,)),
            np.full(count, nbytes, dtype=float),
        ))

    # -- updates ------------------------------------------------------------------------
    def update(self, worker: int, step: int, version_read: int, version_applied: int, time: float) -> None:
        w, s, r, a, t = self.update_rows
        w.append(worker)
        s.append(step)
        r.append(version_read)
        a.append(version_applied)
        t.append(time)

    def updates(self, workers: np.ndarray, steps: np.ndarray | int, version_read: np.ndarray | int,
                version_applied: int, time: float) -> None:
        count = len(workers)
        self.update_blocks.append((
            np.asarray(workers, dtype=np.int64),
            np.broadcast_to(np.asarray(steps, dtype=np.int64), (count,)),
            np.broadcast_to(np.asarray(version_read, dtype=np.int64), (count,)),
            np.full(count, version_applied, dtype=np.int64),
            np.full(count, time, dtype=float),
        ))

    # -- collectives ---------------------------------------------------------------------
    def collective(self, step: int, kind: str, bucket: int, nbytes: float, algorithm: str, start: float,
                   end: float) -> None:
        self.collective_rows.append((step, kind, bucket, nbytes, algorithm, start, end))

    # -- tables ------------------------------------------------------------------------
    @staticmethod
    def _columns(rows: tuple[list, ...], blocks: list[tuple[np.ndarray, ...]], dtypes: tuple) -> list[np.ndarray]:
        columns = []
        for i, dtype in enumerate(dtypes):
            parts = [np.asarray(rows[i], dtype=dtype)] + [block[i].astype(dtype, copy=False) for block in blocks]
            columns.append(np.concatenate(parts) if len(parts) > 1 else parts[0])
        return columns

    def trace_frame(self) -> pd.DataFrame:
        import pandas as pd  # here, not at the top: real ranks import this module for its column names

        w, s, k, a, b, n = self._columns(self.trace_rows, self.trace_blocks,
                                         (np.int64, np.int64, np.int8, float, float, float))
        order = np.lexsort((k, w, a))  # by start time, then worker, then kind
        kind = pd.Categorical.from_codes(k[order], categories=list(KINDS))
        return pd.DataFrame({"worker": w[order], "step": s[order], "kind": kind, "start": a[order],
                             "end": b[order], "bytes": n[order]})

    def updates_frame(self) -> pd.DataFrame:
        import pandas as pd

        w, s, r, a, t = self._columns(self.update_rows, self.update_blocks,
                                      (np.int64, np.int64, np.int64, np.int64, float))
        order = np.lexsort((w, a, t))  # in the order updates were applied
        return pd.DataFrame({"worker": w[order], "step": s[order], "version_read": r[order],
                             "version_applied": a[order], "staleness": (a - r)[order], "time_applied": t[order]})

    def collectives_frame(self) -> pd.DataFrame:
        import pandas as pd

        frame = pd.DataFrame(self.collective_rows, columns=list(COLLECTIVE_COLUMNS))
        return frame.astype({"step": np.int64, "bucket": np.int64, "bytes": float, "start": float, "end": float})
