"""The jitter given to the simulator where workers meet (syncsim.compute.jitter_for_slowest).

A collective waits for the slowest worker, so what the compute probe reports for workers that meet is how
far the slowest rank's work between meetings lay above the mean (real.calibration.compute_fit.meeting_excess),
and the simulator is given the lognormal jitter whose slowest-of-W draw lies that far above: inverting
slowest_excess. Facts used: the expected maximum of W i.i.d. draws grows with their spread (a scale family's
maximum scales with it), so the inverse is unique; the expected maximum of two i.i.d. normals exceeds their mean by
σ/√π (E|Z1 - Z2| / 2), which for a small coefficient of variation the lognormal approaches.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from real.calibration.compute_fit import meeting_excess
from syncsim.compute import ComputeTimes, jitter_for_slowest, slowest_excess


@settings(max_examples=25, deadline=None)
@given(jitter=st.floats(0.02, 1.5), workers=st.integers(2, 6), steps=st.integers(1, 4))
def test_the_jitter_found_gives_back_the_excess_it_was_found_for(jitter, workers, steps):
    excess = slowest_excess(jitter, workers, steps)
    assert excess > 0
    assert jitter_for_slowest(excess, workers, steps) == pytest.approx(jitter, rel=1e-6)


@settings(max_examples=20, deadline=None)
@given(low=st.floats(0.01, 1.0), more=st.floats(0.05, 1.0), workers=st.integers(2, 6), steps=st.integers(1, 4))
def test_a_wider_spread_makes_the_slowest_later_and_more_steps_between_meetings_average_it_out(low, more, workers,
                                                                                                steps):
    assert slowest_excess(low + more, workers, steps) > slowest_excess(low, workers, steps)
    assert slowest_excess(low, workers, steps + 1) < slowest_excess(low, workers, steps)
    assert slowest_excess(low, workers + 1, steps) > slowest_excess(low, workers, steps)


def test_two_workers_of_small_spread_are_late_by_sigma_over_root_pi():
    # E[max(X1, X2)] = mean + sigma / sqrt(pi) for two i.i.d. normals; a lognormal of CV 0.05 is nearly one
    assert slowest_excess(0.05, 2) == pytest.approx(0.05 / math.sqrt(math.pi), rel=0.03)


def test_no_excess_or_one_worker_is_no_jitter_and_an_excess_beyond_reach_is_the_bound():
    assert jitter_for_slowest(0.0, 4) == 0.0 and jitter_for_slowest(-0.1, 4) == 0.0
    assert jitter_for_slowest(0.3, 1) == 0.0 and slowest_excess(0.5, 1) == 0.0
    assert jitter_for_slowest(1e6, 4, high=2.0) == 2.0


def test_the_simulator_s_own_draws_have_the_slowest_excess_the_jitter_was_chosen_for():
    # ComputeTimes, the simulator's draws, given the jitter found for an excess: the slowest of its workers
    # at each step lies that far above the mean (over 64 x 400 steps)
    from syncsim import Cluster, Link, Workload

    excess, workers = 0.25, 4
    jitter = jitter_for_slowest(excess, workers)
    cluster = Cluster.homogeneous(gpus=workers, link=Link(bandwidth=1e9, latency=0.0), jitter=jitter)
    times = ComputeTimes(cluster, Workload(param_bytes=4e6, compute_time=1.0), seed=3)
    drawn = np.vstack([times.block(b) for b in range(400)])
    assert drawn.max(axis=1).mean() / drawn.mean() - 1 == pytest.approx(excess, rel=0.03)


def test_meeting_excess_is_the_slowest_rank_s_work_between_meetings_over_the_mean():
    # two meetings: slowest 3 and 5 against means 2 and 4, so (3 + 5) / (2 + 4) - 1
    assert meeting_excess([[1.0, 3.0], [3.0, 5.0]]) == pytest.approx(8 / 6 - 1)
    # ranks that timed different numbers of whole windows are compared over the meetings all timed
    assert meeting_excess([[1.0, 3.0, 9.0], [3.0, 5.0]]) == pytest.approx(8 / 6 - 1)
    # equal work: no excess; one rank, or a rank that never met: nothing to say
    assert meeting_excess([[2.0, 2.0], [2.0, 2.0]]) == 0.0
    assert meeting_excess([[1.0, 2.0]]) is None and meeting_excess([[1.0], []]) is None
