"""Predicted against published: nccl-tests all-reduce curves, data-parallel scaling and sharded (FSDP, ZeRO)
throughput on stated hardware (docs/published.md).

``python -m studies.published [--out DIR] [--jobs N] [--scheduler ADDRESS]`` reads every dataset under
``tests/data/published/`` (a CSV of measured rows and a JSON saying where they
come from and on what hardware; see that folder's README), builds the
dataset's cluster from the hardware *as stated* through the component table
below — the same physical constants for every dataset, each cited, never a
factor chosen per dataset or row — predicts each row with syncsim (a training
row runs its dataset's scheme, or its own where the CSV has a ``scheme``
column: DiLoCo, local SGD, PowerSGD, ...; at the stated link rate, or the row's
own ``nic_rate``), and writes to ``results/published/``:

- ``published.csv``: one row per measured row: dataset, source, what was
  measured (an all-reduce's time, a scaling efficiency, or a sharded run's
  tokens/s per GPU), the scheme and link rate a training row ran, predicted,
  measured, relative error, the algorithm that ran, whether the row is
  bandwidth-bound and whether it is inside the model (with the reason when
  not), and for a sharded row whether it calibrated its configuration's
  compute efficiency (``calibration``) and that efficiency
  (``compute_efficiency``);
- ``parity.png``: predicted against measured, drawn from the CSV.

Bandwidth-bound rows are all-reduces of at least 64 MiB and training
configurations whose step is communication-bound (the all-reduce of one
step's gradients, uncontended, takes at least as long as its compute; for a
scheme that synchronises every ``period`` steps, that all-reduce divided by the
period; for a sharded scheme, its step's gathers and reduce-scatters one after
another, ``step_communication``). The summary's headline is their error inside the model; it also gives the rows
inside the model that are not bandwidth-bound (latency-bound all-reduces,
compute-bound training), and for every dataset outside the model its error
and the headline had it been included. A dataset is outside the model when
its hardware states no GPUDirect RDMA on a run that crosses the network
(``host_staged``), or when it ran what the model leaves out (``OUTSIDE``:
NVLink SHARP, model parallelism, ...).

Sharded data parallelism (``zero:stage=N``, ``fsdp:...``; tokens/s per GPU).
No source of these datasets publishes a run without communication, the
single-GPU baseline the data-parallel datasets take their compute time from,
so the compute time per step is derived from physics, by one rule for every
dataset (``sharded_rows``):

    compute time = FLOPs per step / (peak × e),
    FLOPs per step = F(decoder, T) × T × batch per GPU,

with F PaLM's training FLOPs per token, 6N + 12·L·H·Q·T (N the parameters in
matrix products, L layers, H query heads of Q dimensions, T the sequence;
``syncsim.workload.decoder_train_flops_per_token``, parameter counts from each
model's published configuration, ``DECODERS``), the peak the GPU's datasheet
gives (``syncsim.workload.PEAK_FLOPS``), and e one compute efficiency per
compute configuration of a dataset: its rows with the same ``technique`` (what
changes the kernels: torch.compile, float8 matmuls; all rows where there is no
such column). e is calibrated on that configuration's smallest-scale row (fewest
GPUs), declared in the CSV's output as ``calibration``: e = that row's measured
tokens/s per GPU × F / peak, its model-FLOP utilisation, i.e. its measured
throughput is taken as compute, as the data-parallel datasets take their
single-GPU run's. e is then held fixed for every other row of the
configuration, which the simulator predicts with the dataset's own scheme and
network. The peak cancels (compute time = F·T·batch / (tokens/s × F) of the
calibration row when the model and sequence are the same), so a GPU whose
exact peak is not stated (Meta's 500 W H100) costs nothing but the reported
efficiency. Calibration rows are reported, never counted in an error. A
dataset that lacks what the rule needs (the network, an absolute throughput to
calibrate on, the model, sequence or batch of each row) carries no
``model.compute`` and keeps ``model.no_prediction`` saying which.
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
from syncsim.collectives import choose, reducescatter_time, sharded_allgather_time
from syncsim.schemes import parse
from syncsim.schemes.actions import AllGatherParameters, ReduceScatterGradients
from syncsim.units import parse_bandwidth
from syncsim.workload import PEAK_FLOPS, decoder_layers, decoder_train_flops_per_token

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
# What the model leaves out, by the name(s) a dataset's "model": {"outside": ...} gives it: what the
# dataset ran (a scheme, a topology, an algorithm NCCL picked), never how well it was predicted.
OUTSIDE = {
    "nvls": "NVLink SHARP (in-switch reduction, NCCL's choice on NVSwitch-3 nodes) is not modelled",
    "fsdp": "FSDP inside each DiLoCo worker: sharded data parallelism nested in another scheme, which the model does "
            "not compose (it runs one scheme per run)",
    "input-pipeline": "real data read from disk: the input pipeline is part of the step (not modelled)",
    "unknown-batch": "the batch size is not published, so the compute time per step is unknown",
    "unknown-configuration": "the models, batches and sequence lengths the figure averages over are not stated in its "
                             "text (image tables only), so no compute time per step can be derived",
    "cube-mesh": "hybrid cube-mesh NVLink (DGX-1): not the switched node the model assumes",
    "ps-on-cpu": "parameters on the host CPU (TensorFlow's parameter-server mode inside one node)",
    "unknown-link": "no rate is stated for the links between nodes (paths over the public internet, or only the "
                    "slowest path's bandwidth), so the network cannot be timed",
    "int8-allreduce": "pseudo-gradients quantised to int8 on the wire and summed in fp32 on the host CPU (a wire "
                      "format the model does not have)",
    "float8-allgather": "FSDP all-gathers the parameters in float8 (a wire format the model does not have)",
    "model-parallel": "data parallelism combined with Megatron tensor (model) parallelism, which the model does not "
                      "have",
}
# The sharded schemes, whose datasets measure tokens/s per GPU and take their compute time from FLOPs (the module's
# docstring, ``sharded_rows``).
SHARDED_SCHEMES = ("zero", "fsdp")


def sharded_schemes(model: dict, rows: pd.DataFrame) -> list[str]:
    """The sharded schemes (``zero:...``, ``fsdp:...``) a dataset ran, per dataset or per row."""
    schemes = {model.get("scheme") or ""} | (set(rows["scheme"].dropna()) if "scheme" in rows else set())
    return sorted(s for s in schemes if s.split(":")[0] in SHARDED_SCHEMES)


# One physical rule for host staging, computed from the stated hardware, the same for every dataset.
# The model's network hop moves a GPU's bytes onto the wire at the NIC's rate. That is GPUDirect RDMA,
# "a direct path for data exchange between the GPU and a third-party peer device using standard
# features of PCI Express" (NVIDIA, GPUDirect RDMA documentation, Overview). Without it NCCL copies
# every network chunk through a host-memory buffer: its net transport puts the buffers in GPU memory
# only when it uses GPUDirect, and then logs the hop "/GDRDMA" (NVIDIA/nccl src/transport/net.cc), and
# its socket (TCP) transport takes host memory only (src/transport/net_socket.cc: ncclSocketPtrSupport
# sets NCCL_PTR_HOST).
# No stated hardware fact gives that copy's rate, so whether the copy or the wire sets the rate cannot
# be predicted: the same no-GPUDirect cluster reached 44 % of a 100G NIC's line rate and 94 % of a
# 10 GbE's (the two hkbu-2080ti-8x4 datasets), one 400G RoCE NIC 30 % (moc-h100-2x1-...). Deciding by
# which of them the model happens to match would be choosing rows by their error, so every dataset
# whose runs cross the network and whose hardware states "gpudirect_rdma": false is outside, whatever
# its error; a dataset that does not state it is predicted as the model assumes (GPUDirect).
HOST_STAGED = "no GPUDirect RDMA: each network hop is copied through host memory (not modelled)"


def host_staged(hardware: dict, rows: pd.DataFrame) -> bool:
    """Whether a dataset's runs cross the network without GPUDirect RDMA, as its hardware states."""
    stated = hardware.get("gpudirect_rdma")
    if stated not in (None, True, False):
        raise ValueError(f"hardware.gpudirect_rdma must be true or false, got {stated!r}")
    return stated is False and bool((rows["nodes"] > 1).any())


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
        labels = self.model.get("outside") or []
        reasons = [OUTSIDE[label] for label in ([labels] if isinstance(labels, str) else labels)]
        if host_staged(self.hardware, self.rows):
            reasons.append(HOST_STAGED)
        return "; ".join(reasons) or None

    def cluster(self, nodes: int, gpus_per_node: int, nic_rate: str | None = None) -> Cluster:
        """The cluster the hardware states; ``nic_rate`` is a row's own link rate where its rows differ in it
        (the CSV's ``nic_rate`` column), else the hardware's."""
        hw = self.hardware
        inter = None
        if nodes > 1:
            stated, where = (nic_rate, "nic_rate column") if nic_rate else (hw["nic_rate"], "hardware.nic_rate")
            rate = parse_bandwidth(stated, f"{self.id}: {where}") * NIC_EFFICIENCY
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
         bound: bool, no_prediction: str = "", scheme: str = "", nic_rate: str = "", calibration: bool = False,
         efficiency: float = math.nan) -> dict:
    reason = ds.outside_model()
    return {"dataset": ds.id, "kind": ds.meta["kind"], "what": what, "size": size, "measured": measured,
            "predicted": predicted, "rel_error": predicted / measured - 1.0, "algorithm": algorithm,
            "bandwidth_bound": bound, "in_model": reason is None, "reason": reason or "",
            "no_prediction": no_prediction, "source": ds.source, "scheme": scheme, "nic_rate": nic_rate,
            "calibration": calibration, "compute_efficiency": efficiency}


