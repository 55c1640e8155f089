"""The compute probe: forked local ranks each time the executor's step of a scheme at once, with
communication that costs nothing (FreeNetwork, a process group of one rank), as the configuration's
workers compute when they share this machine's cores; measure_scheme_compute runs it and caches it."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

from real.calibration.cache import cached
from real.calibration.compute_fit import (
    COMPUTE_SECONDS,
    COMPUTE_STEPS,
    COMPUTE_WARMUP,
    IDLE_GAPS,
    IDLE_STEPS,
    MAX_COMPUTE_STEPS,
    REFERENCE_STEPS,
    summarise_compute,
    worker_work,
)
from syncsim.files import write_atomic

__all__ = ["FreeNetwork", "measure_scheme_compute", "time_worker_steps", "compute_rank"]


def measure_scheme_compute(model: str, batch_size: int, processes: int, folder: Path, scheme: str = "allreduce",
                           slow: float = 1.0, repeat: str = "") -> dict:
    """``processes`` ranks timing the executor's step of ``scheme`` without its communication at once;
    compute_time, jitter, backward_fraction, forward_time, layers, meets (how often the ranks met where
    the scheme's collectives are), and idle_cost (how much longer steps
    take after each of IDLE_GAPS idle than the back-to-back steps paired with them, syncsim's
    Workload.idle_cost). With ``slow`` > 1 the last rank is
    slowed as ``--slow`` slows a run's last worker, and ``slowed_time`` is its step (the others make the
    rest), ``slow_forward`` the forward it timed warm and sized its sleep from, ``slow_wait`` that sleep: a
    run given ``--slow RANK:F:slow_forward`` sleeps as long. A ``repeat`` label (letters, digits, dashes)
    makes the probe one of its own, cached under that label: a repeated measurement takes its own probe
    rather than the one the same work was timed with before."""
    from real.config import MAX_SLOW
    from syncsim.schemes import parse

    try:
        scheme = str(parse(scheme))
    except ValueError as err:
        raise ValueError(f"measure_scheme_compute: scheme: {err}") from None
    if not 1.0 <= slow <= MAX_SLOW or (slow > 1 and processes < 2):
        raise ValueError(f"measure_scheme_compute: slow must be 1 or, with 2 processes or more, up to "
                         f"{MAX_SLOW:g}; got {slow!r} with {processes} processes")
    if repeat and not all(ch.isalnum() or ch == "-" for ch in repeat):
        raise ValueError(f"measure_scheme_compute: repeat must be letters, digits and dashes (a file name's part); "
                         f"got {repeat!r}")
    name = f"compute-{model}-b{batch_size}-p{processes}-{worker_work(scheme)}" + (f"-slow{slow:g}" if slow > 1 else "")
    name += f"-{repeat}" if repeat else ""

    def measure() -> dict:
        from real.testbed.launcher import fork_local

        out = folder / f"{name}.raw.json"
        # Forked as the runs' ranks are (real.testbed.forkserver): no rank spends seconds importing torch.
        codes = fork_local(processes, "real.calibration",
                           ["--compute", str(out), "--model", model, "--batch-size", str(batch_size),
                            "--scheme", scheme, "--slow", str(slow)], folder / "logs" / name, timeout=900)
        if any(codes):
            raise RuntimeError(f"compute probe {name} failed (rank exit codes {codes}); logs in {folder}/logs/{name}")
        return json.loads(out.read_text())

    return cached(folder / f"{name}.json", measure)


class FreeNetwork:
    """A parameter-server client whose network costs nothing: a worker's own tensor work around a push
    and a pull (the gradient cast to the wire format; the pulled parameters cast back to fp32) without
    a byte sent. What the link fits price is left out, everything else the executor does is timed."""

    def __init__(self, flat_params, wire_dtype) -> None:
        self.wire_dtype = wire_dtype
        self.params = flat_params.to(wire_dtype)
        self.nbytes = self.params.numel() * self.params.element_size()

    def push(self, flat_grad, step: int, aggregate: bool) -> int:
        flat_grad.to(self.wire_dtype)
        return self.nbytes

    def wait(self, step: int, threshold: int) -> None:
        pass

    def pull(self, step: int):
        return self.params.float(), self.nbytes

    def stop(self) -> None:
        pass


# -- what the ranks run -------------------------------------------------------------
def compute_rank(out: str, model: str, batch_size: int, scheme: str, slow: float = 1.0) -> None:
    """One rank of the compute probe: its steps timed (the last rank slowed by ``slow``), every rank's
    gathered, and rank 0 writes their summary (summarise_compute)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    last = dist.get_rank() == dist.get_world_size() - 1
    mine = time_worker_steps(model, batch_size, scheme, str(Path(out).parent), slow if last else 1.0)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if dist.get_rank() == 0:
        write_atomic(out, json.dumps(summarise_compute(gathered, model, batch_size, scheme, slow), indent=1))
    dist.destroy_process_group()


