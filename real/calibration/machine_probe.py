"""What each rank of the user calibration (``python -m real.calibrate``) measures: a training step's
forward and backward, the compressors' rates, both with every rank at work at once, and a ping-pong and an
all-reduce swept over message sizes (fitted by real.calibration.fits.link_fits)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import numpy as np

from real.calibration.compression import measure_compression
from real.calibration.timing import timed_once
from real.lifeline import die_with_parent

__all__ = ["MAX_REPEATS", "SIZES", "measure_forward_backward", "machine_rank"]

MAX_REPEATS = 10_000  # repeats per message size: 64 MiB messages 10,000 times is hours already

SIZES = tuple(2**k for k in range(10, 27, 2))  # 1 KiB .. 64 MiB, ×4 apart


def measure_forward_backward(model_name: str, batch_size: int, amp: bool, device: str = "cpu"):
    """The Workload of ``model_name`` whose compute_time is one batch's forward and backward as
    ``Workload.from_torch`` times it (median of repeats), under autocast with ``amp`` (bf16 on CPU, fp16
    on CUDA)."""
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


def machine_rank(out: str, repeats: int, model_name: str, batch_size: int, sizes: tuple[int, ...] = SIZES,
                 powersgd_rank: int = 1) -> None:
    """One rank of the user calibration's probe; rank 0 writes {"pingpong", "allreduce": rows (size,
    median seconds), "compute_concurrent", "compression_concurrent", "world"} to ``out``."""
    import torch.distributed as dist

    die_with_parent()  # a probe rank ends with its launcher (real.lifeline)
    dist.init_process_group("gloo")
    results = {"pingpong": [], "allreduce": [],
               "compute_concurrent": _concurrent_compute(model_name, batch_size),
               "compression_concurrent": _concurrent_compression(model_name, powersgd_rank, repeats)}
    for size in sizes:
        one_way, reduce = _time_size(size, repeats if size < 2**24 else max(3, repeats // 3))
        if dist.get_rank() == 0:
            results["pingpong"].append((size, float(np.median(one_way))))
            results["allreduce"].append((size, float(np.median(reduce))))
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(results | {"world": dist.get_world_size()}))
    dist.destroy_process_group()


def _concurrent_compute(model_name: str, batch_size: int) -> dict:
    """The ranks' mean forward-and-backward time, fp32 and with autocast, every rank computing at once."""
    import torch.distributed as dist

    # Compute while every other rank computes too, as in training: ranks share
    # the machine's cores and memory bandwidth, which a lone process does not see.
    concurrent = {}
    for amp in (False, True):
        dist.barrier()
        workload = measure_forward_backward(model_name, batch_size, amp)
        times = [None] * dist.get_world_size()
        dist.all_gather_object(times, workload.compute_time)
        concurrent["amp" if amp else "fp32"] = float(np.mean(times))
    return concurrent


def _concurrent_compression(model_name: str, powersgd_rank: int, repeats: int) -> dict:
    """compress_flops and scan_rate with every rank measuring at once: the ranks' mean time per unit of
    work (a harmonic mean of their rates), as compute takes the mean time."""
    import torch.distributed as dist

    dist.barrier()
    rates = measure_compression(model_name, powersgd_rank, max(3, repeats),
                                int(os.environ.get("OMP_NUM_THREADS", "1")))
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (rates["compress_flops"], rates["scan_rate"]))
    concurrent = {}
    for i, name in enumerate(("compress_flops", "scan_rate")):
        values = [g[i] for g in gathered if g[i] is not None]
        concurrent[name] = float(len(values) / sum(1 / v for v in values)) if values else None
    return concurrent


def _time_size(size: int, reps: int) -> tuple[list[float], list[float]]:
    """(one-way ping-pong times between ranks 0 and 1, all-reduce times over every rank) of a ``size``-byte
    fp32 message, ``reps`` of each after one warm-up round."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    buf = torch.zeros(size // 4, dtype=torch.float32)
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
        elapsed = timed_once(lambda: dist.all_reduce(buf), idle=0.0)  # as slow as its slowest rank
        if i:
            reduce.append(elapsed)
    return one_way, reduce