def allreduce_rows(ds: Dataset) -> list[dict]:
    rows = []
    for r in ds.rows.itertuples(index=False):
        cluster = ds.cluster(int(r.nodes), int(r.gpus_per_node))
        algorithm, seconds = choose("auto", float(r.size_bytes), cluster)
        rows.append(_row(ds, "allreduce seconds", float(r.size_bytes), r.time_us * 1e-6, seconds, algorithm,
                         r.size_bytes >= BANDWIDTH_BOUND_BYTES))
    return rows


def _cell(row, column: str) -> str:
    """A row's text in an optional CSV column ("" where the dataset has no such column or leaves it empty)."""
    value = getattr(row, column, None)
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def sync_period(scheme: str) -> int:
    """Steps between two synchronisations of the scheme's parameters (``period``: local SGD, DiLoCo), else 1."""
    return int(getattr(parse(scheme), "period", 1))


def simulated_steps(scheme: str) -> int:
    """Steps to simulate a training row: 20, or ten sync periods for a scheme that synchronises every
    ``period`` steps, so that the steady state (after the first tenth, one period) holds whole periods
    and the run's last step, which always synchronises, ends one."""
    return max(20, 10 * sync_period(scheme))


def training_rows(ds: Dataset) -> list[dict]:
    """One row per multi-GPU configuration; a CSV column ``scheme`` (or ``nic_rate``) gives a row its own
    scheme (or link rate) where a dataset's rows differ in it, else the model's (the hardware's)."""
    model = ds.model
    rows = []
    if sharded_schemes(model, ds.rows):
        return sharded_rows(ds)
    if "single_gpu_images_per_s" not in model:  # not enough published to predict: the JSON says why
        if not model.get("no_prediction"):
            raise ValueError(f"{ds.id}: model.single_gpu_images_per_s is missing and model.no_prediction "
                             "does not say why")
        for r in ds.rows.itertuples(index=False):
            if not r.gpus <= 1:  # a GPU count the source does not state (NaN) is no single-GPU baseline
                rows.append(_row(ds, "scaling efficiency", float(r.gpus), float(r.efficiency), math.nan, "",
                                 False, model["no_prediction"], _cell(r, "scheme") or model.get("scheme", ""),
                                 _cell(r, "nic_rate")))
        return rows
    batch = int(model["batch_per_gpu"])
    workload = Workload(param_bytes=4.0 * float(model["parameters"]), batch_size=batch,
                        compute_time=batch / float(model["single_gpu_images_per_s"]), name=ds.id)
    for r in ds.rows.itertuples(index=False):
        if r.gpus <= 1:
            continue  # the single-GPU baseline: efficiency 1 by definition
        scheme, nic_rate = _cell(r, "scheme") or model["scheme"], _cell(r, "nic_rate")
        cluster = ds.cluster(int(r.nodes), int(r.gpus_per_node), nic_rate or None)
        res = simulate(cluster, workload, scheme, steps=simulated_steps(scheme))
        # communication-bound: the whole gradient (parameters) all-reduce of one step, uncontended, takes at
        # least its compute; a scheme that synchronises every `period` steps spreads it over the period
        algorithm = getattr(parse(scheme), "algorithm", "auto")
        comm = choose(algorithm, workload.param_bytes, cluster)[1] / sync_period(scheme)
        measured = float(r.efficiency) if not math.isnan(r.efficiency) else \
            float(r.throughput_samples_per_s) / (r.gpus * float(model["single_gpu_images_per_s"]))
        rows.append(_row(ds, "scaling efficiency", float(r.gpus), measured, res.efficiency, res.algorithms,
                         comm >= workload.compute_time, scheme=scheme, nic_rate=nic_rate))  # type: ignore[operator]
    return rows


