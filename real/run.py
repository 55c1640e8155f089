"""``python -m real.run [options]``: validate, start every rank with torch's launcher, report.

Ranks are started by torch's elastic agent (``torch.distributed.launcher.api.
elastic_launch``, what torchrun itself calls) on this node with a c10d
rendezvous on a free local port, as ``torchrun --standalone`` does. The
options are real.worker's; they are validated here first, so a bad option
fails (exit 2, one line) before any process starts. ``max_restarts=0``: when
a rank fails the agent stops the others (SIGTERM, then SIGKILL) and raises
ChildFailedError; this launcher then writes, for each rank that could not
report, how it ended, merges what the ranks wrote, marks the summary
``complete: false`` and exits 1 naming the first cause (real.failure).
SIGINT/SIGTERM stop the ranks the same way and exit 130/143. The ranks die
with this process however it dies (real.lifeline).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path

from real.config import RunConfig
from real.failure import fates, stand_in, summary_of
from real.interrupt import Interrupted, ignore_signals, raise_on_signals, signal_of
from real.lifeline import announce_parent
from real.trace import merge, rank_dir
from syncsim.arguments import fail
from syncsim.files import write_atomic
from syncsim.limits import check_memory

__all__ = ["main", "launch", "start_ranks", "finish", "describe", "RANK_BYTES"]

# What one local rank holds (Python, torch, gloo, a model): more ranks than fit are refused.
RANK_BYTES = 512 * 2**20


def start_ranks(ranks: int, module: str, argv: list[str]) -> None:
    """``python -m module argv`` on ``ranks`` local ranks via torch's elastic agent; raises ChildFailedError.

    The agent polls the ranks every 0.1 s; when one fails it stops the others (SIGTERM, then SIGKILL
    after ``shutdown_timeout``). The ranks are this process's children and die with it (real.lifeline).
    """
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # One math thread per rank unless the user says otherwise: more ranks than
    # cores already oversubscribe (torchrun sets the same default).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    announce_parent()
    launch_config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=ranks,
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", run_id=str(uuid.uuid4()),
        max_restarts=0, monitor_interval=0.1,
        # seconds between SIGTERM and SIGKILL when the agent stops the ranks
        shutdown_timeout=5,
    )
    elastic_launch(launch_config, sys.executable)("-m", module, *argv)


def launch(cfg: RunConfig, module: str = "real.worker") -> tuple[int, str | None]:
    """Run ``python -m module`` on cfg.ranks local ranks; (exit code, failure message or None).

    A failed run ends with exit code 1; one interrupted by SIGINT or SIGTERM with 128 + the signal
    (the agent forwards the signal to the ranks, which report what they had done). Either way
    OUT/summary.json says ``complete: false`` and names the first cause.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    check_memory("real.run", cfg.ranks, "ranks on this machine", RANK_BYTES, "lower --world or --servers")
    shutil.rmtree(rank_dir(cfg.out), ignore_errors=True)
    try:
        start_ranks(cfg.ranks, module, cfg.to_argv())
    except ChildFailedError as err:
        exits = {rank: failure.exitcode for rank, failure in err.failures.items()}
        return 1, finish(cfg, exits, str(err).strip().splitlines()[0] if str(err).strip() else "the ranks failed")
    except BaseException as err:
        signum = signal_of(err)
        if signum is None:
            raise
        ignore_signals()  # a second Ctrl-C must not cut the report short
        name = signal.Signals(signum).name
        finish(cfg, {}, f"interrupted by {name}", interrupted=name)
        return 128 + signum, f"interrupted by {name}: stopped the ranks"
    return 0, None


def finish(cfg: RunConfig, exits: dict[int, int | None], fallback: str, interrupted: str | None = None,
           failed_at: float | None = None) -> str:
    """After a failure: write each silent rank's fate for it, merge the partial outputs, name the first cause.
    ``failed_at``: when the failure was first seen (time.time()), now if not given; a silent rank whose
    heartbeat was older than its timeout then counts as hung (real.failure.fates)."""
    seen = time.time() if failed_at is None else failed_at
    all_fates = fates(cfg.out, cfg.ranks, cfg.world, cfg.timeout, exits, seen)
    for fate in all_fates:
        if not (rank_dir(cfg.out) / f"result-rank{fate.rank}.json").exists():
            write_atomic(rank_dir(cfg.out) / f"result-rank{fate.rank}.json", json.dumps(stand_in(fate), indent=1))
    message = f"interrupted by {interrupted}" if interrupted else summary_of(all_fates, fallback)
    first = None if interrupted or not all_fates else all_fates[0].public()
    merge(cfg.out, dataclasses.asdict(cfg), complete=False, error=message, first_failure=first)
    return message


def describe(summary: dict, cfg: RunConfig, where: str = "") -> str:
    """One line on a finished run: scheme, ranks, step time, throughput, loss, bytes, outputs."""
    # a run too short for a steady state (under two timed steps) has no step time
    timing = ("step time n/a (too few steps)" if summary["step_time"] is None else
              f"step {summary['step_time'] * 1e3:.2f} ms, {summary['throughput']:.0f} samples/s")
    return (f"{summary['scheme']} on {cfg.world} workers" + (f" + {cfg.servers} servers" if cfg.servers else "")
            + where + f": {timing}, final loss {summary['final_loss']:.4f}, "
            f"{summary['bytes_per_worker_step'] / 1e6:.3f} MB/worker/step; outputs in {cfg.out}/")


def quiet_agent() -> None:
    """torch's agent logs each step of stopping the ranks; this launcher reports the outcome itself."""
    import torch.distributed.launcher.api  # noqa: F401  (creates the agent's loggers)

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic") or name.startswith("torch.distributed.launcher"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def main(argv: list[str] | None = None) -> int:
    raise_on_signals()  # until torch's agent installs its own handlers, and after it
    try:
        cfg = RunConfig.from_argv(argv)
        check_memory("real.run", cfg.ranks, "ranks on this machine", RANK_BYTES, "lower --world or --servers")
    except ValueError as err:
        return fail("real.run", err)
    except Interrupted as err:
        return err.exit_code
    quiet_agent()
    code, message = launch(cfg)
    if code:
        print(f"real.run: {message}; partial outputs in {cfg.out}/ (summary.json has complete=false)",
              file=sys.stderr)
        return code
    summary = json.loads((Path(cfg.out) / "summary.json").read_text())
    print("real.run: " + describe(summary, cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
