"""Each scheme carried out for real (gloo, 2-4 ranks, a few steps) against its defining properties."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from real.data import load
from real.models import build, param_layers
from syncsim.schemes import AllReduceGradients, AverageParameters, parse
from tests.real.runs import ALLREDUCE, ASYNC, LOCAL, PS_SYNC, SSP, option

pytestmark = pytest.mark.distributed

ALL = {"allreduce": ALLREDUCE, "ps_sync": PS_SYNC, "ssp": SSP, "async": ASYNC, "localsgd": LOCAL}


def launch(real_run, args):
    # the synchronous PS run goes through torchrun itself, the others through real.run
    return real_run(*args, torchrun=3) if args is PS_SYNC else real_run(*args)


@pytest.mark.parametrize("name", ALL)
def test_outputs_in_the_simulator_schema_and_bytes_as_the_policy_counts(real_run, name):
    args = ALL[name]
    run = launch(real_run, args)
    assert list(run.trace.columns) == ["worker", "step", "kind", "start", "end", "bytes"]
    assert list(run.updates.columns) == ["worker", "step", "version_read", "version_applied", "staleness",
                                         "time_applied"]
    s = run.summary
    assert s["complete"] is True and s["error"] is None
    world, steps = int(option(args, "--world")), int(option(args, "--steps"))
    assert s["steps_done"] == [steps] * world
    assert len(run.updates) == world * steps  # one row per worker per step, every scheme
    assert (run.updates.staleness == run.updates.version_applied - run.updates.version_read).all()
    layers = param_layers(build(option(args, "--model"), 0))
    policy = parse(option(args, "--scheme")).policy(sum(layers), layers=layers)
    # payload bytes the handlers counted, per worker, equal the simulator's count exactly
    assert s["bytes_sent"] == {str(w): policy.wire_bytes(steps) for w in range(world)}
    for key in ("step_time", "throughput", "final_loss"):
        assert s[key] > 0


@pytest.mark.parametrize("name", ["allreduce", "ps_sync"])
def test_synchronous_replicas_are_identical(real_run, name):
    run = launch(real_run, ALL[name])
    assert len(set(run.summary["param_checksums"].values())) == 1
    per_step = [r["checksums"] for r in run.results.values() if r["role"] == "worker"]
    assert all(c == per_step[0] for c in per_step)  # after every step, not only the last
    # synchronous: every update read the version it was applied to
    assert (run.updates.staleness == 0).all()


def test_allreduce_equals_one_process_on_the_combined_batch(real_run):
    run = real_run(*ALLREDUCE)
    world, steps, batch = (int(option(ALLREDUCE, k)) for k in ("--world", "--steps", "--batch-size"))
    model, data = build("lenet", 0), load("synthetic", 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        x, y = data.combined(step, world, batch)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    got = torch.load(run.out / "ranks" / "params-rank0.pt")
    # Tolerance: the distributed mean is (g0 + g1)/2 summed by gloo per bucket,
    # the single process averages 32 samples in one reduction: the same sum in
    # another order, so fp32 rounding (2^-24 ≈ 6e-8 relative per operation,
    # amplified a little over 4 steps) separates them; 1e-5 absolute on
    # weights of order 0.1 is ~100 ulps, far below any real difference
    # (one missing worker's gradient moves weights by ~lr·|g| ≈ 1e-3).
    for (name, want), have in zip(model.state_dict().items(), got.values()):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5, msg=name)
    # DDP rebuilds its buckets after the first step in the order autograd made
    # the gradients ready; the policy assumes exact reverse parameter order.
    # Here autograd yields conv2's weight before its bias, so one 200-byte
    # tensor sits on the other side of a boundary: same count, same total,
    # boundaries within one small tensor.
    policy = parse(option(ALLREDUCE, "--scheme")).policy(sum(param_layers(model)), layers=param_layers(model))
    action = next(a for a in policy.plan(1, steps) if isinstance(a, AllReduceGradients))
    got = run.results[0]["buckets"]
    assert len(got) == len(action.buckets) and sum(got) == sum(action.buckets)
    assert max(abs(g - b) for g, b in zip(got, action.buckets)) <= max(param_layers(model)[1::2])  # a bias


def test_ssp_never_exceeds_its_bound(real_run):
    run = real_run(*SSP)
    world, s = int(option(SSP, "--world")), 1
    # Between a worker's pull (when every clock >= t-s) and its push at clock t,
    # each other worker can push at most 2s+1 times (it blocks at t+s+1).
    assert run.updates.staleness.max() <= (world - 1) * (2 * s + 1)
    # The clock rule itself: step t computes only after every worker pushed step t-s-1.
    t = run.trace
    push = t[t.kind == "push"].set_index(["worker", "step"]).start
    for row in t[t.kind == "compute"].itertuples():
        if row.step - s - 1 >= 0:
            assert all(row.start >= push[(w, row.step - s - 1)] for w in range(world))


def test_async_ps_shows_staleness_with_a_slow_worker(real_run):
    run = real_run(*ASYNC)
    assert run.updates.staleness.max() > 0
    assert sorted(run.updates.version_applied) == list(range(len(run.updates)))  # one version per arrival
    assert "wait" not in set(run.trace.kind)


def test_local_sgd_replicas_differ_between_averaging_points_and_agree_at_them(real_run):
    run = real_run(*LOCAL)
    steps = int(option(LOCAL, "--steps"))
    policy = parse(option(LOCAL, "--scheme")).policy(1.0)
    a, b = (run.results[w]["checksums"] for w in (0, 1))
    for step in range(steps):
        synced = any(isinstance(x, (AverageParameters, AllReduceGradients)) for x in policy.plan(step, steps))
        assert (a[step] == b[step]) == synced, f"step {step}"
    # versions: local steps read and are applied to the last sync's version,
    # stamped with the averaging time; warm-up steps are versions of their own
    u = run.updates.sort_values(["worker", "step"])
    w0 = u[u.worker == 0]
    assert list(w0.version_read) == [0, 1, 1, 1, 2, 2, 2]
    assert w0.iloc[1:4].time_applied.nunique() == 1
