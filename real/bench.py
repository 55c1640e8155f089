"""``python -m real.bench``: the executor's overhead, and its bytes against the simulator's count.

1. Throughput: the executor running ``allreduce`` against a plain hand-written
   DDP loop (same model, data, batches, optimizer and world; DDP's default
   C++ all-reduce, no hook, no trace). Both run in the same ranks, one after
   the other, ``--repeats`` times (so both see the same process placement and
   machine load, which on a small machine varies more between launches than
   the overhead being measured); medians are compared. Goal: ratio >= 0.95.
2. Bytes: every scheme for a few steps; the payload bytes the executor's
   handlers counted per worker per step against ``policy.wire_bytes(steps) /
   steps``, the simulator's count for the same spec and model. Goal: within 1%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from real.lifeline import die_with_parent
from syncsim.arguments import ArgumentParser, check_count, fail, integer, number
from syncsim.limits import check_memory

__all__ = ["main", "BYTE_SCHEMES"]

MAX_REPEATS = 1000  # alternating runs of the executor and the plain loop

BYTE_SCHEMES = (
    ("allreduce", 0), ("allreduce:precision=fp16", 0), ("allreduce:precision=bf16,overlap=false", 0),
    ("ps", 1), ("ps:mode=async", 2), ("ps:staleness=2,precision=fp16", 1),
    ("localsgd:period=4", 0), ("localsgd:period=3,warmup_steps=2,precision=bf16", 0),
)


def step_time(rows: list[tuple], batch_size: int) -> float:
    """Steady-state step time of trace rows from every rank, by the definition of syncsim.metrics."""
    import pandas as pd

    from syncsim.metrics import steady_state
    from syncsim.recorder import TRACE_COLUMNS, UPDATE_COLUMNS

    trace = pd.DataFrame(rows, columns=list(TRACE_COLUMNS))
    return steady_state(trace, pd.DataFrame(columns=list(UPDATE_COLUMNS)), batch_size).step_time


def plain_loop(model, data, steps: int, batch_size: int, lr: float) -> list[tuple]:
    """The reference: the DDP training loop of torch's DDP tutorial, nothing added but one trace row per step."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    rows = []
    t0 = time.time()
    for step in range(steps):
        start = time.time() - t0
        x, y = data.batch(rank, step, world, batch_size)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        rows.append((rank, step, "compute", start, time.time() - t0, 0))
    return rows


def side_by_side(args: argparse.Namespace) -> None:
    """One rank of the throughput comparison: executor and plain loop alternate in the same processes."""
    import torch
    import torch.distributed as dist

    from real.config import RunConfig
    from real.data import load
    from real.executor import Executor
    from real.models import build
    from real.trace import Recorder

    die_with_parent()  # a benchmark rank ends with its launcher (real.lifeline)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = RunConfig(scheme="allreduce", world=world, model=args.model, data=args.data, steps=args.steps,
                    batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    data = load(args.data, args.seed)
    rows = {"executor": [], "plain": []}  # this rank's trace rows, per repeat
    for repeat in range(args.repeats):
        order = ("executor", "plain") if repeat % 2 == 0 else ("plain", "executor")  # neither always goes first
        for which in order:
            if which == "executor":
                ex = Executor(cfg, rank, build(args.model, args.seed), data, torch.device("cpu"), dist.group.WORLD,
                              Recorder(time.time()))
                ex.run()
                rows["executor"].append(ex.recorder.trace)
            else:
                rows["plain"].append(plain_loop(build(args.model, args.seed), data, args.steps,
                                                args.batch_size, args.lr))
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        times = {k: [step_time([row for g in gathered for row in g[k][i]], args.batch_size)
                     for i in range(args.repeats)] for k in rows}
        Path(args.side_by_side).write_text(json.dumps(times))
    dist.destroy_process_group()


def run_executor(scheme: str, servers: int, args, out: str, steps: int) -> dict:
    from real.config import RunConfig
    from real.run import launch

    cfg = RunConfig(scheme=scheme, world=args.world, servers=servers, model=args.model, data=args.data,
                    steps=steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed, out=out)
    code, message = launch(cfg)
    if code:
        raise RuntimeError(message)
    return json.loads((Path(out) / "summary.json").read_text())


def run_side_by_side(args, tmp: str) -> dict:
    from real.run import start_ranks

    path = os.path.join(tmp, "throughput.json")
    start_ranks(args.world, "real.bench", ["--side-by-side", path, "--model", args.model, "--data", args.data,
                                           "--steps", str(args.steps), "--batch-size", str(args.batch_size),
                                           "--lr", str(args.lr), "--seed", str(args.seed),
                                           "--repeats", str(args.repeats)])
    return json.loads(Path(path).read_text())


