"""Flagship study: speedup and scaling efficiency of every scheme from 1 to 1,024 GPUs.

``python -m studies.scaling [--quick] [--out DIR] [--jobs N] [--scheduler ADDRESS]`` simulates every
scheme below on two sourced clusters (8-GPU NVLink nodes on 100 Gbit/s and on
400 Gbit/s per GPU) for the sourced workload presets, at every power of two of
GPUs, and writes

- ``scaling.csv``: one row per configuration, the spec fields as columns;
- ``scaling.png``: speedup against GPUs, drawn from the CSV alone;
- ``efficiency.png``: scaling efficiency (speedup / GPUs), from the CSV;
- ``trace.json``: a Chrome/Perfetto timeline of one telling configuration.

Parameter-server runs get one server host per worker node (at least one), on
the cluster's inter-node link, so server capacity grows with the cluster.

Sharded data parallelism: the large-model preset ``llama2-7b``
(6.74e9 parameters, PaLM's FLOPs per token, its activations counted) runs the
sharded schemes, ZeRO stages 1-3 and FSDP in bf16 mixed precision, next to
data parallelism with bf16 gradients (``SHARDED_SCHEMES``), on the same
clusters and GPU counts. Every row carries ``memory_per_gpu`` (peak bytes per
GPU, syncsim.memory: parameters, gradients, Adam's state, the gathered units,
activations) and ``fits`` (False where the peak exceeds the GPU's memory, the
cluster preset's ``gpu_memory``); the printed table gives the large model's
speedup and GiB per GPU, marking what does not fit.

Time to accuracy: up to 16 GPUs each configuration is also simulated for
``REPLAY_STEPS`` steps and replayed on the digits classifier
(``syncsim.convergence.Digits``, 16 samples per worker per step, the
staleness study's step size and momentum) until 95 % held-out accuracy;
``steps_to_target`` and ``time_to_target`` (simulated seconds on this
cluster and workload) are its columns. The digits problem stands in for the
model; replaying is the study's dearest part (its cost grows with workers ×
steps) and a larger step's combined batch would be many times the problem's
data, so larger configurations leave the columns empty. Results are cached
(studies.sweep): a rerun computes only what changed.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from studies import sweep
from studies.common import parse_args, run_main, write_csv
from syncsim import Cluster, Workload, simulate
from syncsim.config import check_float, check_int
from syncsim.convergence import Digits, replay, steps_to_target, time_to_target
from syncsim.schemes import parse

SCHEMES = (
    "allreduce", "allreduce:algorithm=ring", "allreduce:algorithm=tree", "allreduce:algorithm=hierarchical",
    "allreduce:precision=fp16", "ps", "ps:mode=async", "ps:staleness=2", "localsgd:period=8",
)
CLUSTERS = ("a100-100g", "h100-400g")
WORKLOADS = ("lenet", "resnet50", "vgg16", "bert-large", "gpt2")
# The large model and what trains it: plain data parallelism (16 bytes of state per parameter: it does not fit an
# 80 GB GPU) against ZeRO's three stages and FSDP, all moving bf16 on the wire (mixed precision).
SHARDED_WORKLOADS = ("llama2-7b",)
SHARDED_SCHEMES = ("allreduce:precision=bf16", "zero:stage=1,precision=bf16", "zero:stage=2,precision=bf16",
                   "zero:stage=3,precision=bf16", "fsdp:precision=bf16")


# The time-to-accuracy replay (see the module's docstring).
REPLAY_MAX_GPUS = 16
REPLAY_STEPS = 200
REPLAY_BATCH = 16
TARGET, LR, MOMENTUM = 0.95, 0.3, 0.5


@dataclass(frozen=True)
class Run:
    """One configuration of the study."""

    cluster: str
    workload: str
    scheme: str
    gpus: int
    steps: int
    jitter: float = 0.05
    seed: int = 0
    replay: bool = True
    """Also replay on digits for time to accuracy (only up to REPLAY_MAX_GPUS GPUs)."""

    def __post_init__(self) -> None:
        check_int("Run", "gpus", self.gpus, 1)
        check_int("Run", "steps", self.steps, 1)
        parse(self.scheme)


@dataclass(frozen=True)
class Study:
    gpus: tuple[int, ...] = tuple(2**i for i in range(11))
    steps: int = 24  # a multiple of every local-SGD period here, so no forced final average skews step time
    clusters: tuple[str, ...] = CLUSTERS
    workloads: tuple[str, ...] = WORKLOADS
    schemes: tuple[str, ...] = SCHEMES
    jitter: float = 0.05
    replay_gpus: int = REPLAY_MAX_GPUS
    """Replay for time to accuracy up to this many GPUs (0: never)."""
    sharded_workloads: tuple[str, ...] = SHARDED_WORKLOADS
    sharded_schemes: tuple[str, ...] = SHARDED_SCHEMES
    """The large-model grid: these schemes on these workloads, on every cluster and GPU count."""

    def __post_init__(self) -> None:
        for g in self.gpus:
            check_int("Study", "gpus", g, 1)
        check_int("Study", "steps", self.steps, 2)
        check_float("Study", "jitter", self.jitter, low=0.0)
        check_int("Study", "replay_gpus", self.replay_gpus, 0)
        if self.replay_gpus > REPLAY_MAX_GPUS:
            raise ValueError(f"Study.replay_gpus must be at most {REPLAY_MAX_GPUS} (the digits replay's limit), "
                             f"got {self.replay_gpus}")

    def runs(self) -> list[Run]:
        grids = ((self.workloads, self.schemes), (self.sharded_workloads, self.sharded_schemes))
        return [Run(c, w, s, g, self.steps, self.jitter, replay=g <= self.replay_gpus)
                for workloads, schemes in grids for c in self.clusters for w in workloads for s in schemes
                for g in self.gpus]


def quick() -> Study:
    return Study(gpus=(1, 4, 16, 64), steps=8, workloads=("lenet", "resnet50"),
                 schemes=("allreduce", "ps:mode=async", "localsgd:period=4"), replay_gpus=1,
                 sharded_schemes=("allreduce:precision=bf16", "fsdp:precision=bf16"))


def build(run: Run) -> tuple[Cluster, Workload]:
    cluster = Cluster.preset(run.cluster, gpus=run.gpus).replace(jitter=run.jitter)
    if parse(run.scheme).name == "ps":
        cluster = cluster.replace(servers=max(1, cluster.nodes))
    return cluster, Workload.preset(run.workload)


def simulate_run(run: Run) -> dict:
    cluster, workload = build(run)
    row = simulate(cluster, workload, run.scheme, steps=run.steps, seed=run.seed).summary()
    row.pop("wall_time")  # machine-dependent: kept out of the study's results, which a rerun must reproduce
    row.update(target=TARGET, steps_to_target=math.nan, time_to_target=math.nan)
    if run.replay:
        longer = simulate(cluster, workload, run.scheme, steps=REPLAY_STEPS, seed=run.seed)
        curve = replay(longer, Digits(seed=run.seed), lr=LR, momentum=MOMENTUM, seed=run.seed,
                       batch_size=REPLAY_BATCH, stop=lambda r: r["accuracy"] >= TARGET)
        row.update(steps_to_target=steps_to_target(curve, TARGET, "accuracy"),
                   time_to_target=time_to_target(curve, TARGET, "accuracy"))
    return row


def plot(csv: Path, out: Path) -> list[Path]:
    """Figures from the CSV alone: speedup and efficiency against GPUs, one panel per workload and cluster."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import seaborn as sns

    data = pd.read_csv(csv)
    paths = []
    for column, name, label in (("speedup", "scaling.png", "speedup over one GPU"),
                                ("efficiency", "efficiency.png", "scaling efficiency")):
        grid = sns.relplot(data=data, x="gpus", y=column, hue="scheme", style="scheme", col="workload",
                           row="cluster", kind="line", markers=True, dashes=False, height=2.6, aspect=1.1,
                           facet_kws={"sharey": False})
        for ax in grid.axes.flat:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            if column == "speedup":
                ax.set_yscale("log", base=2)
                ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        grid.set_axis_labels("GPUs", label)
        grid.set_titles("{row_name} · {col_name}")
        if column == "speedup":
            for ax in grid.axes.flat:  # the ideal: speedup = GPUs
                lo, hi = data["gpus"].min(), data["gpus"].max()
                ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls=":")
        path = out / name
        grid.savefig(path, dpi=110)
        paths.append(path)
    return paths


