"""One host's cores shared by the workers' compute (syncsim.host): processor sharing's closed forms, the
engine carrying it out after a collective, and the cores shared as the simulation reaches each compute
(SharedCores: a parameter-server worker's, a local step)."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from syncsim import Cluster, Link, Workload, simulate
from syncsim.host import SharedCores, SharedHost, shared_finish

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


def _cores_finish(arrivals, drawn, cores: int, workers: int, contention: float | None) -> list[float]:
    """When SharedCores ends each compute of ``drawn`` seconds started at ``arrivals``, run in SimPy."""
    env = simpy.Environment()
    host = SharedCores(env, cores, workers, contention)
    ends = [float("nan")] * len(arrivals)

    def job(i: int):
        yield env.timeout(arrivals[i])
        yield host.start(env.now, drawn[i])
        ends[i] = env.now

    for i in range(len(arrivals)):
        env.process(job(i))
    env.run()
    return ends


@given(starts, st.data(), st.integers(1, 4), st.floats(1.0, 3.0))
@settings(max_examples=200)
def test_cores_shared_as_computes_arrive_end_them_as_the_closed_form_schedule_does(arrivals, data, cores, contention):
    # SharedCores learns of each compute only when the simulation reaches it and reschedules at every
    # arrival and departure; shared_finish knows every start in advance. Both are the same processor
    # sharing (the closed forms above): given the same starts, work (drawn / contention) and overhead
    # (contention over the even share, charged while the jobs outnumber the cores), they end alike.
    drawn = data.draw(st.lists(work, min_size=len(arrivals), max_size=len(arrivals)))
    workers = max(len(arrivals), cores + 1)
    ends = _cores_finish(arrivals, drawn, cores, workers, contention)
    even = max(1.0, workers / cores)
    expected = shared_finish(arrivals, [d / contention for d in drawn], cores, contention / even)
    assert ends == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_a_compute_alone_on_the_cores_takes_its_work_alone_and_all_at_once_their_drawn_time():
    # Four workers whose step takes 6 ms all at once on two cores, measured 2.5 times a lone worker's: alone
    # a compute takes 6 / 2.5 = 2.4 ms; the four started together take 6 ms each, as the probe timed them.
    assert _cores_finish([0.0], [6e-3], 2, 4, 2.5) == pytest.approx([2.4e-3], rel=1e-12)
    assert _cores_finish([0.0] * 4, [6e-3] * 4, 2, 4, 2.5) == pytest.approx([6e-3] * 4, rel=1e-12)


def _server(mode: str, cores: int | None, server_rate: str = "1Gbit/s", contention: float | None = None,
            latency: str = "20us", speed: tuple[float, ...] | None = None):
    cluster = Cluster.homogeneous(4, Link("10Gbit/s", latency), servers=1, server_link=Link(server_rate, latency),
                                  host_cores=cores, host_contention=contention, speed=speed)
    workload = Workload(param_bytes=4e5, compute_time=6e-3, batch_size=32)
    return simulate(cluster, workload, mode, steps=30)


def test_synchronous_server_workers_whose_pulls_end_together_compute_as_the_probe_timed_them():
    # A synchronous server answers the four pulls at once over equal shares of its link, so with no latency
    # (a waiting worker's answer and the last pusher's round trip then cost alike) they end together; four
    # equal computes started together on the shared cores end together at their drawn time (processor
    # sharing's closed form): the run is the one without a host.
    assert _server("ps", 2, contention=2.5, latency="0us").steady.step_time == pytest.approx(
        _server("ps", None, latency="0us").steady.step_time, rel=1e-12)


def test_asynchronous_server_workers_out_of_step_compute_faster_than_all_at_once():
    # Workers of unequal speeds fall out of step at an asynchronous server (a pull of 400 kB takes 64 ms
    # at 50 Mbit/s), so their computes seldom meet: each lies between its work alone (its drawn time over
    # the contention, 2.5) and its drawn time (all four at once, 6 ms over its speed), most nearer the
    # first; and a run whose workers compute faster takes shorter steps.
    speed = (1.0, 0.9, 0.8, 0.7)
    shared = _server("ps:mode=async", 2, "50Mbit/s", contention=2.5, speed=speed)
    trace = shared.trace[shared.trace.kind == "compute"]
    drawn = 6e-3 / trace.worker.map(dict(enumerate(speed)))
    took = trace.end - trace.start
    assert (took >= drawn / 2.5 * (1 - 1e-9)).all() and (took <= drawn * (1 + 1e-9)).all()
    assert (took < drawn / 2).mean() > 0.5
    assert shared.steady.step_time < _server("ps:mode=async", None, "50Mbit/s", speed=speed).steady.step_time


def test_a_compute_that_overlaps_a_collective_keeps_its_drawn_time_on_the_shared_cores():
    # An all-reduce's schedule takes its compute's end as a time of its own (the buckets' readiness), so
    # the cores do not time it: with no spread, a host changes nothing for all-reducing or averaging runs.
    for scheme in ("allreduce", "localsgd:period=1"):
        cluster = Cluster.homogeneous(4, Link("1Gbit/s", "50us"), jitter=0.3)
        workload = Workload(param_bytes=4e5, compute_time=4e-3, batch_size=32)
        shared = cluster.replace(host_cores=2, host_contention=2.5)
        assert simulate(shared, workload, scheme, steps=30).steady.step_time == pytest.approx(
            simulate(cluster, workload, scheme, steps=30).steady.step_time, rel=1e-12)