def time_worker_steps(model_name: str, batch_size: int, scheme: str, folder: str, slow: float = 1.0) -> dict:
    """One rank: the executor's steps of ``scheme`` on one worker whose peers cost nothing, timed as
    COMPUTE_STEPS says.

    The executor runs its own loop (real.executor.Executor.run_step): the batch, the forward and backward
    (through DDP and the executor's byte-counting hook where the plan all-reduces), the optimizer step or
    the push's and pull's tensor work, its trace records, its heartbeat (a run's worker's, real.heartbeat: a
    file written at each step and around each wait, a watchdog thread); for PowerSGD, top-k and DiLoCo also
    the compressor's arithmetic (syncsim.compression: error feedback, P = ΔQ, Gram-Schmidt, Q = ΔᵀP̂, P̂Qᵀ;
    the top-k selection and scatter-add) and the outer optimiser's step, which the executor runs inside its
    step between its collectives. Its collectives run over a process group of this rank alone and its
    parameter-server client is FreeNetwork, so what is timed is the step without its communication, which
    the link fits price, and with everything else: a workload calibrated from it leaves syncsim's compressor
    rates (Workload.compress_flops, scan_rate) unset, or that work would be counted twice.

    After a step whose plan ends in a collective (an all-reduce, a model average, PowerSGD's two rounds,
    top-k's all-gather, DiLoCo's outer step, a sharded step's reduce-scatter) the ranks meet at a
    barrier, untimed, as a run's workers leave each collective together and compute at once: the cores
    are then shared as in the run. Ranks that never met were a poor stand-in for all-reducing workers
    of the small model: four of them computing back to back on two cores took 1.3-2.2 ms a step with a
    coefficient of variation of 1.3-6.3 (a step ran whole, or waited out another rank's time slice),
    where the runs' workers computed 0.5-1.2 ms, varying by 0.8-1.2, and the simulator's slowest of
    four such draws made a local-SGD step 61 % longer than measured.

    The ranks of a scheme that shards its gradients (ZeRO-2 and -3, FSDP: FSDP2's) run on the probe's whole
    group instead, over loopback, and each step's time less its collectives' spans is what is timed: on a
    one-rank group FSDP2 runs no collective and none of the work around one (copying a unit into its
    gather buffer and out, building the reduce-scatter's input), which on two ranks of the small model was
    1.1 ms of a step whose compute was 2.0 ms (3.1 ms outside the collectives). ZeRO-1 skips nothing on a
    one-rank group and keeps it."""
    import gc

    import torch.distributed as dist

    from real.models import param_layers

    executor, client, model, steps, together = _probe_executor(model_name, batch_size, scheme, folder, slow)
    dist.barrier()  # every rank starts at once: they share the cores as a run's ranks do
    timings, step = _time_back_to_back(executor, steps, pushes=client is not None, less_collectives=together)
    before_idle, after_idle = _time_after_idle(executor, step) if client is not None else ([], [])
    layers = list(param_layers(model))
    slow_wait = executor.slow_wait  # a slowed rank's sleep per step (real.executor; 0 when not slowed)
    slow_forward = executor.slow_forward  # the forward that sleep was sized from (None: not slowed)
    executor.heartbeat.stop()  # its watchdog: this rank now waits for the others' timings, not stalled
    # The executor refers to itself (its handlers), so only the collector frees it and the DDP module and
    # averager holding this rank's group: now, before the groups are destroyed. Left to the interpreter's
    # exit, a gloo group outliving its process group's teardown aborts the process ("terminate called
    # without an active exception": 4 of 36 probes of a grid).
    del executor, client
    gc.collect()
    return {"steps": timings["steps"], "forward": timings["forward"], "backward": timings["backward"],
            "layers": layers, "before_idle": before_idle, "after_idle": after_idle, "meetings": timings["meetings"],
            "between": timings["between"], "slow_wait": slow_wait, "slow_forward": slow_forward}