def table(data: pd.DataFrame, study: Study | None = None) -> str:
    study = study or Study()
    # the CSV names each scheme canonically (zero:stage=1 is "zero", its default stage)
    sharded = {str(parse(scheme)) for scheme in study.sharded_schemes}
    large = data["workload"].isin(study.sharded_workloads) & data["scheme"].isin(sharded)
    top = data[~large & (data["gpus"] == data["gpus"].max())]
    pivot = top.pivot_table(index=["cluster", "workload"], columns="scheme", values="speedup")
    return f"speedup at {int(data['gpus'].max())} GPUs (ideal {int(data['gpus'].max())}):\n" + \
        pivot.round(1).to_string() + "\n\n" + switches(data) + "\n\n" + \
        sharded_table(data[large].replace({"scheme": {str(parse(s)): s for s in study.sharded_schemes}}))


# The GPU counts the large-model table shows: one node, then each eightfold, and the largest.
SHARDED_TABLE_GPUS = (8, 64, 512)


def sharded_table(data: pd.DataFrame) -> str:
    """The large model's speedup over one GPU and peak memory per GPU (GiB), by scheme (as the study spells it) and
    GPUs; "!" marks a configuration whose peak exceeds the GPU's memory, "?" one whose activations are unknown (its
    peak then a lower bound)."""
    if data.empty:
        return ""
    shown = sorted({g for g in data["gpus"] if g in SHARDED_TABLE_GPUS} | {int(data["gpus"].max())})
    part = data[data["gpus"].isin(shown)]

    def cell(r) -> str:
        mark = "!" if r.fits is False or r.fits == "False" else "" if r.memory_complete else "?"
        return f"{r.speedup:.1f} x, {r.memory_per_gpu / 2**30:.1f} GiB{mark}"

    cells = part.assign(cell=[cell(r) for r in part.itertuples(index=False)])
    pivot = cells.pivot_table(index=["cluster", "workload", "scheme"], columns="gpus", values="cell", aggfunc="first")
    order = list(dict.fromkeys(data["scheme"]))
    pivot = pivot.reindex(sorted(pivot.index, key=lambda k: (k[0], k[1], order.index(k[2]))))
    memory = ", ".join(f"{c} {m / 2**30:.1f} GiB" for c, m in data.groupby("cluster")["gpu_memory"].first().items())
    return (f"large model, sharded schemes: speedup over one GPU, peak memory per GPU (GPU memory: {memory}; "
            f"! = does not fit)\n" + pivot.to_string())


