"""When does compression or DiLoCo pay? Time to accuracy against the speed of the network between nodes.

``python -m studies.tradeoffs [--quick] [--out DIR] [--jobs N] [--scheduler ADDRESS]`` simulates every
scheme on a cluster whose inter-node network is swept from a DGX's eight 400 Gbit/s rails down to
cross-region rates, replays each simulated update order on scikit-learn's 8×8 digits
(``syncsim.convergence.Digits``) with the scheme's own numerics (PowerSGD's and top-k's error
feedback, DiLoCo's inner and outer optimisers), over several seeds, and writes to
``results/tradeoffs/``:

- ``runs.csv``: one row per (scheme, link rate, seed): step time, bytes per step, steps to the target
  accuracy and time to it;
- ``summary.csv``: per (scheme, link rate), the mean and 95 % interval over seeds of each, and the
  scheme's time to target relative to all-reduce's;
- ``crossovers.csv``: for each scheme, the link rates at which it becomes faster (or slower) to the
  target than plain all-reduce, interpolated on the log-log curves between the swept rates;
- ``tradeoffs.png``: time to target against link rate, one line per scheme with its interval, the
  crossovers marked, drawn from the CSVs.

The model of the time is the simulator's (the workload's compute and gradient, the cluster's links);
the steps come from the replayed problem, which stands in for the model: it shows how each scheme's
compression or infrequent synchronisation moves the steps to a target, not GPT-2's own curve. Every
scheme gets the step size of its optimiser's grid (``LEARNING_RATES``) that reaches the target in the
fewest steps on seed 0, chosen by the same rule for every scheme (``tuned_lr``), so none is tuned in its
own favour. Compressing costs what it would on an H100 (``H100_SCAN_RATE``, ``H100_THIN_PRODUCT_FLOPS``).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from studies import sweep
from studies.common import parse_args, run_main, write_csv
from syncsim import Cluster, Link, Workload, simulate
from syncsim.config import check_float, check_int
from syncsim.convergence import Digits, replay, steps_to_target, time_to_target
from syncsim.schemes import LocalUpdate, parse
from syncsim.units import parse_bandwidth

__all__ = ["Study", "Run", "quick", "main", "crossovers", "summarise"]

SCHEMES = (
    "allreduce", "allreduce:precision=bf16", "allreduce:compression=powersgd,rank=4", "topk:ratio=0.01",
    "diloco:period=16", "diloco:period=16,fragments=4",
)
# Inter-node bandwidth of a whole node, from a DGX H100's eight 400 Gbit/s rails (NCCL reaches 48 GB/s
# each, nccl-tests issue 267) down to what links between sites give: 10 and 1 Gbit/s.
RATES = ("3.2Tbit/s", "400Gbit/s", "100Gbit/s", "25Gbit/s", "10Gbit/s", "1Gbit/s")
# Each scheme's step size is the one of its optimiser's grid that reaches the target in the fewest steps
# (seed 0): SGD's for schemes whose workers step with SGD, AdamW's (whose steps are about lr per value
# whatever the gradient's size) for DiLoCo's AdamW inner steps.
LEARNING_RATES = {"sgd": (0.1, 0.3, 1.0, 3.0), "adamw": (0.003, 0.01, 0.03, 0.1)}
# What compressing costs on an H100 SXM: its HBM3 streams 3.35 TB/s (NVIDIA H100 datasheet). A pass over
# the gradient reads and writes 4-byte values: 3.35e12 / 8 values/s. PowerSGD's thin products (a matrix
# times rank-4 factors) stream the matrix once for 2·4 FLOPs per 4-byte value, so they are memory-bound
# at 2 FLOP per byte: 6.7 TFLOP/s, far below the tensor cores' peak.
H100_SCAN_RATE = 3.35e12 / 8
H100_THIN_PRODUCT_FLOPS = 3.35e12 * 2
MOMENTUM = 0.5
TARGET = 0.92
STEPS = 320  # a multiple of every period here: no forced final synchronisation
REPLAY_BATCH = 16
SEEDS = 5


@dataclass(frozen=True)
class Run:
    """One configuration: a scheme on the cluster at one inter-node rate, one seed, one step size."""

    scheme: str
    rate: str
    gpus: int
    steps: int
    lr: float
    seed: int = 0
    latency: str = "14us"
    workload: str = "gpt2"

    def __post_init__(self) -> None:
        parse(self.scheme)
        parse_bandwidth(self.rate, "Run.rate")
        check_int("Run", "gpus", self.gpus, 1)
        check_int("Run", "steps", self.steps, 1)
        check_float("Run", "lr", self.lr, low=0.0, low_open=True)


@dataclass(frozen=True)
class Study:
    schemes: tuple[str, ...] = SCHEMES
    rates: tuple[str, ...] = RATES
    """Inter-node bandwidth of one node (all its NICs together)."""
    gpus: int = 16
    """GPUs in all: nodes of 8 (the h100-400g preset's)."""
    steps: int = STEPS
    seeds: int = SEEDS
    latency: str = "14us"
    """One-way latency of the inter-node network (NCCL's per network step, as the presets); a WAN's
    milliseconds would add to the schemes that synchronise every step."""
    workload: str = "gpt2"
    learning_rates: dict = field(default_factory=lambda: dict(LEARNING_RATES))
    """The step-size grid of each local optimiser ("sgd", "adamw")."""

    def __post_init__(self) -> None:
        for s in self.schemes:
            parse(s)
        for r in self.rates:
            parse_bandwidth(r, "Study.rates")
        check_int("Study", "gpus", self.gpus, 1)
        check_int("Study", "steps", self.steps, 1)
        check_int("Study", "seeds", self.seeds, 2)
        for optimiser, grid in self.learning_rates.items():
            for lr in grid:
                check_float("Study", f"learning_rates[{optimiser!r}]", lr, low=0.0, low_open=True)
        Workload.preset(self.workload)


def quick() -> Study:
    return Study(schemes=("allreduce", "topk:ratio=0.01", "diloco:period=8,inner=sgd"),
                 rates=("400Gbit/s", "10Gbit/s", "1Gbit/s"), gpus=16, steps=96, seeds=2,
                 learning_rates={"sgd": (0.3,), "adamw": (0.03,)})


def build(run: Run) -> tuple[Cluster, Workload]:
    """The h100-400g preset at ``gpus`` GPUs with its inter-node network replaced by one link of ``rate``
    per node (what a node can send to the others, whichever NIC it leaves by)."""
    cluster = Cluster.preset("h100-400g", gpus=run.gpus)
    cluster = cluster.replace(nics_per_node=1, inter=Link(bandwidth=run.rate, latency=run.latency))
    workload = Workload.preset(run.workload, compress_flops=H100_THIN_PRODUCT_FLOPS, scan_rate=H100_SCAN_RATE)
    return cluster, workload


def execute(run: Run) -> dict:
    cluster, workload = build(run)
    result = simulate(cluster, workload, run.scheme, steps=run.steps, seed=run.seed)
    curve = replay(result, Digits(seed=run.seed), lr=run.lr, momentum=MOMENTUM, seed=run.seed,
                   batch_size=REPLAY_BATCH, stop=lambda row: row["accuracy"] >= TARGET)
    summary = result.summary()
    return {"scheme": run.scheme, "rate": run.rate, "rate_bytes": parse_bandwidth(run.rate, "rate"),
            "seed": run.seed, "lr": run.lr, "gpus": run.gpus, "step_time": summary["step_time"],
            "bytes_per_step": _bytes_per_step(result), "steps_to_target": steps_to_target(curve, TARGET, "accuracy"),
            "time_to_target": time_to_target(curve, TARGET, "accuracy"),
            "final_accuracy": float(curve["accuracy"].iloc[-1])}


def _bytes_per_step(result) -> float:
    """Bytes one worker puts on the wire per step, averaged over the run (the trace's bytes)."""
    trace = result.trace
    moved = trace[trace["kind"] != "compute"]
    return float(moved.groupby("worker")["bytes"].sum().mean()) / result.steps


def optimiser(scheme: str) -> str:
    """The optimiser the scheme's workers step with, read off its plan: AdamW where a LocalUpdate says so."""
    actions = parse(scheme).policy(4.0).actions(2)
    return "adamw" if any(isinstance(a, LocalUpdate) and a.optimizer == "adamw" for a in actions) else "sgd"


def tuned_lr(study: Study, scheme: str, jobs: int, out: Path, scheduler: str | None) -> float:
    """The step size of the scheme's optimiser's grid that reaches the target in the fewest steps, seed 0, at
    the fastest rate (steps do not depend on the rate for these schemes; ties: the smaller step size)."""
    grid = study.learning_rates[optimiser(scheme)]
    if len(grid) == 1:
        return grid[0]
    runs = [Run(scheme, study.rates[0], study.gpus, study.steps, lr, 0, study.latency, study.workload)
            for lr in grid]
    results = sweep.run(execute, runs, study="tradeoffs-lr", out=out, jobs=jobs, scheduler=scheduler)
    best = min(results, key=lambda r: (r["steps_to_target"], r["lr"]))
    return float(best["lr"])


def interval(values: pd.Series) -> tuple[float, float, float]:
    """Mean and 95 % interval (Student's t over the seeds) of finite values; inf when any seed never met it."""
    v = values.to_numpy(dtype=float)
    if not np.isfinite(v).all():
        return math.inf, math.inf, math.inf
    from scipy import stats

    mean = float(v.mean())
    half = float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else 0.0
    return mean, mean - half, mean + half


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (scheme, rate), group in runs.groupby(["scheme", "rate"], sort=False):
        row = {"scheme": scheme, "rate": rate, "rate_bytes": float(group["rate_bytes"].iloc[0]),
               "lr": float(group["lr"].iloc[0]), "seeds": len(group)}
        for column in ("step_time", "steps_to_target", "time_to_target"):
            mean, low, high = interval(group[column])
            row.update({column: mean, f"{column}_low": low, f"{column}_high": high})
        row["bytes_per_step"] = float(group["bytes_per_step"].mean())
        rows.append(row)
    summary = pd.DataFrame(rows)
    base = summary[summary["scheme"] == "allreduce"].set_index("rate")["time_to_target"]
    summary["vs_allreduce"] = [row.time_to_target / base.get(row.rate, math.nan) for row in summary.itertuples()]
    return summary


def crossovers(summary: pd.DataFrame, baseline: str = "allreduce") -> pd.DataFrame:
    """Where each scheme's mean time to target crosses the baseline's, between two swept rates: the rate
    at which log(time ratio) is zero on the straight line through its values at those rates (log rate)."""
    rows = []
    base = summary[summary["scheme"] == baseline].set_index("rate_bytes")["time_to_target"]
    for scheme, group in summary[summary["scheme"] != baseline].groupby("scheme", sort=False):
        curve = group.set_index("rate_bytes")["time_to_target"].sort_index()
        rates = [r for r in curve.index if r in base.index and math.isfinite(curve[r]) and math.isfinite(base[r])]
        ratios = [math.log(curve[r] / base[r]) for r in rates]
        for (r0, l0), (r1, l1) in zip(zip(rates, ratios), zip(rates[1:], ratios[1:])):
            if l0 == 0 or l0 * l1 >= 0:
                continue
            at = math.exp(math.log(r0) + (math.log(r1) - math.log(r0)) * l0 / (l0 - l1))
            rows.append({"scheme": scheme, "baseline": baseline, "rate_bytes": at, "rate_gbit": at * 8 / 1e9,
                         "faster_below": l0 < 0})
    return pd.DataFrame(rows, columns=["scheme", "baseline", "rate_bytes", "rate_gbit", "faster_below"])


def plot(summary_csv: Path, crossovers_csv: Path, out: Path) -> Path:
    """Time to target against link rate (log-log), one line per scheme with its 95 % interval, from the CSVs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, cross = pd.read_csv(summary_csv), pd.read_csv(crossovers_csv)
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for scheme, group in summary.groupby("scheme", sort=False):
        group = group.sort_values("rate_bytes")
        gbit = group["rate_bytes"] * 8 / 1e9
        line, = ax.plot(gbit, group["time_to_target"], marker="o", label=scheme)
        ax.fill_between(gbit, group["time_to_target_low"], group["time_to_target_high"], color=line.get_color(),
                        alpha=0.2, linewidth=0)
        for row in cross[cross["scheme"] == scheme].itertuples():
            ax.axvline(row.rate_gbit, color=line.get_color(), linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("inter-node bandwidth per node (Gbit/s)")
    ax.set_ylabel(f"simulated time to {TARGET:.0%} accuracy (s)")
    ax.legend(fontsize=7)
    ax.set_title("dotted: where a scheme crosses all-reduce")
    fig.tight_layout()
    path = out / "tradeoffs.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def table(summary: pd.DataFrame) -> str:
    shown = summary[["rate", "scheme", "step_time", "steps_to_target", "time_to_target", "vs_allreduce"]].copy()
    shown["step_time"] *= 1e3
    shown.columns = ["rate", "scheme", "ms/step", "steps→target", "s→target", "× all-reduce"]
    return shown.to_string(index=False, float_format=lambda v: "never" if math.isinf(v) else f"{v:,.2f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args("python -m studies.tradeoffs", __doc__, "results/tradeoffs", argv)
    study = quick() if args.quick else Study()
    started = time.perf_counter()
    out: Path = args.out
    lrs = {s: tuned_lr(study, s, args.jobs, out, args.scheduler) for s in study.schemes}
    runs = [Run(s, r, study.gpus, study.steps, lrs[s], seed, study.latency, study.workload)
            for s in study.schemes for r in study.rates for seed in range(study.seeds)]
    results = sweep.run(execute, runs, study="tradeoffs", out=out, jobs=args.jobs, scheduler=args.scheduler)
    frame = write_csv(results, out / "runs.csv")
    summary = write_csv(summarise(frame), out / "summary.csv")
    cross = write_csv(crossovers(summary), out / "crossovers.csv")
    figure = plot(out / "summary.csv", out / "crossovers.csv", out)
    print(f"time to {TARGET:.0%} held-out accuracy on digits, {study.workload} on {study.gpus} GPUs, "
          f"mean of {study.seeds} seeds:")
    print(table(summary))
    for row in cross.itertuples():
        side = "below" if row.faster_below else "above"
        print(f"{row.scheme} beats allreduce {side} {row.rate_gbit:,.3g} Gbit/s per node")
    print(f"\nwrote {out / 'runs.csv'}, {out / 'summary.csv'}, {out / 'crossovers.csv'}, {figure} "
          f"({len(frame)} runs in {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m studies.tradeoffs"))
