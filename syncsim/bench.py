"""Simulator speed, printed: ``python -m syncsim.bench`` (``--quick`` for a smoke run).

1. Synchronous ring all-reduce on 1,024 GPUs (128 nodes x 8) for 1,000 steps
   with jitter: wall time and simulated GPU-steps per second (goal <= 5 s).
2. Asynchronous parameter server with 1,024 workers: applied updates per
   second (goal >= 100k), next to the ceiling of bare SimPy on this machine for
   the minimum three events an update needs (compute done, push done, pull
   done) with no simulation logic at all, measured in the same run.
3. Wall time against GPUs x steps from 64 to 4,096 GPUs and the fitted
   exponent of wall ~ (GPUs x steps)^b (goal b <= 1.1).
4. The schemes that trade bytes for steps (PowerSGD, top-k, DiLoCo) on the
   cluster of [1], with their compressors' own work priced: wall time and
   GPU-steps per second of each, beside synchronous all-reduce's.
5. Sharded data parallelism (FSDP, ZeRO-3) training Llama 2 7B (34 units: a
   gather before each unit's forward and backward, a reduce-scatter after it)
   on the cluster of [1] for 1,000 steps: wall time (goal <= 10 s).

Timed figures are the best of three runs; the async figure and its ceiling
are measured interleaved, so their ratio is robust to machine load.
"""

from __future__ import annotations

import gc
import sys
import time

import numpy as np
import simpy

from syncsim import Cluster, Workload, simulate
from syncsim.arguments import ArgumentParser

REPEATS = 3  # best of three: this machine is shared and noisy
# [4]'s schemes. The workload's compression rates are set so that the compressors' work is simulated too
# (what the rates are does not change what a step costs the simulator): an A100's FP32 rate, 19.5 TFLOP/s,
# and a pass reading two fp32 arrays and writing one at its 1,555 GB/s of HBM2 (A100 40GB datasheet).
COMPRESSING = ("allreduce", "allreduce:compression=powersgd,rank=4", "topk:ratio=0.01", "diloco:period=100,fragments=4")
BENCH_RATES = dict(compress_flops=19.5e12, scan_rate=1555e9 / 12)
# [5]'s schemes, in mixed precision as large models train.
SHARDED = ("fsdp:precision=bf16", "zero:stage=3,precision=bf16")


def bare_simpy_ceiling(workers: int, steps: int) -> float:
    """Updates/s of W processes each waiting on three events per update, nothing else."""
    env = simpy.Environment()
    rng = np.random.default_rng(0)

    def resume(event: simpy.Event):
        def callback(_):
            event._ok, event._value = True, None
            callbacks, event.callbacks = event.callbacks, None
            for cb in callbacks:
                cb(event)
        return callback

    def worker(jitter: np.ndarray):
        for step in range(steps):
            yield env.timeout(0.1 * jitter[step])
            for _ in range(2):  # push done, pull done: a link timer resuming the worker
                done = env.event()
                env.timeout(0.01).callbacks.append(resume(done))
                yield done

    for _ in range(workers):
        env.process(worker(rng.lognormal(0, 0.05, steps)))
    gc.disable()  # as simulate() does
    try:
        start = time.perf_counter()
        env.run()
        return workers * steps / (time.perf_counter() - start)
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m syncsim.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, figures not meaningful")
    args = parser.parse_args(argv)
    scale = 16 if args.quick else 1
    workload = Workload.preset("resnet50")
    _bench_allreduce(workload, scale)
    _bench_async_ps(workload, scale)
    _bench_scaling(workload, args.quick)

    gpus, steps = 1024 // scale, 200 // scale
    cluster = Cluster.preset("a100-100g", gpus=gpus).replace(jitter=0.05)
    rated = workload.replace(**BENCH_RATES)
    print(f"[4] schemes that trade bytes for steps, {cluster.nodes} nodes x {cluster.gpus_per_node} GPUs x {steps} "
          f"steps, jitter 0.05, compression priced:")
    _time_schemes(cluster, rated, COMPRESSING, steps, "")

    gpus, steps = 1024 // scale, 1000 // scale
    cluster = Cluster.preset("a100-100g", gpus=gpus).replace(jitter=0.05)
    llama = Workload.preset("llama2-7b")
    print(f"[5] sharded data parallelism, llama2-7b, {cluster.nodes} nodes x {cluster.gpus_per_node} GPUs x {steps} "
          f"steps, jitter 0.05:")
    _time_schemes(cluster, llama, SHARDED, steps, "goal <= 10 s; ")
    return 0