def _probe_executor(model_name: str, batch_size: int, scheme: str, folder: str, slow: float):
    """(the executor of one worker of ``scheme`` on a process group of this rank alone, its FreeNetwork
    client or None when the scheme has no servers, its model, the steps its plan spans, False), built as
    real.worker builds them; when the ranks are probed together (probed_together), the executor of worker
    ``rank`` on the whole group, and True."""
    import torch
    import torch.distributed as dist

    from real.config import RunConfig, needs_servers
    from real.data import load
    from real.executor import Executor, flat_params
    from real.models import build
    from real.trace import Recorder
    from real.wire import WIRE_DTYPES

    pushes = needs_servers(scheme)
    cfg = RunConfig(scheme=scheme, world=1, servers=int(pushes), model=model_name, batch_size=batch_size,
                    steps=COMPUTE_WARMUP + MAX_COMPUTE_STEPS + len(IDLE_GAPS) * IDLE_STEPS * (REFERENCE_STEPS + 1),
                    out=folder,
                    slow=((0, slow),) if slow > 1 else ())
    rank, world = dist.get_rank(), dist.get_world_size()
    together = probed_together(cfg.spec, world)
    if together:
        cfg = dataclasses.replace(cfg, world=world, slow=((rank, slow),) if slow > 1 else ())
        worker, group = rank, dist.group.WORLD
    else:
        worker, group = 0, [dist.new_group([r]) for r in range(world)][rank]  # every rank makes every group
    model, data = build(cfg.model, cfg.seed), load(cfg.data, cfg.seed)  # as real.worker builds them
    client = FreeNetwork(flat_params(model), WIRE_DTYPES[cfg.spec.precision]) if pushes else None
    executor = Executor(cfg, worker, model, data, torch.device("cpu"), group, Recorder(time.time()),
                        heartbeat=_heartbeat(folder, rank, world, cfg.timeout), client=client)
    return executor, client, model, cfg.steps, together


def _heartbeat(folder: str, rank: int, ranks: int, timeout: float):
    """The heartbeat a run's worker beats (real.worker): its file rewritten at each step and around each
    wait, its watchdog thread awake every 0.2 s. A run's worker does this work, so the probe does it too.
    Without it, the small model's one-worker all-reduce, probed and then run, twelve times in turns, ran a
    median 7.5 % and 5.1 % slower than its probe (two such sets); with it, 0.4 % slower and 3.5 % faster
    (12 and 16 turns). That was the speedup baselines' miss: on two steady grids all six of the small
    model's baseline repeats ran 2-17 % slower than their probes, and every speedup of the model divided
    by them. A probe rank that stalls ends as a run's would."""
    from real.heartbeat import EXIT_STALLED, Heartbeat

    def stalled(step: int, waiting: bool, idle: float) -> None:
        print(f"compute probe rank {rank}: no progress for {idle:.1f} s at step {step}", file=sys.stderr, flush=True)
        os._exit(EXIT_STALLED)

    return Heartbeat(Path(folder) / "logs" / "heartbeats", rank, ranks, timeout, on_stall=stalled)


