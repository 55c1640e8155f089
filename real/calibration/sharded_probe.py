"""The sharded probe: a sharded scheme's collectives of one step timed on the testbed, no model.

The executor runs ZeRO's and FSDP's collectives on gloo with torch's own tools (real.sharded), which do not
run them as NCCL's rings do: on a 2-host testbed at 200 Mbit/s, with the small model (407 kB), a run's
reduce-scatter took 17.6-17.8 ms a step where the ring prices 9.0 ms, both under FSDP2
(``reduce_scatter_single``) and under ZeRO-1 (one ``reduce`` to each owner, each sending one direction at a
time), and ZeroRedundancyOptimizer's broadcasts 17.0 ms where the ring all-gather prices 9.9 ms; FSDP2's
``all_gather_single`` took 10.8 ms against 9.4 ms. Standing in for them with the all-reduce's fit left these
rows' predictions 25-46 % short.

``measure_sharded`` times, on a testbed of the run's workers at its rate, the collectives one step of
``scheme`` issues, in the step's order, with the calls the executor makes (FSDP2's per-unit
``reduce_scatter_single`` and ``all_gather_single`` on flat tensors of each unit's size at the wire
precision, padded as FSDP2 pads them; ZeRO-1's per-owner ``reduce`` and ZeroRedundancyOptimizer's
``step()``), each step after the ranks computed long enough for the links' buckets to refill, as a step's
compute rests them. real.calibration.sharded_fit turns the timings into the Cluster's traffic factors.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from real.calibration.cache import cached, slug
from real.calibration.sharded_fit import KINDS
from real.calibration.timing import refill_idle

__all__ = ["SHARDED_REPEATS", "measure_sharded", "sharded_rank"]

SHARDED_REPEATS = 15  # timed steps' collectives (after one untimed warm-up step)


def measure_sharded(bandwidth: str, folder: Path, scheme: str, model: str, world: int, prefix: str = "sstb",
                    repeats: int = SHARDED_REPEATS) -> dict:
    """The collectives of one step of ``scheme`` (a sharded spec) with ``model``'s tensors, timed on a
    testbed of ``world`` hosts at ``bandwidth``: {"bandwidth", "scheme", "model", "world",
    "reducescatter": [...], "allgather": [...]} (seconds per step of each kind, one entry per timed step),
    cached under ``folder``."""
    from syncsim.schemes import parse

    if world < 2:
        raise ValueError(f"measure_sharded: world must be 2 or more (one worker runs no collective), got {world}")
    spec = str(parse(scheme))
    name = f"sharded-{slug(bandwidth)}-{slug(spec)}-{model}-w{world}"

    def measure() -> dict:
        from real.testbed.launcher import torchrun_on
        from real.testbed.namespaces import Testbed

        out = folder / f"{name}.raw.json"
        with Testbed(hosts=world, bandwidth=bandwidth, prefix=prefix) as bed:
            idle = refill_idle(bed.config)
            codes = torchrun_on(bed, "real.calibration",
                                ["--sharded", str(out), "--scheme", spec, "--model", model, "--repeats", str(repeats),
                                 "--idle", str(idle)], folder / "logs" / name, timeout=900, agent=False)
        if any(codes):
            raise RuntimeError(f"sharded probe {name} failed (node exit codes {codes}); logs in {folder}/logs/{name}")
        return {"bandwidth": bandwidth, "scheme": spec, "model": model, "world": world} | json.loads(out.read_text())

    return cached(folder / f"{name}.json", measure)


# -- the ranks --------------------------------------------------------------------------------------
def _unit_buffers(units: tuple[float, ...], value_bytes: int, world: int, dtype):
    """(input, output) pairs of each unit for a reduce-scatter and an all-gather at ``dtype``: FSDP2 pads each
    unit's flat values to a multiple of the world (torch.chunk of dim 0), so the flat size is rounded up."""
    import torch

    pairs = []
    for unit in units:
        numel = -(-max(1, round(unit / value_bytes)) // world) * world
        pairs.append((torch.zeros(numel, dtype=dtype), torch.zeros(numel // world, dtype=dtype)))
    return pairs


def _fsdp_step(plan, units, group) -> dict[str, float]:
    """One step's FSDP2 collectives in plan order: every unit's all-gather per AllGatherParameters, every
    unit's reduce-scatter (backward order) per ReduceScatterGradients. Seconds per kind."""
    import torch.distributed as dist

    from syncsim.schemes import AllGatherParameters, ReduceScatterGradients

    spent = dict.fromkeys(KINDS, 0.0)
    for action in plan:
        if isinstance(action, AllGatherParameters):
            t0 = time.perf_counter()
            for whole, shard in units:
                dist.all_gather_single(whole, shard, group=group)
            spent["allgather"] += time.perf_counter() - t0
        elif isinstance(action, ReduceScatterGradients):
            t0 = time.perf_counter()
            for whole, shard in reversed(units):
                dist.reduce_scatter_single(output=shard, input=whole, group=group)
            spent["reducescatter"] += time.perf_counter() - t0
    return spent


def _zero_step(zero, owned, group) -> dict[str, float]:
    """One step's ZeRO-1 collectives as the executor issues them (real.sharded.reduce_to_owners, then
    ZeroRedundancyOptimizer.step(): its owners' broadcasts). Seconds per kind."""
    from real.sharded import reduce_to_owners

    t0 = time.perf_counter()
    reduce_to_owners(owned, group)
    t1 = time.perf_counter()
    zero.step()
    return {"reducescatter": t1 - t0, "allgather": time.perf_counter() - t1}


def _zero_setup(model, group):
    """ZeroRedundancyOptimizer over ``model`` (SGD, lr 0: the broadcasts, not the values, are timed) and each
    rank's parameters (real.sharded.zero_owners, as the executor finds them)."""
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from real.sharded import zero_owners

    params = list(model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    zero = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, process_group=group, lr=0.0)
    return zero, zero_owners(zero, params, group, torch.device("cpu"))


def sharded_rank(out: str, scheme: str, model_name: str, repeats: int, idle: float) -> None:
    """One rank: the step's collectives of ``scheme`` with ``model_name``'s tensors, ``repeats`` times after a
    warm-up, each after ``idle`` seconds of compute; rank 0 writes {kind: [seconds per step, ...]}."""
    import torch.distributed as dist

    from real.calibration.timing import busy
    from real.models import build, param_layers, param_shapes
    from real.wire import WIRE_DTYPES, value_bytes
    from syncsim.files import write_atomic
    from syncsim.schemes import AllGatherParameters, parse
    from syncsim.schemes.policy import REPLICATED

    dist.init_process_group("gloo")
    group, world = dist.group.WORLD, dist.get_world_size()
    model = build(model_name, 0)
    layers = param_layers(model)
    spec = parse(scheme)
    policy = spec.policy(sum(layers), layers=layers, shapes=param_shapes(model))
    plan = policy.plan(1, 3)  # a middle step: what every step but the first and last issues
    if policy.layout.gradients == REPLICATED:
        zero, owned = _zero_setup(model, group)
        step = lambda: _zero_step(zero, owned, group)  # noqa: E731
    else:
        forward = next((a for a in plan if isinstance(a, AllGatherParameters) and a.phase == "forward"), None)
        sizes = forward.units if forward is not None and forward.units else (sum(layers) * spec.wire_ratio,)
        units = _unit_buffers(sizes, value_bytes(spec.precision), world, WIRE_DTYPES[spec.precision])
        step = lambda: _fsdp_step(plan, units, group)  # noqa: E731
    timings: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for repeat in range(repeats + 1):  # the first is a warm-up (connections, buffers)
        dist.barrier()
        busy(idle)  # the links rest while the core computes, as in a step, and their buckets refill
        spent = step()
        if repeat:
            for kind in KINDS:
                timings[kind].append(spent[kind])
    if dist.get_rank() == 0:
        write_atomic(out, json.dumps(timings))
    dist.destroy_process_group()
