"""Predicted against published: nccl-tests all-reduce curves and data-parallel scaling on stated hardware.

``python -m studies.published [--out DIR] [--jobs N] [--scheduler ADDRESS]`` reads every dataset under
``tests/data/published/`` (a CSV of measured rows and a JSON saying where they
come from and on what hardware; see that folder's README), builds the
dataset's cluster from the hardware *as stated* through the component table
below — the same physical constants for every dataset, each cited, never a
factor chosen per dataset or row — predicts each row with syncsim, and writes
to ``results/published/``:

- ``published.csv``: one row per measured row: dataset, source, what was
  measured (an all-reduce's time, or a scaling efficiency), predicted,
  measured, relative error, the algorithm that ran, whether the row is
  bandwidth-bound and whether it is inside the model (with the reason when
  not);
- ``parity.png``: predicted against measured, drawn from the CSV.

Bandwidth-bound rows are all-reduces of at least 64 MiB and training
configurations whose step is communication-bound (the all-reduce of one
step's gradients, uncontended, takes at least as long as its compute). Rows
outside the model are reported with their error but kept out of the summary:
NVIDIA's NVLink SHARP (NVLS, in-switch reduction, which NCCL uses on
NVSwitch-3 systems: H100, H200) is not modelled.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from studies import sweep
from studies.common import parse_args, run_main, write_csv
from syncsim import Cluster, Link, Workload, simulate
from syncsim.collectives import choose
from syncsim.schemes import parse
from syncsim.units import parse_bandwidth

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "published"
BANDWIDTH_BOUND_BYTES = 64 * 2**20

# -- components: what NCCL reaches on each kind of hardware -----------------------------------
# A dataset's JSON names its intra-node component ("model": {"intra": ...}); the rates are NCCL's
# own (src/graph/topo.h): NVLink = links x per-link rate, A100 12 x 20.0 GB/s, H100/H200 18 x 20.6,
# V100 6 x 20.0, P100 4 x 18.0; PCIe Gen3 x16 12 GB/s (PCI_BW). Per-step latencies are those
# NCCL's tuner gives its bandwidth (Simple) protocol (src/graph/tuning.cc, NCCL 2.20): 3.4 us
# per NVLink step, 5.7 us per PCIe step, 14 us per network step, 8.4 us base latency.
INTRA = {"A100": Link("240GB/s", "3.4us"), "H100": Link("370.8GB/s", "3.4us"),
         "H200": Link("370.8GB/s", "3.4us"), "V100-SXM2": Link("120GB/s", "3.4us"),
         "P100-SXM2": Link("72GB/s", "3.4us"), "PCIe3": Link("12GB/s", "5.7us")}
NET_LATENCY = "14us"
LAUNCH = "8.4us"
# NICs reach 96 % of their line rate under NCCL: "We usually consider 24GB/s is the peak performance
# per 200G NIC (12 GB/s for 100G NICs)" (NCCL maintainer, NVIDIA/nccl-tests issue 119).
NIC_EFFICIENCY = 0.96
# What the model leaves out, by the name a dataset's "model": {"outside": ...} gives it.
OUTSIDE = {
    "nvls": "NVLink SHARP (in-switch reduction, NCCL's choice on NVSwitch-3 nodes) is not modelled",
    "host-staged": "GPUDirect RDMA off: host-memory copies, not the links, set the rate (not modelled)",
    "fsdp": "sharded data parallelism (all-gather + reduce-scatter per layer), not all-reduce",
    "input-pipeline": "real data read from disk: the input pipeline is part of the step (not modelled)",
    "unknown-batch": "the batch size is not published, so the compute time per step is unknown",
    "cube-mesh": "hybrid cube-mesh NVLink (DGX-1): not the switched node the model assumes",
    "ps-on-cpu": "parameters on the host CPU (TensorFlow's parameter-server mode inside one node)",
}


@dataclass(frozen=True)
class Dataset:
    id: str
    meta: dict
    rows: pd.DataFrame

    @property
    def hardware(self) -> dict:
        return self.meta["hardware"]

    @property
    def model(self) -> dict:
        return self.meta["model"]

    @property
    def source(self) -> str:
        src = self.meta["source"]
        return src.get("url") or "/".join(str(src[k]) for k in ("repo", "path") if src.get(k))

    def outside_model(self) -> str | None:
        """Why the model does not cover this dataset, or None."""
        reason = self.model.get("outside")
        return None if reason is None else OUTSIDE[reason]

    def cluster(self, nodes: int, gpus_per_node: int) -> Cluster:
        hw = self.hardware
        inter = None
        if nodes > 1:
            rate = parse_bandwidth(hw["nic_rate"], f"{self.id}: hardware.nic_rate") * NIC_EFFICIENCY
            inter = Link(rate, NET_LATENCY)
        return Cluster(nodes=nodes, gpus_per_node=gpus_per_node, nics_per_node=int(hw.get("nics_per_node") or 1),
                       intra=INTRA[self.model["intra"]] if gpus_per_node > 1 else None, inter=inter,
                       collective_latency=LAUNCH, name=self.id)


def load(folder: Path = DATA) -> list[Dataset]:
    datasets = []
    for meta_path in sorted(folder.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        datasets.append(Dataset(meta_path.stem, meta, pd.read_csv(meta_path.with_suffix(".csv"))))
    if not datasets:
        raise ValueError(f"no published datasets (*.json + *.csv) under {folder}")
    return datasets


def _row(ds: Dataset, what: str, size: float, measured: float, predicted: float, algorithm: str,
         bound: bool) -> dict:
    reason = ds.outside_model()
    return {"dataset": ds.id, "kind": ds.meta["kind"], "what": what, "size": size, "measured": measured,
            "predicted": predicted, "rel_error": predicted / measured - 1.0, "algorithm": algorithm,
            "bandwidth_bound": bound, "in_model": reason is None, "reason": reason or "", "source": ds.source}


def allreduce_rows(ds: Dataset) -> list[dict]:
    rows = []
    for r in ds.rows.itertuples(index=False):
        cluster = ds.cluster(int(r.nodes), int(r.gpus_per_node))
        algorithm, seconds = choose("auto", float(r.size_bytes), cluster)
        rows.append(_row(ds, "allreduce seconds", float(r.size_bytes), r.time_us * 1e-6, seconds, algorithm,
                         r.size_bytes >= BANDWIDTH_BOUND_BYTES))
    return rows


def training_rows(ds: Dataset) -> list[dict]:
    model = ds.model
    rows = []
    if "single_gpu_images_per_s" not in model:  # outside the model, and not enough published to predict
        for r in ds.rows.itertuples(index=False):
            if r.gpus > 1:
                rows.append(_row(ds, "scaling efficiency", float(r.gpus), float(r.efficiency), math.nan, "",
                                 False))
        return rows
    batch = int(model["batch_per_gpu"])
    workload = Workload(param_bytes=4.0 * float(model["parameters"]), batch_size=batch,
                        compute_time=batch / float(model["single_gpu_images_per_s"]), name=ds.id)
    for r in ds.rows.itertuples(index=False):
        if r.gpus <= 1:
            continue  # the single-GPU baseline: efficiency 1 by definition
        cluster = ds.cluster(int(r.nodes), int(r.gpus_per_node))
        res = simulate(cluster, workload, model["scheme"], steps=20)
        # communication-bound: one step's whole gradient all-reduce takes at least its compute
        comm = choose(parse(model["scheme"]).algorithm, workload.param_bytes, cluster)[1]  # type: ignore[attr-defined]
        measured = float(r.efficiency) if not math.isnan(r.efficiency) else \
            float(r.throughput_samples_per_s) / (r.gpus * float(model["single_gpu_images_per_s"]))
        rows.append(_row(ds, "scaling efficiency", float(r.gpus), measured, res.efficiency, res.algorithms,
                         comm >= workload.compute_time))  # type: ignore[operator]
    return rows


@dataclass(frozen=True)
class Prediction:
    """One dataset to predict (the sweep runner's configuration): its id and a digest of its files."""

    dataset: str
    digest: str
    folder: str = str(DATA)


def prediction(dataset: Dataset, folder: Path = DATA) -> Prediction:
    files = b"".join((folder / f"{dataset.id}{suffix}").read_bytes() for suffix in (".json", ".csv"))
    return Prediction(dataset.id, hashlib.sha256(files).hexdigest()[:16], str(folder))


def predict_dataset(config: Prediction) -> list[dict]:
    folder = Path(config.folder)
    ds = Dataset(config.dataset, json.loads((folder / f"{config.dataset}.json").read_text()),
                 pd.read_csv(folder / f"{config.dataset}.csv"))
    if ds.meta["kind"] == "nccl-allreduce":
        return allreduce_rows(ds)
    if ds.meta["kind"] == "training-scaling":
        return training_rows(ds)
    raise ValueError(f"{ds.id}: unknown kind {ds.meta['kind']!r}; expected nccl-allreduce or training-scaling")


def predict(datasets: list[Dataset]) -> pd.DataFrame:
    return pd.DataFrame([row for ds in datasets for row in predict_dataset(prediction(ds))])


def bounded(data: pd.DataFrame) -> pd.DataFrame:
    """The rows the targets speak of: bandwidth-bound and inside the model."""
    return data[data["bandwidth_bound"] & data["in_model"]]


def summary(data: pd.DataFrame) -> str:
    rows = bounded(data)
    err = rows["rel_error"].abs()
    worst = rows.assign(abs_error=err).nlargest(3, "abs_error")
    lines = [f"bandwidth-bound, in-model rows: median |error| {err.median():.1%}, max {err.max():.1%} "
             f"over {len(rows)} rows of {rows['dataset'].nunique()} datasets"]
    for r in worst.itertuples(index=False):
        lines.append(f"  worst: {r.dataset} {r.what} at {r.size:.4g}: predicted {r.predicted:.4g}, measured "
                     f"{r.measured:.4g} ({r.rel_error:+.1%}, {r.algorithm})")
    outside = data[~data["in_model"]]
    for dataset, group in outside.groupby("dataset"):
        big = group[group["bandwidth_bound"]]["rel_error"]
        lines.append(f"  outside the model: {dataset} ({group['reason'].iloc[0]}): median error "
                     f"{big.median():+.1%} on its bandwidth-bound rows")
    return "\n".join(lines)


def plot(csv: Path, out: Path) -> Path:
    """Predicted against measured, one marker per dataset; hollow: not bounded by the targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = pd.read_csv(csv).dropna(subset=["predicted", "measured"])
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.2), gridspec_kw={"width_ratios": (1.2, 1)})
    for ax, kind, label, log in ((axes[0], "nccl-allreduce", "all-reduce time (s)", True),
                                 (axes[1], "training-scaling", "scaling efficiency", False)):
        part = data[data["kind"] == kind]
        if part.empty:
            ax.set_visible(False)
            continue
        lo, hi = part[["measured", "predicted"]].min().min(), part[["measured", "predicted"]].max().max()
        lo, hi = (lo / 1.5, hi * 1.5) if log else (lo - 0.05, min(1.05, hi + 0.05))
        grid = np.geomspace(lo, hi, 50) if log else np.linspace(lo, hi, 50)
        ax.plot(grid, grid, color="grey", lw=0.8)
        ax.fill_between(grid, grid / 1.15, grid * 1.15, color="grey", alpha=0.15, lw=0, label="±15 %")
        for i, (dataset, group) in enumerate(part.groupby("dataset")):
            solid = group["bandwidth_bound"] & group["in_model"]
            style = dict(marker="osD^v<>pPh"[i % 10], color=f"C{i % 10}", s=24)
            hollow = style | {"color": "none", "edgecolors": style["color"]}
            ax.scatter(group.loc[solid, "measured"], group.loc[solid, "predicted"],
                       label=dataset if solid.any() else None, **style)
            ax.scatter(group.loc[~solid, "measured"], group.loc[~solid, "predicted"],
                       label=None if solid.any() else dataset, **hollow)
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"predicted {label}")
        if log:
            ax.legend(fontsize=6.5, loc="upper left")
        else:
            ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.suptitle("syncsim against published measurements (hollow: latency-bound, compute-bound or outside the model)")
    fig.tight_layout()
    path = out / "parity.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args("python -m studies.published", __doc__, "results/published", argv)
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


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m studies.published"))
