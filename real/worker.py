"""One rank of a real run: ``torchrun --nproc-per-node N -m real.worker [options]``.

Ranks 0..world-1 are workers (real.executor), ranks world..world+servers-1
parameter servers (real.server). One code path from 1 rank to many, rank and
world size from torchrun's environment (nanoGPT's pattern); multi-node runs
use torchrun's own c10d rendezvous (``--nnodes``, ``--rdzv-backend c10d``,
``--rdzv-endpoint HOST:PORT``). Each rank writes its files under OUT/ranks/;
after the final barrier rank 0 merges them (real.trace.merge).

However a rank ends it says so: an exception, its watchdog finding it hung
or waiting in vain (real.heartbeat) and SIGINT/SIGTERM (real.interrupt) each
write its report, with the step, before it exits; it dies with its parent
(real.lifeline).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from real.config import RunConfig
from real.data import load
from real.executor import Executor, flat_params
from real.heartbeat import EXIT_STALLED, Heartbeat, came_from_peer, limit
from real.interrupt import on_signals
from real.lifeline import die_with_parent
from real.models import build
from real.server import Server
from real.trace import Recorder, merge, rank_dir
from real.wire import WIRE_DTYPES
from syncsim.arguments import fail

__all__ = ["main"]

# NCCL's algorithm names for the spec's collective algorithm (NCCL_ALGO, see
# NCCL's environment-variable docs). gloo picks its own all-reduce algorithm;
# there the spec's algorithm is a simulator cost-model knob only.
NCCL_ALGO = {"ring": "Ring", "tree": "Tree"}


def setup(cfg: RunConfig, rank: int) -> torch.device:
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
        # NCCL: a collective that outlives the timeout aborts the communicator and ends the process
        # (torch's watchdog; docs: ProcessGroupNCCL, TORCH_NCCL_ASYNC_ERROR_HANDLING=1 "tear down")
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    dist.init_process_group(backend, timeout=pg_timeout(cfg))
    return device


def pg_timeout(cfg: RunConfig) -> timedelta:
    """torch's process-group timeout: it bounds setup (ranks start at different times), then backs up the
    watchdog (real.heartbeat), which ends any run whose ranks stop making progress after --timeout."""
    return timedelta(seconds=limit(cfg.timeout, -1, waiting=True))


def start_time() -> float:
    # A common time origin once every rank is set up: rank 0's clock, sent to
    # everyone (ranks on other hosts keep their clock offset; NTP holds that
    # to about a millisecond).
    t0 = torch.tensor([time.time()], dtype=torch.float64)
    dist.broadcast(t0, src=0)
    return float(t0)


def brief(err: BaseException, limit: int = 200) -> str:
    """``Type: message`` on one line, without gloo's source location and advice, cut to ``limit``."""
    text = " ".join(str(err).split())
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\] ", "", text)  # "[.../gloo/transport/tcp/pair.cc:537] "
    text = text.split(" This is typically caused")[0]
    text = f"{type(err).__name__}: {text}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _where(step: int) -> str:
    return "during setup" if step < 0 else f"at step {step}"


def _stall_message(rank: int, role: str, step: int, waiting: bool, idle: float, timeout: float) -> tuple[str, str]:
    where, allowed = _where(step), limit(timeout, step, waiting)
    if waiting:
        return "waited", (f"rank {rank} ({role}) waited {idle:.1f} s for its peers {where} while no rank made "
                          f"progress (limit {allowed:g} s: --timeout {timeout:g} + grace)")
    return "hung", f"rank {rank} ({role}) hung {where}: no progress for {idle:.1f} s (limit {allowed:g} s, --timeout)"


