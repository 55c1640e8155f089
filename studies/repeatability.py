"""``python -m studies.repeatability``: the validation study run several times, to see how far a measurement repeats.

A prediction can only be judged down to how well the thing predicted repeats. This study runs
``studies.validation`` ``--times`` times (its quick preset unless ``--full``), each time in a folder
of its own and so with calibrations measured afresh, and asks of every configuration:

- how much its **measured** step time varies from one repeat to the next (sample coefficient of
  variation, ``measured_cv``): the floor under any prediction's error on this machine;
- how much its **prediction** varies (``predicted_cv``), which is the calibration's drift carried
  through the model;
- the range of its relative **error** over the repeats (``error_min``, ``error_median``,
  ``error_max``) and its runs' median drift within a run (``measured_spread``, see
  syncsim.metrics.step_time_spread).

If the same configuration measured twice differs by more than the prediction misses it, the miss is
this machine's, not the model's. Writes ``OUT/repeat-<i>/`` (each a whole validation study: CSV,
figure, runs, calibrations; a rerun resumes each), ``OUT/repeats.csv`` (every row of every repeat,
with its repeat number), ``OUT/repeatability.csv`` (one row per configuration) and
``OUT/repeatability.png`` (each configuration's errors over the repeats beside its measured
variation, drawn from ``repeats.csv``). Needs root and iproute2, as the validation does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from real.validation.config import KEY
from real.validation.verdict import failed
from studies import validation

__all__ = ["main", "summarise", "summary_lines", "plot", "TIMES"]

TIMES = 5
COLUMNS = (*KEY, "repeats", "measured_mean", "measured_cv", "predicted_cv", "compute_cv", "error_min",
           "error_median", "error_max", "measured_spread")


def _cv(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.std(ddof=1) / values.mean()) if len(values) >= 2 else float("nan")


def summarise(repeats: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration of ``repeats`` (validation rows with a ``repeat`` column); failed rows left out."""
    ok = repeats[~failed(repeats) & repeats["measured_step_time"].notna()]
    rows = []
    for key, group in ok.groupby(list(KEY), sort=False):
        rows.append(dict(zip(KEY, key)) | {
            "repeats": int(group["repeat"].nunique()),
            "measured_mean": float(group["measured_step_time"].mean()),
            "measured_cv": _cv(group["measured_step_time"]),
            "predicted_cv": _cv(group["predicted_step_time"]),
            "compute_cv": _cv(group["compute_time"]),
            "error_min": float(group["rel_error"].min()),
            "error_median": float(group["rel_error"].median()),
            "error_max": float(group["rel_error"].max()),
            "measured_spread": float(group["measured_spread"].median()) if "measured_spread" in group
            else float("nan"),
        })
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _label(row) -> str:
    slow = f", slow {row['slow']:g}" if row["slow"] > 1 else ""
    return f"{row['scheme']} on {row['world']} workers, {row['bandwidth']}, {row['model']}{slow}"


def summary_lines(table: pd.DataFrame) -> list[str]:
    """The verdict: how far measurements repeat, against how far predictions miss, per configuration."""
    if table.empty:
        return ["no configuration has two measured repeats"]
    cv = table["measured_cv"].dropna()
    lines = [f"measured step time repeats within a coefficient of variation of median {cv.median():.1%}, "
             f"max {cv.max():.1%} over {len(table)} configurations x {int(table['repeats'].max())} repeats"]
    for _, r in table.iterrows():
        lines.append(f"  {_label(r)}: measured varies {r['measured_cv']:.1%}, predicted {r['predicted_cv']:.1%}; "
                     f"error {r['error_min']:+.1%} .. {r['error_max']:+.1%} (median {r['error_median']:+.1%})")
    return lines


def plot(repeats_csv: Path, out: Path) -> Path:
    """Each configuration's errors over the repeats (dots) beside ± its measured variation (bar); from the CSV."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    repeats = pd.read_csv(repeats_csv, keep_default_na=False, na_values=[""])
    table = summarise(repeats)
    fig, ax = plt.subplots(figsize=(8, 0.6 * max(len(table), 3) + 1.2))
    for i, (_, r) in enumerate(table.iterrows()):
        mine = repeats[(repeats[list(KEY)] == pd.Series({k: r[k] for k in KEY})).all(axis=1)]
        ax.barh(i, 2 * r["measured_cv"] * 100, left=-r["measured_cv"] * 100, color="0.85", height=0.6)
        ax.plot(mine["rel_error"] * 100, [i] * len(mine), "o", color="C0")
    ax.axvline(0, color="0.3", lw=0.8)
    ax.set_yticks(range(len(table)), [_label(r) for _, r in table.iterrows()], fontsize=8)
    ax.set_xlabel("prediction error, % (dots: repeats; grey: ± measured variation)")
    fig.tight_layout()
    path = out / "repeatability.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from syncsim.arguments import ArgumentParser, check_count, integer
    from syncsim.files import check_out_dir

    ap = ArgumentParser(prog="python -m studies.repeatability", description=__doc__.splitlines()[0])
    ap.add_argument("--times", type=integer, default=TIMES, help=f"repeats of the study (default {TIMES})")
    ap.add_argument("--full", action="store_true",
                    help="repeat the default grid (about half an hour each), not the quick preset")
    ap.add_argument("--out", default="results/repeatability", help="output folder")
    ap.add_argument("--prefix", default="sstb", help="testbed namespace prefix")
    args = ap.parse_args(argv)
    try:
        check_count("--times", args.times, 2, 100)
        args.out = check_out_dir(args.out)
    except ValueError as err:
        ap.error(str(err))
    return args


def main(argv: list[str] | None = None) -> int:
    from studies.common import write_csv

    args = parse_args(argv)
    frames = []
    for i in range(1, args.times + 1):
        folder = args.out / f"repeat-{i}"
        print(f"studies.repeatability: repeat {i} of {args.times} in {folder}", flush=True)
        code = validation.main([*([] if args.full else ["--quick"]), "--out", str(folder), "--prefix", args.prefix])
        if code:
            return code  # the validation said why (no testbed, interrupted, bad input)
        frame = pd.read_csv(folder / "validation.csv", keep_default_na=False, na_values=[""])
        frames.append(frame.assign(repeat=i))
    repeats = write_csv(pd.concat(frames, ignore_index=True), args.out / "repeats.csv")
    table = write_csv(summarise(repeats), args.out / "repeatability.csv")
    figure = plot(args.out / "repeats.csv", args.out)
    for line in summary_lines(table):
        print(f"studies.repeatability: {line}")
    print(f"studies.repeatability: wrote {args.out / 'repeatability.csv'}, {args.out / 'repeats.csv'} and {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
