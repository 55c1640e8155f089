"""``python -m real.validation.repredict OUT``: a finished validation study's rows predicted again by the
simulator as it is now, from the calibration the study cached under OUT, with nothing measured: the same
runs, only the prediction redone, to see what a change to the model does to every row in seconds.

A row whose calibration timed the run's own collectives in the minute before it (an all-reducing run
with several workers, a top-k exchange: real.validation.traffic's timed_size and timed_gather) is
predicted again from the timings the study kept of them (measure_link's ``keep``); a row whose
calibration the folder lacks (a study older than those kept timings, for such rows), or whose run's
records (OUT/runs/NAME/trace.csv, updates.csv) are gone, keeps its recorded prediction. The summary
says how many rows each. Re-predicted rows are compared with their runs as the study compares them
(real.validation.evaluation.compared), the measured figures read again from the kept records.

``--host`` is a diagnostic too: every row's cluster is one host whose cores the ranks share, the ranks
leaving each collective as far apart as the row's own timed collectives let them go, and a parameter
server's workers sharing them with whoever computes when each compute starts
(real.validation.calibration.shared_host, syncsim.host); a study older than that spread's record gives
no spread, and its rows compute together after a collective as before.

``--window BYTES`` is a diagnostic too: every parameter server's link takes that window instead of the one
the study read on the testbed (syncsim's Link.window: a reply sends a window per queueing delay of the
pushes it waits behind; 0: none, the model before the study read it).

``--compute drawn`` is a diagnostic instead: each row's compute is drawn at random from its own run's
compute phases rather than from the probe's distribution (real.validation.prediction.predict_drawn), and
``--compute drawn-untailed`` does the same with the phases' tail cut off; a row whose run communicates
nothing or whose trace has no compute phase keeps its recorded prediction.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pandas as pd

from real.validation.config import Config
from real.validation.settings import Settings

__all__ = ["repredict", "main"]


def _settings(frame: pd.DataFrame, configs: list[Config], out: Path) -> Settings:
    """The study's settings as far as its calibration's cache names depend on them."""
    from real.validation.traffic import sent_precisions

    return Settings(out=out, steps=int(frame["steps"].max()), batch_size=int(frame["batch_size"].max()), repeats=5,
                    prefix="sstb", run_timeout=300.0, loss_steps=0, precisions=sent_precisions(configs))


def repredict(frame: pd.DataFrame, out: Path, compute: str = "probe", host: bool = False,
              window: float | None = None) -> tuple[pd.DataFrame, dict[str, int]]:
    """``frame`` (a study's validation.csv under ``out``) with each measured row's prediction redone from
    the cached calibration; and how many rows were re-predicted, kept and not cached (each of those two
    keeps its recorded prediction). With ``compute`` one of prediction.DRAWN, a diagnostic: each row's
    compute is drawn from its run's own compute phases (prediction.predict_drawn), and a row whose run
    communicates nothing or whose trace has no compute phase is kept. With ``host``, a diagnostic: each
    row's cluster is a shared host (calibration.shared_host). With a ``window`` (bytes), a diagnostic: each
    server link's Link.window."""
    from real.calibration.cache import NotCached, offline
    from real.validation.calibration import calibrate, shared_host
    from real.validation.evaluation import compared
    from real.validation.frame import derive
    from real.validation.measurement import read_steady
    from real.validation.prediction import DRAWN, as_run_on_gloo, predict, predict_drawn
    from real.validation.verdict import failed
    from syncsim import simulate

    if compute != "probe" and compute not in DRAWN:
        raise ValueError(f"repredict: compute must be probe, {' or '.join(DRAWN)}; got {compute!r}")
    frame = frame.copy()
    rows = frame[~failed(frame)]
    configs = [Config(r.scheme, int(r.world), r.bandwidth, r.model, float(r.slow)) for r in rows.itertuples()]
    settings = _settings(rows, configs, out)
    counts = {"repredicted": 0, "kept": 0, "not cached": 0}
    for (i, row), config in zip(rows.iterrows(), configs):
        steps = int(row["run_steps"])
        try:
            with offline():
                calibration = calibrate(config, settings)
            trace, measured = read_steady(out / "runs" / config.name, int(row["batch_size"]), steps, config.world)
        except (NotCached, FileNotFoundError):
            counts["not cached"] += 1
            continue
        scheme = as_run_on_gloo(config.scheme)
        try:
            with offline():
                cluster = (shared_host(calibration.cluster, row.to_dict(), config, settings) if host
                           else calibration.cluster)
        except NotCached:
            counts["not cached"] += 1
            continue
        if window is not None and cluster.servers:
            cluster = cluster.replace(server_link=dataclasses.replace(cluster.server_net, window=window))
        if compute == "probe":
            prediction = predict(simulate(cluster, calibration.workload, scheme, steps=steps, seed=0))
        else:
            prediction = predict_drawn(cluster, calibration.workload, scheme, trace, steps, config.world, compute)
            if prediction is None:
                counts["kept"] += 1
                continue
        figures = compared(prediction.steady, measured) | {"predicted_seed_cv": prediction.seed_cv}
        frame.loc[i, list(figures)] = list(figures.values())
        counts["repredicted"] += 1
    return derive(frame), counts


def _window(text: str) -> float:
    """``--window``'s bytes: a size of 0 or more."""
    from syncsim.units import parse_size

    window = float(parse_size(text, "--window"))
    if not 0 <= window < math.inf:  # NaN fails too
        raise ValueError(f"--window must be a size of 0 bytes or more, got {text!r}")
    return window


def main(argv: list[str] | None = None) -> int:
    from real.testbed.preemption import TAIL
    from real.validation.prediction import DRAWN
    from real.validation.summary import summary_lines
    from syncsim.arguments import ArgumentParser

    ap = ArgumentParser(prog="python -m real.validation.repredict", description=__doc__.splitlines()[0])
    ap.add_argument("out", help="a finished study's folder (its validation.csv and calibration/)")
    ap.add_argument("--compute", choices=("probe",) + DRAWN, default="probe",
                    help="probe: the prediction as the study makes it (default); drawn: a diagnostic, each "
                         "row's compute drawn from its run's own compute phases; drawn-untailed: the same "
                         f"with phases over {TAIL:g} times their median replaced by the median")
    ap.add_argument("--host", action="store_true",
                    help="a diagnostic: each row's ranks share this machine's cores, leaving each collective as far "
                         "apart as the row's own timed collectives let them go; a parameter server's workers "
                         "sharing them as each compute starts (syncsim.host)")
    ap.add_argument("--window", default=None, metavar="BYTES",
                    help="a diagnostic: every parameter server's link takes this window (Link.window, e.g. 300kB; "
                         "0: none) instead of the one the study read on the testbed")
    args = ap.parse_args(argv)
    try:
        window = None if args.window is None else _window(args.window)
    except ValueError as err:
        ap.error(str(err))
    out = Path(args.out)
    if not (out / "validation.csv").is_file():
        ap.error(f"out: {out / 'validation.csv'} does not exist (run python -m studies.validation --out {out})")
    frame, counts = repredict(pd.read_csv(out / "validation.csv"), out, args.compute, args.host, window)
    written = out / ("repredicted" + ("" if args.compute == "probe" else f"-{args.compute}")
                     + ("-host" if args.host else "")
                     + (f"-window{window:g}" if window is not None else "") + ".csv")
    frame.to_csv(written, index=False)
    print(f"re-predicted {counts['repredicted']} rows from {out / 'calibration'}; {counts['kept']} kept their "
          f"recorded prediction (with --compute drawn: their run has no compute phase of its own), "
          f"{counts['not cached']} not cached (their calibration or their run's records are not in {out}; a "
          f"study older than its rows' kept collective timings lacks them for all-reducing rows): these keep "
          f"their recorded prediction too")
    if args.host:
        why = "a diagnostic that gives each row's ranks one shared host, not the study's prediction"
    elif window is not None:
        why = "a diagnostic that gives each server's link a window of its own, not the study's prediction"
    elif args.compute != "probe":
        why = "a diagnostic that gives each row its run's own compute, not a prediction"
    else:
        why = ("these rows were predicted again from a finished study's runs; only the study, which times its "
               "machine first, judges its targets")
    for line in summary_lines(frame, not_judged=why):
        print(line)
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
