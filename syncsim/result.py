"""What a simulation returns: timings, the trace, the applied updates, and views of them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from syncsim.cluster import Cluster
from syncsim.files import write_atomic
from syncsim.memory import Memory, estimate
from syncsim.metrics import SteadyState, steady_state
from syncsim.recorder import Recorder
from syncsim.schemes import Scheme
from syncsim.workload import Workload

__all__ = ["SimResult", "single_gpu_throughput"]


def single_gpu_throughput(workload: Workload) -> float:
    """Samples/s of plain training on one nominal GPU: no communication, no noise."""
    return workload.batch_size / workload.compute_time  # type: ignore[operator]


@dataclass(frozen=True, eq=False)
class SimResult:
    cluster: Cluster
    workload: Workload
    scheme: Scheme
    steps: int
    seed: int
    step_end: np.ndarray = field(repr=False)
    """Simulated time at which each (step, worker) finished, shape (steps, workers): the engine's own
    record, equal to the step boundaries the trace shows (syncsim.metrics.step_ends)."""
    recorder: Recorder = field(repr=False)
    wall_time: float = 0.0
    """Seconds of real time the simulation took."""
    versions: int = 0
    """Versions of the authoritative parameters produced."""

    @property
    def workers(self) -> int:
        return self.cluster.gpus

    @cached_property
    def steady(self) -> SteadyState:
        """Steady-state figures from the trace and updates, by the definition real runs use too (syncsim.metrics)."""
        return steady_state(self.trace, self.updates, self.workload.batch_size, steps=self.steps,
                            workers=self.workers)

    @property
    def warmup_steps(self) -> int:
        """Steps left out of the steady state: the first tenth of the run, at least one."""
        return self.steady.warmup

    @property
    def worker_step_times(self) -> np.ndarray:
        """Each worker's mean seconds per step over the steady state (gaps between its step ends)."""
        return self.steady.worker_step_times

    @property
    def step_time(self) -> float:
        """Mean seconds per step in steady state (harmonic over workers, so throughput = W·batch/step_time)."""
        return self.steady.step_time

    @property
    def throughput(self) -> float:
        """Samples per second, whole cluster, steady state."""
        return self.steady.throughput

    @property
    def makespan(self) -> float:
        """Simulated seconds until the last worker finished its last step."""
        return float(self.step_end[-1].max())

    @property
    def speedup(self) -> float:
        """Throughput relative to plain training of the same workload on one nominal GPU."""
        return self.steady.speedup(single_gpu_throughput(self.workload))

    @property
    def efficiency(self) -> float:
        """Scaling efficiency: speedup / workers."""
        return self.speedup / self.workers

    @cached_property
    def memory(self) -> Memory:
        """One worker's memory at its peak (syncsim.memory); ``memory.fits`` flags a configuration that does
        not fit the cluster's ``gpu_memory`` (False), does (True) or cannot be told (None)."""
        return estimate(self.cluster, self.workload, self.scheme)

    @cached_property
    def trace(self) -> pd.DataFrame:
        """One row per timed action: worker, step, kind, start, end, bytes (seconds, bytes on the wire)."""
        return self.recorder.trace_frame()

    @cached_property
    def collectives(self) -> pd.DataFrame:
        """One row per bucket of every collective: step, kind, bucket, bytes, algorithm (what ran), start, end."""
        return self.recorder.collectives_frame()

    @cached_property
    def updates(self) -> pd.DataFrame:
        """One row per applied gradient: worker, step, version_read, version_applied, staleness, time_applied."""
        return self.recorder.updates_frame()

    def summary(self) -> dict:
        """One tidy row: the configuration and the headline figures."""
        return {
            "scheme": str(self.scheme), "scheme_name": self.scheme.name, **{
                f"scheme.{k}": v for k, v in self.scheme.fields().items()},
            "cluster": self.cluster.name, "gpus": self.workers, "nodes": self.cluster.nodes,
            "gpus_per_node": self.cluster.gpus_per_node, "servers": self.cluster.servers,
            "workload": self.workload.name, "param_bytes": self.workload.param_bytes,
            "compute_time": self.workload.compute_time, "batch_size": self.workload.batch_size,
            "jitter": self.cluster.jitter, "straggler_prob": self.cluster.straggler_prob,
            "straggler_slowdown": self.cluster.straggler_slowdown, "steps": self.steps, "seed": self.seed,
            "step_time": self.step_time, "throughput": self.throughput, "speedup": self.speedup,
            "efficiency": self.efficiency,
            "mean_staleness": self.steady.staleness_mean, "max_staleness": self.steady.staleness_max,
            "algorithms": self.algorithms,
            "memory_per_gpu": self.memory.peak, "memory_complete": self.memory.complete,
            "gpu_memory": self.cluster.gpu_memory, "fits": self.memory.fits,
            "wall_time": self.wall_time,
        }

    @property
    def algorithms(self) -> str:
        """The collective algorithms that ran, by share of bytes, e.g. "tree" or "ring 62% + tree 38%"."""
        frame = self.collectives
        if frame.empty:
            return ""
        share = frame.groupby("algorithm")["bytes"].sum().sort_values(ascending=False) / frame["bytes"].sum()
        if len(share) == 1:
            return str(share.index[0])
        return " + ".join(f"{name} {fraction:.0%}" for name, fraction in share.items())

    def to_chrome_trace(self, path: str | Path, max_workers: int = 64, max_steps: int | None = None) -> Path:
        """Write the trace as Chrome trace-event JSON (open in Perfetto or chrome://tracing).

        One process per node and one thread per worker; only the first
        ``max_workers`` workers (and ``max_steps`` steps) are written, to keep
        the file small enough for a viewer.
        """
        trace = self.trace
        keep = trace["worker"] < max_workers
        if max_steps is not None:
            keep &= trace["step"] < max_steps
        trace = trace[keep]
        per_node = self.cluster.gpus_per_node
        events: list[dict] = []
        for w in sorted(trace["worker"].unique()):
            events.append({"ph": "M", "name": "process_name", "pid": int(w) // per_node,
                           "args": {"name": f"node {int(w) // per_node}"}})
            events.append({"ph": "M", "name": "thread_name", "pid": int(w) // per_node, "tid": int(w),
                           "args": {"name": f"worker {int(w)}"}})
        for row in trace.itertuples(index=False):
            events.append({
                "name": str(row.kind), "cat": str(row.kind), "ph": "X",
                "ts": row.start * 1e6, "dur": max(0.0, (row.end - row.start) * 1e6),
                "pid": int(row.worker) // per_node, "tid": int(row.worker),
                "args": {"step": int(row.step), "bytes": float(row.bytes)},
            })
        meta = {"scheme": str(self.scheme), "cluster": self.cluster.name, "workload": self.workload.name,
                "gpus": self.workers, "steps": self.steps, "seed": self.seed}
        return write_atomic(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms",
                                                     "otherData": meta}))

