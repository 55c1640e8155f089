"""The link probe times a collective from the last rank's arrival, as syncsim starts one (real.calibration.timing)."""

from __future__ import annotations

import json
import os

import pytest
import torch.multiprocessing as mp

from tests.real.test_compute_calibration import _free_port

LATE = 0.08  # seconds rank 1 arrives after rank 0, in every round


def _in_group(rank: int, port: int, out: str, body) -> None:
    """One of two gloo ranks on loopback running ``body(rank)``; rank 0 writes what it returns to ``out``."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    result = body(rank)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def _spawned(tmp_path, body) -> dict:
    """What rank 0 of two spawned ranks running ``body`` (a module-level function) returned."""
    out = tmp_path / f"{body.__name__}.json"
    mp.spawn(_in_group, args=(_free_port(), str(out), body), nprocs=2, join=True)
    return json.loads(out.read_text())


def _late_peer(rank: int) -> dict:
    import time
    import types

    import torch
    import torch.distributed as dist

    from real.calibration import timing

    if rank == 1:  # rank 1 leaves each round's rest LATE seconds after rank 0
        timing.time = types.SimpleNamespace(perf_counter=time.perf_counter,
                                            sleep=lambda s: time.sleep(s + LATE))
    buf = torch.zeros(1024)
    return {kind: [timing.timed_once(lambda: dist.all_reduce(buf), 0.0, from_last=kind == "from_last")
                   for _ in range(3)]
            for kind in ("slowest", "from_last")}


@pytest.mark.distributed
def test_a_collective_is_timed_from_the_last_rank_s_arrival(tmp_path):
    # The slowest rank's own elapsed time counts the wait for a late peer (about LATE); timed from the last
    # arrival, a 4 kB all-reduce on loopback takes milliseconds, as syncsim charges it once all have arrived.
    # The barrier before each round releases the two ranks apart (by milliseconds on a loaded machine, and
    # either may leave first), so the slowest rank's wait is LATE give or take that skew, not LATE or more.
    timings = _spawned(tmp_path, _late_peer)
    assert all(t >= 0.75 * LATE for t in timings["slowest"])
    assert all(0 < t < LATE / 2 for t in timings["from_last"])


def _late_leaver(rank: int) -> dict:
    import time

    from real.calibration import timing

    exits: list = []
    # rank 0 leaves the action LATE seconds after rank 1: its part ends last
    timed = [timing.timed_once(lambda: time.sleep(LATE if rank == 0 else 0.0), 0.0, from_last=True, exits=exits)
             for _ in range(3)]
    return {"timed": timed, "exits": exits}


@pytest.mark.distributed
def test_a_collective_s_timing_records_how_far_before_the_last_each_rank_left(tmp_path):
    # timed_once's ``exits``: per round, each rank's lead over the last rank to leave, increasing, the
    # last's 0. Rank 1 leaves at once and rank 0 LATE seconds later (both started together), so each round
    # records [0, ~LATE], and the round's time is still from the last start to the last end (~LATE), each
    # give or take the milliseconds by which the barrier releases the ranks apart.
    result = _spawned(tmp_path, _late_leaver)
    assert len(result["exits"]) == 3
    for (first, second), timed in zip(result["exits"], result["timed"]):
        assert first == 0.0 and LATE * 0.75 <= second < LATE * 1.5
        assert LATE * 0.75 <= timed < LATE * 1.5


AFTER, WORK = 0.15, 0.01  # seconds each rank stays busy after the action, and the action's own time


def _busy_after(rank: int) -> dict:
    import time

    from real.calibration import timing

    began = time.perf_counter()
    timed = [timing.timed_once(lambda: time.sleep(WORK), 0.0, from_last=True, after=AFTER) for _ in range(3)]
    return {"timed": timed, "elapsed": time.perf_counter() - began}


@pytest.mark.distributed
def test_the_busy_after_a_timed_collective_is_spent_but_not_timed(tmp_path):
    # timed_once's ``after`` keeps each rank busy once its part is over (a run's next compute step): the
    # three rounds take at least 3 x AFTER of wall time, yet each round's time is its action's (WORK, a
    # sleep), not WORK + AFTER: the busy period lies outside the instants the ranks compare.
    result = _spawned(tmp_path, _busy_after)
    assert result["elapsed"] >= 3 * AFTER
    assert all(WORK <= t < WORK + AFTER / 2 for t in result["timed"])


def _at_size_rank(rank: int, port: int, out: str) -> None:
    from real.calibration.link_probe import link_rank

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    link_rank(out, repeats=1, idle=1e-3, at=[(4096, "fp32"), (2048, "fp16")], sweep_sizes=False)


@pytest.mark.distributed
def test_the_link_probe_times_the_runs_own_sizes_each_after_a_busy_rest(tmp_path):
    # --at sizes are all-reduced at_repeats times each (real.calibration.link_probe.link_rank: as many as
    # AT_SECONDS hold, AT_REPEATS to AT_MAX_REPEATS), from the last rank's arrival, after each rank kept its
    # core busy for the rest; --no-sweep times nothing else. The ranks agree on the count (each sets it
    # from the same max-reduced first timing): had they not, one would wait at a collective the other never
    # joins, and the spawn would not return.
    from real.calibration.timing import AT_MAX_REPEATS, AT_REPEATS

    out = tmp_path / "probe.json"
    mp.spawn(_at_size_rank, args=(_free_port(), str(out)), nprocs=2, join=True)
    probe = json.loads(out.read_text())
    assert "pingpong" not in probe and "allreduce_fp32" not in probe
    assert [(size, precision) for size, precision, _ in probe["at_size"]] == [(4096, "fp32"), (2048, "fp16")]
    for _, _, timings in probe["at_size"]:
        assert AT_REPEATS <= len(timings) <= AT_MAX_REPEATS and all(0 < t < 1.0 for t in timings)
    # each timing's exit spreads are kept beside it: one pair per timing (two ranks), the last rank's 0 first
    assert [(size, precision) for size, precision, _ in probe["at_exits"]] == [(4096, "fp32"), (2048, "fp16")]
    for (_, _, timings), (_, _, spreads) in zip(probe["at_size"], probe["at_exits"]):
        assert len(spreads) == len(timings) and all(len(s) == 2 and s[0] == 0.0 <= s[1] < 1.0 for s in spreads)


def _work_on_one_core(rank: int) -> dict:
    import time

    import torch.distributed as dist

    from real.calibration import timing

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # both ranks on one core: they share it
    dist.barrier()
    began, cpu = time.perf_counter(), time.thread_time()
    timing.work(WORK_CPU)
    return {"wall": time.perf_counter() - began, "cpu": time.thread_time() - cpu}


WORK_CPU = 0.2  # seconds of a core's time each rank computes


@pytest.mark.distributed
def test_work_after_a_collective_is_a_core_s_time_so_sharing_a_core_stretches_it(tmp_path):
    # timing.work computes WORK_CPU of the thread's own CPU time, as a step's compute is work, not a span:
    # two ranks on one core each take about twice as long in wall time (a wall-clock spin would take
    # WORK_CPU whatever the sharing).
    result = _spawned(tmp_path, _work_on_one_core)
    assert result["cpu"] >= WORK_CPU
    assert result["wall"] >= 1.5 * WORK_CPU