def parser() -> ArgumentParser:
    from real.config import DATA, MODELS

    ap = ArgumentParser(prog="python -m real.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="lenet", choices=MODELS)
    ap.add_argument("--data", default="synthetic", choices=DATA)
    ap.add_argument("--world", type=integer, default=2)
    ap.add_argument("--steps", type=integer, default=100)
    ap.add_argument("--batch-size", type=integer, default=64)
    ap.add_argument("--lr", type=number, default=0.05)
    ap.add_argument("--seed", type=integer, default=0)
    ap.add_argument("--repeats", type=integer, default=3)
    ap.add_argument("--byte-steps", type=integer, default=8)
    ap.add_argument("--skip-bytes", action="store_true")
    ap.add_argument("--side-by-side", help=argparse.SUPPRESS)
    return ap


def check(args: argparse.Namespace) -> None:
    """Every run this benchmark makes, checked as real.run would before any rank starts."""
    from real.config import RunConfig
    from real.run import RANK_BYTES

    check_count("--steps", args.steps, 5)
    check_count("--repeats", args.repeats, 1, MAX_REPEATS)
    check_count("--byte-steps", args.byte_steps, 1)
    for flag, steps in (("--steps", args.steps + 1), ("--byte-steps", args.byte_steps)):
        try:
            RunConfig(world=args.world, model=args.model, data=args.data, steps=steps, batch_size=args.batch_size,
                      lr=args.lr, seed=args.seed, out=tempfile.gettempdir())
        except ValueError as err:
            raise ValueError(f"{err} (from {flag})" if "RunConfig.steps" in str(err) else str(err)) from None
    servers = max(servers for _, servers in BYTE_SCHEMES)
    check_memory("real.bench", args.world + servers, "ranks on this machine", RANK_BYTES, "lower --world")


def print_throughput(args: argparse.Namespace, times: dict) -> None:
    executor, plain = times["executor"], times["plain"]
    ex, pl = statistics.median(executor), statistics.median(plain)
    samples = args.world * args.batch_size
    print(f"\nreal.bench: throughput, {args.model} on {args.world} gloo ranks, batch {args.batch_size}/worker, "
          f"{args.steps} steps, median of {args.repeats}")
    print(f"  plain DDP loop      {samples / pl:9.1f} samples/s  ({pl * 1e3:.2f} ms/step; runs "
          + ", ".join(f"{t * 1e3:.2f}" for t in plain) + ")")
    print(f"  real executor       {samples / ex:9.1f} samples/s  ({ex * 1e3:.2f} ms/step; runs "
          + ", ".join(f"{t * 1e3:.2f}" for t in executor) + ")")
    print(f"  ratio executor/plain = {pl / ex:.3f}  (goal >= 0.95)")


def compare_bytes(args: argparse.Namespace, tmp: str) -> None:
    """Each byte scheme's payload per worker per step, the executor's count against the simulator's."""
    import real.models
    from syncsim.schemes import parse

    model = real.models.build(args.model, args.seed)
    layers = real.models.param_layers(model)
    print(f"\nreal.bench: payload bytes per worker per step, {args.model} ({sum(layers) / 1e6:.3f} MB fp32), "
          f"{args.byte_steps} steps")
    print(f"  {'scheme':48s} {'servers':>7s} {'executor':>12s} {'simulator':>12s} {'diff':>8s}")
    worst = 0.0
    for scheme, servers in BYTE_SCHEMES:
        summary = run_executor(scheme, servers, args, os.path.join(tmp, "bytes"), args.byte_steps)
        policy = parse(scheme).policy(sum(layers), layers=layers)
        sim = policy.wire_bytes(args.byte_steps) / args.byte_steps
        got = summary["bytes_per_worker_step"]
        diff = (got - sim) / sim
        worst = max(worst, abs(diff))
        print(f"  {scheme:48s} {servers:7d} {got:12.0f} {sim:12.0f} {diff:+8.3%}")
    print(f"  largest difference {worst:.3%}  (goal <= 1%)")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.side_by_side:
        side_by_side(args)
        return 0
    try:
        check(args)
    except ValueError as err:
        return fail("real.bench", err)
    with tempfile.TemporaryDirectory() as tmp:
        print_throughput(args, run_side_by_side(args, tmp))
        if not args.skip_bytes:
            compare_bytes(args, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