def _bench_allreduce(workload: Workload, scale: int) -> None:
    """[1]: the synchronous hot path, the fastest of REPEATS runs."""
    gpus, steps = 1024 // scale, 1000 // scale
    cluster = Cluster.preset("a100-100g", gpus=gpus).replace(jitter=0.05)
    res = min((simulate(cluster, workload, "allreduce", steps=steps, seed=0) for _ in range(REPEATS)),
              key=lambda r: r.wall_time)
    rate = gpus * steps / res.wall_time
    print(f"[1] sync ring all-reduce, {cluster.nodes} nodes x {cluster.gpus_per_node} GPUs x {steps} steps, "
          f"jitter 0.05: {res.wall_time:.2f} s wall, {rate / 1e3:.0f}k GPU-steps/s (goal <= 5 s, >= 200k/s)")


def _bench_async_ps(workload: Workload, scale: int) -> None:
    """[2]: applied updates per second of an asynchronous parameter server, against bare SimPy's ceiling."""
    workers, ps_steps = 1024 // scale, 100 // scale
    cluster = Cluster.preset("a100-100g", gpus=workers).replace(jitter=0.05, servers=16)
    updates = ceiling = 0.0
    for _ in range(REPEATS):  # interleaved, so both see the same machine
        res = simulate(cluster, workload, "ps:mode=async", steps=ps_steps, seed=0)
        updates = max(updates, len(res.updates) / res.wall_time)
        ceiling = max(ceiling, bare_simpy_ceiling(workers, ps_steps))
    print(f"[2] async PS, {workers} workers, 16 servers, {ps_steps} steps: {updates / 1e3:.0f}k applied updates/s "
          f"(goal >= 100k); bare SimPy, 3 events/update, no logic: {ceiling / 1e3:.0f}k/s "
          f"-> engine at {updates / ceiling:.0%} of that ceiling")


def _bench_scaling(workload: Workload, quick: bool) -> None:
    """[3]: how wall time grows with GPUs x steps, a power law fitted over the sizes."""
    sizes = [64, 256, 1024, 4096] if not quick else [16, 32, 64]
    points = []
    for g in sizes:
        for s in ((50, 200) if not quick else (10, 20)):
            cluster = Cluster.preset("a100-100g", gpus=g).replace(jitter=0.05)
            res = simulate(cluster, workload, "allreduce", steps=s, seed=0)
            points.append((g * s, res.wall_time))
            print(f"    {g:5d} GPUs x {s:4d} steps: {res.wall_time:6.3f} s")
    x, y = np.log([p[0] for p in points]), np.log([p[1] for p in points])
    slope = np.polyfit(x, y, 1)[0]
    print(f"[3] wall ~ (GPUs x steps)^b over {sizes[0]}..{sizes[-1]} GPUs: b = {slope:.3f} (goal <= 1.1)")


def _time_schemes(cluster: Cluster, workload: Workload, schemes, steps: int, note: str) -> None:
    """One line per scheme: the fastest of REPEATS runs' wall time and rate, and its simulated step."""
    for scheme in schemes:
        res = min((simulate(cluster, workload, scheme, steps=steps, seed=0) for _ in range(REPEATS)),
                  key=lambda r: r.wall_time)
        print(f"    {scheme:40s} {res.wall_time:6.3f} s wall, {cluster.gpus * steps / res.wall_time / 1e3:5.0f}k "
              f"GPU-steps/s ({note}simulated step {res.step_time * 1e3:.2f} ms)")


if __name__ == "__main__":
    sys.exit(main())
