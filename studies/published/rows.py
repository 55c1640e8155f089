"""One row of ``published.csv``, and the cells and step counts a row's prediction reads."""

from __future__ import annotations

import math

from studies.published.dataset import Dataset
from syncsim.schemes import parse

__all__ = ["output_row", "cell", "value_of", "sync_period", "simulated_steps"]


def output_row(ds: Dataset, what: str, size: float, measured: float, predicted: float, algorithm: str,
               bound: bool, no_prediction: str = "", scheme: str = "", nic_rate: str = "", calibration: bool = False,
               efficiency: float = math.nan) -> dict:
    """One row of published.csv: a measured row of ``ds``, its prediction, and whether the model covers it."""
    reason = ds.outside_model()
    return {"dataset": ds.id, "kind": ds.meta["kind"], "what": what, "size": size, "measured": measured,
            "predicted": predicted, "rel_error": predicted / measured - 1.0, "algorithm": algorithm,
            "bandwidth_bound": bound, "in_model": reason is None, "reason": reason or "",
            "no_prediction": no_prediction, "source": ds.source, "scheme": scheme, "nic_rate": nic_rate,
            "calibration": calibration, "compute_efficiency": efficiency}


def cell(row, column: str) -> str:
    """A row's text in an optional CSV column ("" where the dataset has no such column or leaves it empty)."""
    value = getattr(row, column, None)
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def sync_period(scheme: str) -> int:
    """Steps between two synchronisations of the scheme's parameters (``period``: local SGD, DiLoCo), else 1."""
    return int(getattr(parse(scheme), "period", 1))


def simulated_steps(scheme: str) -> int:
    """Steps to simulate a training row: 20, or ten sync periods for a scheme that synchronises every
    ``period`` steps, so that the steady state (after the first tenth, one period) holds whole periods
    and the run's last step, which always synchronises, ends one."""
    return max(20, 10 * sync_period(scheme))


def value_of(ds: Dataset, row, column: str) -> str:
    """A row's own value of ``column`` (a CSV column), else the dataset's (``model.<column>``), else ""."""
    return cell(row, column) or str(ds.model.get(column) or "")
