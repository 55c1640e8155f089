"""The server probe: one worker and one parameter server on a 2-host testbed, no model, timing the
executor's push-and-wait and pull (real.server's protocol) beyond what the link carries; fitted by
real.calibration.server_fit."""

from __future__ import annotations

import json
import time
from pathlib import Path

from real.calibration.cache import cached, slug
from real.calibration.messages import PRECISIONS
from real.calibration.timing import refill_idle

__all__ = ["SERVER_REPEATS", "measure_server", "server_rank"]

SERVER_REPEATS = 20  # timed push-and-waits and pulls (after one untimed warm-up of each)


def measure_server(bandwidth: str, folder: Path, size: int, precision: str = "fp32", prefix: str = "sstb",
                   repeats: int = SERVER_REPEATS) -> dict:
    """The server protocol timed on a 2-host testbed at ``bandwidth`` with a payload of ``size`` bytes at
    the wire ``precision``: {"bandwidth", "size", "precision", "push_wait": [...], "pull": [...]},
    seconds, cached under ``folder`` (the calibration's cache: the same rate and size are timed once)."""
    if precision not in PRECISIONS:
        raise ValueError(f"measure_server: precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    name = f"server-{slug(bandwidth)}-{int(size)}-{precision}"

    def measure() -> dict:
        from real.testbed.launcher import torchrun_on
        from real.testbed.namespaces import Testbed

        out = folder / f"{name}.raw.json"
        with Testbed(hosts=2, bandwidth=bandwidth, prefix=prefix) as bed:
            idle = refill_idle(bed.config)
            codes = torchrun_on(bed, "real.calibration",
                                ["--server", str(out), "--size", str(int(size)), "--precision", precision,
                                 "--repeats", str(repeats), "--idle", str(idle)],
                                folder / "logs", timeout=900, agent=False)
        if any(codes):
            raise RuntimeError(f"server probe at {bandwidth} failed (node exit codes {codes}); logs in {folder}/logs")
        return {"bandwidth": bandwidth, "size": int(size), "precision": precision} | json.loads(out.read_text())

    return cached(folder / f"{name}.json", measure)


# -- what the ranks run -------------------------------------------------------------
def server_rank(out: str, size: int, precision: str, repeats: int, idle: float) -> None:
    """Rank 0 a worker pushing (with a clock wait, as a synchronous server's worker does) and pulling,
    rank 1 a server; the worker writes the timings."""
    import torch
    import torch.distributed as dist

    from real.server import Client, Server
    from real.trace import Recorder
    from real.wire import WIRE_DTYPES, value_bytes
    from syncsim.files import write_atomic

    dist.init_process_group("gloo")
    wire = WIRE_DTYPES[precision]
    numel = max(1, size // value_bytes(precision))
    if dist.get_rank() == 1:
        Server(1, 1, 1, torch.zeros(numel), 0.0, wire, Recorder(time.time())).run()
    else:
        client, grad = Client(1, 1, numel, wire), torch.zeros(numel)
        timings: dict[str, list[float]] = {"push_wait": [], "pull": []}
        for step in range(repeats + 1):  # the first of each is a warm-up (connections, buffers)
            time.sleep(idle)  # the links rest, as a step's compute rests them, and their buckets refill
            t0 = time.perf_counter()
            client.push(grad, step, aggregate=True)
            client.wait(step, step + 1)  # this push applied: the synchronous server's round
            t1 = time.perf_counter()
            time.sleep(idle)
            t2 = time.perf_counter()
            client.pull(step)
            t3 = time.perf_counter()
            if step:
                timings["push_wait"].append(t1 - t0)
                timings["pull"].append(t3 - t2)
        client.stop()
        write_atomic(out, json.dumps(timings))
    dist.destroy_process_group()
