"""UpdateLog: what a replay reads from a run, and the clear errors a malformed log gets.

A real run's updates.csv is replayed like a simulation's table, so a log that
cannot be a run — a collective a worker never joined, a worker joining twice,
a version skipped, a gradient reading a version not yet made — must stop the
replay with a message that says what is wrong, not replay something else.
"""

from __future__ import annotations

import pandas as pd
import pytest

from syncsim import Cluster, Link, Workload, simulate
from syncsim.convergence import Quadratic, Replayer, UpdateLog
from syncsim.recorder import UPDATE_COLUMNS
from syncsim.schemes import parse

PROBLEM = Quadratic((1.0, 2.0))


def log(scheme: str, workers: int, steps: int, rows: list[tuple[int, int, int, int]]) -> UpdateLog:
    """An UpdateLog of (worker, step, version_read, version_applied) rows, applied a second apart."""
    table = pd.DataFrame([(w, t, r, a, a - r, float(i)) for i, (w, t, r, a) in enumerate(rows)],
                         columns=list(UPDATE_COLUMNS))
    return UpdateLog(parse(scheme).policy(16.0), workers, steps, 2, table)


def test_a_simulation_and_its_log_replay_the_same():
    result = simulate(Cluster.homogeneous(3, Link("1GB/s"), servers=1), Workload(64.0, 0.01, batch_size=2),
                      "ps:mode=async", steps=4)
    from_result = Replayer(result, PROBLEM, lr=0.1).run()
    from_log = Replayer(UpdateLog.of(result), PROBLEM, lr=0.1).run()
    assert (from_result.parameters() == from_log.parameters()).all()
    assert UpdateLog.of(result).versions == result.versions == 12


@pytest.mark.parametrize("scheme", ["allreduce", "ps"])  # an all-reduce joined, a synchronous round pushed
def test_a_table_that_ends_inside_a_collective(scheme):
    with pytest.raises(RuntimeError, match=r"ends inside a collective: 1 of 2 workers joined"):
        Replayer(log(scheme, 2, 1, [(0, 0, 0, 0)]), PROBLEM, lr=0.1).run()


@pytest.mark.parametrize("worker", [0, 1])
def test_a_collective_joined_twice_by_one_worker(worker):
    with pytest.raises(RuntimeError, match=rf"joined by workers \[{worker}, {worker}\], not each worker once"):
        Replayer(log("allreduce", 2, 2, [(worker, 0, 0, 0), (worker, 1, 0, 0)]), PROBLEM, lr=0.1).run()


def test_a_skipped_version():
    with pytest.raises(RuntimeError, match="replay is at version 1 but the updates table applies to 2"):
        Replayer(log("ps:mode=async", 1, 2, [(0, 0, 0, 0), (0, 1, 1, 2)]), PROBLEM, lr=0.1).run()


def test_a_version_applied_twice_where_each_push_makes_one():
    with pytest.raises(RuntimeError, match="replay is at version 1 but the updates table applies to 0"):
        Replayer(log("ps:mode=async", 2, 1, [(0, 0, 0, 0), (1, 0, 0, 0)]), PROBLEM, lr=0.1).run()


def test_a_replay_stops_when_asked():
    replayer = Replayer(log("ps:mode=async", 1, 3, [(0, 0, 0, 0), (0, 1, 1, 1), (0, 2, 2, 2)]), PROBLEM, lr=0.1)
    replayer.run(on_version=lambda version, time, applied: version == 2)
    assert replayer.version == 2 and replayer.applied == 2


@pytest.mark.parametrize("workers,rows,message", [
    # step 1 claims to read version 2 while the servers are at version 1 (and keep only it)
    (1, [(0, 0, 0, 0), (0, 1, 2, 1)], r"reads version 2 but the replay keeps versions 1\.\.1"),
    # the same at version 1 with three versions kept (a later push is 2 stale): 0 and 1 exist so far
    (2, [(0, 0, 0, 0), (0, 1, 7, 1), (1, 0, 0, 2)], r"reads version 7 but the replay keeps versions 0\.\.1"),
])
def test_a_gradient_reading_a_version_not_yet_made(workers, rows, message):
    with pytest.raises(RuntimeError, match=message):
        Replayer(log("ps:mode=async", workers, 2, rows), PROBLEM, lr=0.1).run()


def test_bad_logs_are_refused_by_field():
    policy = parse("allreduce").policy(16.0)
    table = pd.DataFrame(columns=list(UPDATE_COLUMNS))
    with pytest.raises(ValueError, match="UpdateLog.workers must be an integer >= 1"):
        UpdateLog(policy, 0, 1, 1, table)
    with pytest.raises(ValueError, match="missing staleness, time_applied"):
        UpdateLog(policy, 1, 1, 1, table.drop(columns=["staleness", "time_applied"]))
    with pytest.raises(ValueError, match="UpdateLog.policy must be a syncsim.schemes.Policy, got str"):
        UpdateLog("allreduce", 1, 1, 1, table)
    with pytest.raises(ValueError, match="a SimResult from syncsim.simulate or an UpdateLog, got DataFrame"):
        Replayer(table, PROBLEM, lr=0.1)
    assert UpdateLog(policy, 1, 1, 1, table).versions == 0
    lying = log("ps:mode=async", 1, 2, [(0, 0, 0, 0), (0, 1, 0, 1)]).updates.assign(staleness=0)
    with pytest.raises(ValueError, match="worker 0 step 1 reads 0, is applied to 1 and says staleness 0"):
        UpdateLog(policy, 1, 2, 1, lying)
    with pytest.raises(ValueError, match="replay.seed must be an integer >= 0, got -1"):
        Replayer(log("allreduce", 1, 1, [(0, 0, 0, 0)]), PROBLEM, lr=0.1, seed=-1)


def test_a_replay_may_give_the_problem_its_own_batch_size():
    result = simulate(Cluster.homogeneous(2, Link("1GB/s")), Workload(64.0, 0.01, batch_size=8), "allreduce", steps=2)
    assert len(Replayer(result, PROBLEM, lr=0.1, batch_size=1).sampler.indices(0, 0)) == 1
    assert len(Replayer(result, PROBLEM, lr=0.1).sampler.indices(0, 0)) == 8
    with pytest.raises(ValueError, match="replay.batch_size must be an integer >= 1, got 0"):
        Replayer(result, PROBLEM, lr=0.1, batch_size=0)
