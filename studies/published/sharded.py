"""Sharded data parallelism (FSDP, ZeRO): compute time from FLOPs, one efficiency per configuration (the
package's docstring), and the rows it predicts."""

from __future__ import annotations

import math

import pandas as pd

from studies.published.dataset import Dataset
from studies.published.rows import cell, output_row, simulated_steps, value_of
from syncsim import Cluster, Workload, simulate
from syncsim.collectives import reducescatter_time, sharded_allgather_time
from syncsim.decoders import decoder_layers, decoder_train_flops_per_token
from syncsim.schemes import parse
from syncsim.schemes.actions import AllGatherParameters, ReduceScatterGradients
from syncsim.workload import PEAK_FLOPS

__all__ = ["SHARDED_WHAT", "step_communication", "calibration_rows", "sharded_rows"]

SHARDED_WHAT = "tokens/s per GPU"


def _tokens_per_gpu(ds: Dataset, row) -> float:
    """The measured tokens/s per GPU: the source's own figure where the CSV has it, else the CSV's samples/s (each a
    full sequence) x the sequence / GPUs, the inverse of how those samples/s were derived."""
    printed = cell(row, "tokens_per_s_per_gpu")
    if printed:
        return float(printed)
    return float(row.throughput_samples_per_s) * int(value_of(ds, row, "seq_len")) / int(row.gpus)


def _sharded_workload(ds: Dataset, row, efficiency: float) -> Workload:
    """The row's workload: its decoder's blocks as layers (FSDP's units), the compute time the rule gives."""
    compute, decoder = ds.model["compute"], value_of(ds, row, "decoder")
    seq, batch = int(value_of(ds, row, "seq_len")), int(value_of(ds, row, "batch_per_gpu"))
    flops = decoder_train_flops_per_token(decoder, seq) * seq * batch
    layers = decoder_layers(decoder)
    return Workload(param_bytes=sum(layers), layers=layers, batch_size=batch,
                    compute_time=flops / (PEAK_FLOPS[compute["gpu"]] * efficiency), name=ds.id)


def _efficiency(ds: Dataset, row) -> float:
    """e: the row's measured tokens/s per GPU x training FLOPs per token over the GPU's peak (its model-FLOP
    utilisation)."""
    seq = int(value_of(ds, row, "seq_len"))
    return _tokens_per_gpu(ds, row) * decoder_train_flops_per_token(value_of(ds, row, "decoder"), seq) \
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
            printed = cell(r, "tokens_per_s_per_gpu")  # the measured figure where the source gives it as such
            rows.append(output_row(ds, SHARDED_WHAT, float(r.gpus), float(printed) if printed else math.nan,
                                   math.nan, "", False, model["no_prediction"], value_of(ds, r, "scheme"),
                                   cell(r, "nic_rate")))
        return rows
    if "grad_accum" in ds.rows and (ds.rows["grad_accum"].fillna(1) != 1).any():
        raise ValueError(f"{ds.id}: rows with gradient accumulation (grad_accum > 1) cannot be predicted: the "
                         "simulator's step is one forward and backward, and FSDP gathers again for every micro-batch")
    calibrated = calibration_rows(ds.rows)
    records = list(ds.rows.itertuples(index=False))
    efficiency = {technique: _efficiency(ds, records[i]) for technique, i in calibrated.items()}
    for i, r in enumerate(records):
        technique = cell(r, "technique")
        scheme, nic_rate = value_of(ds, r, "scheme"), cell(r, "nic_rate")
        workload = _sharded_workload(ds, r, efficiency[technique])
        cluster = ds.cluster(int(r.nodes), int(r.gpus_per_node), nic_rate or None)
        res = simulate(cluster, workload, scheme, steps=simulated_steps(scheme))
        predicted = res.throughput * int(value_of(ds, r, "seq_len")) / int(r.gpus)
        bound = step_communication(cluster, workload, scheme) >= workload.compute_time  # type: ignore[operator]
        rows.append(output_row(ds, SHARDED_WHAT, float(r.gpus), _tokens_per_gpu(ds, r), predicted, res.algorithms,
                               bound, scheme=scheme, nic_rate=nic_rate, calibration=i == calibrated[technique],
                               efficiency=efficiency[technique]))
    return rows
