"""``python -m real.run [options]``: validate, start every rank with torch's launcher, report.

Ranks are started by torch's elastic agent (``torch.distributed.launcher.api.
elastic_launch``, what torchrun itself calls) on this node with a c10d
rendezvous on a free local port, as ``torchrun --standalone`` does. The
options are real.worker's; they are validated here first, so a bad option
fails before any process starts. ``max_restarts=0``: when a rank fails the
agent stops the others (SIGTERM, then SIGKILL) and raises ChildFailedError;
then this launcher merges what the ranks wrote, marks the summary
``complete: false`` and exits 1 naming the failing rank and its step.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import uuid

from real.config import RunConfig
from real.trace import merge, rank_dir

__all__ = ["main", "launch", "start_ranks", "failure_message", "describe"]


def start_ranks(ranks: int, module: str, argv: list[str]) -> None:
    """``python -m module argv`` on ``ranks`` local ranks via torch's elastic agent; raises ChildFailedError."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # One math thread per rank unless the user says otherwise: more ranks than
    # cores already oversubscribe (torchrun sets the same default).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    launch_config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=ranks,
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", run_id=str(uuid.uuid4()),
        max_restarts=0, monitor_interval=0.1,
        # seconds between SIGTERM and SIGKILL when the agent stops the ranks
        shutdown_timeout=5,
    )
    elastic_launch(launch_config, sys.executable)("-m", module, *argv)


def launch(cfg: RunConfig, module: str = "real.worker") -> tuple[int, str | None]:
    """Run ``python -m module`` on cfg.ranks local ranks; (exit code, failure message or None)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    shutil.rmtree(rank_dir(cfg.out), ignore_errors=True)
    try:
        start_ranks(cfg.ranks, module, cfg.to_argv())
    except ChildFailedError as err:
        message = failure_message(cfg, err)
        merge(cfg.out, dataclasses.asdict(cfg), complete=False, error=message)
        return 1, message
    return 0, None


def failure_message(cfg: RunConfig, err: Exception) -> str:
    """Name the rank that failed first and its step, from the rank files (or torch's report)."""
    from real.worker import Progress

    reports = {}
    for path in rank_dir(cfg.out).glob("result-rank*.json"):
        data = json.loads(path.read_text())
        reports[data["rank"]] = data
    errors = sorted((r for r in reports.values() if r.get("error")), key=lambda r: r["error_time"])
    silent = [r for r in range(cfg.ranks) if r not in reports]
    parts = []
    for rank in silent:
        step = Progress.read(cfg.out, rank)
        parts.append(f"rank {rank} stopped without a report at step {step} (hung or crashed, "
                     f"or stopped by the launcher after another rank failed)")
    # A rank's own error is the cause, a timeout waiting for a peer is a
    # consequence: then the silent (hung) ranks come first.
    if errors and "imed out" not in errors[0]["error"]:
        parts.insert(0, errors[0]["error"])
    elif errors:
        parts.append(errors[0]["error"])
    if not parts:
        parts.append(str(err))
    return "run failed: " + "; ".join(parts)


def describe(summary: dict, cfg: RunConfig, where: str = "") -> str:
    """One line on a finished run: scheme, ranks, step time, throughput, loss, bytes, outputs."""
    # a run too short for a steady state (under two timed steps) has no step time
    timing = ("step time n/a (too few steps)" if summary["step_time"] is None else
              f"step {summary['step_time'] * 1e3:.2f} ms, {summary['throughput']:.0f} samples/s")
    return (f"{summary['scheme']} on {cfg.world} workers" + (f" + {cfg.servers} servers" if cfg.servers else "")
            + where + f": {timing}, final loss {summary['final_loss']:.4f}, "
            f"{summary['bytes_per_worker_step'] / 1e6:.3f} MB/worker/step; outputs in {cfg.out}/")


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = RunConfig.from_argv(argv)
    except ValueError as err:
        print(f"real.run: error: {err}", file=sys.stderr)
        return 2
    code, message = launch(cfg)
    summary_path = os.path.join(cfg.out, "summary.json")
    if code:
        print(f"real.run: {message}", file=sys.stderr)
        print(f"real.run: partial outputs in {cfg.out}/ (summary.json has complete=false)", file=sys.stderr)
        return code
    with open(summary_path) as f:
        summary = json.load(f)
    print("real.run: " + describe(summary, cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
