"""Time to a target: the first evaluated point of a replay curve that meets it.

The answer is as fine as the replay's evaluation cadence (``every``): it is
the first *evaluated* version at or past the target, never an interpolation
that could claim a target the run did not demonstrably reach.
"""

from __future__ import annotations

import math

import pandas as pd

from syncsim.config import is_number

__all__ = ["time_to_target", "steps_to_target", "first_at_target"]

# Metrics where larger is better; every other metric (loss) is met from above.
HIGHER_IS_BETTER = ("accuracy",)


def first_at_target(curve: pd.DataFrame, target: float, metric: str = "loss") -> int | None:
    """Position of the first row meeting ``target`` (loss ≤ target, accuracy ≥ target), or None."""
    if metric not in curve.columns:
        raise ValueError(f"the curve has no column {metric!r}; columns: {', '.join(map(str, curve.columns))}")
    if not is_number(target) or not math.isfinite(target):
        raise ValueError(f"target must be a finite number, got {target!r}")
    values = curve[metric].to_numpy()
    met = values >= target if metric in HIGHER_IS_BETTER else values <= target
    hits = met.nonzero()[0]
    return int(hits[0]) if len(hits) else None


def time_to_target(curve: pd.DataFrame, target: float, metric: str = "loss") -> float:
    """Simulated seconds until the curve first meets ``target``; inf if it never does."""
    hit = first_at_target(curve, target, metric)
    return math.inf if hit is None else float(curve["time"].iloc[hit])


def steps_to_target(curve: pd.DataFrame, target: float, metric: str = "loss") -> float:
    """Steps per worker (gradients applied / workers) until ``target``; inf if never met."""
    hit = first_at_target(curve, target, metric)
    return math.inf if hit is None else float(curve["steps"].iloc[hit])