# -- sharded data parallelism: compute time from FLOPs, one efficiency per configuration (the module's docstring) --
SHARDED_WHAT = "tokens/s per GPU"


def _value(ds: Dataset, row, column: str) -> str:
    """A row's own value of ``column`` (a CSV column), else the dataset's (``model.<column>``), else ""."""
    return _cell(row, column) or str(ds.model.get(column) or "")


def _tokens_per_gpu(ds: Dataset, row) -> float:
    """The measured tokens/s per GPU: the source's own figure where the CSV has it, else the CSV's samples/s (each a
    full sequence) x the sequence / GPUs, the inverse of how those samples/s were derived."""
    printed = _cell(row, "tokens_per_s_per_gpu")
    if printed:
        return float(printed)
    return float(row.throughput_samples_per_s) * int(_value(ds, row, "seq_len")) / int(row.gpus)


def _sharded_workload(ds: Dataset, row, efficiency: float) -> Workload:
    """The row's workload: its decoder's blocks as layers (FSDP's units), the compute time the rule gives."""
    compute, decoder = ds.model["compute"], _value(ds, row, "decoder")
    seq, batch = int(_value(ds, row, "seq_len")), int(_value(ds, row, "batch_per_gpu"))
    flops = decoder_train_flops_per_token(decoder, seq) * seq * batch
    layers = decoder_layers(decoder)
    return Workload(param_bytes=sum(layers), layers=layers, batch_size=batch,
                    compute_time=flops / (PEAK_FLOPS[compute["gpu"]] * efficiency), name=ds.id)


