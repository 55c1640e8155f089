"""One rank of a real run: ``torchrun --nproc-per-node N -m real.worker [options]``.

Ranks 0..world-1 are workers (real.executor), ranks world..world+servers-1
parameter servers (real.server). One code path from 1 rank to many, rank and
world size from torchrun's environment (nanoGPT's pattern); multi-node runs
use torchrun's own c10d rendezvous (``--nnodes``, ``--rdzv-backend c10d``,
``--rdzv-endpoint HOST:PORT``). Each rank writes its files under OUT/ranks/;
after the final barrier rank 0 merges them (real.trace.merge).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from real.config import RunConfig
from real.data import load
from real.executor import Executor, flat_params
from real.hooks import WIRE_DTYPES
from real.models import build
from real.server import Server
from real.trace import Recorder, merge, rank_dir

__all__ = ["main", "Progress"]

# NCCL's algorithm names for the spec's collective algorithm (NCCL_ALGO, see
# NCCL's environment-variable docs). gloo picks its own all-reduce algorithm;
# there the spec's algorithm is a simulator cost-model knob only.
NCCL_ALGO = {"ring": "Ring", "tree": "Tree"}


class Progress:
    """The step a rank last started, kept in OUT/ranks/progress-rank<R> so that a
    hung or killed rank's step can still be named. One 12-byte pwrite per step."""

    def __init__(self, out: str, rank: int):
        path = rank_dir(out) / f"progress-rank{rank}"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def __call__(self, step: int) -> None:
        os.pwrite(self.fd, f"{step:>11}\n".encode(), 0)

    @staticmethod
    def read(out: str, rank: int) -> int | None:
        try:
            return int((rank_dir(out) / f"progress-rank{rank}").read_text())
        except (OSError, ValueError):
            return None


def setup(cfg: RunConfig) -> tuple[int, torch.device]:
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if size != cfg.ranks:
        raise SystemExit(f"real.worker: {size} ranks were started but --world {cfg.world} --servers "
                         f"{cfg.servers} needs {cfg.ranks} (torchrun --nproc-per-node {cfg.ranks})")
    if cfg.device == "cuda" and rank < cfg.world:  # servers keep their shards in host memory
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = cfg.backend
    if backend == "nccl":
        # the collective algorithm the plan's collectives ask for (ring, tree, ...)
        algorithms = {a.algorithm for a in cfg.actions if hasattr(a, "algorithm")}
        algorithm = algorithms.pop() if len(algorithms) == 1 else None
        if algorithm in NCCL_ALGO:
            os.environ.setdefault("NCCL_ALGO", NCCL_ALGO[algorithm])
        # Parameter-server messages and the start-time broadcast are CPU
        # tensors, which NCCL does not carry: route CPU tensors over gloo.
        backend = "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, timeout=timedelta(seconds=cfg.timeout))
    return rank, device


def start_time() -> float:
    # A common time origin once every rank is set up: rank 0's clock, sent to
    # everyone (ranks on other hosts keep their clock offset; NTP holds that
    # to about a millisecond).
    t0 = torch.tensor([time.time()], dtype=torch.float64)
    dist.broadcast(t0, src=0)
    return float(t0)


@record
def main(argv: list[str] | None = None) -> None:
    cfg = RunConfig.from_argv(argv)
    rank, device = setup(cfg)
    progress = Progress(cfg.out, rank)
    recorder = Recorder(time.time())
    workers = dist.new_group(list(range(cfg.world))) if cfg.servers else dist.group.WORLD
    config = dataclasses.asdict(cfg)
    role = "worker" if rank < cfg.world else "server"
    actor = None
    try:
        model = build(cfg.model, cfg.seed).to(device)
        if role == "worker":
            data = load(cfg.data, cfg.seed).to(device)
            actor = Executor(cfg, rank, model, data, device, workers, recorder, progress)
            recorder.t0 = start_time()
            actor.run()
            result = actor.result()
            if cfg.save_params:
                torch.save(model.state_dict(), rank_dir(cfg.out) / f"params-rank{rank}.pt")
        else:
            fail = cfg.failure(rank)
            actor = Server(rank, cfg.world, cfg.servers, flat_params(model).cpu(), cfg.lr,
                           WIRE_DTYPES[cfg.spec.precision], recorder, slow=cfg.slow_factor(rank),
                           fail_step=fail[0] if fail else None, fail_mode=fail[1] if fail else "crash",
                           progress=progress)
            recorder.t0 = start_time()
            actor.run()
            result = actor.result()
        recorder.write(cfg.out, rank, result | {"error": None})
        dist.barrier()
        if rank == 0:
            merge(cfg.out, config, complete=True)
        dist.destroy_process_group()
    except Exception as err:
        step = getattr(actor, "step", None)
        where = f"at step {step}" if step is not None and step >= 0 else "during setup"
        message = f"rank {rank} ({role}) failed {where}: {type(err).__name__}: {err}"
        print(message, file=sys.stderr, flush=True)
        partial = actor.result() if actor is not None else {"rank": rank, "role": role}
        partial.update(error=message, step=step, error_time=time.time())
        recorder.write(cfg.out, rank, partial)
        if rank == 0:
            merge(cfg.out, config, complete=False, error=message)
        raise RuntimeError(message) from err


if __name__ == "__main__":
    main()
