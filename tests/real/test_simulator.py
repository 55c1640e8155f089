"""The simulator and the executor carry out the same plans: same sync actions, same staleness rules."""

from __future__ import annotations

import pytest

from real.models import build, param_layers
from syncsim import simulate
from syncsim.cluster import Cluster, Link
from syncsim.schemes import parse
from syncsim.workload import Workload
from tests.real.runs import ALLREDUCE, ASYNC, LOCAL, PS_SYNC, SSP, option

pytestmark = pytest.mark.distributed


RUNS = {"allreduce": ALLREDUCE, "ps_sync": PS_SYNC, "ssp": SSP, "async": ASYNC, "localsgd": LOCAL}


def sync_actions(trace) -> dict:
    """(worker, step) -> kinds in time order, consecutive repeats merged (one row per bucket or one per action)."""
    seq = {}
    for (worker, step), rows in trace.sort_values(["worker", "step", "start", "end"]).groupby(["worker", "step"]):
        kinds = []
        for kind in rows.kind:
            if not kinds or kinds[-1] != kind:
                kinds.append(kind)
        seq[(int(worker), int(step))] = kinds
    return seq


def simulated(args):
    world, servers = int(option(args, "--world")), int(option(args, "--servers", 0))
    steps, batch = int(option(args, "--steps")), int(option(args, "--batch-size"))
    speed = [1.0] * world
    slow = option(args, "--slow")
    if slow:
        rank, factor = slow.split(":")
        speed[int(rank)] = 1.0 / float(factor)
    layers = param_layers(build(option(args, "--model"), 0))
    workload = Workload(param_bytes=sum(layers), compute_time="5ms", batch_size=batch, layers=layers)
    cluster = Cluster.homogeneous(gpus=world, link=Link(bandwidth="1GB/s", latency="100us"), servers=servers,
                                  speed=tuple(speed))
    return simulate(cluster, workload, parse(option(args, "--scheme")), steps=steps, seed=0)


@pytest.mark.parametrize("name", RUNS)
def test_same_sync_actions_per_worker_and_step(real_run, name):
    args = RUNS[name]
    run = real_run(*args, torchrun=3) if args is PS_SYNC else real_run(*args)
    res = simulated(args)
    assert sync_actions(res.trace) == sync_actions(run.trace)
    assert len(res.updates) == len(run.updates)


@pytest.mark.parametrize("name", RUNS)
def test_same_staleness_rules(real_run, name):
    args = RUNS[name]
    run = real_run(*args, torchrun=3) if args is PS_SYNC else real_run(*args)
    res = simulated(args)
    spec = parse(option(args, "--scheme"))
    world = int(option(args, "--world"))
    if name == "ssp":
        bound = (world - 1) * (2 * spec.staleness + 1)
        assert res.updates.staleness.max() <= bound and run.updates.staleness.max() <= bound
    elif name == "async":
        assert res.updates.staleness.max() > 0 and run.updates.staleness.max() > 0
    else:
        assert (res.updates.staleness == 0).all() and (run.updates.staleness == 0).all()
        # synchronous schemes: identical version numbering, row for row
        key = ["worker", "step"]
        sim = res.updates.sort_values(key)[key + ["version_read", "version_applied"]].reset_index(drop=True)
        real = run.updates.sort_values(key)[key + ["version_read", "version_applied"]].reset_index(drop=True)
        assert sim.astype(int).equals(real.astype(int))
