"""Time to accuracy: asynchrony buys throughput and can cost steps; which gets there first?

``python -m studies.staleness [--quick] [--out DIR] [--jobs N] [--scheduler ADDRESS]`` simulates
each scheme at each worker count and straggler level, replays the simulated
update order on a LeNet-style classifier of scikit-learn's 8×8 digits
(``syncsim.convergence.Digits``), and writes to ``results/staleness/``:

- ``curves.csv``: held-out loss and accuracy against simulated seconds and
  steps, one row per evaluation of every run;
- ``summary.csv``: per run, throughput, mean staleness, steps to the target
  accuracy and time to it — the two factors of time-to-accuracy side by side;
- ``staleness.png``: loss against simulated wall-clock time, one line per
  scheme, a panel per worker count and straggler level, drawn from the CSV.

Time per step comes from the simulated cluster and workload (a ResNet-50-sized
gradient on 25 Gbit/s Ethernet, 5% compute jitter, one parameter-server host
per worker, as when every worker node also runs a server shard);
steps needed come from the replayed problem, which stands in for the model:
the study shows how staleness moves the second factor, not ResNet-50's own
accuracy. All schemes share one step size and momentum, so no scheme is tuned
in its own favour.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from studies import sweep
from studies.common import parse_args, run_main, write_csv
from syncsim import Cluster, Link, Workload, simulate
from syncsim.config import check_float, check_int
from syncsim.convergence import Digits, replay, steps_to_target, time_to_target
from syncsim.schemes import parse

SCHEMES = ("allreduce", "ps", "ps:staleness=2", "ps:mode=async", "localsgd:period=8")
# 25 Gbit/s Ethernet per host: the common cloud fabric below the InfiniBand of the presets.
LINK = Link(bandwidth="25Gbit/s", latency="10us")


@dataclass(frozen=True)
class Run:
    """One configuration: a scheme on a cluster of ``workers`` with stragglers, replayed on digits."""

    scheme: str
    workers: int
    straggler_prob: float
    steps: int
    lr: float
    momentum: float
    target: float
    slowdown: float = 4.0
    jitter: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        parse(self.scheme)
        check_int("Run", "workers", self.workers, 1)
        check_float("Run", "straggler_prob", self.straggler_prob, low=0.0, high=1.0)
        check_int("Run", "steps", self.steps, 1)


@dataclass(frozen=True)
class Study:
    schemes: tuple[str, ...] = SCHEMES
    workers: tuple[int, ...] = (4, 16)
    straggler_probs: tuple[float, ...] = (0.0, 0.1)
    """Probability that a GPU straggles on a step (4× slower), per GPU and step."""
    steps: int = 304  # a multiple of the local-SGD period: no forced final average
    """Steps per worker for every scheme (the glossary's step: one minibatch per worker)."""
    lr: float = 0.3
    momentum: float = 0.5
    target: float = 0.95
    """Held-out accuracy that counts as trained."""
    workload: Workload = field(default_factory=lambda: Workload(
        param_bytes=25_557_032 * 4, compute_time="130ms", batch_size=16, name="resnet50-digits"))
    """ResNet-50's gradient size and roughly its A100 step time (the preset's), with digits-sized batches."""

    def __post_init__(self) -> None:
        for w in self.workers:
            check_int("Study", "workers", w, 1)
        for p in self.straggler_probs:
            check_float("Study", "straggler_probs", p, low=0.0, high=1.0)
        check_int("Study", "steps", self.steps, 1)
        check_float("Study", "lr", self.lr, low=0.0, low_open=True)
        check_float("Study", "momentum", self.momentum, low=0.0, high=1.0, high_open=True)
        check_float("Study", "target", self.target, low=0.0, high=1.0)
        for s in self.schemes:
            parse(s)

    def runs(self) -> list[Run]:
        return [Run(s, w, p, self.steps, self.lr, self.momentum, self.target)
                for p in self.straggler_probs for w in self.workers for s in self.schemes]


def quick() -> Study:
    return Study(schemes=("allreduce", "ps:mode=async", "localsgd:period=4"), workers=(4,),
                 straggler_probs=(0.0, 0.1), steps=40, target=0.6)


def cluster(run: Run) -> Cluster:
    # One server host per worker (server shards colocated with the workers,
    # as in MXNet or BytePS deployments), so the servers' NICs carry as much as
    # the workers' and stragglers, not server bandwidth, decide the contest;
    # schemes without pushes leave the servers idle.
    return Cluster.homogeneous(run.workers, LINK, servers=run.workers, jitter=run.jitter,
                               straggler_prob=run.straggler_prob, straggler_slowdown=run.slowdown)


def execute(args: tuple[Run, Workload]) -> dict:
    run, workload = args
    result = simulate(cluster(run), workload, run.scheme, steps=run.steps, seed=run.seed)
    curve = replay(result, Digits(seed=run.seed), lr=run.lr, momentum=run.momentum, seed=run.seed)
    summary = result.summary()
    keys = {"scheme": run.scheme, "workers": run.workers, "straggler_prob": run.straggler_prob}
    row = {**keys, "throughput": summary["throughput"], "step_time": summary["step_time"],
           "mean_staleness": summary["mean_staleness"], "max_staleness": summary["max_staleness"],
           "target": run.target, "steps_to_target": steps_to_target(curve, run.target, "accuracy"),
           "time_to_target": time_to_target(curve, run.target, "accuracy"),
           "final_accuracy": float(curve["accuracy"].iloc[-1]), "final_loss": float(curve["loss"].iloc[-1]),
           "makespan": result.makespan}
    return {"summary": row, "curve": curve.assign(**keys)}


def plot(csv: Path, out: Path) -> Path:
    """Loss against simulated wall-clock time, one line per scheme, from curves.csv alone."""
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    data = pd.read_csv(csv)
    data["stragglers"] = data["straggler_prob"].map(lambda p: f"stragglers {p:g}")
    data["cluster"] = data["workers"].map(lambda w: f"{w} workers")
    grid = sns.relplot(data=data, x="time", y="loss", hue="scheme", col="cluster", row="stragglers", kind="line",
                       height=2.8, aspect=1.3, facet_kws={"sharex": False, "sharey": True}, estimator=None)
    for ax in grid.axes.flat:
        ax.set_yscale("log")
    grid.set_axis_labels("simulated wall-clock time (s)", "held-out loss")
    grid.set_titles("{col_name} · {row_name}")
    path = out / "staleness.png"
    grid.savefig(path, dpi=110)
    return path


def table(summary: pd.DataFrame) -> str:
    shown = summary[["straggler_prob", "workers", "scheme", "throughput", "mean_staleness", "steps_to_target",
                     "time_to_target"]].copy()
    shown.columns = ["stragglers", "W", "scheme", "samples/s", "staleness", "steps→target", "s→target"]
    return shown.to_string(index=False, float_format=lambda v: "never" if math.isinf(v) else f"{v:,.1f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args("python -m studies.staleness", __doc__, "results/staleness", argv)
    study = quick() if args.quick else Study()
    started = time.perf_counter()
    results = sweep.run(execute, [(run, study.workload) for run in study.runs()], study="staleness", out=args.out,
                        jobs=args.jobs, scheduler=args.scheduler)
    out: Path = args.out
    summary = write_csv([r["summary"] for r in results], out / "summary.csv")
    write_csv(pd.concat([r["curve"] for r in results], ignore_index=True), out / "curves.csv")
    figure = plot(out / "curves.csv", out)
    print(f"time to {study.target:.0%} held-out accuracy on digits "
          f"(lr {study.lr:g}, momentum {study.momentum:g}, {study.steps} steps per worker):")
    print(table(summary))
    print(f"\nwrote {out / 'summary.csv'}, {out / 'curves.csv'}, {figure} "
          f"({len(summary)} runs in {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m studies.staleness"))
