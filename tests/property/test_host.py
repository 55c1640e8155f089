"""One host's cores shared by the workers' compute (syncsim.host): processor sharing's closed forms, and the
engine carrying it out after a collective."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syncsim import Cluster, Link, Workload, simulate
from syncsim.host import SharedHost, shared_finish

starts = st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=1, max_size=8)
work = st.floats(1e-3, 5.0, allow_nan=False)


@given(st.integers(1, 8), st.integers(1, 8), work)
def test_jobs_that_start_together_with_equal_work_end_together_n_over_c_times_later(n, cores, w):
    # Closed form of processor sharing: n equal jobs on c cores each progress at min(1, c/n) of a core.
    assert shared_finish([0.0] * n, [w] * n, cores) == pytest.approx([w * max(1.0, n / cores)] * n, rel=1e-12)


@given(starts, st.data())
def test_as_many_cores_as_jobs_leave_every_job_alone(arrivals, data):
    # With a core for every job none waits: each ends its own work after its start.
    works = data.draw(st.lists(work, min_size=len(arrivals), max_size=len(arrivals)))
    assert shared_finish(arrivals, works, len(arrivals)) == pytest.approx(
        [s + w for s, w in zip(arrivals, works)], rel=1e-12, abs=1e-12)


@given(starts, st.data())
@settings(max_examples=200)
def test_one_core_is_busy_exactly_as_long_as_any_work_conserving_schedule(arrivals, data):
    # A fact of work-conserving single-server queues: the busy periods, and so when the last job ends, do
    # not depend on the order the work is served in. First come, first served gives it in closed form:
    # t = max(t, start) + work over the jobs by start. Processor sharing never idles a core with work left.
    works = data.draw(st.lists(work, min_size=len(arrivals), max_size=len(arrivals)))
    t = 0.0
    for s, w in sorted(zip(arrivals, works)):
        t = max(t, s) + w
    finish = shared_finish(arrivals, works, 1)
    assert max(finish) == pytest.approx(t, rel=1e-9)
    # and no job ends before it could have alone
    assert all(f >= s + w - 1e-9 for f, s, w in zip(finish, arrivals, works))


def test_two_jobs_on_one_core_share_it_while_both_are_present():
    # A: work 2 from 0; B: work 1 from 1. Alone until 1 (A has 1 left), then half a core each: B's 1 takes
    # 2 (ends at 3), and A's 1 left also ends at 3.
    assert shared_finish([0.0, 1.0], [2.0, 1.0], 1) == pytest.approx([3.0, 3.0])
    # B with work 0.5: ends at 2, A then alone with 0.5 left ends at 2.5.
    assert shared_finish([0.0, 1.0], [2.0, 0.5], 1) == pytest.approx([2.5, 2.0])


def _ring(world: int, cores: int | None, spread: float) -> float:
    cluster = Cluster.homogeneous(world, Link("1Gbit/s", "50us"), host_cores=cores, exit_spread=spread)
    workload = Workload(param_bytes=4e5, compute_time=4e-3, batch_size=32)
    return simulate(cluster, workload, "allreduce", steps=40).steady.step_time


def test_a_host_s_workers_leaving_a_collective_together_compute_as_the_probe_timed_them():
    # No spread: every worker starts its step's compute at once, as the compute probe's ranks did, so each
    # takes the workload's compute_time (equal works on a shared host end together): the step is unchanged.
    assert _ring(4, 2, 0.0) == pytest.approx(_ring(4, None, 0.0), rel=1e-12)


def test_workers_leaving_a_collective_apart_overlap_less_on_the_shared_cores():
    # Four workers on two cores computed 4 ms at once, 2 ms of work each alone. Leaving 6 ms apart (2 ms
    # between them), each computes alone: the last to leave ends its compute 2 ms after the collective,
    # 2 ms sooner than together. With a core each, leaving apart changes nothing for the last to leave.
    together = _ring(4, 2, 0.0)
    assert _ring(4, 2, 6e-3) == pytest.approx(together - 2e-3, rel=1e-9)
    assert _ring(4, 4, 6e-3) == pytest.approx(_ring(4, 4, 0.0), rel=1e-12) == pytest.approx(together, rel=1e-12)


def test_the_host_s_schedule_is_the_processor_sharing_of_the_spread_departures():
    # SharedHost.after_collective: leads evenly spaced over the spread, in an order drawn per collective, and
    # the work the probe's contention leaves (drawn time / max(1, workers / cores)), shared by processor
    # sharing; a worker whose work ended before the collective did owes nothing (0).
    host = SharedHost(cores=2, workers=3, exit_spread=3.0, seed=5)
    times = {(7, 0): 3.0, (7, 1): 1.5, (7, 2): 0.3}
    durations = [host.after_collective(7, w, lambda step, worker: times[step, worker]) for w in range(3)]
    order = [int(w) for w in __import__("numpy").random.default_rng([5, 7, 1]).permutation(3)]
    leads = {order[0]: 3.0, order[1]: 1.5, order[2]: 0.0}
    works = [times[7, w] / 1.5 for w in range(3)]
    want = [max(0.0, f) for f in shared_finish([-leads[w] for w in range(3)], works, 2)]
    assert durations == pytest.approx(want, rel=1e-12)


def test_a_spread_without_a_shared_host_is_refused():
    with pytest.raises(ValueError, match="exit_spread .* needs host_cores"):
        Cluster.homogeneous(2, Link("1Gbit/s", "50us"), exit_spread=1e-3)


@given(st.integers(1, 8), st.integers(1, 8), work, st.floats(1.0, 3.0))
def test_time_slicing_s_overhead_slows_only_jobs_that_outnumber_the_cores(n, cores, w, overhead):
    # n equal jobs together: each progresses at min(1, c/n) of a core, and overhead times slower still while
    # they outnumber the cores; with a core each they run alone whatever the overhead.
    want = w * max(1.0, n / cores) * (overhead if n > cores else 1.0)
    assert shared_finish([0.0] * n, [w] * n, cores, overhead) == pytest.approx([want] * n, rel=1e-12)


@given(st.floats(1.0, 4.0), work)
def test_a_measured_contention_keeps_workers_leaving_together_at_the_probe_s_step(contention, w):
    # A compute probe of every worker at once measured the drawn time w, contention times a lone worker's
    # step: workers that start together on the shared host (no spread) must still take w each, whatever
    # the contention (the overhead it implies is charged while they outnumber the cores).
    host = SharedHost(cores=2, workers=4, exit_spread=0.0, seed=1, contention=contention)
    assert [host.after_collective(3, k, lambda step, worker: w) for k in range(4)] == pytest.approx([w] * 4, rel=1e-9)


def test_a_lone_worker_s_work_is_the_drawn_time_over_the_measured_contention():
    # Spread far apart (each alone on the cores), a worker's compute is its work alone: 2.7 ms drawn at a
    # contention of 2.7 is 1 ms of a core; with no measurement the even share (workers / cores, 2) gives 1.35.
    for contention, alone in ((2.7, 1e-3), (None, 1.35e-3)):
        host = SharedHost(cores=2, workers=4, exit_spread=1.0, seed=2, contention=contention)
        ends = [host.after_collective(0, k, lambda step, worker: 2.7e-3) for k in range(4)]
        assert max(ends) == pytest.approx(alone, rel=1e-9)


def test_a_contention_without_a_shared_host_or_below_one_is_refused():
    with pytest.raises(ValueError, match="host_contention .* needs host_cores"):
        Cluster.homogeneous(4, Link("1Gbit/s", "50us"), host_contention=2.5)
    with pytest.raises(ValueError, match="host_contention"):
        Cluster.homogeneous(4, Link("1Gbit/s", "50us"), host_cores=2, host_contention=0.5)
