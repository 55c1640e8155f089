"""Processor-sharing links: the virtual-time link against a brute-force reference."""

import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st
from pytest import approx

from syncsim.network import SharedLink


def run_link(flows, bandwidth, cap=float("inf"), burst=0.0):
    """Finish time of each (start, bytes) flow on a SharedLink."""
    env = simpy.Environment()
    link = SharedLink(env, bandwidth, cap=cap, burst=burst)
    finish = [None] * len(flows)

    def sender(i, start, nbytes):
        yield env.timeout(start)
        yield link.transfer(nbytes)
        finish[i] = env.now

    for i, (start, nbytes) in enumerate(flows):
        env.process(sender(i, start, nbytes))
    env.run()
    return finish


def reference(flows, bandwidth, cap=float("inf"), burst=0.0):
    """Brute force: advance to the next arrival or completion, recomputing every rate (O(n) per event).

    A token bucket of ``burst`` bytes (tc-tbf) fills at the link's rate while no flow is active, and
    a flow arriving then passes as many of its bytes as it holds at once."""
    remaining = {}
    finish = [None] * len(flows)
    pending = sorted(range(len(flows)), key=lambda i: flows[i][0])
    now = 0.0
    tokens, idle_since = burst, 0.0
    while pending or remaining:
        rate = min(cap, bandwidth / len(remaining)) if remaining else 0.0
        next_arrival = flows[pending[0]][0] if pending else float("inf")
        next_done = now + min(remaining.values()) / rate if remaining else float("inf")
        t = min(next_arrival, next_done)
        for i in remaining:
            remaining[i] -= (t - now) * rate
        now = t
        for i in [i for i, r in remaining.items() if r <= 1e-9 * flows[i][1]]:
            finish[i] = now
            del remaining[i]
            if not remaining:
                idle_since = now
        while pending and flows[pending[0]][0] <= now:
            i = pending.pop(0)
            size = flows[i][1]
            if not remaining:
                tokens = min(burst, tokens + (now - idle_since) * bandwidth)
                granted = min(tokens, size)
                tokens, size, idle_since = tokens - granted, size - granted, now
            if size > 0:
                remaining[i] = size
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
    # Basis: equal sharing gives each of two flows B/2.
    assert run_link([(0.0, 1e6), (0.0, 1e6)], 1e6) == [approx(2.0), approx(2.0)]
    assert run_link([(0.0, 1e6)], 1e6) == [approx(1.0)]


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


def test_a_burst_passes_at_once_after_an_idle_spell():
    # Basis: a token bucket (tc-tbf) of b bytes, full at the start, refilled at the rate while idle.
    # 1 MB with a 0.25 MB bucket at 1 MB/s: 0.75 s. The second flow comes 0.1 s after the first ended,
    # when the bucket holds 0.1 MB: 1 MB - 0.1 MB at 1 MB/s ends 0.9 s later.
    assert run_link([(0.0, 1e6), (0.85, 1e6)], 1e6, burst=2.5e5) == [approx(0.75), approx(1.75)]
    # a flow that fits in the bucket passes at once; the link stays idle
    assert run_link([(0.0, 1e5)], 1e6, burst=2.5e5) == [approx(0.0)]


@given(st.lists(st.tuples(st.floats(0, 5), st.floats(1e3, 1e7)), min_size=1, max_size=25),
       st.floats(1e5, 1e8), st.floats(0, 1e6))
def test_token_bucket_matches_brute_force(flows, bandwidth, burst):
    flows = sorted(flows)  # same-time arrivals take the bucket in the same order on both sides
    got = run_link(flows, bandwidth, burst=burst)
    want = reference(flows, bandwidth, burst=burst)
    assert got == [approx(w, rel=1e-9, abs=1e-9) for w in want]
