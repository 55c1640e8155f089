"""Processor-sharing links: the virtual-time link against a brute-force reference."""

import math

import numpy as np
import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st
from pytest import approx

from syncsim.network import SharedLink


class Draws:
    """A stand-in for numpy's Generator that hands out given standard normals, in order."""

    def __init__(self, values):
        self.values = list(values)

    def standard_normal(self):
        return self.values.pop(0)


def run_link(flows, bandwidth, cap=float("inf"), burst=0.0, newcomer_weight=1.0, spread=0.0, draws=(), refill=None,
             window=0.0):
    """Finish time of each (start, bytes) flow on a SharedLink."""
    env = simpy.Environment()
    link = SharedLink(env, bandwidth, cap=cap, burst=burst, refill=refill, newcomer_weight=newcomer_weight,
                      sharing_spread=spread, rng=Draws(draws), window=window)
    finish = [None] * len(flows)

    def sender(i, start, nbytes):
        yield env.timeout(start)
        yield link.transfer(nbytes)
        finish[i] = env.now

    for i, (start, nbytes) in enumerate(flows):
        env.process(sender(i, start, nbytes))
    env.run()
    return finish


def water_fill(weights, bandwidth, cap):
    """Max-min fair rates of flows with these weights, each at most ``cap``: fill every flow in
    proportion to its weight; a flow that reaches the cap keeps it, and the rest share what is left."""
    rates, free, left = {}, dict(weights), bandwidth
    while free:
        unit = left / sum(free.values())
        capped = [i for i, w in free.items() if w * unit > cap]
        if not capped:
            rates.update({i: w * unit for i, w in free.items()})
            break
        for i in capped:
            rates[i] = cap
            left -= cap
            del free[i]
    return rates


def reference(flows, bandwidth, cap=float("inf"), burst=0.0, newcomer_weight=1.0, spread=0.0, draws=(), refill=None):
    """Brute force: advance to the next arrival or completion, recomputing every rate (O(n) per event).

    A token bucket of ``burst`` bytes (tc-tbf) fills at ``refill`` (default: the link's rate) while no
    flow is active, and
    a flow arriving then passes as many of its bytes as it holds at once. Every flow that enters the
    link weighs exp(spread / sqrt(2) * z), z the next of ``draws``, and the flow that arrived last, while
    it is active, ``newcomer_weight`` times that."""
    draws = list(draws)
    own = {}
    remaining = {}
    finish = [None] * len(flows)
    pending = sorted(range(len(flows)), key=lambda i: flows[i][0])
    now = 0.0
    tokens, idle_since = burst, 0.0
    refill = bandwidth if refill is None else refill
    newest = None
    while pending or remaining:
        rates = water_fill({i: own[i] * (newcomer_weight if i == newest else 1.0) for i in remaining}, bandwidth, cap)
        next_arrival = flows[pending[0]][0] if pending else float("inf")
        next_done = now + min(r / rates[i] for i, r in remaining.items()) if remaining else float("inf")
        t = min(next_arrival, next_done)
        for i in remaining:
            remaining[i] -= (t - now) * rates[i]
        now = t
        for i in [i for i, r in remaining.items() if r <= 1e-9 * flows[i][1]]:
            finish[i] = now
            del remaining[i]
            if i == newest:
                newest = None
            if not remaining:
                idle_since = now
        while pending and flows[pending[0]][0] <= now:
            i = pending.pop(0)
            size = flows[i][1]
            if not remaining:
                tokens = min(burst, tokens + (now - idle_since) * refill)
                granted = min(tokens, size)
                tokens, size, idle_since = tokens - granted, size - granted, now
            if size > 0:
                remaining[i] = size
                newest = i
                own[i] = math.exp(spread / math.sqrt(2) * draws.pop(0)) if spread else 1.0
            else:
                finish[i] = now
    return finish


