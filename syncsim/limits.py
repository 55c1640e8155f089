"""The sizes syncsim refuses, and why: a run that cannot fit fails at once with the limit it hit.

Every limit is far above real use (the largest training clusters have about 10^5 GPUs; the
largest models a few TB of fp32 parameters), so it only stops typos and sizes that would
otherwise grow for minutes and end in MemoryError. What a run keeps in memory grows with
workers × steps; a run whose estimate exceeds this machine's memory is refused, saying how
much would fit.
"""

from __future__ import annotations

import os
from pathlib import Path

from syncsim.units import format_size

__all__ = ["MAX_GPUS", "MAX_PARAM_BYTES", "MAX_BUCKETS", "SIM_BYTES_PER_WORKER_STEP", "RUN_BYTES_PER_RANK_STEP",
           "memory_bytes", "check_memory"]

MAX_GPUS = 2**20
"""GPUs (and parameter-server hosts) in one cluster: 1,048,576, ten times the largest clusters built."""
MAX_PARAM_BYTES = 2.0**50
"""Parameter bytes of one model: 1 PiB, 280 trillion fp32 parameters."""
MAX_BUCKETS = 2**20
"""Gradient buckets per all-reduce (DDP's bucket_cap_mb): a 1 TB model in 1 MiB buckets still fits."""
SIM_BYTES_PER_WORKER_STEP = 512
"""What simulate keeps per worker-step (trace rows, update rows, step ends): 150-460 bytes measured,
by scheme; reading res.trace as a DataFrame takes about as much again."""
RUN_BYTES_PER_RANK_STEP = 2048
"""What a rank of a real run keeps per step: trace and update rows, step start, loss, checksum."""


def memory_bytes() -> int:
    """This machine's memory: physical RAM, or the cgroup's limit when that is lower (a container)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def check_memory(owner: str, units: int, what: str, per_unit: int, change: str) -> None:
    """Refuse ``units`` of ``what`` at ``per_unit`` bytes each when that exceeds this machine's memory."""
    need, have = units * per_unit, memory_bytes()
    if need > have:
        raise ValueError(f"{owner}: {units:,} {what} would keep about {need / 2**30:,.1f} GiB in memory "
                         f"(~{format_size(per_unit)} each), more than this machine's {have / 2**30:,.1f} GiB; at most "
                         f"{have // per_unit:,} fit here: {change}")