def _efficiency(ds: Dataset, row) -> float:
    """e: the row's measured tokens/s per GPU x training FLOPs per token over the GPU's peak (its model-FLOP
    utilisation)."""
    seq = int(_value(ds, row, "seq_len"))
    return _tokens_per_gpu(ds, row) * decoder_train_flops_per_token(_value(ds, row, "decoder"), seq) \
        / PEAK_FLOPS[ds.model["compute"]["gpu"]]


def step_communication(cluster: Cluster, workload: Workload, scheme: str) -> float:
    """Seconds of one step's gathers and reduce-scatters, one after another and uncontended: what the step would
    take on communication alone."""
    policy = parse(scheme).policy(workload.param_bytes, workload.layers, workload.backward_fraction)
    seconds = 0.0
    for action in policy.plan(0, 1):
        if isinstance(action, AllGatherParameters):
            seconds += sum(sharded_allgather_time(cluster, unit) for unit in action.units)
        elif isinstance(action, ReduceScatterGradients):
            seconds += sum(reducescatter_time(cluster, bucket) for bucket in action.buckets)
    return seconds


def calibration_rows(rows: pd.DataFrame) -> dict[str, int]:
    """The calibration row of each compute configuration (its ``technique``, or the whole dataset): the position
    of its row with the fewest GPUs, which must be one row."""
    groups = rows["technique"].fillna("") if "technique" in rows else pd.Series("", index=rows.index)
    chosen = {}
    for technique, group in rows.groupby(groups, sort=False):
        smallest = group[group["gpus"] == group["gpus"].min()]
        if len(smallest) != 1:
            raise ValueError(f"configuration {technique or '(all rows)'!r} has {len(smallest)} rows at its smallest "
                             f"scale ({int(group['gpus'].min())} GPUs): the calibration row must be one row")
        chosen[technique] = rows.index.get_loc(smallest.index[0])
    return chosen


