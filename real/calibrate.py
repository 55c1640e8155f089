"""``python -m real.calibrate --model NAME --world N --out FILE.json``: measure this setup for syncsim.

Writes ``{"cluster": ..., "workload": ..., "fit": ...}``: ``Cluster.from_json``
and ``Workload.from_json`` read the first two keys, so ``simulate`` predicts
this very setup; "fit" keeps the raw sweeps and the quality of each fit.

- Compute: ``Workload.from_torch`` times forward and backward of one batch
  (median of repeats), without and with autocast (bf16 on CPU, fp16 on CUDA),
  once alone and once on every rank at the same time; the concurrent time
  (what a rank of a real run gets when ranks share cores and memory) becomes
  the workload's ``compute_time``, and ``--amp`` picks which. Threads: as many
  as a rank gets under real.run (OMP_NUM_THREADS, 1 by default).
- Network: ``world`` ranks (at least 2) started by torch's launcher run a
  ping-pong between ranks 0 and 1 and an all-reduce over all ranks, over
  message sizes from 1 KiB to 64 MiB. Each curve is fitted by least squares
  to the closed form the simulator uses (syncsim.collectives): one-way
  ``t = α + n/B`` and ring all-reduce ``t = L + 2(p-1)·α + 2(p-1)/p · n/B``.
  The ping-pong's α is the per-hop latency; the all-reduce's intercept less
  2(p-1) such hops is L, the fixed cost of one collective
  (``Cluster.collective_latency``), and its slope gives the bandwidth
  collectives reach. The fit weighs each point by 1/t (least squares on
  relative error), else the 64 MiB points decide everything and α comes out
  as noise; R² and relative residuals are reported. The worker link takes
  the per-hop α and the all-reduce bandwidth (what collectives see), the
  server link the ping-pong fit (what point-to-point pushes see).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from real.lifeline import die_with_parent
from syncsim.arguments import ArgumentParser, check_count, fail, integer
from syncsim.files import check_out_file
from syncsim.limits import MAX_GPUS, check_memory

__all__ = ["main", "fit_linear", "fit_theil_sen", "link_fits", "measure_compute"]

MAX_REPEATS = 10_000  # repeats per message size: 64 MiB messages 10,000 times is hours already

SIZES = tuple(2**k for k in range(10, 27, 2))  # 1 KiB .. 64 MiB, ×4 apart


def fit_linear(n: np.ndarray, t: np.ndarray) -> tuple[float, float, float, list[float]]:
    """Weighted least squares t ≈ a + b·n with weights 1/t; (a, b, R², relative residuals)."""
    w = 1.0 / t
    design = np.stack([np.ones_like(n), n], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    pred = a + b * n
    r2 = 1.0 - float(np.sum((t - pred) ** 2) / np.sum((t - t.mean()) ** 2))
    return float(a), float(b), r2, [float(x) for x in (t - pred) / t]


def fit_theil_sen(n: np.ndarray, t: np.ndarray) -> tuple[float, float, float, list[float]]:
    """Theil-Sen line t ≈ a + b·n through individual timings; (a, b, R², relative residuals).

    b is the median of the slopes between every two timings of different sizes, a the median of
    t − b·n (Sen 1968, Theil 1950). A timing that a stall of the machine inflated moves a least-squares
    line through every timing, and a median of a size's few timings when the stall took most of them;
    the pairwise median stays on the line as long as more than half of the pairs join undisturbed
    timings. Needs timings of at least two sizes."""
    n, t = np.asarray(n, dtype=float), np.asarray(t, dtype=float)
    i, j = np.triu_indices(len(n), 1)
    apart = n[i] != n[j]
    if not apart.any():
        raise ValueError(f"fit_theil_sen needs timings of at least two sizes, got sizes {sorted(set(n.tolist()))}")
    b = float(np.median((t[j] - t[i])[apart] / (n[j] - n[i])[apart]))
    a = float(np.median(t - b * n))
    pred = a + b * n
    spread = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - float(np.sum((t - pred) ** 2)) / spread if spread > 0 else 1.0
    return a, b, r2, [float(x) for x in (t - pred) / t]


def link_fits(probe_result: dict, min_bytes: float = 0.0) -> dict:
    """Fitted (α, B) of a probe's ping-pong and all-reduce curves, over messages of at least ``min_bytes``.

    One-way ``t = α + n/B``; ring all-reduce ``t = L + 2(p-1)·α + 2(p-1)/p · n/B`` solved for the
    launch cost L (α from the ping-pong) and B.
    """
    p = probe_result["world"]
    fits = {}
    for name in ("pingpong", "allreduce"):
        rows = [row for row in probe_result[name] if row[0] >= min_bytes]
        n, t = (np.array([row[i] for row in rows], dtype=float) for i in (0, 1))
        a, b, r2, res = fit_linear(n, t)
        if name == "pingpong":
            fit = {"alpha": max(a, 0.0), "bandwidth": 1.0 / b, "model": "t = alpha + n/B (one way)"}
        else:
            hop = fits["pingpong"]["alpha"]
            fit = {"alpha": hop, "launch": max(a - 2 * (p - 1) * hop, 0.0), "intercept": a,
                   "bandwidth": 2 * (p - 1) / (p * b), "ranks": p,
                   "model": "t = L + 2(p-1) alpha + 2(p-1)/p n/B (ring; alpha from the ping-pong)"}
        fits[name] = fit | {"r2": r2, "relative_residuals": res, "sizes": n.tolist(), "seconds": t.tolist()}
    return fits


def measure_compute(model_name: str, batch_size: int, amp: bool, device: str = "cpu"):
    import torch

    from real.data import load
    from real.models import build
    from syncsim.workload import Workload

    model = build(model_name, 0).to(device)
    x, _ = load("synthetic", 0).to(device).batch(0, 0, 1, batch_size)
    ctx = (torch.autocast(device, dtype=torch.bfloat16 if device == "cpu" else torch.float16)
           if amp else contextlib.nullcontext())
    with ctx:
        workload = Workload.from_torch(model, x, repeats=10, warmup=3, name=model_name + ("+amp" if amp else ""))
    return workload


# -- the probe each rank runs ------------------------------------------------------
def probe(out: str, repeats: int, model_name: str, batch_size: int, sizes: tuple[int, ...] = SIZES) -> None:
    import torch
    import torch.distributed as dist

    die_with_parent()  # a probe rank ends with its launcher (real.lifeline)
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    results = {"pingpong": [], "allreduce": [], "compute_concurrent": {}}
    # Compute while every other rank computes too, as in training: ranks share
    # the machine's cores and memory bandwidth, which a lone process does not see.
    for amp in (False, True):
        dist.barrier()
        workload = measure_compute(model_name, batch_size, amp)
        times = [None] * p
        dist.all_gather_object(times, workload.compute_time)
        results["compute_concurrent"]["amp" if amp else "fp32"] = float(np.mean(times))
    for size in sizes:
        buf = torch.zeros(size // 4, dtype=torch.float32)
        reps = repeats if size < 2**24 else max(3, repeats // 3)
        one_way, reduce = [], []
        for i in range(reps + 1):  # the first round warms up the connection
            dist.barrier()
            if rank in (0, 1):
                t0 = time.perf_counter()
                if rank == 0:
                    dist.send(buf, 1)
                    dist.recv(buf, 1)
                else:
                    dist.recv(buf, 0)
                    dist.send(buf, 0)
                if i:
                    one_way.append((time.perf_counter() - t0) / 2)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            elapsed = torch.tensor([time.perf_counter() - t0])
            # the collective is as slow as its slowest rank
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if i:
                reduce.append(float(elapsed))
        if rank == 0:
            results["pingpong"].append((size, float(np.median(one_way))))
            results["allreduce"].append((size, float(np.median(reduce))))
    if rank == 0:
        Path(out).write_text(json.dumps(results | {"world": p}))
    dist.destroy_process_group()


def measure_network(world: int, repeats: int, model_name: str, batch_size: int) -> dict:
    from real.run import start_ranks

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "probe.json")
        start_ranks(max(2, world), "real.calibrate", ["--probe", out, "--repeats", str(repeats),
                                                      "--model", model_name, "--batch-size", str(batch_size)])
        return json.loads(Path(out).read_text())


def main(argv: list[str] | None = None) -> int:
    from real.config import MODELS, RunConfig
    from real.run import RANK_BYTES

    ap = ArgumentParser(prog="python -m real.calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="lenet", choices=MODELS)
    ap.add_argument("--world", type=integer, default=2, help="ranks in the network sweep (>= 2)")
    ap.add_argument("--servers", type=integer, default=0, help="parameter-server hosts to put in the cluster")
    ap.add_argument("--batch-size", type=integer, default=32)
    ap.add_argument("--amp", action="store_true", help="use the autocast compute time as the workload")
    ap.add_argument("--repeats", type=integer, default=7)
    ap.add_argument("--out", default="results/real/calibration.json")
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        probe(args.probe, args.repeats, args.model, args.batch_size)
        return 0
    try:
        # the same bounds as a real run's, then the output file: all before anything is measured
        RunConfig(world=args.world, servers=0, model=args.model, batch_size=args.batch_size, out=tempfile.gettempdir())
        check_count("--servers", args.servers, 0, MAX_GPUS)
        check_count("--repeats", args.repeats, 1, MAX_REPEATS)
        check_memory("real.calibrate", max(2, args.world), "ranks on this machine", RANK_BYTES, "lower --world")
        check_out_file(args.out)
    except ValueError as err:
        return fail("real.calibrate", err)
    import torch

    from syncsim.cluster import Cluster, Link

    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    plain = measure_compute(args.model, args.batch_size, amp=False)
    mixed = measure_compute(args.model, args.batch_size, amp=True)
    net = measure_network(args.world, args.repeats, args.model, args.batch_size)
    p = net["world"]
    concurrent = net["compute_concurrent"]
    fit = {"model": args.model, "batch_size": args.batch_size, "threads": threads, "torch": torch.__version__,
           "compute": {name: {"compute_time": w.compute_time, "backward_fraction": w.backward_fraction,
                              "compute_time_concurrent": concurrent[name]}
                       for name, w in (("fp32", plain), ("amp", mixed))}}
    fit.update(link_fits(net))
    link = Link(bandwidth=fit["allreduce"]["bandwidth"], latency=fit["allreduce"]["alpha"])
    server_link = Link(bandwidth=fit["pingpong"]["bandwidth"], latency=fit["pingpong"]["alpha"])
    cluster = Cluster.homogeneous(gpus=args.world, link=link, servers=args.servers,
                                  server_link=server_link if args.servers else None, name="calibrated",
                                  collective_latency=fit["allreduce"]["launch"])
    # The workload takes the time measured with all ranks computing at once:
    # that is what a rank of a real run gets.
    workload = mixed if args.amp else plain
    workload = workload.replace(compute_time=concurrent["amp" if args.amp else "fp32"])
    from real.trace import write_atomic

    write_atomic(args.out, json.dumps({"cluster": cluster.to_dict(), "workload": workload.to_dict(), "fit": fit},
                                      indent=1))
    print(f"real.calibrate: {args.model} batch {args.batch_size}: compute {plain.compute_time * 1e3:.2f} ms alone, "
          f"{concurrent['fp32'] * 1e3:.2f} ms with {p} ranks computing (backward {plain.backward_fraction:.0%}); "
          f"with autocast {mixed.compute_time * 1e3:.2f} ms alone, {concurrent['amp'] * 1e3:.2f} ms with {p} ranks")
    for name in ("allreduce", "pingpong"):
        f = fit[name]
        launch = f" + launch {f['launch'] * 1e6:.1f} us" if "launch" in f else ""
        print(f"real.calibrate: {name}: alpha {f['alpha'] * 1e6:.1f} us/hop{launch}, "
              f"B {f['bandwidth'] / 1e9:.3f} GB/s, R² {f['r2']:.4f}, "
              f"max |relative residual| {max(map(abs, f['relative_residuals'])):.2f}")
    print(f"real.calibrate: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
