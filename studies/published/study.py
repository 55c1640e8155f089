"""The study: predict every dataset, write published.csv and parity.png, print the summary."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

import studies.published
from studies import sweep
from studies.common import parse_args, write_csv
from studies.published.dataset import load
from studies.published.plot import plot
from studies.published.predict import predict_dataset, prediction
from studies.published.summary import summary

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args("python -m studies.published", studies.published.__doc__, "results/published", argv)
    started = time.perf_counter()
    results = sweep.run(predict_dataset, [prediction(ds) for ds in load()], study="published", out=args.out,
                        jobs=args.jobs, scheduler=args.scheduler)
    data = pd.DataFrame([row for rows in results for row in rows])
    out: Path = args.out
    csv = out / "published.csv"
    write_csv(data, csv)
    figure = plot(csv, out)
    print(summary(data))
    print(f"\nwrote {csv}, {figure} ({len(data)} rows in {time.perf_counter() - started:.1f} s)")
    return 0
