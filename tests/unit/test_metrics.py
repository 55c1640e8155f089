"""One definition of the steady-state figures, and the simulator and real/ computing them identically."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from real.trace import _csv_text, merge, rank_dir
from syncsim import Cluster, Link, Workload, simulate
from syncsim.files import write_atomic
from syncsim.metrics import (
    SteadyState,
    pooled_steady_state,
    staleness_distance,
    steady_state,
    step_ends,
    step_time_spread,
    warmup_steps,
)
from syncsim.recorder import TRACE_COLUMNS, UPDATE_COLUMNS


def table(columns, rows):
    return pd.DataFrame(rows, columns=list(columns))


def test_definition_on_a_hand_made_trace():
    # worker 0 ends its steps at 1, 2, 3, ..., 10 s; worker 1 at 2, 4, ..., 20 s (a step's end is its
    # latest row: the pull after the compute). Warm-up: max(1, 10 // 10) = 1 step.
    rows = []
    for step in range(10):
        rows += [(0, step, "compute", step, step + 0.5, 0), (0, step, "pull", step + 0.5, step + 1.0, 8)]
        rows += [(1, step, "compute", 2 * step, 2 * step + 2.0, 0)]
    updates = table(UPDATE_COLUMNS, [(0, 0, 0, 3, 3, 1.0), (1, 5, 2, 3, 1, 12.0), (0, 9, 5, 9, 4, 10.0)])
    figures = steady_state(table(TRACE_COLUMNS, rows), updates, batch_size=8)
    assert figures.warmup == 1
    np.testing.assert_allclose(figures.worker_step_times, [(10 - 1) / 9, (20 - 2) / 9])
    assert figures.throughput == pytest.approx(8 / 1.0 + 8 / 2.0)
    assert figures.step_time == pytest.approx(2 / (1 / 1.0 + 1 / 2.0))  # harmonic: W·batch/throughput
    assert figures.speedup(8.0) == pytest.approx(1.5)
    # the update of step 0 is in the warm-up
    assert figures.staleness_mean == pytest.approx(2.5) and figures.staleness_max == 4


def test_pooled_runs_are_one_run_as_long_as_all_of_them():
    # Two runs of 10 steps each timing 9 after the warm-up: worker 0 at 1 s and 3 s a step is, over the
    # 18 steps of both, 2 s a step; a worker missing a figure in one run has none pooled.
    def state(times, stale):
        return SteadyState(steps=10, warmup=1, batch_size=8, worker_step_times=np.array(times),
                           staleness=np.array(stale))

    pooled = pooled_steady_state([state([1.0, 2.0, 4.0], [0, 1]), state([3.0, 2.0, np.nan], [2])])
    np.testing.assert_allclose(pooled.worker_step_times[:2], [2.0, 2.0])
    assert np.isnan(pooled.worker_step_times[2])
    assert pooled.step_time == pytest.approx(2.0) and pooled.throughput == pytest.approx(8 / 2.0 * 2)
    assert sorted(pooled.staleness.tolist()) == [0, 1, 2] and pooled.staleness_mean == pytest.approx(1.0)
    assert pooled_steady_state([state([1.0], [])]).step_time == 1.0  # one run pools to itself
    with pytest.raises(ValueError, match="no runs"):
        pooled_steady_state([])
    with pytest.raises(ValueError, match="differ"):
        pooled_steady_state([state([1.0], []), SteadyState(20, 2, 8, np.array([1.0]), np.array([]))])


def test_step_time_spread_is_the_variation_of_consecutive_windows_after_the_warm_up():
    # 11 steps (warm-up: step 0). Steps 1-5 take 1 s, steps 6-10 take 3 s: with two windows of five
    # steps the windows' step times are 1 and 3, mean 2, population standard deviation 1.
    ends, rows = 0.0, []
    for step in range(11):
        took = 7.0 if step == 0 else 1.0 if step <= 5 else 3.0  # the warm-up step's time is left out
        rows.append((0, step, "compute", ends, ends + took, 0))
        ends += took
    trace = table(TRACE_COLUMNS, rows)
    assert step_time_spread(trace, windows=2) == pytest.approx(0.5)
    # the same for two workers in step: the harmonic mean of equal times is that time
    both = table(TRACE_COLUMNS, rows + [(1, *r[1:]) for r in rows])
    assert step_time_spread(both, windows=2) == pytest.approx(0.5)
    # a steady run does not wander; a hole in a worker's trace or too few steps give no figure
    steady = table(TRACE_COLUMNS, [(0, s, "compute", s, s + 1.0, 0) for s in range(11)])
    assert step_time_spread(steady) == pytest.approx(0.0, abs=1e-12)
    assert np.isnan(step_time_spread(steady, windows=4, steps=12))
    assert np.isnan(step_time_spread(table(TRACE_COLUMNS, rows[:3]), windows=4))
    with pytest.raises(ValueError, match="windows must be at least 2, got 1"):
        step_time_spread(steady, windows=1)


def test_warmup_and_partial_runs():
    assert [warmup_steps(s) for s in (1, 2, 9, 10, 25, 100)] == [0, 1, 1, 1, 2, 10]
    one = table(TRACE_COLUMNS, [(0, 0, "compute", 0.0, 0.25, 0)])
    assert steady_state(one, table(UPDATE_COLUMNS, []), 4).step_time == 0.25  # one step: measured from t = 0
    # worker 1 failed after its warm-up step: no figure for it, worker 0's stands
    rows = [(0, s, "compute", s, s + 1.0, 0) for s in range(4)] + [(1, 0, "compute", 0.0, 1.0, 0)]
    figures = steady_state(table(TRACE_COLUMNS, rows), table(UPDATE_COLUMNS, []), 2, steps=4, workers=2)
    assert np.isnan(figures.worker_step_times[1]) and figures.step_time == 1.0
    assert np.isnan(step_ends(table(TRACE_COLUMNS, rows), 2, 4)[3, 1])


def test_staleness_distance_is_the_two_sample_ks_statistic():
    assert staleness_distance([0, 1, 2], [0, 1, 2]) == 0.0
    assert staleness_distance([0, 0], [3, 3]) == 1.0
    # F_a = (.5, 1, 1), F_b = (0, .5, 1) at 0, 1, 2: largest gap 0.5
    assert staleness_distance([0, 1], [1, 2]) == 0.5


@pytest.mark.parametrize("scheme", ["allreduce", "ps:mode=async", "ps:staleness=1", "localsgd:period=2"])
def test_the_same_trace_gives_identical_figures_on_both_sides(tmp_path, scheme):
    """A simulated run's trace and updates, written as a real run's rank files and merged by real/,
    give the summary exactly the simulator's figures: one definition, computed once."""
    cluster = Cluster.homogeneous(3, Link("1GB/s", "50us"), servers=1, speed=(1.0, 0.5, 0.8), jitter=0.2)
    workload = Workload(param_bytes="4MiB", compute_time="20ms", batch_size=16)
    res = simulate(cluster, workload, scheme, steps=20, seed=3)
    trace, updates = res.trace, res.updates
    for w in range(cluster.gpus):  # each rank writes its own rows
        mine = trace[trace.worker == w].astype({"kind": str})
        write_atomic(rank_dir(tmp_path) / f"trace-rank{w}.csv",
                     _csv_text(TRACE_COLUMNS, list(mine.itertuples(index=False, name=None))))
        write_atomic(rank_dir(tmp_path) / f"updates-rank{w}.csv", _csv_text(
            UPDATE_COLUMNS, list(updates[updates.worker == w].itertuples(index=False, name=None))))
        write_atomic(rank_dir(tmp_path) / f"result-rank{w}.json", json.dumps({"rank": w, "role": "worker"}))
    config = {"scheme": scheme, "world": 3, "servers": 1, "steps": 20, "batch_size": 16}
    summary = merge(tmp_path, config, complete=True)
    assert summary["step_time"] == res.step_time
    assert summary["throughput"] == res.throughput
    assert summary["worker_step_times"] == list(res.worker_step_times)
    assert summary["staleness_mean"] == res.steady.staleness_mean
    assert summary["staleness_max"] == res.steady.staleness_max
    if scheme.startswith("ps:"):
        assert res.steady.staleness_max > 0  # the comparison covers staleness that is not all zero