def sharded_rows(ds: Dataset) -> list[dict]:
    """A sharded dataset's rows: predicted tokens/s per GPU where the dataset states what the rule needs
    (``model.compute``), else the rows with ``model.no_prediction``."""
    model, rows = ds.model, []
    if "compute" not in model:
        if not model.get("no_prediction"):
            raise ValueError(f"{ds.id}: a sharded dataset needs model.compute (the rule's inputs) or "
                             "model.no_prediction (why it has no prediction)")
        for r in ds.rows.itertuples(index=False):
            printed = _cell(r, "tokens_per_s_per_gpu")  # the measured figure where the source gives it as such
            rows.append(_row(ds, SHARDED_WHAT, float(r.gpus), float(printed) if printed else math.nan, math.nan, "",
                             False, model["no_prediction"], _value(ds, r, "scheme"), _cell(r, "nic_rate")))
        return rows
    if "grad_accum" in ds.rows and (ds.rows["grad_accum"].fillna(1) != 1).any():
        raise ValueError(f"{ds.id}: rows with gradient accumulation (grad_accum > 1) cannot be predicted: the "
                         "simulator's step is one forward and backward, and FSDP gathers again for every micro-batch")
    calibrated = calibration_rows(ds.rows)
    records = list(ds.rows.itertuples(index=False))
    efficiency = {technique: _efficiency(ds, records[i]) for technique, i in calibrated.items()}
    for i, r in enumerate(records):
        technique = _cell(r, "technique")
        scheme, nic_rate = _value(ds, r, "scheme"), _cell(r, "nic_rate")
        workload = _sharded_workload(ds, r, efficiency[technique])
        cluster = ds.cluster(int(r.nodes), int(r.gpus_per_node), nic_rate or None)
        res = simulate(cluster, workload, scheme, steps=simulated_steps(scheme))
        predicted = res.throughput * int(_value(ds, r, "seq_len")) / int(r.gpus)
        bound = step_communication(cluster, workload, scheme) >= workload.compute_time  # type: ignore[operator]
        rows.append(_row(ds, SHARDED_WHAT, float(r.gpus), _tokens_per_gpu(ds, r), predicted, res.algorithms, bound,
                         scheme=scheme, nic_rate=nic_rate, calibration=i == calibrated[technique],
                         efficiency=efficiency[technique]))
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


def plot(csv: Path, out: Path) -> Path:
    """Predicted against measured, one marker per dataset; hollow: not bounded by the targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = pd.read_csv(csv).dropna(subset=["predicted", "measured"])
    panels = (("allreduce seconds", "all-reduce time (s)", True), ("scaling efficiency", "scaling efficiency", False),
              (SHARDED_WHAT, "tokens/s per GPU (FSDP, ZeRO)", True))
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.6))
    for ax, (what, label, log) in zip(axes, panels):
        part = data[data["what"] == what]
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
            if what == SHARDED_WHAT:  # compute-bound, but what the sharded targets speak of: calibration rows hollow
                solid = group["in_model"] & ~calibrating(group)
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
        # the points lie along the diagonal: the legends go in the empty corners
        ax.legend(fontsize=6, loc="upper left" if what == "allreduce seconds" else "lower right")
    fig.suptitle("syncsim against published measurements (hollow: latency-bound, compute-bound, a calibration row or "
                 "outside the model)")
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