def switches(data: pd.DataFrame) -> str:
    """Where ``allreduce`` (algorithm=auto, NCCL's choice per bucket) changes algorithm as GPUs grow."""
    auto = data[(data["scheme"] == "allreduce") & (data["gpus"] > 1)].sort_values("gpus")
    lines = ["allreduce (auto) runs, by GPUs:"]
    for (cluster, workload), group in auto.groupby(["cluster", "workload"]):
        runs, previous = [], None
        for gpus, algorithms in zip(group["gpus"], group["algorithms"].fillna("")):
            if algorithms != previous:
                runs.append(f"{algorithms} from {gpus}")
                previous = algorithms
        lines.append(f"  {cluster} · {workload}: " + "; ".join(runs))
    return "\n".join(lines)


def telling_trace(out: Path, quick_run: bool) -> Path:
    """SSP (s=2) with stragglers on 16 GPUs: pushes contend at the servers and fast workers wait."""
    cluster = Cluster.preset("a100-100g", gpus=16).replace(jitter=0.1, straggler_prob=0.1, straggler_slowdown=3.0,
                                                           servers=2)
    res = simulate(cluster, Workload.preset("resnet50"), "ps:staleness=2", steps=6 if quick_run else 20, seed=0)
    return res.to_chrome_trace(out / "trace.json")


def main(argv: list[str] | None = None) -> int:
    args = parse_args("python -m studies.scaling", __doc__, "results/scaling", argv)
    study = quick() if args.quick else Study()
    started = time.perf_counter()
    rows = sweep.run(simulate_run, study.runs(), study="scaling", out=args.out, jobs=args.jobs,
                     scheduler=args.scheduler)
    out: Path = args.out
    csv = out / "scaling.csv"
    data = write_csv(rows, csv)
    figures = plot(csv, out)
    trace = telling_trace(out, args.quick)
    print(table(data, study))
    print(f"\nwrote {csv}, {', '.join(str(f) for f in figures)}, {trace} "
          f"({len(data)} configurations in {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m studies.scaling"))