def _time_back_to_back(executor, planned: int, pushes: bool, less_collectives: bool = False) -> tuple[dict, int]:
    """({"steps", "forward", "backward": timings after COMPUTE_WARMUP, "meetings"}, the last step run):
    steps back to back until this rank (or, where the ranks meet at their scheme's collectives, every
    rank) has timed what COMPUTE_STEPS and COMPUTE_SECONDS ask; ``planned``: the steps the plan spans.
    ``less_collectives``: each step's time is taken less the spans of the sharded collectives it recorded."""
    import torch
    import torch.distributed as dist

    from syncsim.schemes.actions import COLLECTIVE_SYNCS as meeting  # after them the workers leave together
    steps, forward, backward = [], [], []
    between: list[float] = []  # this rank's timed work from one meeting to the next, whole windows only
    timed, meetings, window, whole = 0.0, 0, 0.0, False  # whole: the window so far holds timed steps only
    alone = dist.get_world_size() == 1  # a lone rank has no one to meet

    def enough(step: int) -> bool:  # this rank has timed what COMPUTE_STEPS and COMPUTE_SECONDS ask
        return step >= COMPUTE_WARMUP + COMPUTE_STEPS and timed >= COMPUTE_SECONDS

    for step in range(COMPUTE_WARMUP + MAX_COMPUTE_STEPS):
        if (pushes or alone) and enough(step):  # ranks that never meet stop on their own
            break
        began = executor.recorder.now()
        t0 = time.perf_counter()
        executor.run_step(step)
        elapsed = time.perf_counter() - t0
        phases = [executor.forward_time, executor.backward_time]  # what real.executor times (a --slow rank's wait)
        if less_collectives:
            elapsed, phases = _less_collectives(executor, began, elapsed, phases)
        window += elapsed
        if step >= COMPUTE_WARMUP:
            timed += elapsed
            steps.append(elapsed)
            forward.append(phases[0])
            backward.append(phases[1])
        else:
            whole = False
        if not alone and any(isinstance(action, meeting) for action in executor.policy.plan(step, planned)):
            # the workers leave the step's collective together (untimed); they stop together, once every
            # rank has timed enough, or the others would wait at this meeting for a rank that left
            if whole:
                between.append(window)
            window, whole = 0.0, True
            every_rank_done = torch.tensor([float(enough(step + 1))])
            dist.all_reduce(every_rank_done, op=dist.ReduceOp.MIN)
            meetings += 1
            if every_rank_done.item():
                break
    return {"steps": steps, "forward": forward, "backward": backward, "meetings": meetings,
            "between": between}, step


def probed_together(spec, processes: int) -> bool:
    """Whether the compute probe of ``spec`` (a parsed scheme) on ``processes`` ranks runs them on one
    group, timing each step less its collectives: a scheme whose plan shards the gradients (its StateLayout;
    the executor runs those on FSDP2, real.sharded), on more than one rank."""
    from syncsim.schemes.policy import SHARDED

    return processes > 1 and spec.policy(1.0).layout.gradients == SHARDED


def within(spans, start: float, end: float) -> float:
    """Seconds between ``start`` and ``end`` that the (start, end) ``spans`` cover, spans that overlap counted
    once (their union, taken left to right). The compute probe takes a step's collectives off it with this,
    and the validation study's replay a sharded run's compute rows (real.validation.prediction)."""
    covered, reach = 0.0, start
    for a, b in sorted(spans):
        lo, hi = max(a, reach), min(b, end)
        if hi > lo:
            covered += hi - lo
            reach = hi
    return covered


def _less_collectives(executor, began: float, elapsed: float, phases: list[float]) -> tuple[float, list[float]]:
    """The step just run (begun at ``began`` on the executor's recorder clock) less FSDP2's collective calls
    since then (real.sharded's collective_spans), and its forward and backward each less those within it."""
    spans = [(a, b) for a, b in executor.collective_spans if a >= began]
    forward_end = executor.backward_end - executor.backward_time
    forward = phases[0] - within(spans, forward_end - executor.forward_time, forward_end)
    backward = phases[1] - within(spans, forward_end, executor.backward_end)
    return elapsed - within(spans, began, math.inf), [forward, backward]


def _time_after_idle(executor, step: int) -> tuple[list[list[float]], list[list[float]]]:
    """For a worker of parameter servers, IDLE_STEPS steps after each of IDLE_GAPS seconds idle, as its
    steps follow its wait for the servers (the ranks idle together, as they computed together), each paired
    with the step just before its gap, the last of REFERENCE_STEPS back to back: (before, after), per gap.
    Paired, the machine's drift over the seconds the gaps take is in both alike. A worker waiting for a
    collective is not idle (its own threads reduce), and syncsim charges it no idle cost."""
    import torch.distributed as dist

    steps = itertools.count(step + 1)  # the steps after the back-to-back phase's last

    def timed_step() -> float:  # the executor's next step, its seconds (the gap before it not counted)
        t0 = time.perf_counter()
        executor.run_step(next(steps))
        return time.perf_counter() - t0

    dist.barrier()
    before_idle, after_idle = [], []
    for gap in IDLE_GAPS:
        before, after = [], []
        for _ in range(IDLE_STEPS):
            before.append([timed_step() for _ in range(REFERENCE_STEPS)][-1])
            time.sleep(gap)
            after.append(timed_step())
        before_idle.append(before)
        after_idle.append(after)
    return before_idle, after_idle
