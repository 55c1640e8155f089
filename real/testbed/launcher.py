"""Runs on the emulated network: one torchrun *node* per testbed host (multi-node c10d rendezvous, one rank each).

``run(bed, cfg)`` carries out a real.worker run of a RunConfig on a built Testbed and merges its outputs
as real.run does; ``torchrun_on`` starts any module that way. Each node is real.agent (torchrun with a
lifeline): the agents die with this launcher and the ranks with their agents (real.lifeline); or, with
``agent=False``, each rank is forked into its host by real.testbed.forkserver. ``fork_local`` forks ranks
in the machine's own network the same way (the compute probes' ranks).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from real.agent import EXITS_ENV, read_exits
from real.interrupt import signal_of
from real.lifeline import PARENT_ENV
from real.testbed import forkserver
from real.testbed.forkserver import signal_group
from real.testbed.namespaces import HOST_IFACE, Testbed
from syncsim.files import write_atomic

__all__ = ["torchrun_on", "fork_local", "rank_env", "run"]

# c10d's dynamic rendezvous ranks nodes by sorting their descriptors, whose first field is the address
# given by --local-addr (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py, sorted(participants));
# the testbed's three-digit final octets make string order equal host order, so host i runs rank i.
# --node-rank is ignored by every backend but "static" (torch/distributed/run.py warns so), hence not passed.
FAILURE_GRACE = 5.0  # seconds the other nodes get to report their own errors after one node failed
# When a node was first seen failed (time.time(), in the log folder): the instant a silent rank's heartbeat
# is judged at (real.failure.fates), not the end of FAILURE_GRACE and the stop, by which time a rank killed
# while computing would read as hung for those seconds.
FAILED_AT_FILE = "failed-at.json"
NETWORK_FILE = "network.json"  # in a run's testbed folder: its shapers and congestion control (Testbed.describe)
STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL when the launcher stops nodes (torch's agent: the same)
MAX_RUN_TIMEOUT = 7 * 86400.0  # --run-timeout at most a week
RDZV_PORT = 29400  # torchrun's default c10d port; each namespace has its own port space


def torchrun_on(bed: Testbed, module: str, argv: list[str], log_dir: str | Path, timeout: float,
                agent: bool = True, fork: bool = True) -> list[int]:
    """``torchrun -m module argv`` as one node per host (one rank each); the nodes' exit codes (124: stopped).

    Each node is ``python -m real.agent``, torchrun with a lifeline: the agents die with this launcher and
    their ranks with them (real.lifeline), and each agent records how its ranks ended in
    ``log_dir/exits-node<i>.json`` (real.agent). An interrupt stops the nodes (SIGTERM, which the agents
    forward to the ranks so they report) before it is raised again.

    ``agent=False`` starts the rank itself on each host, with the variables torchrun would give it (RANK,
    WORLD_SIZE, MASTER_ADDR and MASTER_PORT: torch's env:// rendezvous, host 0 serving the store),
    forked from a server that imported torch once (real.testbed.forkserver), and records each rank's exit
    status itself. Half the processes and no rendezvous rounds: a 5-host run of 5 steps took 18 s
    instead of 32 s; and no rank imports torch (``fork=False``: each is ``python -m module argv`` in its
    host instead; ``python -m real.testbed.launch_bench`` times both). A study that starts a hundred runs
    on two cores needs both. The ranks run the same code.
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    hosts = bed.config.hosts
    env = dict(os.environ, GLOO_SOCKET_IFNAME=HOST_IFACE)  # else gloo binds the hostname's address (127.0.0.1)
    env.setdefault("OMP_NUM_THREADS", "1")
    env[PARENT_ENV] = str(os.getpid())  # `ip netns exec` execs the agent: this process is its parent
    run_id = uuid.uuid4().hex[:12]

    def start(i: int):
        if not agent:
            own = dict(env, **rank_env(i, hosts, bed.ips[0], RDZV_PORT))
            if fork:
                return forkserver.start(bed.host_ns[i], module, argv, own, log_dir / f"node{i}.log")
            with open(log_dir / f"node{i}.log", "w") as log:
                return bed.popen(i, [sys.executable, "-m", module, *argv], stdout=log, stderr=subprocess.STDOUT,
                                 env=own)
        cmd = [sys.executable, "-m", "real.agent", "--nnodes", str(hosts), "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{bed.ips[0]}:{RDZV_PORT}", "--rdzv-id", run_id,
               # is_host: node 0 serves the rendezvous store; torch's own guess compares the endpoint
               # with the hostname's address, which here is 127.0.0.1 (c10d_rendezvous_backend.py).
               "--rdzv-conf", f"is_host={'true' if i == 0 else 'false'},join_timeout=60",
               "--local-addr", bed.ips[i], "--max-restarts", "0", "--monitor-interval", "0.1",
               "-m", module, *argv]
        with open(log_dir / f"node{i}.log", "w") as log:
            return bed.popen(i, cmd, stdout=log, stderr=subprocess.STDOUT,
                             env=dict(env, **{EXITS_ENV: str(log_dir / f"exits-node{i}.json")}))

    return _supervise(start, hosts, log_dir, timeout, record_exits=not agent)


def fork_local(processes: int, module: str, argv: list[str], log_dir: str | Path, timeout: float) -> list[int]:
    """``python -m module argv`` on ``processes`` ranks of this machine's own network, forked from the fork
    server as the testbed's ranks are (real.testbed.forkserver), with torch's env:// rendezvous on a free
    loopback port; the ranks' exit codes (124: stopped), each rank's output in ``log_dir/rank<i>.log``. As
    torchrun_on: the others are stopped soon after one fails, an interrupt stops them all and is raised."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # one math thread per rank, as torchrun and real.run.start_ranks set
    with socket.socket() as probe:  # a port free now; the store binds it a moment later (torchrun: the same)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def start(i: int):
        own = dict(env, **rank_env(i, processes, "127.0.0.1", port))
        return forkserver.start(None, module, argv, own, log_dir / f"rank{i}.log")

    return _supervise(start, processes, log_dir, timeout, record_exits=True)


def rank_env(rank: int, ranks: int, master: str, port: int) -> dict[str, str]:
    """The variables torchrun gives a rank of one-rank nodes (torch's env:// rendezvous; rank 0 serves the store)."""
    return {"RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": str(rank), "MASTER_ADDR": master, "MASTER_PORT": str(port)}


def _supervise(start, count: int, log_dir: Path, timeout: float, record_exits: bool) -> list[int]:
    """Start ``count`` processes (``start(i)``, a Popen or a ForkedRank each) and watch them until all have
    ended or ``timeout`` passed; their exit codes (124: stopped). ``record_exits``: write the exit status of
    each that failed to ``log_dir/exits-node<i>.json``, as an agent does for its ranks."""
    procs = []
    try:
        for i in range(count):
            procs.append(start(i))
        deadline, failure_seen = time.monotonic() + timeout, False
        while None in [p.poll() for p in procs] and time.monotonic() < deadline:  # polls every node
            # torch's agents stop a failed node's own ranks only: a rank on another node that waits in a
            # collective for the dead one waits until its watchdog gives up (real.heartbeat). So, as the
            # agent does on one node, stop every node soon after the first one fails.
            if not failure_seen and any(p.returncode for p in procs):
                failure_seen = True
                write_atomic(log_dir / FAILED_AT_FILE, json.dumps(time.time()))
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
            time.sleep(0.1)
        stopped = _stop(procs)  # the nodes still running at the deadline read as 124, as with timeout(1)
        return [124 if i in stopped else p.returncode for i, p in enumerate(procs)]
    except BaseException:
        _stop(procs)  # an interrupt: let the ranks report, then pass it on
        raise
    finally:
        for p in procs:
            if p.poll() is None:
                signal_group(p, signal.SIGKILL)
                p.wait(timeout=10)
        if record_exits:  # what an agent records: the exit status of a rank that failed, negative for a signal
            for i, p in enumerate(procs):
                if p.returncode:
                    write_atomic(log_dir / f"exits-node{i}.json", json.dumps({str(i): p.returncode}))


def _stop(procs: list[subprocess.Popen]) -> set[int]:
    """SIGTERM to every node still running (its agent forwards it; the ranks report), SIGKILL after STOP_GRACE;
    the indices of the nodes stopped."""
    stopped = {i for i, p in enumerate(procs) if p.poll() is None}
    for i in stopped:
        signal_group(procs[i], signal.SIGTERM)
    end = time.monotonic() + STOP_GRACE
    for p in procs:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(p, signal.SIGKILL)
            p.wait(timeout=10)
    return stopped


def run(bed: Testbed, cfg, timeout: float = 600.0, agent: bool = True, fork: bool = True) -> tuple[int, str | None]:
    """A real.worker run of ``cfg`` (a RunConfig) on the testbed; (exit code, failure message or None).
    ``agent``: each node through torchrun's agent (real.agent), or the rank alone, forked unless ``fork``
    is False (see torchrun_on).

    As real.run: 0 on success, 1 on a failure (the first cause named from the ranks' reports, the exit
    statuses the agents recorded and the heartbeats), 128 + the signal when interrupted.
    """
    from real.run import finish
    from real.trace import rank_dir

    if bed.config.hosts != cfg.ranks:
        raise ValueError(f"testbed hosts ({bed.config.hosts}) must equal the run's ranks ({cfg.ranks}: "
                         f"{cfg.world} workers + {cfg.servers} servers)")
    shutil.rmtree(rank_dir(cfg.out), ignore_errors=True)
    logs = Path(cfg.out) / "testbed"
    for old in [*logs.glob("exits-node*.json"), logs / FAILED_AT_FILE]:
        old.unlink(missing_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    write_atomic(logs / NETWORK_FILE, json.dumps(bed.describe(), indent=1))  # the shapers and the TCP it ran with
    try:
        codes = torchrun_on(bed, "real.worker", cfg.to_argv(), logs, timeout, agent=agent, fork=fork)
    except BaseException as err:
        signum = signal_of(err)
        if signum is None:
            raise
        name = signal.Signals(signum).name
        finish(cfg, read_exits(logs.glob("exits-node*.json")), f"interrupted by {name}", interrupted=name)
        return 128 + signum, f"interrupted by {name}: stopped the nodes"
    if any(codes) or not (Path(cfg.out) / "summary.json").exists():
        seen = logs / FAILED_AT_FILE
        message = finish(cfg, read_exits(logs.glob("exits-node*.json")), f"torchrun nodes exited with {codes}",
                         failed_at=json.loads(seen.read_text()) if seen.exists() else None)
        return 1, message + f" (node exit codes {codes}; logs in {logs}/)"
    return 0, None