class _Rank:
    """One rank's run, and what it reports when it cannot finish it: its recorder, heartbeat and actor."""

    def __init__(self, cfg: RunConfig, rank: int) -> None:
        self.cfg, self.rank = cfg, rank
        self.role = "worker" if rank < cfg.world else "server"
        self.recorder = Recorder(time.time())
        self.actor = None
        self.heartbeat = Heartbeat(cfg.out, rank, cfg.ranks, cfg.timeout, on_stall=self.stalled)

    def report(self, kind: str, message: str, detail: str, step: int | None) -> None:
        partial = self.actor.result() if self.actor is not None else {"rank": self.rank, "role": self.role}
        partial.update(error=message, error_kind=kind, detail=detail, step=step, error_time=time.time())
        self.recorder.write(self.cfg.out, self.rank, partial)

    def stalled(self, step: int, waiting: bool, idle: float) -> None:
        # the watchdog thread: the main thread is stuck, so report for it and end the process,
        # which closes this rank's connections and frees the peers waiting on it
        kind, message = _stall_message(self.rank, self.role, step, waiting, idle, self.cfg.timeout)
        print(message, file=sys.stderr, flush=True)
        self.report(kind, message, f"no progress for {idle:.1f} s", step)
        os._exit(EXIT_STALLED)

    def stopped(self, signum: int) -> None:
        # SIGINT/SIGTERM (the launcher stopping the run, or anyone), acted on at once from a thread:
        # the main thread may be blocked in a wait that never returns
        name = signal.Signals(signum).name
        step = self.heartbeat.step
        self.report("interrupted", f"rank {self.rank} ({self.role}) was stopped by {name} {_where(step)}", name,
                    step)
        os._exit(128 + signum)

    def run(self) -> int:
        cfg, rank, heartbeat, recorder = self.cfg, self.rank, self.heartbeat, self.recorder
        device = setup(cfg, rank)
        with heartbeat.waiting_for_peers():
            workers = dist.new_group(list(range(cfg.world)), timeout=pg_timeout(cfg)) if cfg.servers \
                else dist.group.WORLD
        model = build(cfg.model, cfg.seed).to(device)
        if self.role == "worker":
            data = load(cfg.data, cfg.seed).to(device)
            with heartbeat.waiting_for_peers():  # DDP's constructor broadcasts the parameters
                self.actor = Executor(cfg, rank, model, data, device, workers, recorder, heartbeat)
        else:
            fail_at = cfg.failure(rank)
            self.actor = Server(rank, cfg.world, cfg.servers, flat_params(model).cpu(), cfg.lr,
                                WIRE_DTYPES[cfg.spec.precision], recorder, slow=cfg.slow_factor(rank),
                                fail_step=fail_at[0] if fail_at else None,
                                fail_mode=fail_at[1] if fail_at else "crash", heartbeat=heartbeat)
        with heartbeat.waiting_for_peers():
            recorder.t0 = start_time()
        self.actor.run()
        self.finish()
        return 0

    def finish(self) -> None:
        """Write this rank's result (and parameters when asked); rank 0 merges every rank's once all have."""
        cfg, rank, actor, heartbeat = self.cfg, self.rank, self.actor, self.heartbeat
        result = actor.result()
        if cfg.save_params:  # a worker's parameters whole, or a server's final shard: what a replay ends at
            saved = actor.state_dict() if self.role == "worker" else actor.shard
            torch.save(saved, rank_dir(cfg.out) / f"params-rank{rank}.pt")
        self.recorder.write(cfg.out, rank, result | {"error": None})
        with heartbeat.waiting_for_peers():
            dist.barrier()
        if rank == 0:
            merge(cfg.out, dataclasses.asdict(cfg), complete=True)
        with heartbeat.waiting_for_peers():
            dist.destroy_process_group()
        heartbeat.stop()

    def failed(self, err: Exception) -> int:
        self.heartbeat.stop()
        step = self.heartbeat.step
        # an exception out of a wait for peers comes from a peer (a closed connection, torch's
        # timeout): a consequence; any other is this rank's own failure
        kind = "peer" if came_from_peer(err, self.heartbeat.waiting) else "error"
        detail = brief(err)
        verb = "lost its peers" if kind == "peer" else "failed"
        message = f"rank {self.rank} ({self.role}) {verb} {_where(step)}: {detail}"
        print(message, file=sys.stderr, flush=True)
        if kind == "error":
            traceback.print_exc()
        self.report(kind, message, detail, step)
        return 1


@record
def main(argv: list[str] | None = None) -> int:
    try:
        cfg = RunConfig.from_argv(argv, prog="python -m real.worker")
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError as err:
        return fail("real.worker", err)
    except KeyError as err:
        return fail("real.worker", f"{err.args[0]} is not set; start ranks with torchrun or python -m real.run")
    if size != cfg.ranks:
        return fail("real.worker", f"{size} ranks were started but --world {cfg.world} --servers {cfg.servers} "
                                   f"needs {cfg.ranks} (torchrun --nproc-per-node {cfg.ranks})")
    die_with_parent()  # no rank outlives its launcher (real.lifeline)
    me = _Rank(cfg, rank)
    on_signals(me.stopped)
    try:
        return me.run()
    except Exception as err:
        return me.failed(err)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # After a failure gloo's threads can abort the interpreter's exit ("terminate called without an
    # active exception"); the rank has reported, so leave without running destructors.
    os._exit(code)
