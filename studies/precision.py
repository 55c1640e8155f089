"""Mixed precision, in numbers: fp32, fp16 and bf16 on the wire, with and without autocast compute.

``python -m studies.precision [--quick] [--measure] [--out DIR] [--jobs N] [--scheduler ADDRESS]``
checks the claim that mixed precision speeds up training, separating its two
parts — 16-bit *compute* (autocast, a numeric format: fp32 master weights,
16-bit matmuls) and 16-bit *communication* (gradients all-reduced in fp16 or
bf16: half the bytes) — on the presets, and writes ``results/precision/``:

- ``precision.csv``: per cluster, workload, GPU count, wire precision and
  compute format: step time, throughput, speedup (over one GPU computing in
  the same format), bytes on the wire per worker and step,
  and, from the digits replay with the wire's rounding and GradScaler-style
  dynamic loss scaling for fp16, the share of optimiser steps skipped for
  overflow, steps and simulated seconds to 95 % held-out accuracy;
- ``precision.png``: step time by format, drawn from the CSV.

With ``--measure`` (root: the emulated network of ``real.testbed``) the executor
checks the same claim on this machine: all-reduce with fp32, fp16 and bf16 on
the wire (DDP's compression hook) and with bf16 autocast compute, two workers
training LeNet behind 50 Mbit/s and 1 Gbit/s links, each predicted and measured
by ``studies.validation`` into ``OUT/measured/``, and the measured speed-up of
each half printed beside the predicted one.

Compute time. The workload presets are timed at the A100's 16-bit tensor-core
peak (312 TFLOP/s) and a model-FLOP utilisation: they are the *autocast*
compute time. Without autocast the same matmuls run in TF32 at half that peak
(A100: 156 TFLOP/s; H100 SXM: 494.7 against 989.4; NVIDIA datasheets), so at
the same utilisation the fp32 step computes ``FP32_COMPUTE_FACTOR`` = 2 times
longer — an upper bound on what autocast buys, since memory-bound layers do not
speed up (measured on this machine's CPU by ``real.calibrate``, which times
both). The replay rounds what crosses the wire; autocast's rounding inside
forward and backward is the executor's to measure, not the replay's.
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
from syncsim.config import check_choice, check_int
from syncsim.convergence import Digits, replay, steps_to_target, time_to_target
from syncsim.schemes import PRECISIONS, AllReduce

# Peak dense TF32 against 16-bit tensor-core throughput: 156 vs 312 TFLOP/s on A100 (A100 datasheet),
# 494.7 vs 989.4 on H100 SXM (H100 datasheet).
FP32_COMPUTE_FACTOR = 2.0
TARGET, LR, MOMENTUM, REPLAY_BATCH, REPLAY_STEPS = 0.95, 0.3, 0.5, 16, 200
# --measure: every format against fp32, on links where communication dominates (50 Mbit/s) and where
# compute does (1 Gbit/s), two workers, the larger of the executor's models.
MEASURED_SCHEMES = ("allreduce", "allreduce:precision=fp16", "allreduce:precision=bf16", "allreduce:amp=true",
                    "allreduce:amp=true,precision=fp16")
MEASURED_RATES, MEASURED_WORKERS, MEASURED_MODEL = ("50Mbit/s", "1Gbit/s"), 2, "lenet"


@dataclass(frozen=True)
class Run:
    cluster: str
    workload: str
    gpus: int
    precision: str
    amp: bool
    steps: int = 24
    replay: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("Run", "precision", self.precision, PRECISIONS)
        check_int("Run", "gpus", self.gpus, 1)

    @property
    def scheme(self) -> AllReduce:
        return AllReduce(precision=self.precision, amp=self.amp)


@dataclass(frozen=True)
class Study:
    clusters: tuple[str, ...] = ("a100-100g", "h100-400g")
    workloads: tuple[str, ...] = ("resnet50", "bert-large", "gpt2")
    gpus: tuple[int, ...] = (8, 64, 512)
    replay_gpus: int = 64

    def runs(self) -> list[Run]:
        return [Run(c, w, g, p, amp, replay=g <= self.replay_gpus) for c in self.clusters for w in self.workloads
                for g in self.gpus for p in PRECISIONS for amp in (False, True)]


def quick() -> Study:
    return Study(clusters=("a100-100g",), workloads=("resnet50",), gpus=(8, 64), replay_gpus=8)


def workload(run: Run) -> Workload:
    preset = Workload.preset(run.workload)
    return preset if run.amp else preset.replace(compute_time=preset.compute_time * FP32_COMPUTE_FACTOR)


def execute(run: Run) -> dict:
    cluster = Cluster.preset(run.cluster, gpus=run.gpus).replace(jitter=0.05)
    work, scheme = workload(run), run.scheme
    result = simulate(cluster, work, scheme, steps=run.steps, seed=run.seed)
    row = {"cluster": run.cluster, "workload": run.workload, "gpus": run.gpus, "precision": run.precision,
           "compute": "autocast" if run.amp else "fp32", "scheme": str(scheme),
           "compute_time": work.compute_time, "step_time": result.step_time, "throughput": result.throughput,
           "speedup": result.speedup,
           "wire_bytes_per_step": scheme.policy(work.param_bytes).wire_bytes(1),
           "skipped_share": math.nan, "steps_to_target": math.nan, "time_to_target": math.nan}
    if run.replay:
        longer = simulate(cluster, work, scheme, steps=REPLAY_STEPS, seed=run.seed)
        curve = replay(longer, Digits(seed=run.seed), lr=LR, momentum=MOMENTUM, seed=run.seed,
                       batch_size=REPLAY_BATCH, stop=lambda r: r["accuracy"] >= TARGET)
        versions = max(1, int(curve["version"].iloc[-1]))
        row.update(skipped_share=curve.attrs["skipped"] / versions,
                   steps_to_target=steps_to_target(curve, TARGET, "accuracy"),
                   time_to_target=time_to_target(curve, TARGET, "accuracy"))
    return row


def plot(csv: Path, out: Path) -> Path:
    """Step time by wire precision and compute format, a panel per cluster and workload, from the CSV."""
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    data = pd.read_csv(csv)
    data["format"] = data["compute"] + " compute, " + data["precision"] + " wire"
    grid = sns.catplot(data=data, x="gpus", y="step_time", hue="format", col="workload", row="cluster",
                       kind="bar", height=2.6, aspect=1.2, sharey=False)
    grid.set_axis_labels("GPUs", "step time (s)")
    grid.set_titles("{row_name} · {col_name}")
    path = out / "precision.png"
    grid.savefig(path, dpi=110)
    return path


def verdict(data: pd.DataFrame) -> str:
    """How much each half of mixed precision buys, as ratios of step time (medians over the grid)."""
    key = ["cluster", "workload", "gpus"]
    t = data.pivot_table(index=key, columns=["compute", "precision"], values="step_time")
    compute = t[("fp32", "fp32")] / t[("autocast", "fp32")]
    wire = t[("autocast", "fp32")] / t[("autocast", "fp16")]
    both = t[("fp32", "fp32")] / t[("autocast", "fp16")]
    lines = ["step-time speed-up (median over clusters, workloads; by GPUs):"]
    for gpus in sorted(data["gpus"].unique()):
        at = t.index.get_level_values("gpus") == gpus
        lines.append(f"  {gpus:5d} GPUs: autocast compute x{compute[at].median():.2f}, "
                     f"fp16 wire x{wire[at].median():.2f}, both x{both[at].median():.2f}")
    skipped = data.loc[data["precision"] == "fp16", "skipped_share"].dropna()
    if len(skipped):
        lines.append(f"  fp16 wire: {skipped.mean():.2%} of optimiser steps skipped for overflow (GradScaler defaults)")
    return "\n".join(lines)


def measure(out: Path) -> int:
    """The executor's half (``--measure``): studies.validation over the formats; its exit code."""
    from studies import validation

    return validation.main(["--schemes", ",".join(MEASURED_SCHEMES), "--worlds", str(MEASURED_WORKERS),
                            "--bandwidths", ",".join(MEASURED_RATES), "--models", MEASURED_MODEL, "--slow", "1",
                            "--out", str(out)])