def test_a_link_counts_its_flows_and_bytes_and_needs_bandwidth():
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=f"bandwidth must be > 0, got {bad}"):
            SharedLink(simpy.Environment(), bad)
    env = simpy.Environment()
    link = SharedLink(env, 1e6)
    assert link.active == 0 and link.peak_flows == 0 and link.bytes_served == 0
    flows = [link.transfer(n) for n in (1e6, 2e6, 1.0, 0.0, -5.0)]
    # a transfer of no bytes completes at once and never joins the link; a single byte does join it
    assert [f.triggered for f in flows] == [False, False, False, True, True]
    assert link.active == 3 and link.peak_flows == 3 and link.bytes_served == 3e6 + 1
    env.run()
    assert link.active == 0 and link.peak_flows == 3 and env.now == approx(3.000001)
    link.transfer(1e6)
    assert link.peak_flows == 3  # the most flows ever at once, not the latest count
    SharedLink(env, 0.5)         # any positive bandwidth is a bandwidth


def test_flows_half_a_byte_apart_finish_half_a_byte_apart():
    # Basis: processor sharing at 1 B/s: both flows get 0.5 B/s until the first has its 1,000 bytes
    # (t = 2,000 s), then the other's last half byte goes alone at 1 B/s. "Finished" tolerates float
    # rounding of the finish tag, never a fraction of a byte.
    assert run_link([(0.0, 1000.0), (0.0, 1000.5)], 1.0) == [approx(2000.0, abs=1e-9), approx(2000.5, abs=1e-9)]


def test_two_equal_flows_take_twice_as_long():
    # Basis: equal sharing gives each of two flows B/2 — also on a link built with every default.
    assert run_link([(0.0, 1e6), (0.0, 1e6)], 1e6) == [approx(2.0), approx(2.0)]
    assert run_link([(0.0, 1e6)], 1e6) == [approx(1.0)]
    env = simpy.Environment()
    link = SharedLink(env, 1e6)
    first, second = link.transfer(1e6), link.transfer(1e6)
    env.run()
    assert first.ok and second.ok and env.now == approx(2.0, rel=1e-12)
    assert link.newcomer_weight == 1.0 and link.sharing_spread == 0.0


def test_late_arrival_shares_the_rest():
    # A: 1 MB at t=0 alone for 0.5 s (0.5 MB left), then shares with B: both at 0.5 MB/s.
    # A finishes at 1.5 s; B has 0.5 MB left and finishes alone at 2.0 s.
    assert run_link([(0.0, 1e6), (0.5, 1e6)], 1e6) == [approx(1.5), approx(2.0)]


def test_cap_limits_a_lone_flow():
    assert run_link([(0.0, 1e6)], 1e9, cap=1e6) == [approx(1.0)]
    # Ten capped flows on a link that could carry them all at the cap: no slowdown.
    assert run_link([(0.0, 1e6)] * 10, 1e9, cap=1e6) == [approx(1.0)] * 10


# Basis: two implementations of processor sharing (virtual time, O(log n); brute force, O(n))
# must agree on every random arrival pattern.
@given(st.lists(st.tuples(st.floats(0, 5), st.floats(1e3, 1e7)), min_size=1, max_size=25),
       st.floats(1e5, 1e8), st.one_of(st.just(float("inf")), st.floats(1e5, 1e8)))
def test_virtual_time_matches_brute_force(flows, bandwidth, cap):
    got = run_link(flows, bandwidth, cap)
    want = reference(flows, bandwidth, cap)
    assert got == [approx(w, rel=1e-9, abs=1e-12) for w in want]


# Basis: a link's own window is bookkeeping of its queue (syncsim.network): it caps only the flows of a link
# whose acknowledgements wait in that queue (acks_via), so it takes the per-flow path, which must finish
# every flow when processor sharing does.
@given(st.lists(st.tuples(st.floats(0, 5), st.floats(1e3, 1e7)), min_size=1, max_size=12),
       st.floats(1e5, 1e8), st.one_of(st.just(float("inf")), st.floats(1e5, 1e8)), st.floats(1e3, 1e7))
def test_a_window_of_its_own_changes_no_flow_s_finish(flows, bandwidth, cap, window):
    got = run_link(flows, bandwidth, cap, window=window)
    want = reference(flows, bandwidth, cap)
    assert got == [approx(w, rel=1e-9, abs=1e-12) for w in want]


def test_a_cap_by_acknowledgements_needs_a_window():
    env = simpy.Environment()
    incoming = SharedLink(env, 1e9, window=1e5)
    with pytest.raises(ValueError, match="acks_via .* needs a window > 0"):
        SharedLink(env, 1e9, acks_via=incoming)
    with pytest.raises(ValueError, match="window must be a finite number of bytes >= 0"):
        SharedLink(env, 1e9, window=-1.0)


