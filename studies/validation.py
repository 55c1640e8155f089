"""``python -m studies.validation``: every scheme predicted by syncsim against measured on the emulated network.

For each configuration (scheme, workers, link rate, model, one slowed worker or none):

1. calibrate here, under the configuration's own contention (real.calibration): link α, β and
   a collective's launch cost fitted on a testbed at that rate (an all-reduce over as many hosts as
   the run has workers, a ping-pong between two); compute time, its jitter and the backward's share timed
   with as many processes computing at once as the configuration has ranks; for a parameter server
   with several workers, how two colliding transfers of the gradient split a host's shaper, timed
   on a 3-host testbed (the server NIC's newcomer weight and sharing spread, syncsim.network); and for
   any parameter server, its own time per push and pull beyond its link, timed with one worker and no
   model (real.calibration.server_probe, Cluster.server_service);
2. predict: ``simulate`` on that Cluster and Workload, the slowed worker as its speed factor, every
   all-reduce a ring as gloo runs it (as_run_on_gloo);
3. measure: the executor runs the scheme for real on a testbed of world + servers hosts (a slowed worker
   sizing its sleep from the forward its compute probe timed, so both sleep alike);
4. compare, by one definition of every figure (syncsim.metrics) on both sides, and record how much the
   measured run's own step time wandered (measured_spread, syncsim.metrics.step_time_spread): the
   floor under the row's error on a machine whose speed drifts;
5. replay (a diagnostic, not a prediction): ``simulate`` once more with the run's own compute phases
   (``replayed_compute``) in place of the calibrated compute model, so that ``replayed_error`` is
   what the rest of the model (links, sharing, scheduling) misses once compute is exactly as it ran;
6. loss curves: the run's update log replayed on its model and data (real.replay, syncsim.convergence)
   predicts each worker's loss at each of its first LOSS_STEPS steps, compared with the losses the
   executor logged (``loss_rel_median``, ``loss_rel_max``: |replayed / logged - 1|).

The compressing schemes (PowerSGD, top-k, DiLoCo) are calibrated by the same rules: the compute probe
times the executor's step, their compressor's arithmetic and DiLoCo's outer step inside it, so the
workload leaves syncsim's compressor rates unset; the link probe times what the run sends (PowerSGD's
two all-reduces, top-k's all-gathers of indices and values, DiLoCo's pseudo-gradient); the workload has
the model's tensor shapes, so PowerSGD's rounds are the run's sizes. The sharded schemes (ZeRO, FSDP: not in
the default grid; name them with --schemes, two workers or more) are calibrated the same way, their compute
probe timing the executor's step under ZeroRedundancyOptimizer or FSDP2, and the all-reduce of their
gradient standing for their reduce-scatters and all-gathers (timed_size).

Writes ``OUT/validation.csv`` (one row per configuration; a failed one is a row with its reason),
``OUT/parity.png`` (drawn from the CSV alone), each run's real and simulated traces under
``OUT/runs/<configuration>/``, the calibrations under ``OUT/calibration/`` and, timed before the
first run, the machine's own steadiness (real.testbed.steadiness) as ``OUT/steadiness.json``. A rerun keeps the
finished rows and measures only the rest. Needs root and iproute2 (the testbed).

The steps above are real.validation's (calibration, prediction, measurement, losses, evaluation); this
module is the study: its default grid, command line, progress, report and figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from real.validation.config import KEY, STEPS, Config, model_bytes
from real.validation.evaluation import evaluate
from real.validation.frame import COLUMNS, derive
from real.validation.losses import LOSS_STEPS, loss_figures
from real.validation.measurement import run_spread
from real.validation.prediction import MAX_STEPS
from real.validation.summary import summary_lines
from real.validation.verdict import failed

__all__ = ["grid", "quick_grid", "main", "parse_args", "plot", "fill_in_older_rows"]

SCHEMES = ("allreduce", "allreduce:precision=fp16", "ps", "ps:mode=async", "ps:staleness=2", "localsgd:period=4")
WORLDS = (1, 2, 4)
BANDWIDTHS = ("50Mbit/s", "200Mbit/s", "1Gbit/s")
MODELS = ("mlp", "lenet")
# The schemes that trade bytes for steps (PowerSGD, top-k, DiLoCo) and the sharded ones (ZeRO-1, ZeRO-3, FSDP)
# join the default grid as a few rows of their own, (schemes, worlds, bandwidths) for every model, without
# straggler rows: two workers at 200 Mbit/s. Each row costs the grid about 10 s (its own probes and a run), and
# the grid's 112 other rows take 25-27 of its 30 minutes; the compressed messages (2.7-34 kB) pass within a
# tbf bucket at every rate, so another rate adds time, not information. A command line that names --schemes,
# --worlds or --bandwidths runs what it names (docs/real.md), other rates and stragglers included.
COMPRESSED = ("allreduce:compression=powersgd,rank=4", "topk:ratio=0.01", "diloco:period=4")
SHARDED = ("zero:stage=1", "zero:stage=3", "fsdp")
EXTRA = ((COMPRESSED, (2,), ("200Mbit/s",)), (SHARDED, (2,), ("200Mbit/s",)))
SLOW = 3.0  # the straggler rows' slowed worker computes this many times as long
BATCH = 32
QUICK_BATCH = 256
"""The quick preset's batch: every step milliseconds long. At 32 the one-worker step of the small model
is under a millisecond, where one burst of a shared machine decides the row (-16 % to -23 % over CI runs;
37 % with a compute calibration that left out the executor's own bookkeeping)."""
# Seconds of real.testbed.steadiness at the study's start: how much this machine's own speed moves from
# one window to the next, quoted in the summary beside the errors (a minute of a 26-minute grid).
STEADINESS, QUICK_STEADINESS, MAX_STEADINESS = 60.0, 10.0, 600.0


def grid(schemes=SCHEMES, worlds=WORLDS, bandwidths=BANDWIDTHS, models=MODELS, slow=SLOW, extra=EXTRA) -> list[Config]:
    """Every scheme × workers × rate × model, plus one straggler row per scheme and model (at the fewest
    workers from two up, and the middle rate) and the one-worker all-reduce each speedup is measured against;
    then, for every model, the rows of ``extra``: each (schemes, worlds, bandwidths) block's product, without
    straggler rows (EXTRA: the compressing and sharded schemes' few rows of the default grid).

    A one-worker run that sends nothing (no parameter server) is the same run at every rate, so it is
    run once, at the first rate; except the speedup baseline, which is run at every rate as repeats of
    one measurement, spread over its model's rows (the first before them, the last after them): every
    speedup of the model divides by it, and one 2-second run or compute probe that a slow spell of this
    machine catches decides them all (a small model's baseline run 65 % slower than its probe made the
    speedups' median error 30.4 %). The speedups divide by the repeats' median (real.validation.frame.derive).
    """
    configs: list[Config] = []
    for model in models:
        rows: list[Config] = []
        for scheme in schemes:
            for world in worlds:
                for bandwidth in bandwidths:
                    config = Config(scheme, world, bandwidth, model)
                    if world == 1 and config.servers == 0:
                        config = dataclasses.replace(config, bandwidth=bandwidths[0])
                    if not config.baseline:
                        rows.append(config)
            several = [w for w in worlds if w >= 2]  # a straggler needs a peer to hold up
            if slow > 1 and several:
                rows.append(Config(scheme, min(several), bandwidths[len(bandwidths) // 2], model, slow))
        rows += [Config(scheme, world, bandwidth, model) for block_schemes, block_worlds, block_rates in extra
                 for scheme in block_schemes for world in block_worlds for bandwidth in block_rates]
        repeats = [Config("allreduce", 1, bandwidth, model) for bandwidth in bandwidths]
        spacing = len(rows) / max(1, len(repeats) - 1)
        for k, repeat in reversed(list(enumerate(repeats))):  # from the back: earlier positions stay put
            rows.insert(round(k * spacing), repeat)
        configs.extend(rows)
    unique = {c.key: c for c in configs}
    return list(unique.values())


def quick_grid(slow: float = SLOW) -> list[Config]:
    """About 100 s with its calibration: the small model at one rate, two workers; synchronous and
    asynchronous PS, all-reduce."""
    return [Config("allreduce", 1, "200Mbit/s", "mlp"), Config("allreduce", 2, "200Mbit/s", "mlp"),
            Config("ps", 2, "200Mbit/s", "mlp"), Config("ps:mode=async", 2, "200Mbit/s", "mlp", slow)]


# -- the report's figure --------------------------------------------------------------
def plot(csv: Path, out: Path) -> Path:
    """Predicted against measured step time, log axes, ±10 % band, one marker per scheme; from the CSV alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = pd.read_csv(csv, keep_default_na=False, na_values=[""])
    data = data[~failed(data) & data["measured_step_time"].notna()]
    fig, ax = plt.subplots(figsize=(5.5, 5))
    markers = "osD^v<>phX*"
    for i, (scheme, rows) in enumerate(data.groupby("scheme", sort=True)):
        ax.scatter(rows["measured_step_time"] * 1e3, rows["predicted_step_time"] * 1e3, label=scheme,
                   marker=markers[i % len(markers)], s=28, alpha=0.8)
    if len(data):
        low = min(data["measured_step_time"].min(), data["predicted_step_time"].min()) * 1e3 / 1.5
        high = max(data["measured_step_time"].max(), data["predicted_step_time"].max()) * 1e3 * 1.5
        line = np.geomspace(low, high, 50)
        ax.plot(line, line, color="black", lw=0.8)
        ax.fill_between(line, line * 0.9, line * 1.1, color="grey", alpha=0.2, label="±10 %")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title("syncsim against the emulated network")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = out / "parity.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# -- the command line ------------------------------------------------------------------
FLAGS = {"scheme": "--schemes", "world": "--worlds", "bandwidth": "--bandwidths", "model": "--models",
         "slow": "--slow"}


def _items(flag: str, text: str, kind=str) -> tuple:
    """A comma-separated option's values, or ValueError naming the option. In ``--schemes`` a comma also
    separates a scheme's own options: an item ``key=value`` continues the scheme before it
    (``allreduce:amp=true,precision=fp16,ps`` is two schemes)."""
    items = [item.strip() for item in text.split(",")]
    if flag == "--schemes":
        joined: list[str] = []
        for item in items:
            if joined and "=" in item and ":" not in item:
                joined[-1] += "," + item
            else:
                joined.append(item)
        items = joined
    if not all(items):
        raise ValueError(f"{flag} must be a comma-separated list without empty items, got {text!r}")
    if kind is int:
        bad = [item for item in items if not item.isascii() or not item.isdigit()]
        if bad:
            raise ValueError(f"{flag} takes positive integers, got {bad[0]!r}")
        return tuple(int(item) for item in items)
    return tuple(items)


def configurations(args: argparse.Namespace) -> list[Config]:
    """The study's configurations, each checked (a bad value is refused naming its option)."""
    from real.config import RunConfig
    from syncsim.config import check_float

    try:
        check_float("Config", "slow", args.slow, low=1.0)  # also when no straggler row is made
        # the compressing and sharded schemes' own rows (EXTRA) belong to the default grid: a command line
        # that names its schemes, workers or rates runs what it names
        default = (args.schemes, args.worlds, args.bandwidths) == (SCHEMES, WORLDS, BANDWIDTHS)
        configs = quick_grid(args.slow) if args.quick else grid(args.schemes, args.worlds, args.bandwidths,
                                                                 args.models, args.slow, EXTRA if default else ())
    except ValueError as err:
        field = str(err).split(" ", 1)[0].removeprefix("Config.").split(":")[0]
        raise ValueError(f"{FLAGS.get(field, '--' + field)}: {err}") from None
    for config in configs:  # what the runs will be given, checked before any is started
        RunConfig(scheme=config.scheme, world=config.world, servers=config.servers, model=config.model,
                  steps=args.steps, batch_size=args.batch_size)
    return configs


def _parser():
    from syncsim.arguments import ArgumentParser, integer, number

    ap = ArgumentParser(prog="python -m studies.validation", description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", default=",".join(SCHEMES),
                    help="comma-separated scheme specs; a scheme's own options continue it "
                         "(allreduce:compression=powersgd,rank=4,topk:ratio=0.01 is two schemes)")
    ap.add_argument("--worlds", default=",".join(map(str, WORLDS)), help="comma-separated worker counts")
    ap.add_argument("--bandwidths", default=",".join(BANDWIDTHS), help="comma-separated link rates")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated real.models names")
    ap.add_argument("--slow", type=number, default=SLOW, help="straggler rows' slowdown (1: no straggler rows)")
    ap.add_argument("--steps", type=integer, default=STEPS, help="steps per worker of a run (fewer for long runs)")
    ap.add_argument("--batch-size", type=integer, default=None,
                    help=f"per worker (default {BATCH}; {QUICK_BATCH} with --quick)")
    ap.add_argument("--repeats", type=integer, default=5, help="repeats per message size in the link probe")
    ap.add_argument("--loss-steps", type=integer, default=LOSS_STEPS,
                    help="compare each run's logged losses with its replayed schedule over this many first steps "
                         "(0: not compared)")
    ap.add_argument("--out", default="results/validation", help="output folder")
    ap.add_argument("--quick", action="store_true", help="four configurations of the small model (about 100 s)")
    ap.add_argument("--prefix", default="sstb", help="testbed namespace prefix")
    ap.add_argument("--run-timeout", type=number, default=300.0, help="seconds before a run is stopped")
    ap.add_argument("--steadiness", type=number, default=None,
                    help=f"seconds to time the machine's own steadiness first (default {STEADINESS:g}; "
                         f"{QUICK_STEADINESS:g} with --quick; 0: not timed)")
    return ap


def _check(args: argparse.Namespace) -> None:
    """Every option checked (ValueError naming it), the lists split, the configurations and the settings
    they share made."""
    from real.calibrate import MAX_REPEATS
    from real.testbed import TestbedConfig
    from real.testbed.launcher import MAX_RUN_TIMEOUT
    from real.validation.settings import Settings
    from real.validation.traffic import sent_precisions
    from syncsim.arguments import check_count
    from syncsim.files import check_out_dir

    args.out = check_out_dir(args.out)
    check_count("--steps", args.steps, 2)
    check_count("--repeats", args.repeats, 1, MAX_REPEATS)
    check_count("--loss-steps", args.loss_steps, 0, MAX_STEPS)
    if args.steadiness != 0 and not 2 <= args.steadiness <= MAX_STEADINESS:
        raise ValueError(f"--steadiness must be 0 (not timed) or 2 to {MAX_STEADINESS:g} seconds, "
                         f"got {args.steadiness:g}")
    if not 0 < args.run_timeout <= MAX_RUN_TIMEOUT:
        raise ValueError(f"--run-timeout must be in (0, {MAX_RUN_TIMEOUT:g}] seconds, got {args.run_timeout:g}")
    TestbedConfig(prefix=args.prefix)
    args.schemes, args.bandwidths, args.models = (_items(flag, getattr(args, flag[2:]))
                                                  for flag in ("--schemes", "--bandwidths", "--models"))
    args.worlds = _items("--worlds", args.worlds, int)
    args.configs = configurations(args)
    args.settings = Settings(out=args.out, steps=args.steps, batch_size=args.batch_size, repeats=args.repeats,
                             prefix=args.prefix, run_timeout=args.run_timeout, loss_steps=args.loss_steps,
                             precisions=sent_precisions(args.configs))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The study's options; ``configs``, its configurations, and ``settings`` (real.validation.settings),
    what they share, added."""
    ap = _parser()
    args = ap.parse_args(argv)
    if args.batch_size is None:
        args.batch_size = QUICK_BATCH if args.quick else BATCH
    if args.steadiness is None:
        args.steadiness = QUICK_STEADINESS if args.quick else STEADINESS
    try:
        _check(args)
    except ValueError as err:
        ap.error(str(err))
    return args


def measured_steadiness(args: argparse.Namespace, timed_now: bool):
    """The machine's steadiness (real.testbed.steadiness) timed now, on the study's smallest model at its
    batch, and kept as OUT/steadiness.json; when nothing is to run (a finished study resumed) or
    ``--steadiness 0``, the one kept, or None."""
    from real.testbed.steadiness import Steadiness, measure_steadiness
    from syncsim.files import write_atomic

    path = args.out / "steadiness.json"
    if timed_now and args.steadiness > 0:
        model = min({c.model for c in args.configs}, key=model_bytes)
        print(f"studies.validation: timing this machine's own steadiness for {args.steadiness:g} s "
              f"({model}, batch {args.batch_size})", file=sys.stderr)
        result = measure_steadiness(model, args.batch_size, args.steadiness)
        write_atomic(path, result.to_json())
        return result
    return Steadiness.from_json(path.read_text()) if path.exists() else None


def fill_in_older_rows(rows: list[dict], configs: dict, out: Path, loss_steps: int = 0) -> list[dict]:
    """Compatibility with tables written by older versions of the study, the one place it lives: finished
    rows measured before ``measured_spread`` existed get it from their run's kept trace
    (``OUT/runs/<configuration>/trace.csv``), and, with ``loss_steps``, rows measured before the loss
    curves were compared get that comparison from the run's kept outputs (loss_figures), so a resumed
    study reports every row's drift and losses without running anything again; a row whose run's files
    are gone keeps NaN. Rows this version wrote have both, unless measured with ``--loss-steps 0``."""
    for row in rows:
        config = configs.get(tuple(row[k] for k in KEY))
        if config is None:
            continue
        folder = out / "runs" / config.name
        trace = folder / "trace.csv"
        if pd.isna(row.get("measured_spread")) and trace.exists():
            row["measured_spread"] = run_spread(pd.read_csv(trace), int(row["run_steps"]), config.world)
        if loss_steps and pd.isna(row.get("loss_rel_max")) and (folder / "summary.json").exists():
            row.update(loss_figures(folder, loss_steps))
    return rows


def _finished_rows(args: argparse.Namespace, csv: Path) -> list[dict]:
    """The rows of an earlier start that a rerun keeps: finished ones of the same steps and batch (failed
    ones are tried again)."""
    if not csv.exists():
        return []
    old = pd.read_csv(csv, keep_default_na=False, na_values=[""])
    old = old[~failed(old) & (old["steps"] == args.steps) & (old["batch_size"] == args.batch_size)]
    return fill_in_older_rows(old.to_dict("records"), {c.key: c for c in args.configs}, args.out, args.loss_steps)


def _save(rows: list[dict], csv: Path) -> None:
    from studies.common import write_csv

    write_csv(derive(pd.DataFrame(rows)).reindex(columns=[*COLUMNS, "predicted_throughput", "measured_throughput"]),
              csv)


def _report(args: argparse.Namespace, csv: Path, rows: list[dict], steadiness) -> Path:
    """The summary's lines printed, from the table as written (the grid's rows only); the figure's path."""
    wanted = {c.key for c in args.configs}
    frame = pd.read_csv(csv, keep_default_na=False, na_values=[""]) if rows else pd.DataFrame(columns=COLUMNS)
    frame = frame[[tuple(r) in wanted for r in frame[list(KEY)].itertuples(index=False, name=None)]]
    figure = plot(csv, args.out)
    # the grid's own wall time: every row's (calibration, prediction, run) and the steadiness timing
    wall = float(frame["wall_time"].sum()) + (len(steadiness.step_times) * steadiness.window if steadiness else 0.0)
    for line in summary_lines(frame, steadiness, default_keys={c.key for c in grid()}, wall_seconds=wall):
        print(f"studies.validation: {line}")
    return figure


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    from real.interrupt import Interrupted, raise_on_signals
    from real.testbed import unavailable
    from syncsim.arguments import fail

    args = parse_args(argv)
    reason = unavailable()
    if reason:
        return fail("studies.validation", reason)
    raise_on_signals()  # SIGINT/SIGTERM unwind through each Testbed's __exit__, which removes the namespaces
    csv = args.out / "validation.csv"
    rows = _finished_rows(args, csv)  # resume: finished rows stay, failed ones are tried again
    done = {tuple(r[k] for k in KEY) for r in rows}
    todo = [c for c in args.configs if c.key not in done]
    started = time.perf_counter()
    if rows and not todo:
        _save(rows, csv)  # nothing to run: the resumed rows, with any drift filled in from their traces
    try:
        steadiness = measured_steadiness(args, timed_now=bool(todo))
        for config in tqdm(todo, desc="validation", unit="run", dynamic_ncols=True):
            rows.append(evaluate(config, args.settings))
            _save(rows, csv)
    except Interrupted as err:
        print(f"studies.validation: interrupted by {err.name}; finished rows are in {csv}, a rerun resumes",
              file=sys.stderr)
        return err.exit_code
    figure = _report(args, csv, rows, steadiness)
    print(f"studies.validation: wrote {csv} and {figure} ({len(todo)} runs in "
          f"{time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
