"""The rates of a compressor's own work on this machine (syncsim's Workload.compress_flops and scan_rate),
timed with syncsim.compression's own arithmetic, as the executor runs it."""

from __future__ import annotations

import time

import numpy as np

__all__ = ["measure_compression", "median_seconds"]


def median_seconds(work, repeats: int, warmup: int = 2) -> float:
    """The median time of ``repeats`` calls of ``work()`` after ``warmup`` untimed ones."""
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
    from syncsim.compression.work import compression_work
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
    gradient = rng.standard_normal(n)
    k = TopK().k(n)
    with threadpool_limits(threads, user_api="blas"):
        seconds = _time_compressors(factors, gradient, k, shapes, rank, scheme.min_compression, repeats)
    compress_flops = flops / seconds["products"] if seconds["products"] else None
    scan_rate = n / seconds["partition"]

    def priced(work) -> float:
        return sum((f / compress_flops if compress_flops else 0.0) + v / scan_rate for f, v in work)

    sparse_action = SparseAllGather(values=k, size=n, value_bytes=4)
    return {"compress_flops": compress_flops, "scan_rate": scan_rate, "rank": rank, "threads": threads,
            "matrices": [list(m) for m in matrices], "values": n, "k": k, "product_seconds": seconds["products"],
            "product_flops": flops, "partition_seconds": seconds["partition"],
            "check": {"topk": {"measured": seconds["topk"], "priced": priced(compression_work(sparse_action, 1))},
                      "powersgd": {"measured": seconds["powersgd"], "priced": priced(compression_work(action, 1))}}}


def _time_compressors(factors, gradient, k: int, shapes, rank: int, min_compression, repeats: int) -> dict:
    """Median seconds of PowerSGD's thin products over ``factors`` (None without a matrix), of a partition
    of ``gradient``'s magnitudes around its top ``k``, and, as the check, of top-k's and PowerSGD's whole
    per-worker work as the executor runs it, stage by stage, one worker (W = 1)."""
    from syncsim.compression import LowRank, Sparsifier, layout, scatter_mean

    def products():
        for m, q in factors:
            p = m @ q
            back = m.T @ p
            p @ back.T

    n = len(gradient)
    seconds = {"products": median_seconds(products, repeats) if factors else None}
    magnitude = np.abs(gradient)  # the pass alone: |Δ| is a pass of its own (compression_work counts it)
    seconds["partition"] = median_seconds(lambda: np.partition(magnitude, n - k), repeats)
    sparsifier = Sparsifier(n, k)

    def sparse():
        indices, values = sparsifier.compress(gradient)
        scatter_mean([indices], [values], n)

    seconds["topk"] = median_seconds(sparse, repeats)
    low_rank = LowRank(layout(shapes, rank, min_compression))

    def powersgd():
        plain, ps = low_rank.start(gradient)
        qs = low_rank.middle(ps)
        low_rank.finish(plain, qs)

    seconds["powersgd"] = median_seconds(powersgd, repeats)
    return seconds