def test_a_burst_passes_at_once_after_an_idle_spell():
    # Basis: a token bucket (tc-tbf) of b bytes, full at the start, refilled at the rate while idle.
    # 1 MB with a 0.25 MB bucket at 1 MB/s: 0.75 s. The second flow comes 0.1 s after the first ended,
    # when the bucket holds 0.1 MB: 1 MB - 0.1 MB at 1 MB/s ends 0.9 s later.
    assert run_link([(0.0, 1e6), (0.85, 1e6)], 1e6, burst=2.5e5) == [approx(0.75), approx(1.75)]
    # a flow that fits in the bucket passes at once; the link stays idle
    assert run_link([(0.0, 1e5)], 1e6, burst=2.5e5) == [approx(0.0)]
    # a shaper refilling at 2 MB/s (its own rate; the flows reach 1 MB/s through it) holds 0.2 MB 0.1 s
    # after the first flow: the second's 0.8 MB left end 0.8 s later
    assert run_link([(0.0, 1e6), (0.85, 1e6)], 1e6, burst=2.5e5, refill=2e6) == [approx(0.75), approx(1.65)]


# The bucket refills at the link's rate (refill None, the default) or at a shaper's faster own rate.
@given(st.lists(st.tuples(st.floats(0, 5), st.floats(1e3, 1e7)), min_size=1, max_size=25),
       st.floats(1e5, 1e8), st.floats(0, 1e6), st.one_of(st.none(), st.floats(1, 10)))
def test_token_bucket_matches_brute_force(flows, bandwidth, burst, faster):
    flows = sorted(flows)  # same-time arrivals take the bucket in the same order on both sides
    refill = None if faster is None else faster * bandwidth
    got = run_link(flows, bandwidth, burst=burst, refill=refill)
    want = reference(flows, bandwidth, burst=burst, refill=refill)
    assert got == [approx(w, rel=1e-9, abs=1e-9) for w in want]


def test_a_newcomer_of_weight_three_takes_three_quarters():
    # Basis: weighted processor sharing (GPS) with weights 3 (the newest flow) and 1 at 1 MB/s.
    # A starts alone; at 0.5 s (0.5 MB left) B starts and takes 0.75 MB/s, A 0.25 MB/s. B's 1 MB
    # ends at 0.5 + 1/0.75 = 1.8333 s, when A has 0.5 - 1.3333 x 0.25 = 0.1667 MB left: alone, 2.0 s.
    # The link stays work-conserving: the last byte leaves at 2 MB / 1 MB/s = 2.0 s whatever w is.
    assert run_link([(0.0, 1e6), (0.5, 1e6)], 1e6, newcomer_weight=3.0) == [approx(2.0), approx(0.5 + 1 / 0.75)]
    # A newcomer that weighs less than the rest (w = 1/3): B gets 0.25 MB/s; A's 0.5 MB ends at 0.5 + 0.5/0.75.
    assert run_link([(0.0, 1e6), (0.5, 1e6)], 1e6, newcomer_weight=1 / 3) == [approx(0.5 + 0.5 / 0.75), approx(2.0)]
    # A newcomer that finishes first leaves the others equal (no flow inherits its weight): C, 3 x
    # the rate of A and B (0.6 MB/s of 1 MB/s), ends 0.2 MB at 1/3 s; A and B, 1/15 MB served, share.
    a_b = 1 / 3 + (1e6 - 1e6 / 15) / 5e5
    assert run_link([(0.0, 1e6), (0.0, 1e6), (0.0, 2e5)], 1e6, newcomer_weight=3.0) == [
        approx(a_b), approx(a_b), approx(1 / 3)]



