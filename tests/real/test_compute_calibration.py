"""The compute probe times the executor's own step without its communication (real.calibration.compute_probe).

The simulator is given a compute time and prices communication from the link fits; a run's step is the
executor's loop. So the probe must time that loop, bookkeeping included: a sub-millisecond step of the
small model spends a fifth of its time outside the forward, backward and optimizer step (the byte-counting
hook, the trace), which a hand-written timing loop leaves out. Planting a known delay in the executor's
trace records must show up, whole, in the calibrated step; so must one planted in each write of the
heartbeat a run's worker beats (real.heartbeat), which the probe's executor beats too.
"""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

DELAY = 0.002  # seconds planted in every trace record the executor writes
SCHEMES = ("allreduce", "allreduce:precision=fp16", "ps:staleness=2", "localsgd:period=4")
SLOW = 3.0  # the straggler rows' factor (studies.validation.SLOW)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(rank: int, world: int, port: int, calibration, seconds: float) -> None:
    """This spawned rank joins a gloo group of ``world`` on one math thread; the compute probe times at
    least ``seconds`` (its own minimum is for a quiet measurement, not for these checks)."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    calibration.COMPUTE_SECONDS = seconds


def _rank(rank: int, port: int, folder: str) -> None:
    import statistics
    import time

    import torch.distributed as dist

    from real.calibration import compute_probe as calibration
    from real.heartbeat import Heartbeat
    from real.trace import Recorder

    _join(rank, 1, port, calibration, 0.3)
    span, write = Recorder.span, Heartbeat._write
    calls = {"n": 0}

    def slowed_down(original):
        def slow(self, *args, **kwargs):
            calls["n"] += 1
            time.sleep(DELAY)
            return original(self, *args, **kwargs)
        return slow

    def planted(scheme: str, cls, name: str, original) -> tuple[float, float]:
        """(mean step, calls per step) with DELAY planted in each call of cls.name."""
        setattr(cls, name, slowed_down(original))
        calls["n"] = 0
        try:
            timed = calibration.time_worker_steps("mlp", 32, scheme, folder)
        finally:
            setattr(cls, name, original)
        paired = sum(map(len, timed["after_idle"]))  # each step after a gap follows its reference steps
        steps = calibration.COMPUTE_WARMUP + len(timed["steps"]) + paired * (1 + calibration.REFERENCE_STEPS)
        return statistics.fmean(timed["steps"]), calls["n"] / steps

    results = {}
    for scheme in SCHEMES:
        plain = calibration.time_worker_steps("mlp", 32, scheme, folder)
        slowed, spans_per_step = planted(scheme, Recorder, "span", span)
        beaten, beats_per_step = planted(scheme, Heartbeat, "_write", write)
        results[scheme] = {"plain": statistics.fmean(plain["steps"]), "slowed": slowed,
                           "spans_per_step": spans_per_step, "beaten": beaten, "beats_per_step": beats_per_step,
                           "forward": statistics.fmean(plain["forward"]),
                           "backward": statistics.fmean(plain["backward"]), "layers": plain["layers"],
                           "before_idle": plain["before_idle"], "after_idle": plain["after_idle"]}
    straggler = calibration.time_worker_steps("mlp", 32, "allreduce", folder, slow=SLOW)
    results["straggler"] = {k: straggler[k] for k in ("steps", "forward", "backward", "slow_wait")}
    with open(os.path.join(folder, "compute.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


@pytest.mark.distributed
def test_the_compute_probe_times_the_executor_s_own_step_bookkeeping_included(tmp_path):
    mp.spawn(_rank, args=(_free_port(), str(tmp_path)), nprocs=1, join=True)
    results = json.loads((tmp_path / "compute.json").read_text())
    straggler = results.pop("straggler")
    # A rank probed with --slow F sleeps (F-1) x COMPUTE_PER_FORWARD x its warm forward (timed once, back to
    # back) between forward and backward (real.executor), so each of its steps holds its forward, that sleep
    # and a backward: the slowed step studies.validation gives the simulator is measured with the sleep in it.
    from real.calibration import compute_probe as calibration
    from real.executor import COMPUTE_PER_FORWARD

    wait = straggler["slow_wait"]
    # the sleep is sized from a forward of this model: within a factor of the steps' own forwards (which
    # include whatever wakes the rank), and the same every step
    forwards = sorted(straggler["forward"])
    assert 0.2 * forwards[0] <= wait / ((SLOW - 1) * COMPUTE_PER_FORWARD) <= 5 * forwards[len(forwards) // 2]
    for step, forward, backward in zip(straggler["steps"], straggler["forward"], straggler["backward"]):
        assert backward >= wait and step >= forward + wait
    for scheme, r in results.items():
        # every scheme's step writes at least its compute span; the PS step its push and pull too
        assert r["spans_per_step"] >= (3 if scheme.startswith("ps") else 1), (scheme, r)
        planted = r["spans_per_step"] * DELAY
        # the planted delay is in the timed step, whole (sleep never returns early; 10 % for the clock)
        assert r["slowed"] - r["plain"] >= 0.9 * planted, (scheme, r)
        # the step beats the heartbeat a run's worker beats (real.executor.run_step at its start, at least),
        # and those writes are timed with it
        assert r["beats_per_step"] >= 1, (scheme, r)
        assert r["beaten"] - r["plain"] >= 0.9 * r["beats_per_step"] * DELAY, (scheme, r)
        # the forward and the backward are parts of the step, each measured
        assert 0 < r["forward"] and 0 < r["backward"] and r["forward"] + r["backward"] < r["plain"], (scheme, r)
        assert sum(r["layers"]) == 101_770 * 4  # the small model's parameters, fp32 bytes
        # then, for a worker of servers, IDLE_STEPS steps after each of IDLE_GAPS idle, each holding the
        # step's work and not the gap
        # (a step with the planted delays lasts more than 2 ms; the 30 ms gap is left out of its timing)
        gaps = len(calibration.IDLE_GAPS) if scheme.startswith("ps") else 0  # only servers' workers idle
        assert [len(t) for t in r["after_idle"]] == [calibration.IDLE_STEPS] * gaps
        assert all(0 < t < calibration.IDLE_GAPS[-1] for times in r["after_idle"] for t in times), (scheme, r)
        # each paired with a back-to-back step timed just before its gap, which holds no gap either
        assert [len(t) for t in r["before_idle"]] == [calibration.IDLE_STEPS] * gaps
        assert all(0 < t < calibration.IDLE_GAPS[-1] for times in r["before_idle"] for t in times), (scheme, r)


def test_free_network_does_the_worker_s_tensor_work_and_sends_nothing():
    from real.calibration.compute_probe import FreeNetwork

    params = torch.arange(6, dtype=torch.float32)
    client = FreeNetwork(params, torch.float16)
    assert client.push(torch.ones(6), step=0, aggregate=False) == 12  # six fp16 values
    client.wait(step=0, threshold=0)
    pulled, nbytes = client.pull(step=0)
    assert nbytes == 12 and pulled.dtype == torch.float32 and torch.equal(pulled, params)


def _meeting_rank(rank: int, port: int, folder: str) -> None:
    import torch.distributed as dist

    from real.calibration import compute_probe as calibration

    _join(rank, 2, port, calibration, 0.2)
    mine = {}
    for scheme in ("allreduce", "localsgd:period=4", "ps"):
        timed = calibration.time_worker_steps("mlp", 32, scheme, folder, slow=SLOW if rank == 1 else 1.0)
        mine[scheme] = [len(timed["steps"]), timed["meetings"], timed["steps"], timed["between"]]
    gathered = [None, None]
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        with open(os.path.join(folder, "meetings.json"), "w") as f:
            json.dump(gathered, f)
    dist.destroy_process_group()


@pytest.mark.distributed
def test_the_compute_probe_s_ranks_meet_where_their_scheme_s_collectives_are(tmp_path):
    # A run's workers leave each collective together and then compute at once, so the probe's ranks meet
    # after every step whose plan all-reduces (every step) or averages (every 4th of local SGD), and stop
    # together: a slowed rank and its peer time as many steps. Ranks of a parameter server never meet.
    from real.calibration.compute_fit import COMPUTE_WARMUP

    mp.spawn(_meeting_rank, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    fast, slowed = json.loads((tmp_path / "meetings.json").read_text())
    for scheme, every in (("allreduce", 1), ("localsgd:period=4", 4)):
        (steps, meetings, _, _), (slowed_steps, slowed_meetings, _, _) = fast[scheme], slowed[scheme]
        assert steps == slowed_steps and meetings == slowed_meetings, scheme
        assert (COMPUTE_WARMUP + steps) % every == 0 and meetings == (COMPUTE_WARMUP + steps) // every, scheme
        # each rank's work from one meeting to the next (meeting_excess compares the ranks' over them): the
        # timed steps of every window that holds no warm-up step, summed, in order
        for _, _, timings, between in (fast[scheme], slowed[scheme]):
            first = -(-COMPUTE_WARMUP // every) * every - COMPUTE_WARMUP  # the first whole window's first step
            windows = [sum(timings[k:k + every]) for k in range(first, len(timings), every)]
            assert between == pytest.approx(windows, rel=1e-12) and len(between) >= 10, scheme
    assert fast["ps"][1] == slowed["ps"][1] == 0 and fast["ps"][3] == slowed["ps"][3] == []
