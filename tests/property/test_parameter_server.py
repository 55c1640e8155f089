"""Parameter-server timing, clocks and versions."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from syncsim import Cluster, Link, Workload, simulate
from syncsim.schemes import ParameterServer


def ps_cluster(p, k, worker_bw=1e9, server_bw=1e9, latency=0.0, **kw):
    return Cluster.homogeneous(p, Link(worker_bw, latency), servers=k, server_link=Link(server_bw, latency), **kw)


# Basis: p simultaneous pushes of n bytes sharded over k servers are k·p flows of n/k; a worker's
# NIC splits into k flows (cap B_w/k), a server NIC shares among p flows (B_s/p each), so one push
# takes alpha + max(n/B_w, p·n/(k·B_s)): the parameter server's bottleneck. After a synchronous round
# every worker pulls, the mirror image out of the servers. Pulls start together only without latency:
# the round's answer reaches the worker whose push closed it a round trip later than the others.
@pytest.mark.parametrize("kind", ["push", "pull"])
@given(st.integers(1, 64), st.integers(1, 8), st.floats(1e4, 1e8), st.floats(1e7, 1e11), st.floats(1e7, 1e11),
       st.floats(0, 1e-4))
def test_push_and_pull_bottleneck(kind, p, k, n, worker_bw, server_bw, alpha):
    if kind == "pull":
        alpha = 0.0
    cluster = ps_cluster(p, k, worker_bw, server_bw, alpha)
    res = simulate(cluster, Workload(n, 0.01), ParameterServer(mode="sync"), steps=1)
    rows = res.trace[res.trace["kind"] == kind]
    expected = alpha + max(n / worker_bw, p * n / (k * server_bw))
    assert len(rows) == p
    np.testing.assert_allclose(rows["end"] - rows["start"], expected, rtol=1e-9)
    assert (rows["bytes"] == n).all()


# Basis: a pull is a request and its answer, a message each way: two latencies besides the answer's
# bytes, where a push (one message) pays one. One worker, so nothing else shares a link.
@given(st.integers(1, 8), st.floats(1e4, 1e8), st.floats(1e7, 1e11), st.floats(1e7, 1e11), st.floats(0, 1e-3))
def test_a_pull_pays_two_latencies(k, n, worker_bw, server_bw, alpha):
    res = simulate(ps_cluster(1, k, worker_bw, server_bw, alpha), Workload(n, 0.01), ParameterServer(mode="sync"),
                   steps=1)
    pull = res.trace[res.trace["kind"] == "pull"].iloc[0]
    assert pull["end"] - pull["start"] == pytest.approx(2 * alpha + max(n / worker_bw, n / (k * server_bw)),
                                                        rel=1e-9)


def _clocks_at(updates: pd.DataFrame, workers: int, when: float) -> np.ndarray:
    applied = updates[updates["time_applied"] <= when]
    return np.bincount(applied["worker"], minlength=workers)


# Basis: SSP (Ho et al. 2013): a worker starts clock c only when the slowest worker has
# completed at least c - s clocks, so no worker runs more than s clocks ahead.
@given(st.integers(2, 12), st.integers(0, 4), st.floats(0, 0.5), st.floats(1, 6), st.integers(0, 10**6))
def test_ssp_clock_gap_within_bound(p, s, prob, slowdown, seed):
    cluster = ps_cluster(p, 1, jitter=0.2, straggler_prob=prob, straggler_slowdown=slowdown)
    res = simulate(cluster, Workload(1e6, 0.01), ParameterServer(staleness=s), steps=12, seed=seed)
    computes = res.trace[res.trace["kind"] == "compute"]
    updates = res.updates
    for row in computes.itertuples():
        if row.step == 0:
            continue
        clocks = _clocks_at(updates, p, row.start)
        assert clocks.min() >= row.step - s, (row.worker, row.step, clocks)


# Basis: SSP with s = 0 is bulk-synchronous: the same waits, so the same times as a synchronous PS.
@given(st.integers(1, 10), st.floats(0, 0.4), st.integers(0, 10**6))
def test_ssp_zero_times_equal_sync(p, jitter, seed):
    cluster = ps_cluster(p, 2, jitter=jitter)
    sync = simulate(cluster, Workload(1e6, 0.01), "ps", steps=8, seed=seed)
    ssp0 = simulate(cluster, Workload(1e6, 0.01), "ps:staleness=0", steps=8, seed=seed)
    np.testing.assert_array_equal(sync.step_end, ssp0.step_end)
    pd.testing.assert_frame_equal(sync.trace, ssp0.trace)
    # Each synchronous round is one version whose W updates all read the version they apply to.
    assert (sync.updates["staleness"] == 0).all() and sync.versions == 8
    assert ssp0.versions == 8 * p


# Basis: syncsim.schemes.actions (WaitForClock): the servers send the slowest clock with every pull
# reply, and a worker asks them only when the clock it last heard of does not allow it to go on
# (an SSP client reads from its cache while the cache is fresh enough, Ho et al. 2013). Identical
# workers stay in lock-step, so the pull of step t hears at least clock t (every worker's previous
# push has landed; this round's may land in the same instant, after the pull) and, with s >= 2, no
# wait of step t + 1 (threshold t + 2 - s) needs a message: SSP runs exactly as asynchronous
# training, latencies included.
@given(st.integers(2, 8), st.integers(2, 5), st.floats(1e-6, 1e-3), st.integers(1, 3))
def test_ssp_that_never_binds_sends_no_clock_requests(p, s, alpha, k):
    cluster = ps_cluster(p, k, latency=alpha, jitter=0.0)
    ssp = simulate(cluster, Workload(1e6, 0.01), ParameterServer(staleness=s), steps=10)
    asynchronous = simulate(cluster, Workload(1e6, 0.01), "ps:mode=async", steps=10)
    np.testing.assert_array_equal(ssp.step_end, asynchronous.step_end)
    waits = ssp.trace[ssp.trace["kind"] == "wait"]
    assert len(waits) == 10 * p and (waits["end"] == waits["start"]).all()


# Basis: with the same compute-time draws and a network too fast to matter, SSP is a max-plus
# recurrence (a worker starts step t+1 at the later of its own finish and the slowest worker
# reaching clock t+1-s); a larger s only weakens the condition, so by induction every step
# ends no later, and the run's throughput (samples / makespan) does not fall.
@given(st.integers(2, 10), st.floats(0.05, 0.5), st.floats(2, 8), st.integers(0, 10**6))
def test_throughput_non_decreasing_in_staleness(p, prob, slowdown, seed):
    cluster = ps_cluster(p, 1, worker_bw=1e15, server_bw=1e15, straggler_prob=prob, straggler_slowdown=slowdown)
    workload = Workload(1e3, 0.01)
    runs = [simulate(cluster, workload, ParameterServer(staleness=s), steps=40, seed=seed) for s in (0, 1, 2, 4, 8)]
    runs.append(simulate(cluster, workload, "ps:mode=async", steps=40, seed=seed))
    for tighter, looser in zip(runs, runs[1:]):
        assert (looser.step_end <= tighter.step_end + 1e-9).all()
        assert looser.makespan <= tighter.makespan + 1e-9


def test_async_one_worker_is_sequential():
    res = simulate(ps_cluster(1, 1), Workload(1e6, 0.01), "ps:mode=async", steps=20)
    assert res.versions == 20
    assert (res.updates["staleness"] == 0).all()
    assert list(res.updates["version_applied"]) == list(range(20))


def test_async_identical_workers_have_fixed_delay():
    # tau + 1 identical workers push in lock-step; each update lands behind the other tau.
    tau = 3
    res = simulate(ps_cluster(tau + 1, 1), Workload(1e6, 0.01), "ps:mode=async", steps=30)
    later = res.updates[res.updates["step"] >= 1]
    assert (later["staleness"] == tau).all()


def test_ps_without_servers_is_a_clear_error():
    with pytest.raises(ValueError, match="servers >= 1"):
        simulate(Cluster.homogeneous(4, Link("1GB/s")), Workload(1e6, 0.01), "ps")


# Basis: a server NIC behind a token bucket of b bytes (tc-tbf), idle long enough to refill, passes
# the first b bytes of a lone push at once: alpha + max(0, n - b)/B.
@given(st.floats(1e4, 1e8), st.floats(1e7, 1e10), st.floats(0, 1e-4), st.floats(0, 1e7))
def test_push_through_a_server_link_with_a_burst(n, bandwidth, alpha, burst):
    cluster = Cluster.homogeneous(1, Link(1e15), servers=1, server_link=Link(bandwidth, alpha, burst=burst))
    res = simulate(cluster, Workload(n, 0.01), ParameterServer(mode="sync"), steps=1)
    push = res.trace[res.trace["kind"] == "push"].iloc[0]
    assert push["end"] - push["start"] == pytest.approx(alpha + max(0.0, n - burst) / bandwidth, rel=1e-9)


# Basis: weighted processor sharing (syncsim.network). p pushes start together at one server NIC of
# rate B (the workers' own NICs far faster); the last to start has weight w, the others 1. With w > 1
# it ends first, at n(p-1+w)/(wB), and the others at pn/B; with w < 1 the others end first, at
# n(p-1+w)/B, and it at pn/B. Either way the link's work is conserved: the last push ends at pn/B.
@given(st.integers(2, 16), st.sampled_from([0.25, 0.5, 2.0, 5.0]), st.floats(1e4, 1e8), st.floats(1e7, 1e10))
def test_simultaneous_pushes_share_a_server_nic_by_its_newcomer_weight(p, w, n, bandwidth):
    server = Link(bandwidth, 0.0, newcomer_weight=w)
    cluster = Cluster.homogeneous(p, Link(1e15), servers=1, server_link=server)
    res = simulate(cluster, Workload(n, 0.01), ParameterServer(mode="sync"), steps=1)
    durations = np.sort((lambda r: (r["end"] - r["start"]).to_numpy())(res.trace[res.trace["kind"] == "push"]))
    whole = p * n / bandwidth
    if w > 1:
        expected = [n * (p - 1 + w) / (w * bandwidth)] + [whole] * (p - 1)
    else:
        expected = [n * (p - 1 + w) / bandwidth] * (p - 1) + [whole]
    np.testing.assert_allclose(durations, expected, rtol=1e-9)


def test_a_sharing_spread_draws_from_the_runs_seed():
    # The weights are drawn from the run's seed: the same seed gives the same run, another seed
    # another split of the server NIC (no compute jitter here, so only the link's draws differ).
    server = Link(1e8, 0.0, sharing_spread=0.5)
    cluster = Cluster.homogeneous(4, Link(1e15), servers=1, server_link=server)

    def pushes(seed):
        trace = simulate(cluster, Workload(1e6, 0.01), ParameterServer(mode="sync"), steps=5, seed=seed).trace
        return trace[trace["kind"] == "push"]["end"].to_numpy()

    np.testing.assert_array_equal(pushes(1), pushes(1))
    assert not np.allclose(pushes(1), pushes(2))
    with pytest.raises(ValueError, match="Link.sharing_spread"):
        Link(1e8, sharing_spread=-0.1)


# Basis: the server's own time per request (Cluster.server_service, s) is charged once to each push, before
# the server applies it, and once to each pull's answer (syncsim.engine). A synchronous round is the pushes,
# the round closing on the last arrival, then the pulls: every arrival and every pull's end moves by s and
# nothing else changes (without jitter the workers are identical), so each step grows by exactly 2s, with
# any number of workers and servers sharing the links.
@given(st.integers(1, 8), st.integers(1, 3), st.floats(1e4, 1e7), st.floats(1e6, 1e9), st.floats(0, 1e-4),
       st.floats(1e-6, 1e-2))
def test_the_server_s_time_per_request_adds_one_to_each_push_and_each_pull(p, k, n, bandwidth, alpha, service):
    workload = Workload(n, 0.01)
    plain = simulate(ps_cluster(p, k, bandwidth, bandwidth, alpha), workload, "ps", steps=6)
    served = simulate(ps_cluster(p, k, bandwidth, bandwidth, alpha, server_service=service), workload, "ps", steps=6)
    assert served.step_time == pytest.approx(plain.step_time + 2 * service, rel=1e-9, abs=1e-12)
    # and the update order is the same: the service delays every arrival alike
    order = ["worker", "step", "version_read", "version_applied", "staleness"]
    pd.testing.assert_frame_equal(served.updates[order], plain.updates[order])


def test_the_server_s_time_per_request_is_a_time_and_not_negative():
    assert Cluster.homogeneous(1, Link(1e9), servers=1, server_service="250us").server_service == pytest.approx(250e-6)
    with pytest.raises(ValueError, match="server_service"):
        Cluster.homogeneous(1, Link(1e9), servers=1, server_service=-1e-3)


# Basis: Link.crossing_stretch's definition. A push of n bytes started d after the server began a
# reply of n bytes on an idle link of rate B overlaps the reply for n/B - d (d < n/B), or not at all;
# its bytes are through at d + n/B and it is held (s - 1) times that overlap more. A sample of one
# factor s gives s every time; with no sample the two directions are independent. One flow each way,
# so a newcomer weight (the weighted link's path) changes nothing.
@given(st.floats(1e4, 1e8), st.floats(1e6, 1e10), st.floats(1.0, 3.0), st.floats(0.0, 1.5), st.integers(1, 4),
       st.sampled_from([1.0, 2.0]))
def test_a_push_crossing_a_reply_is_held_by_its_stretch_times_the_overlap(n, bandwidth, stretch, lag, k, weight):
    import simpy

    from syncsim.recorder import Recorder
    from syncsim.server import ServerGroup

    d = lag * n / bandwidth
    ends = {}
    for sample in ((), (stretch,)):
        server = Link(bandwidth, newcomer_weight=weight, crossing_stretch=sample)
        cluster = Cluster.homogeneous(2, Link(1e15), servers=k, server_link=server)
        env = simpy.Environment()
        group = ServerGroup(env, cluster, Recorder(), state=None)

        def pusher(env, group, sample):
            yield env.timeout(d)
            yield group.push(n)
            ends[sample] = env.now

        env.process(pusher(env, group, sample))
        group.pull(n)
        env.run()
    lone = n / k / bandwidth  # each of the k servers carries a shard
    overlap = max(0.0, lone - d)
    assert ends[()] == pytest.approx(d + lone, rel=1e-9)
    assert ends[(stretch,)] == pytest.approx(d + lone + (stretch - 1) * overlap, rel=1e-9, abs=1e-15)


def test_a_crossing_stretch_is_a_sample_of_factors_of_at_least_one():
    assert Link(1e9, crossing_stretch=[1.0, 1.5]).crossing_stretch == (1.0, 1.5)  # a TOML list is kept as a tuple
    with pytest.raises(ValueError, match=r"Link.crossing_stretch must be in \[1, inf\], got 0.9"):
        Link(1e9, crossing_stretch=(1.2, 0.9))
    with pytest.raises(ValueError, match="Link.crossing_stretch must be a sequence of factors"):
        Link(1e9, crossing_stretch=1.5)


# Basis: Link.crossing_stretch's definition. Pushes take the sample's factors in its order, from a start
# the seed draws, wrapping round: three pushes, each crossing a whole reply of its own size (overlap
# n/B), are held (s_i - 1)·n/B for s_i consecutive in the sample, whatever the seed.
@given(st.lists(st.floats(1.0, 3.0), min_size=1, max_size=5), st.integers(0, 10**6))
def test_pushes_take_the_crossing_stretches_in_their_measured_order(sample, seed):
    import simpy

    from syncsim.recorder import Recorder
    from syncsim.server import ServerGroup

    n, bandwidth = 1e6, 1e8
    cluster = Cluster.homogeneous(2, Link(1e15), servers=1, server_link=Link(bandwidth, crossing_stretch=sample))
    env = simpy.Environment()
    group = ServerGroup(env, cluster, Recorder(), state=None, seed=seed)
    holds = []

    def crossing(env, group):
        for _ in range(3):
            start = env.now
            group.pull(n)
            yield group.push(n)
            holds.append((env.now - start) * bandwidth / n - 1)
            yield env.timeout(1.0)  # both links idle again

    env.process(crossing(env, group))
    env.run()
    rotations = [[sample[(first + i) % len(sample)] - 1 for i in range(3)] for first in range(len(sample))]
    assert any(np.allclose(holds, rotation, rtol=1e-9, atol=1e-12) for rotation in rotations), (holds, sample)


def _reply_after_pushes(n, bandwidth, starts, reply=None, replies=1, push=None, reply_at=0.0, **link):
    """How long the last of ``replies`` replies of ``reply`` bytes (n by default), started at ``reply_at`` on
    one server of link rate ``bandwidth`` (a Link with ``link``'s fields), takes while pushes of ``push``
    bytes (n by default) start at ``starts``, each sent at that rate by its worker."""
    import simpy

    from syncsim.recorder import Recorder
    from syncsim.server import ServerGroup

    link = Link(bandwidth, **link)
    cluster = Cluster.homogeneous(max(1, len(starts), replies), link, servers=1, server_link=link)
    env = simpy.Environment()
    group = ServerGroup(env, cluster, Recorder(), state=None)
    ended = []

    def pushing(at):
        yield env.timeout(at)
        yield group.push(n if push is None else push)

    def answer():
        yield env.timeout(reply_at)
        yield group.pull(n if reply is None else reply)
        ended.append(env.now - reply_at)

    for at in starts:
        env.process(pushing(at))
    for _ in range(replies):
        env.process(answer())
    env.run()
    return max(ended)


# Basis: the acknowledgement clock (Jacobson 1988): a sender with W bytes unacknowledged sends at most W per
# round trip. p >= 2 pushes sent at B each into the server's link of rate B queue B·(1 - 1/p) a second each
# until each holds its window W (by t_fill = W/(B·(1 - 1/p))); a reply started after that has its
# acknowledgements wait p·W/B behind them, so it sends W/(p·W/B) = B/p, one push's share, and takes p·n/B.
# The pushes are long enough to keep their windows queued throughout, so nothing moves and the cap is exact.
@given(st.integers(2, 6), st.floats(1e4, 1e8), st.floats(1e6, 1e10), st.floats(0.01, 1.0))
def test_a_reply_behind_pushes_whose_windows_fill_the_queue_gets_one_push_s_share(p, n, bandwidth, fraction):
    window = fraction * n
    start = 2 * window / (bandwidth * (1 - 1 / p))
    push = 2 * (n + window) + bandwidth * start
    ended = _reply_after_pushes(n, bandwidth, [0.0] * p, push=push, reply_at=start, window=window)
    assert ended == pytest.approx(p * n / bandwidth, rel=1e-9)


# Basis: as above, two replies each send at most B/p (each its own window per round trip) and share the
# outgoing link's B equally: each gets min(B/2, B/p), so the pair takes n·max(2, p)/B. Two replies lose less
# than one to the same pushes (on the testbed, three pushes stretched one 1.72 MB reply 2.75 times and two
# together 1.42; docs/log.md, "2026-12-07, late").
@given(st.integers(2, 6), st.floats(1e4, 1e8), st.floats(1e6, 1e10), st.floats(0.01, 1.0))
def test_two_replies_behind_the_same_pushes_each_get_a_push_s_share(p, n, bandwidth, fraction):
    window = fraction * n
    start = 2 * window / (bandwidth * (1 - 1 / p))
    push = 2 * (2 * n + window) + bandwidth * start
    ended = _reply_after_pushes(n, bandwidth, [0.0] * p, push=push, replies=2, reply_at=start, window=window)
    assert ended == pytest.approx(max(2, p) * n / bandwidth, rel=1e-9)


# Basis: the same clock while the queue fills. Two pushes start with the reply at 0 (no buckets): each queues
# B/2 a second, so the acknowledgements wait Q/B = t; the reply sends at B while W/t >= B (t <= W/B), then
# W/t until each push holds its window (t = 2W/B), then B/2. By T it has sent W + W·ln 2 + (B/2)(T - 2W/B),
# so it ends at T = 2(n - W·ln 2)/B (for n >= W(1 + ln 2)). The simulator holds the cap for steps in which
# the queue grows linearly, at the cap's mean over each (syncsim.network), so the bytes it lets through are
# exact: the closed form to rounding (a cap read at each step's start instead is 1 % fast).
@given(st.floats(1e4, 1e8), st.floats(1e6, 1e10), st.floats(0.01, 1 / (1 + math.log(2))))
def test_a_reply_slows_as_the_queue_of_pushes_started_with_it_fills(n, bandwidth, fraction):
    window = fraction * n
    ended = _reply_after_pushes(n, bandwidth, [0.0, 0.0], push=4 * n, window=window)
    assert ended == pytest.approx(2 * (n - window * math.log(2)) / bandwidth, rel=1e-6)


# Basis: one push sent at B into a link of rate B queues nothing (its sender is no faster than the link), so
# a reply beside it sends at B, whatever the window; and the latency outside the queue is not in the cap.
@given(st.floats(1e4, 1e8), st.floats(1e6, 1e10), st.floats(0.01, 1.0), st.floats(0.0, 1e-2))
def test_one_push_slows_no_reply(n, bandwidth, fraction, latency):
    ended = _reply_after_pushes(n, bandwidth, [0.0], window=fraction * n, latency=latency)
    assert ended == pytest.approx(n / bandwidth, rel=1e-9)


def test_a_window_is_a_size_in_bytes_not_negative():
    assert Link(1e9, window="256KiB").window == 256 * 1024
    assert Link(1e9).window == 0.0
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="Link.window"):
            Link(1e9, window=bad)