def test_a_capped_flow_leaves_its_share_to_the_others():
    # Basis: max-min fairness with weights. 1 MB/s, cap 0.5 MB/s, newcomer weight 6 beside two flows:
    # its weighted share 0.75 MB/s is capped at 0.5; the other two share the remaining 0.5 (0.25 each).
    # C's 0.5 MB ends at 1 s; A and B, 0.75 MB left each, then go at the cap: 1 + 1.5 = 2.5 s.
    assert run_link([(0.0, 1e6), (0.0, 1e6), (0.0, 5e5)], 1e6, cap=5e5, newcomer_weight=6.0) == [
        approx(2.5), approx(2.5), approx(1.0)]
    # A light newcomer (w = 0.2) beside two flows capped at 0.4 MB/s gets the 0.2 MB/s they leave.
    # A and B (0.4 MB) end at 1 s; C has 0.2 MB left and then goes alone at the cap: 1.5 s.
    assert run_link([(0.0, 4e5), (0.0, 4e5), (0.0, 4e5)], 1e6, cap=4e5, newcomer_weight=0.2) == [
        approx(1.0), approx(1.0), approx(1.5)]
    # Three others beside a capped newcomer share what it leaves, 0.5 MB/s, a third each (not a whole
    # number of bytes per second): D (w = 6, capped at 0.5 MB/s) ends its 1 MB at 2 s, when A, B and C
    # have 1/3 MB each done; the 2 MB left go at 1 MB/s shared: 4 s.
    assert run_link([(0.0, 1e6)] * 4, 1e6, cap=5e5, newcomer_weight=6.0) == [
        approx(4.0, rel=1e-12)] * 3 + [approx(2.0, rel=1e-12)]


def test_a_newcomer_weight_must_be_positive_and_finite():
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="newcomer_weight must be a finite number > 0"):
            SharedLink(simpy.Environment(), 1e6, newcomer_weight=bad)


# Basis: weighted processor sharing with the newest flow weighing w0 must agree with progressive
# filling recomputed at every event (a reference written apart), caps and token bucket included.
@given(st.lists(st.tuples(st.floats(0, 5), st.floats(1e3, 1e7)), min_size=1, max_size=25),
       st.floats(1e5, 1e8), st.one_of(st.just(float("inf")), st.floats(1e5, 1e8)),
       st.floats(0.05, 20), st.sampled_from([0.0, 1e5]))
def test_a_weighted_newcomer_matches_brute_force(flows, bandwidth, cap, weight, burst):
    flows = sorted(flows)  # same-time arrivals become the newcomer in the same order on both sides
    got = run_link(flows, bandwidth, cap, burst=burst, newcomer_weight=weight)
    want = reference(flows, bandwidth, cap, burst=burst, newcomer_weight=weight)
    assert got == [approx(w, rel=1e-9, abs=1e-9) for w in want]


def test_a_sharing_spread_must_be_finite_non_negative_and_have_an_rng():
    for bad in (-0.1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="sharing_spread must be a finite number >= 0"):
            SharedLink(simpy.Environment(), 1e6, sharing_spread=bad, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="needs an rng"):
        SharedLink(simpy.Environment(), 1e6, sharing_spread=0.3)


# Basis: with a sharing spread, each flow that enters the link draws its own weight exp(spread/sqrt(2) * z)
# and keeps it; the newest active flow weighs newcomer_weight times its own; progressive filling
# recomputed at every event with the same draws must agree.
@given(st.lists(st.tuples(st.floats(0, 5), st.floats(1e3, 1e7)), min_size=1, max_size=25),
       st.floats(1e5, 1e8), st.one_of(st.just(float("inf")), st.floats(1e5, 1e8)),
       st.floats(0.2, 5), st.floats(0.05, 1.5), st.sampled_from([0.0, 1e5]), st.integers(0, 2**32 - 1))
def test_random_newcomer_weights_match_brute_force(flows, bandwidth, cap, weight, spread, burst, seed):
    flows = sorted(flows)
    draws = np.random.default_rng(seed).standard_normal(len(flows))
    got = run_link(flows, bandwidth, cap, burst=burst, newcomer_weight=weight, spread=spread, draws=draws)
    want = reference(flows, bandwidth, cap, burst=burst, newcomer_weight=weight, spread=spread, draws=draws)
    assert got == [approx(w, rel=1e-9, abs=1e-9) for w in want]