def measured_speedups(data: pd.DataFrame) -> pd.DataFrame:
    """Per link rate and format (``compute/wire``, e.g. ``autocast/fp16``), the measured and predicted
    step-time speed-up over fp32 compute and wire, from the --measure run's validation.csv."""
    from syncsim.schemes import parse

    data = data[(data["world"] == MEASURED_WORKERS) & (data["error"].astype("string").fillna("") == "")]
    specs = data["scheme"].map(parse)
    data = data.assign(format=[("autocast" if s.amp else "fp32") + "/" + s.precision for s in specs])
    rows = []
    for rate, group in data.groupby("bandwidth", sort=False):
        t = group.set_index("format")
        if "fp32/fp32" not in t.index:
            continue
        base = t.loc["fp32/fp32"]  # fp32 compute and wire: what each format is a speed-up over
        rows += [{"bandwidth": rate, "link_bandwidth": base["link_bandwidth"], "format": fmt,
                  "measured": base["measured_step_time"] / t.at[fmt, "measured_step_time"],
                  "predicted": base["predicted_step_time"] / t.at[fmt, "predicted_step_time"]}
                 for fmt in t.index.drop("fp32/fp32")]
    return pd.DataFrame(rows, columns=["bandwidth", "link_bandwidth", "format", "measured", "predicted"])


def measured_verdict(data: pd.DataFrame) -> str:
    """Measured against predicted speed-up of each format over fp32, per link rate, from validation.csv."""
    lines = ["measured on the emulated network (predicted), step-time speed-up over fp32 compute and wire:"]
    for rate, rows in measured_speedups(data).groupby("bandwidth", sort=False):
        lines.append(f"  {rate}: " + ", ".join(f"{r.format} x{r.measured:.2f} (x{r.predicted:.2f})"
                                              for r in rows.itertuples(index=False)))
    return "\n".join(lines)


def options(parser) -> None:
    parser.add_argument("--measure", action="store_true",
                        help="also run the executor on the emulated network (root; about four minutes)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args("python -m studies.precision", __doc__, "results/precision", argv, options)
    if args.measure:  # the emulated network needs root and iproute2: say so before any work
        from real.testbed import unavailable
        from syncsim.arguments import fail

        reason = unavailable()
        if reason:
            return fail("studies.precision", f"--measure: {reason}")
    study = quick() if args.quick else Study()
    started = time.perf_counter()
    rows = sweep.run(execute, study.runs(), study="precision", out=args.out, jobs=args.jobs,
                     scheduler=args.scheduler)
    out: Path = args.out
    csv = out / "precision.csv"
    data = write_csv(rows, csv)
    figure = plot(csv, out)
    print(verdict(data))
    print(f"\nwrote {csv}, {figure} ({len(data)} configurations in {time.perf_counter() - started:.1f} s)")
    if args.measure:
        code = measure(out / "measured")
        if code:
            return code
        print(measured_verdict(pd.read_csv(out / "measured" / "validation.csv", keep_default_na=False,
                                           na_values=[""])))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m studies.precision"))
