"""Every dataset's rows predicted: nccl-tests all-reduces and data-parallel training (sharded datasets by
``studies.published.sharded``), one dataset per configuration of the sweep runner."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from studies.published.dataset import DATA, Dataset, sharded_schemes
from studies.published.rows import cell, output_row, simulated_steps, sync_period
from studies.published.sharded import sharded_rows
from syncsim import Workload, simulate
from syncsim.collectives import choose
from syncsim.schemes import parse

__all__ = ["BANDWIDTH_BOUND_BYTES", "allreduce_rows", "training_rows", "Prediction", "prediction", "predict_dataset",
           "predict"]

BANDWIDTH_BOUND_BYTES = 64 * 2**20


def allreduce_rows(ds: Dataset) -> list[dict]:
    rows = []
    for r in ds.rows.itertuples(index=False):
        cluster = ds.cluster(int(r.nodes), int(r.gpus_per_node))
        algorithm, seconds = choose("auto", float(r.size_bytes), cluster)
        rows.append(output_row(ds, "allreduce seconds", float(r.size_bytes), r.time_us * 1e-6, seconds, algorithm,
                               r.size_bytes >= BANDWIDTH_BOUND_BYTES))
    return rows


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
                rows.append(output_row(ds, "scaling efficiency", float(r.gpus), float(r.efficiency), math.nan, "",
                                       False, model["no_prediction"], cell(r, "scheme") or model.get("scheme", ""),
                                       cell(r, "nic_rate")))
        return rows
    batch = int(model["batch_per_gpu"])
    workload = Workload(param_bytes=4.0 * float(model["parameters"]), batch_size=batch,
                        compute_time=batch / float(model["single_gpu_images_per_s"]), name=ds.id)
    for r in ds.rows.itertuples(index=False):
        if r.gpus <= 1:
            continue  # the single-GPU baseline: efficiency 1 by definition
        scheme, nic_rate = cell(r, "scheme") or model["scheme"], cell(r, "nic_rate")
        cluster = ds.cluster(int(r.nodes), int(r.gpus_per_node), nic_rate or None)
        res = simulate(cluster, workload, scheme, steps=simulated_steps(scheme))
        # communication-bound: the whole gradient (parameters) all-reduce of one step, uncontended, takes at
        # least its compute; a scheme that synchronises every `period` steps spreads it over the period
        algorithm = getattr(parse(scheme), "algorithm", "auto")
        comm = choose(algorithm, workload.param_bytes, cluster)[1] / sync_period(scheme)
        measured = float(r.efficiency) if not math.isnan(r.efficiency) else \
            float(r.throughput_samples_per_s) / (r.gpus * float(model["single_gpu_images_per_s"]))
        rows.append(output_row(ds, "scaling efficiency", float(r.gpus), measured, res.efficiency, res.algorithms,
                               comm >= workload.compute_time, scheme=scheme, nic_rate=nic_rate))  # type: ignore[operator]
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
