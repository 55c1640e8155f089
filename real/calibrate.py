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
- Compression (``measure_compression``): the rates at which a worker does a compressor's own work,
  the workload's ``compress_flops`` and ``scan_rate``, timed on what runs it: the executor carries
  out PowerSGD and top-k with syncsim.compression, numpy in float64 on the CPU, with as many BLAS
  threads as a rank gets. ``compress_flops``: PowerSGD's thin products P = MQ, Q = MᵀP and PQᵀ at
  the model's own matrix shapes and ``--rank`` (6·rows·cols·r FLOPs a matrix, over their time).
  ``scan_rate``: values/s of a partition of a gradient of the model's size around its top 1 %
  (top-k's costliest pass). Timed alone and on every rank at once, as compute is; the workload
  takes the concurrent rates. As a check, the whole of top-k's and PowerSGD's per-worker work
  (syncsim.compression's Sparsifier and LowRank, stage by stage) is timed too and set beside what the
  simulator charges for it at those rates (syncsim.engine.compression_work).
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

__all__ = ["main", "fit_linear", "fit_theil_sen", "link_fits", "measure_compute", "measure_compression"]

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


def _median_seconds(work, repeats: int, warmup: int = 2) -> float:
    times = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        work()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def measure_compression(model_name: str, rank: int = 1, repeats: int = 7, threads: int = 1) -> dict:
    """The rates of a compressor's own work on this machine (syncsim's Workload.compress_flops and
    scan_rate), timed with syncsim.compression's own arithmetic: numpy, float64, ``threads`` BLAS threads.

    compress_flops: PowerSGD's three thin products per matrix (P = MQ, Q = MᵀP, PQᵀ: 6·rows·cols·r FLOPs)
    over the matrices torch's rule compresses at ``rank`` (syncsim.schemes.allreduce.matrix_split; every
    tensor of two or more dimensions if none qualifies). scan_rate: the gradient's values over the time of
    np.partition of them around the top 1 % (TopK's default ratio): the pass that finds the k-th
    magnitude, the costliest of top-k's (numpy's introselect). "check": the whole of top-k's and
    PowerSGD's per-worker work, timed, beside what the simulator charges for it at these rates."""
    from threadpoolctl import threadpool_limits

    from real.models import build
    from syncsim.compression import LowRank, Sparsifier, layout, scatter_mean
    from syncsim.engine import compression_work
    from syncsim.schemes import AllReduce, SparseAllGather, TopK

    model = build(model_name, 0)
    shapes = tuple(tuple(int(d) for d in q.shape) for q in model.parameters() if q.requires_grad)
    n = sum(int(np.prod(shape)) for shape in shapes)
    rng = np.random.default_rng(0)
    scheme = AllReduce(compression="powersgd", rank=rank)
    action = scheme.low_rank(4.0 * n, None, shapes)
    matrices = action.matrices or tuple((shape[0], int(np.prod(shape)) // shape[0]) for shape in shapes
                                        if len(shape) > 1)
    factors = [(rng.standard_normal((rows, cols)), rng.standard_normal((cols, min(rank, rows, cols))))
               for rows, cols in matrices]
    flops = sum(6 * m.shape[0] * m.shape[1] * q.shape[1] for m, q in factors)

    def products():
        for m, q in factors:
            p = m @ q
            back = m.T @ p
            p @ back.T

    gradient = rng.standard_normal(n)
    k = TopK().k(n)
    with threadpool_limits(threads, user_api="blas"):
        product_seconds = _median_seconds(products, repeats) if factors else None
        magnitude = np.abs(gradient)  # the pass alone: |Δ| is a pass of its own (compression_work counts it)
        partition_seconds = _median_seconds(lambda: np.partition(magnitude, n - k), repeats)
        # the check: the compressors as the executor runs them, stage by stage, one worker (W = 1)
        sparsifier = Sparsifier(n, k)

        def sparse():
            indices, values = sparsifier.compress(gradient)
            scatter_mean([indices], [values], n)

        topk_seconds = _median_seconds(sparse, repeats)
        low_rank = LowRank(layout(shapes, rank, scheme.min_compression))

        def powersgd():
            plain, ps = low_rank.start(gradient)
            qs = low_rank.middle(ps)
            low_rank.finish(plain, qs)

        powersgd_seconds = _median_seconds(powersgd, repeats)
    compress_flops = flops / product_seconds if product_seconds else None
    scan_rate = n / partition_seconds

    def priced(work) -> float:
        return sum((f / compress_flops if compress_flops else 0.0) + v / scan_rate for f, v in work)

    sparse_action = SparseAllGather(values=k, size=n, value_bytes=4)
    return {"compress_flops": compress_flops, "scan_rate": scan_rate, "rank": rank, "threads": threads,
            "matrices": [list(m) for m in matrices], "values": n, "k": k, "product_seconds": product_seconds,
            "product_flops": flops, "partition_seconds": partition_seconds,
            "check": {"topk": {"measured": topk_seconds, "priced": priced(compression_work(sparse_action, 1))},
                      "powersgd": {"measured": powersgd_seconds, "priced": priced(compression_work(action, 1))}}}


# -- the probe each rank runs ------------------------------------------------------
def probe(out: str, repeats: int, model_name: str, batch_size: int, sizes: tuple[int, ...] = SIZES,
          powersgd_rank: int = 1) -> None:
    import torch
    import torch.distributed as dist

    die_with_parent()  # a probe rank ends with its launcher (real.lifeline)
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    results = {"pingpong": [], "allreduce": [], "compute_concurrent": {}, "compression_concurrent": {}}
    # Compute while every other rank computes too, as in training: ranks share
    # the machine's cores and memory bandwidth, which a lone process does not see.
    for amp in (False, True):
        dist.barrier()
        workload = measure_compute(model_name, batch_size, amp)
        times = [None] * p
        dist.all_gather_object(times, workload.compute_time)
        results["compute_concurrent"]["amp" if amp else "fp32"] = float(np.mean(times))
    dist.barrier()  # compression's rates, every rank at once too
    rates = measure_compression(model_name, powersgd_rank, max(3, repeats),
                                int(os.environ.get("OMP_NUM_THREADS", "1")))
    gathered = [None] * p
    dist.all_gather_object(gathered, (rates["compress_flops"], rates["scan_rate"]))
    for i, name in enumerate(("compress_flops", "scan_rate")):
        values = [g[i] for g in gathered if g[i] is not None]
        # the ranks' mean time per unit of work (a harmonic mean of their rates), as compute takes the mean time
        results["compression_concurrent"][name] = float(len(values) / sum(1 / v for v in values)) if values else None
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


def measure_network(world: int, repeats: int, model_name: str, batch_size: int, rank: int = 1) -> dict:
    from real.run import start_ranks

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "probe.json")
        start_ranks(max(2, world), "real.calibrate", ["--probe", out, "--repeats", str(repeats),
                                                      "--model", model_name, "--batch-size", str(batch_size),
                                                      "--rank", str(rank)])
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
    ap.add_argument("--rank", type=integer, default=1,
                    help="PowerSGD rank whose thin products set compress_flops (torch's default: 1)")
    ap.add_argument("--out", default="results/real/calibration.json")
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        probe(args.probe, args.repeats, args.model, args.batch_size, powersgd_rank=args.rank)
        return 0
    try:
        # the same bounds as a real run's, then the output file: all before anything is measured
        RunConfig(world=args.world, servers=0, model=args.model, batch_size=args.batch_size, out=tempfile.gettempdir())
        check_count("--servers", args.servers, 0, MAX_GPUS)
        check_count("--repeats", args.repeats, 1, MAX_REPEATS)
        check_count("--rank", args.rank, 1, 2**20)
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
    compression = measure_compression(args.model, args.rank, args.repeats, threads)
    net = measure_network(args.world, args.repeats, args.model, args.batch_size, args.rank)
    p = net["world"]
    concurrent = net["compute_concurrent"]
    fit = {"model": args.model, "batch_size": args.batch_size, "threads": threads, "torch": torch.__version__,
           "compute": {name: {"compute_time": w.compute_time, "backward_fraction": w.backward_fraction,
                              "compute_time_concurrent": concurrent[name]}
                       for name, w in (("fp32", plain), ("amp", mixed))},
           "compression": compression | {"concurrent": net["compression_concurrent"]}}
    fit.update(link_fits(net))
    link = Link(bandwidth=fit["allreduce"]["bandwidth"], latency=fit["allreduce"]["alpha"])
    server_link = Link(bandwidth=fit["pingpong"]["bandwidth"], latency=fit["pingpong"]["alpha"])
    cluster = Cluster.homogeneous(gpus=args.world, link=link, servers=args.servers,
                                  server_link=server_link if args.servers else None, name="calibrated",
                                  collective_latency=fit["allreduce"]["launch"])
    # The workload takes the time measured with all ranks computing at once:
    # that is what a rank of a real run gets.
    workload = mixed if args.amp else plain
    workload = workload.replace(compute_time=concurrent["amp" if args.amp else "fp32"],
                                **net["compression_concurrent"])  # compress_flops, scan_rate: every rank at once
    from real.trace import write_atomic

    write_atomic(args.out, json.dumps({"cluster": cluster.to_dict(), "workload": workload.to_dict(), "fit": fit},
                                      indent=1))
    print(f"real.calibrate: {args.model} batch {args.batch_size}: compute {plain.compute_time * 1e3:.2f} ms alone, "
          f"{concurrent['fp32'] * 1e3:.2f} ms with {p} ranks computing (backward {plain.backward_fraction:.0%}); "
          f"with autocast {mixed.compute_time * 1e3:.2f} ms alone, {concurrent['amp'] * 1e3:.2f} ms with {p} ranks")
    rates, check = net["compression_concurrent"], compression["check"]
    flops_text = (f"{compression['compress_flops'] / 1e9:.2f} GFLOP/s alone, {rates['compress_flops'] / 1e9:.2f} "
                  f"with {p} ranks" if rates["compress_flops"] else "not measured (no matrix)")
    print(f"real.calibrate: compression: thin products (rank {args.rank}, {len(compression['matrices'])} matrices) "
          f"{flops_text}; scan {compression['scan_rate'] / 1e6:.1f} M values/s alone, "
          f"{rates['scan_rate'] / 1e6:.1f} with {p} ranks (partition of {compression['values']:,} values)")
    print(f"real.calibrate: compression check, one worker alone: top-k's own work "
          f"{check['topk']['measured'] * 1e3:.2f} ms measured, {check['topk']['priced'] * 1e3:.2f} ms priced at "
          f"these rates; PowerSGD's "
          f"{check['powersgd']['measured'] * 1e3:.2f} ms measured, {check['powersgd']['priced'] * 1e3:.2f} ms priced")
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