def test_collisions_split_as_lognormal_weights_about_the_newcomer_weight():
    # Basis: two flows of n bytes started together on a link of rate B, the newer weighing w times the
    # older (w = 1.5 exp(0.4/sqrt(2) (z1 - z2)): log-mean log(1.5), log-sd 0.4): if w > 1
    # it ends first, at n(1 + w)/(wB); else the older one ends first, at n(1 + w)/B. Inverting the first
    # end gives each collision's w; over 4,000 collisions drawn with log-mean log(1.5) and log-sd 0.4,
    # the sample mean and sd of log w lie within 5 standard errors of those (se = 0.4/sqrt(4000) for
    # the mean, about 0.4/sqrt(8000) for the sd).
    env, n, bandwidth = simpy.Environment(), 1e6, 1e7
    link = SharedLink(env, bandwidth, newcomer_weight=1.5, sharing_spread=0.4, rng=np.random.default_rng(3))
    logs = []

    def collision():
        older, newer = link.transfer(n), link.transfer(n)
        start = env.now
        first = yield older | newer
        t = env.now - start
        w = n / (bandwidth * t - n) if newer in first else bandwidth * t / n - 1
        logs.append(math.log(w))
        yield older & newer

    def collisions():
        for _ in range(4000):
            yield env.process(collision())

    env.process(collisions())
    env.run()
    assert abs(np.mean(logs) - math.log(1.5)) < 5 * 0.4 / math.sqrt(4000)
    assert abs(np.std(logs, ddof=1) - 0.4) < 5 * 0.4 / math.sqrt(8000)


def test_every_flow_draws_its_own_weight_so_four_collided_flows_end_apart():
    # Basis: weighted processor sharing with each flow's own weight (syncsim.network). Four flows of 1 MB
    # start together on 1 MB/s with weights exp(0.5/sqrt(2) z) for z = -1, 0, 1, 2 (w0 = 1): the heaviest
    # (z = 2) takes w/sum(w) of the link until it ends, at sum(w)/w seconds, and a lighter flow always
    # has more left than a heavier one, so they end lightest last, each at its own time. Were only the
    # newest flow's weight drawn, the other three would end together.
    z = [-1.0, 0.0, 1.0, 2.0]
    w = [math.exp(0.5 / math.sqrt(2) * v) for v in z]
    got = run_link([(0.0, 1e6)] * 4, 1e6, spread=0.5, draws=z)
    assert got[3] == approx(sum(w) / w[3])
    assert got == sorted(got, reverse=True) and len({round(g, 9) for g in got}) == 4
    assert got[0] == approx(4.0)  # the link's work is conserved: the last byte leaves at 4 MB / 1 MB/s


def test_a_sender_burst_must_be_finite_non_negative():
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="sender_burst must be a finite number of bytes >= 0"):
            SharedLink(simpy.Environment(), 1e6, sender_burst=bad)


# Basis: FIFO arithmetic of two shapers in series. Two senders, each behind its own shaper of rate B
# and bucket b, send n bytes into one FIFO shaper of rate B and bucket b (both full), starting 0 and
# d apart (B*d <= n - b). The first's bucketful passes both shapers at once, then its bytes arrive at
# B and leave at once; the second's bucketful arrives at d, ahead of the first's later bytes. The
# first's last byte arrives at (n - b)/B behind 2n - B*d bytes in all and leaves once the shaper has
# served them, at (2n - B*d - b)/B; the second's, the last of 2n bytes, at (2n - b)/B: the pair leaves
# as far apart as it came. Without the senders' buckets the first would end b/B earlier.
@given(st.floats(1e4, 1e7), st.floats(1e5, 1e8), st.floats(0.0, 0.25), st.floats(0.0, 1.0))
def test_senders_buckets_keep_two_colliding_flows_as_far_apart_as_they_started(n, bandwidth, bucket, lag):
    b = bucket * n
    d = lag * (n - b) / bandwidth
    env = simpy.Environment()
    link = SharedLink(env, bandwidth, cap=bandwidth, burst=b, sender_burst=b)
    ends = [None, None]

    def sender(i, start):
        yield env.timeout(start)
        yield link.transfer(n)
        ends[i] = env.now

    env.process(sender(0, 0.0))
    env.process(sender(1, d))
    env.run()
    assert ends[0] == approx((2 * n - bandwidth * d - b) / bandwidth, rel=1e-9, abs=1e-12)
    assert ends[1] == approx((2 * n - b) / bandwidth, rel=1e-9, abs=1e-12)
    one_shaper = run_link([(0.0, n), (d, n)], bandwidth, cap=bandwidth, burst=b)
    assert one_shaper[0] == approx(ends[0] - b / bandwidth, rel=1e-9, abs=1e-12)
