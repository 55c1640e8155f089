"""Run a scheme on the emulated network: ``python -m real.testbed [--hosts N] [--bandwidth B] -- <real.run options>``.

``python -m real.testbed --hosts 3 --bandwidth 200Mbit/s -- --scheme ps --servers 1 --world 2`` builds
the testbed (real.namespaces), starts one torchrun *node* per host (multi-node c10d rendezvous, one rank
per node), merges the outputs, tears the testbed down and prints the summary. ``python -m real.testbed
--check`` runs the prediction check of real.validate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from real.namespaces import HOST_IFACE, Testbed, TestbedConfig, TestbedUnavailable, unavailable

__all__ = ["Testbed", "TestbedConfig", "TestbedUnavailable", "unavailable", "torchrun_on", "run", "exit_on_sigterm",
           "main"]

# c10d's dynamic rendezvous ranks nodes by sorting their descriptors, whose first field is the address
# given by --local-addr (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py, sorted(participants));
# the testbed's three-digit final octets make string order equal host order, so host i runs rank i.
# --node-rank is ignored by every backend but "static" (torch/distributed/run.py warns so), hence not passed.
FAILURE_GRACE = 5.0  # seconds the other nodes get to report their own errors after one node failed
RDZV_PORT = 29400  # torchrun's default c10d port; each namespace has its own port space


def torchrun_on(bed: Testbed, module: str, argv: list[str], log_dir: str | Path, timeout: float) -> list[int]:
    """``torchrun -m module argv`` as one node per host (one rank each); the nodes' exit codes (124: killed)."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    hosts = bed.config.hosts
    env = dict(os.environ, GLOO_SOCKET_IFNAME=HOST_IFACE)  # else gloo binds the hostname's address (127.0.0.1)
    env.setdefault("OMP_NUM_THREADS", "1")
    run_id = uuid.uuid4().hex[:12]
    procs = []
    try:
        for i in range(hosts):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(hosts), "--nproc-per-node", "1",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{bed.ips[0]}:{RDZV_PORT}", "--rdzv-id", run_id,
                   # is_host: node 0 serves the rendezvous store; torch's own guess compares the endpoint
                   # with the hostname's address, which here is 127.0.0.1 (c10d_rendezvous_backend.py).
                   "--rdzv-conf", f"is_host={'true' if i == 0 else 'false'},join_timeout=60",
                   "--local-addr", bed.ips[i], "--max-restarts", "0", "--monitor-interval", "0.1",
                   "-m", module, *argv]
            with open(log_dir / f"node{i}.log", "w") as log:
                procs.append(bed.popen(i, cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
        deadline = time.monotonic() + timeout
        while None in [p.poll() for p in procs] and time.monotonic() < deadline:  # polls every node
            # torch's agents stop a failed node's own ranks only: a rank on another node that waits in a
            # collective for the dead one can wait forever (seen: rank 0 stuck in DDP's backward after
            # rank 1 raised). So, as the agent does on one node, stop every node soon after one fails.
            if any(p.returncode for p in procs):
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
            time.sleep(0.1)
        # A node that outlives the deadline is killed (its session; its ranks, which torch's agent starts in
        # sessions of their own, go with the namespace) and reads as 124, as with timeout(1).
        return [p.returncode if p.poll() is not None else 124 for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


def run(bed: Testbed, cfg, timeout: float = 600.0) -> tuple[int, str | None]:
    """A real.worker run of ``cfg`` (a RunConfig) on the testbed; (exit code, failure message or None)."""
    from real.run import finish
    from real.trace import rank_dir

    if bed.config.hosts != cfg.ranks:
        raise ValueError(f"testbed hosts ({bed.config.hosts}) must equal the run's ranks ({cfg.ranks}: "
                         f"{cfg.world} workers + {cfg.servers} servers)")
    shutil.rmtree(rank_dir(cfg.out), ignore_errors=True)
    codes = torchrun_on(bed, "real.worker", cfg.to_argv(), Path(cfg.out) / "testbed", timeout)
    if any(codes) or not (Path(cfg.out) / "summary.json").exists():
        message = finish(cfg, {}, f"torchrun nodes exited with {codes}")
        return 1, message + f" (node exit codes {codes}; logs in {cfg.out}/testbed/)"
    return 0, None


def exit_on_sigterm() -> None:
    # SIGTERM (timeout(1), a CI runner) kills Python without running `finally`; as SystemExit it unwinds
    # through the Testbed's __exit__, which removes the namespaces.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def main(argv: list[str] | None = None) -> int:
    from real.config import RunConfig

    exit_on_sigterm()
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, theirs = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(prog="python -m real.testbed", description=__doc__.splitlines()[0],
                                 epilog="Options after -- are real.run's (see docs/real.md).")
    ap.add_argument("--hosts", type=int, help="hosts (default: the run's ranks, world + servers)")
    ap.add_argument("--bandwidth", default="200Mbit/s", help="each link's rate, each direction")
    ap.add_argument("--queue", default="20ms", help="tbf latency: longest wait in a shaper")
    ap.add_argument("--prefix", default="sstb", help="namespace name prefix")
    ap.add_argument("--run-timeout", type=float, default=600.0, help="seconds before the nodes are killed")
    ap.add_argument("--check", action="store_true", help="measure, run and compare with syncsim (real.validate)")
    args = ap.parse_args(ours)
    if args.check:
        from real.validate import main as check

        return check(["--bandwidth", args.bandwidth, "--prefix", args.prefix, *theirs])
    try:
        cfg = RunConfig.from_argv(theirs)
        hosts = cfg.ranks if args.hosts is None else args.hosts
        if hosts != cfg.ranks:
            raise ValueError(f"--hosts must equal the run's ranks, world + servers = {cfg.ranks}; got {hosts}")
        bed = Testbed(hosts=hosts, bandwidth=args.bandwidth, prefix=args.prefix, queue=args.queue)
    except ValueError as err:
        print(f"real.testbed: error: {err}", file=sys.stderr)
        return 2
    try:
        with bed:
            code, message = run(bed, cfg, timeout=args.run_timeout)
    except TestbedUnavailable as err:
        print(f"real.testbed: error: {err}", file=sys.stderr)
        return 2
    if code:
        print(f"real.testbed: {message}", file=sys.stderr)
        return code
    from real.run import describe

    summary = json.loads((Path(cfg.out) / "summary.json").read_text())
    print("real.testbed: " + describe(summary, cfg, f" on {hosts} hosts, {args.bandwidth} links"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
