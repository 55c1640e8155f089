"""The study's table: its columns, the figures derived from the rows (errors, speedups), and the repeats of
each model's baseline that say how far one measurement repeats on this machine."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from real.validation.config import KEY, is_baseline
from real.validation.verdict import failed

__all__ = ["COLUMNS", "Span", "BaselineRepeats", "derive", "recorded", "baseline_repeats"]

COLUMNS = (*KEY, "steps", "run_steps", "batch_size", "predicted_step_time", "measured_step_time", "rel_error",
           "measured_spread", "dropped", "predicted_seed_cv", "predicted_speedup", "measured_speedup", "speedup_error",
           "predicted_staleness_mean", "measured_staleness_mean", "staleness_mean_error", "predicted_staleness_max",
           "measured_staleness_max", "staleness_distance", "compute_time", "jitter", "probe_jitter", "meeting_excess",
           "link_bandwidth", "link_alpha",
           "link_launch", "server_bandwidth", "server_alpha", "server_newcomer_weight", "server_sharing_spread",
           "server_duplex_stretch", "server_service", "reducescatter_traffic", "allgather_traffic", "slow_forward",
           "link_at_size", "link_exit_spread",
           "replayed_step_time", "replayed_error", "loss_steps", "loss_rel_median", "loss_rel_max", "wall_time",
           "error")


# what derive reads of every row; a row that failed before its prediction or its run has none of them
_MEASURED = ("predicted_step_time", "measured_step_time", "predicted_throughput", "measured_throughput",
             "predicted_staleness_mean", "measured_staleness_mean")


def derive(frame: pd.DataFrame) -> pd.DataFrame:
    """Relative errors, and speedups over each model's one-worker all-reduce (measured and predicted alike):
    over the median of its repeats' throughputs (studies.validation.grid), each side's own. A table whose
    rows all failed before they were predicted or measured (each has an ``error`` and nothing else) gets
    the figures' columns empty."""
    frame = frame.reindex(columns=list(dict.fromkeys([*frame.columns, *_MEASURED])))
    frame["rel_error"] = frame["predicted_step_time"] / frame["measured_step_time"] - 1
    baseline = is_baseline(frame["scheme"], frame["world"], frame["slow"])
    base = frame[baseline & ~failed(frame)].groupby("model")[["predicted_throughput", "measured_throughput"]].median()
    for side in ("predicted", "measured"):
        frame[f"{side}_speedup"] = frame[f"{side}_throughput"] / frame["model"].map(base[f"{side}_throughput"])
    # the baseline's repeats measure the denominator, not the model's speedup: no error to report
    frame["speedup_error"] = (frame["predicted_speedup"] / frame["measured_speedup"] - 1).where(~baseline)
    if "replayed_step_time" in frame:  # rows that all failed before a run was replayed have none
        frame["replayed_error"] = frame["replayed_step_time"] / frame["measured_step_time"] - 1
    stale = frame["measured_staleness_mean"] > 0
    frame["staleness_mean_error"] = np.where(
        stale, frame["predicted_staleness_mean"] / frame["measured_staleness_mean"].where(stale) - 1, np.nan)
    return frame


def recorded(frame: pd.DataFrame, column: str) -> pd.Series:
    """``column``'s values where rows have one; empty for a table without that column."""
    return frame[column].dropna() if column in frame else pd.Series(dtype=float)


class Span(NamedTuple):
    """The fastest and slowest of some step times, seconds."""

    low: float
    high: float

    @property
    def apart(self) -> float:
        return self.high / self.low - 1


class BaselineRepeats(NamedTuple):
    """One model's speedup baseline over its repeats: how many ran, and the span of their measured step
    times and of their compute probes."""

    model: str
    runs: int
    measured: Span
    probed: Span


def baseline_repeats(frame: pd.DataFrame) -> list[BaselineRepeats]:
    """Each model's speedup baseline over its repeats (studies.validation.grid), where it has two or more:
    the same configuration measured and probed again minutes apart, identical but for the time it ran. How
    far apart they lie is how far apart two measurements of one compute-bound configuration can lie on this
    machine, what no prediction made before a run can do better than: a 2-core virtual machine whose
    processes run faster and slower by spells (7 repeats of the small model's baseline at 200 Mbit/s, run
    back to back: 1.44-2.03 ms measured, 1.34-2.15 ms probed, with every phase of a slow run slow alike:
    docs/log.md)."""
    rows = frame[is_baseline(frame["scheme"], frame["world"], frame["slow"])]
    found = []
    for model, runs in rows.groupby("model", sort=False):
        measured, probed = recorded(runs, "measured_step_time"), recorded(runs, "compute_time")
        if len(measured) >= 2 and len(probed) >= 2:
            found.append(BaselineRepeats(str(model), len(measured), Span(float(measured.min()), float(measured.max())),
                                         Span(float(probed.min()), float(probed.max()))))
    return found
