"""Invariants every simulation keeps, on random valid configurations."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from syncsim import Cluster, Link, Workload, simulate
from syncsim.metrics import step_ends
from syncsim.result import single_gpu_throughput
from syncsim.schemes import parse

links = st.builds(Link, bandwidth=st.floats(1e8, 1e12), latency=st.floats(0, 1e-4))
scheme_texts = st.sampled_from([
    "allreduce", "allreduce:overlap=false", "allreduce:algorithm=tree", "allreduce:algorithm=hierarchical",
    "allreduce:precision=fp16,bucket_bytes=1MiB", "ps", "ps:mode=async", "ps:staleness=1", "ps:staleness=3",
    "localsgd:period=1", "localsgd:period=4,warmup_steps=2", "localsgd:period=3,precision=bf16",
])


@st.composite
def configs(draw, noisy=True):
    nodes = draw(st.integers(1, 4))
    per_node = draw(st.integers(1, 4))
    cluster = Cluster(
        nodes=nodes, gpus_per_node=per_node, intra=draw(links), inter=draw(links),
        servers=draw(st.integers(1, 3)), server_link=draw(st.one_of(st.none(), links)),
        jitter=draw(st.floats(0, 0.5)) if noisy else 0.0,
        straggler_prob=draw(st.floats(0, 0.3)) if noisy else 0.0,
        straggler_slowdown=draw(st.floats(1, 5)) if noisy else 1.0,
    )
    layers = draw(st.one_of(st.none(), st.lists(st.floats(1e3, 1e7), min_size=1, max_size=6)))
    workload = Workload(param_bytes=None if layers else draw(st.floats(1e3, 1e8)), layers=layers,
                        compute_time=draw(st.floats(1e-3, 0.2)), batch_size=draw(st.integers(1, 64)))
    return cluster, workload, draw(scheme_texts), draw(st.integers(1, 12)), draw(st.integers(0, 2**31))


@given(configs())
def test_random_configs_keep_invariants(config):
    cluster, workload, scheme, steps, seed = config
    res = simulate(cluster, workload, scheme, steps=steps, seed=seed)
    trace, updates = res.trace, res.updates
    assert res.step_time > 0 and np.isfinite(res.throughput)
    assert (trace["end"] >= trace["start"]).all() and (trace["start"] >= 0).all()
    # every worker computes every step exactly once
    computes = trace[trace["kind"] == "compute"]
    assert len(computes) == steps * cluster.gpus
    # a worker's computes never overlap each other, nor do its communications (only an
    # overlapped all-reduce may run beside backward), and both follow step order
    for _, rows in trace.groupby("worker", observed=True):
        for is_compute in (True, False):
            part = rows[(rows["kind"] == "compute") == is_compute].sort_values(["start", "end"], kind="stable")
            assert (part["start"].to_numpy()[1:] >= part["end"].to_numpy()[:-1] - 1e-12).all()
            assert (np.diff(part["step"].to_numpy()) >= 0).all()
    # updates: staleness never negative, versions applied in order, one row per worker-step
    assert (updates["staleness"] >= 0).all()
    assert (np.diff(updates["version_applied"].to_numpy()) >= 0).all()
    assert len(updates) == steps * cluster.gpus
    # the trace carries every step's boundary: the engine's own record of step ends is the latest end
    # among each (worker, step)'s rows, which is what the steady-state figures are computed from. Equal
    # to rounding: SimPy reaches an instant t as now + (t - now), which can differ from t in the last bit.
    np.testing.assert_allclose(step_ends(trace, cluster.gpus, steps), res.step_end, rtol=1e-12, atol=0)
    assert not updates.duplicated(["worker", "step"]).any()
    # synchronous schemes and local SGD (whose local steps land in the version they started from)
    if res.scheme.name in ("allreduce", "localsgd") or getattr(res.scheme, "mode", None) == "sync":
        assert (updates["staleness"] == 0).all()


# Basis: on identical noiseless GPUs no worker steps faster than one GPU alone, so W workers
# deliver at most W times the samples per second.
@given(configs(noisy=False))
def test_speedup_at_most_workers_on_homogeneous_clusters(config):
    cluster, workload, scheme, steps, seed = config
    res = simulate(cluster, workload, scheme, steps=steps, seed=seed)
    assert res.speedup <= cluster.gpus * (1 + 1e-9)
    assert res.throughput == pytest.approx(res.speedup * single_gpu_throughput(workload))


# Basis: 16-bit formats carry 2 bytes per value instead of 4, and nothing else changes.
@given(configs(noisy=False), st.sampled_from(["fp16", "bf16"]))
def test_half_precision_halves_bytes_on_the_wire(config, half):
    cluster, workload, scheme, steps, seed = config
    full = simulate(cluster, workload, replace(parse(scheme), precision="fp32"), steps=steps, seed=seed)
    halved = simulate(cluster, workload, replace(parse(scheme), precision=half), steps=steps, seed=seed)
    assert halved.trace["bytes"].sum() == pytest.approx(full.trace["bytes"].sum() / 2, rel=1e-12)


@given(configs())
def test_same_seed_same_trace(config):
    cluster, workload, scheme, steps, seed = config
    a = simulate(cluster, workload, scheme, steps=steps, seed=seed)
    b = simulate(cluster, workload, scheme, steps=steps, seed=seed)
    pd.testing.assert_frame_equal(a.trace, b.trace, check_exact=True)
    pd.testing.assert_frame_equal(a.updates, b.updates, check_exact=True)


def test_different_seed_different_noise():
    cluster = Cluster.homogeneous(4, Link("10GB/s"), jitter=0.2)
    a = simulate(cluster, Workload(1e6, 0.01), "allreduce", steps=5, seed=1)
    b = simulate(cluster, Workload(1e6, 0.01), "allreduce", steps=5, seed=2)
    assert not np.array_equal(a.step_end, b.step_end)


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=0), "steps"), (dict(seed=-1), "seed"), (dict(scheme="ring"), "unknown scheme"),
])
def test_simulate_rejects(kwargs, message):
    args = dict(cluster=Cluster.homogeneous(2, Link("1GB/s")), workload=Workload(1e6, 0.01), scheme="allreduce")
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        simulate(**args)


@given(configs(noisy=False), st.lists(st.tuples(st.floats(1e-4, 0.5), st.floats(0, 0.05)), min_size=1, max_size=4,
                                      unique_by=lambda point: point[0]))
def test_a_compute_lasts_its_idle_cost_longer_after_its_worker_idled(config, points):
    # Workload.idle_cost's definition: a compute that starts g seconds after its worker's previous compute
    # ended, with no collective of its own in between, lasts idle_extra(g) longer (none for a worker's
    # first; none after an all-reduce or an averaging, whose reduction keeps the worker busy). Noise-free,
    # every compute is otherwise compute_time: each compute row of the trace is compute_time plus
    # idle_extra(its gap) for parameter-server workers, and compute_time alone for collective schemes
    # (their local steps follow the previous compute at once).
    cluster, workload, scheme, steps, seed = config
    workload = replace(workload, idle_cost=tuple(sorted(points)))
    trace = simulate(cluster, workload, scheme, steps=steps, seed=seed).trace
    with_servers = scheme.startswith("ps")
    for _, rows in trace[trace.kind == "compute"].sort_values("start").groupby("worker"):
        starts, ends = rows.start.to_numpy(), rows.end.to_numpy()
        gaps = np.concatenate([[0.0], starts[1:] - ends[:-1]])
        expected = [workload.compute_time + (workload.idle_extra(g) if with_servers else 0.0) for g in gaps]
        assert ends - starts == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_one_parameter_server_worker_s_step_grows_by_the_idle_cost_of_its_wait():
    # One worker of a synchronous parameter server computes, pushes, waits and pulls: noise-free its step
    # is T0 = compute + communication. Its next compute starts T0 - compute after the last ended, so with
    # an idle cost its step is T0 + idle_extra(T0 - compute), step after step (a closed form).
    cluster = Cluster.homogeneous(gpus=1, link=Link("50MB/s", "300us"), servers=1)
    plain = Workload(param_bytes="400kB", compute_time="1ms")
    idle = replace(plain, idle_cost=((2e-3, 0.2e-3), (8e-3, 0.6e-3), (30e-3, 1.0e-3)))
    t0 = simulate(cluster, plain, "ps", steps=20).steady.step_time
    waited = t0 - plain.compute_time
    assert 8e-3 < waited < 30e-3  # between two points: the interpolation is what is checked
    expected = t0 + 0.6e-3 + (1.0e-3 - 0.6e-3) * (waited - 8e-3) / (30e-3 - 8e-3)
    assert simulate(cluster, idle, "ps", steps=20).steady.step_time == pytest.approx(expected, rel=1e-9)


@given(configs())
def test_replaying_the_drawn_compute_times_reproduces_the_run(config):
    """simulate(compute_times=T) computes each step exactly T[step][worker]: handed the very times the
    model drew for that seed (speed, jitter and stragglers applied), it makes the same run, event for
    event. The identity rests on compute being the engine's only random draw besides the servers'
    sharing, which the seed fixes in both runs."""
    from syncsim.compute import ComputeTimes

    cluster, workload, scheme, steps, seed = config
    cluster = replace(cluster, speed=tuple(1.0 / (1 + 0.5 * (w % 2)) for w in range(cluster.gpus)))
    drawn = ComputeTimes(cluster, workload, seed)
    table = [[drawn(step, w) for w in range(cluster.gpus)] for step in range(steps)]
    ran = simulate(cluster, workload, scheme, steps=steps, seed=seed)
    replayed = simulate(cluster, workload, scheme, steps=steps, seed=seed, compute_times=table)
    pd.testing.assert_frame_equal(replayed.trace, ran.trace)
    pd.testing.assert_frame_equal(replayed.updates, ran.updates)
    # and the replayed times are used as they are: the speed factors are not applied a second time
    plain = replace(cluster, speed=None, jitter=0.0, straggler_prob=0.0)
    again = simulate(plain, workload, scheme, steps=steps, seed=seed, compute_times=table)
    pd.testing.assert_frame_equal(again.trace, ran.trace)


def test_a_replayed_step_computes_as_long_as_its_row_says():
    """Every compute lasts exactly its replayed time: no jitter, and no idle cost although the worker
    idles while its parameter server answers (a measured phase already holds what idling cost it)."""
    cluster = Cluster(nodes=1, gpus_per_node=1, jitter=0.3, servers=1, inter=Link(bandwidth=1e8, latency=1e-4))
    workload = Workload(param_bytes=1e6, compute_time=0.01, batch_size=8, idle_cost=((0.001, 0.5),))
    table = [[0.002], [0.0], [0.007], [0.004]]
    res = simulate(cluster, workload, "ps", steps=4, compute_times=table)
    assert (res.trace["kind"] == "pull").sum() >= 3  # the worker did wait for its server between computes
    computes = res.trace[res.trace["kind"] == "compute"].sort_values("step")
    np.testing.assert_allclose((computes["end"] - computes["start"]).to_numpy(), [0.002, 0.0, 0.007, 0.004])
