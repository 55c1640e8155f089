"""The study's printed summary: errors of the rows the targets speak of, and of every other group."""

from __future__ import annotations

import pandas as pd

from studies.published.sharded import SHARDED_WHAT

__all__ = ["calibrating", "bounded", "KINDS", "count", "errors", "errors_of_datasets", "summary", "sharded_summary"]


def calibrating(data: pd.DataFrame) -> pd.Series:
    """Which rows calibrate a compute efficiency (sharded datasets): reported, never counted in an error."""
    if "calibration" not in data:
        return pd.Series(False, index=data.index)
    return data["calibration"].fillna(False).astype(bool)


def bounded(data: pd.DataFrame) -> pd.DataFrame:
    """The rows the targets speak of: bandwidth-bound and inside the model (calibration rows never)."""
    return data[data["bandwidth_bound"] & data["in_model"] & ~calibrating(data)]


# The kinds of row, as the summary names them ("what" in the CSV).
KINDS = {"allreduce seconds": "all-reduce time", "scaling efficiency": "scaling efficiency",
         SHARDED_WHAT: "sharded tokens/s per GPU"}


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def errors(rows: pd.DataFrame) -> str:
    """Median and max |error| over the rows that have a prediction, and how many; never a NaN."""
    err = rows["rel_error"].abs().dropna()
    if err.empty:
        return f"no prediction on its {count(len(rows), 'row')}" if len(rows) else "no rows"
    text = f"median |error| {err.median():.1%}, max {err.max():.1%} over {count(len(err), 'row')}"
    return text + (f" ({len(rows) - len(err)} not predicted)" if len(err) < len(rows) else "")


def errors_of_datasets(rows: pd.DataFrame) -> str:
    datasets = f" of {count(rows['dataset'].nunique(), 'dataset')}" if len(rows) else ""
    return errors(rows) + datasets


def summary(data: pd.DataFrame) -> str:
    rows = bounded(data)
    lines = [f"bandwidth-bound, in-model rows: {errors_of_datasets(rows)}"]
    worst = rows.assign(abs_error=rows["rel_error"].abs()).dropna(subset=["abs_error"]).nlargest(3, "abs_error")
    for r in worst.itertuples(index=False):
        lines.append(f"  worst: {r.dataset} {r.what} at {r.size:.4g}: predicted {r.predicted:.4g}, measured "
                     f"{r.measured:.4g} ({r.rel_error:+.1%}, {r.algorithm})")
    calibration = calibrating(data)
    outside = data[~data["in_model"]]
    # the headline had each outside dataset been let in: how much the exclusions move it
    for dataset, group in outside[outside["bandwidth_bound"] & outside["rel_error"].notna()
                                  & ~calibration[outside.index]].groupby("dataset"):
        lines.append(f"  with {dataset} included: {errors(pd.concat([rows, group]))}")
    inside = data[data["in_model"] & ~data["bandwidth_bound"] & ~calibration]
    for what, name in KINDS.items():
        if what != SHARDED_WHAT:  # the sharded rows have lines of their own (sharded_summary)
            part = inside[inside["what"] == what]
            lines.append(f"not bandwidth-bound, in-model rows, {name}: {errors_of_datasets(part)}")
    lines += sharded_summary(data)
    for dataset, group in outside.groupby("dataset"):
        predicted = group[group["rel_error"].notna() & ~calibration[group.index]]
        big = predicted[predicted["bandwidth_bound"]]["rel_error"]
        if predicted.empty:
            why = next((w for w in group["no_prediction"] if isinstance(w, str) and w), "none made")
            verdict = f"no prediction: {why} ({count(len(group), 'row')})"
        elif big.empty:
            verdict = (f"no bandwidth-bound rows; median error {predicted['rel_error'].median():+.1%} over its "
                       f"{count(len(predicted), 'row')}")
        else:
            verdict = f"median error {big.median():+.1%} on its {count(len(big), 'bandwidth-bound row')}"
        lines.append(f"  outside the model: {dataset} ({group['reason'].iloc[0]}): {verdict}")
    return "\n".join(lines)


def sharded_summary(data: pd.DataFrame) -> list[str]:
    """The sharded datasets inside the model: their errors together (calibration rows not counted), then each one's,
    with its calibrated efficiencies or why it has no prediction. Outside ones get the outside lines' verdict too."""
    sharded = data[data["what"] == SHARDED_WHAT]
    if sharded.empty:
        return []
    calibration = calibrating(sharded)
    counted = sharded[~calibration & sharded["in_model"]]
    lines = [f"sharded (FSDP/ZeRO) tokens/s per GPU, in-model rows, calibration rows not counted: "
             f"{errors_of_datasets(counted)}"]
    for dataset, group in sharded.groupby("dataset"):
        where = "" if group["in_model"].all() else " (outside the model)"
        if group["rel_error"].isna().all():
            if group["in_model"].all():  # an outside one's reason is on its outside line
                lines.append(f"  {dataset}: no prediction: {group['no_prediction'].iloc[0]} "
                             f"({count(len(group), 'row')})")
            continue
        predicted, calibrated = group[~calibration[group.index]], group[calibration[group.index]]
        err = predicted["rel_error"].dropna()
        verdict = (f"median error {err.median():+.1%}, max |error| {err.abs().max():.1%} over its "
                   f"{count(len(err), 'row')}" if len(err) else "no row beyond its calibration rows")
        efficiency = ", ".join(f"{e:.1%}" for e in calibrated["compute_efficiency"])
        lines.append(f"  {dataset}{where}: {verdict}; compute efficiency {efficiency} of the datasheet peak, "
                     f"calibrated on {count(len(calibrated), 'row')} (simulated there: median "
                     f"{calibrated['rel_error'].median():+.1%})")
    return lines
