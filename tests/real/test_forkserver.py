"""Ranks forked from the fork server (real.testbed.forkserver) behave as ranks started with ``ip netns exec``.

The testbed's studies fork their ranks from one process that imported torch, instead of starting
``python -m`` in each host; what a rank can observe must not change: its host's interfaces, addresses
and /etc files (as ip-netns(8) gives a command), its environment, folder and argv, a session of its
own, and the exit status python itself would end with. And nothing outlives the launcher.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from real.testbed import Testbed, forkserver, unavailable
from real.testbed.launcher import fork_local
from real.testbed.namespaces import HOST_IFACE, namespaces
from tests.real.conftest import ROOT

PREFIX = "sstbfork"  # distinct from the other testbed tests' prefixes
PROBE = "tests.real.forked_probe"
needs_testbed = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


@pytest.fixture
def server(monkeypatch):
    """A fork server of this test's own, started with tests/ importable (the server's sys.path is fixed
    when it starts), closed after the test."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(forkserver, "_server", None)
    yield
    if forkserver._server is not None:
        forkserver._server.close()


def _env(**extra) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)


@pytest.mark.testbed
@needs_testbed
def test_a_forked_rank_sees_its_host_as_a_command_run_by_ip_netns_exec_does(tmp_path, server):
    with Testbed(hosts=2, prefix=PREFIX) as bed:
        exec_out, fork_out = tmp_path / "exec.json", tmp_path / "fork.json"
        started = bed.popen(1, [sys.executable, "-m", PROBE, str(exec_out), "ok"], env=_env(SYNCSIM_PROBE="given"),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # as the launcher did
        assert started.wait(timeout=60) == 0, started.stdout.read()
        rank = forkserver.start(bed.host_ns[1], PROBE, [str(fork_out), "ok"], _env(SYNCSIM_PROBE="given"),
                                tmp_path / "fork.log")
        assert rank.wait(timeout=60) == 0, (tmp_path / "fork.log").read_text()
        exec_seen, fork_seen = json.loads(exec_out.read_text()), json.loads(fork_out.read_text())
        assert fork_seen["pid"] == rank.pid and fork_seen["pid"] != os.getpid()
        assert (exec_seen.pop("argv"), fork_seen.pop("argv")) == ([str(exec_out), "ok"], [str(fork_out), "ok"])
        for seen in (exec_seen, fork_seen):
            del seen["pid"]
        assert fork_seen == exec_seen
        # and that is host 1's view: its interface and loopback only, its hostname its own address
        assert fork_seen["sysfs"] == fork_seen["interfaces"] == sorted(["lo", HOST_IFACE])
        assert fork_seen["hostname"] == [bed.ips[1]] and fork_seen["env"] == "given"
        assert fork_seen["cwd"] == str(ROOT) and fork_seen["session_leader"]
        assert (tmp_path / "fork.log").read_text() == "probe written\n"
    assert namespaces(PREFIX) == []
    # the launcher's own view is untouched by what its ranks mounted and joined
    assert sorted(name for _, name in socket.if_nameindex()) != sorted(["lo", HOST_IFACE])


@pytest.mark.distributed
def test_a_forked_rank_ends_with_the_status_python_would_end_with(tmp_path, server):
    def run(mode: str):
        rank = forkserver.start(None, PROBE, [str(tmp_path / f"{mode}.json"), mode], _env(), tmp_path / f"{mode}.log")
        return rank, tmp_path / f"{mode}.log"

    for mode, status in [("ok", 0), ("exit3", 3), ("raise", 1)]:
        rank, log = run(mode)
        assert rank.wait(timeout=60) == status and rank.returncode == status, log.read_text()
    assert "RuntimeError: the probe was asked to fail" in log.read_text()  # the traceback, as python prints it
    missing = forkserver.start(None, "tests.real.no_such_probe", [], _env(), tmp_path / "missing.log")
    assert missing.wait(timeout=60) == 1 and "No module named" in (tmp_path / "missing.log").read_text()
    rank, log = run("sleep")
    while not (tmp_path / "sleep.json").exists():
        time.sleep(0.05)
    assert rank.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        rank.wait(timeout=0.2)
    forkserver.signal_group(rank, signal.SIGKILL)
    assert rank.wait(timeout=10) == -signal.SIGKILL  # a signal reads as Popen reads it


@pytest.mark.distributed
def test_fork_local_joins_the_ranks_and_stops_the_others_when_one_fails(tmp_path, server):
    out = tmp_path / "ok"
    assert fork_local(2, PROBE, [str(out), "allreduce"], tmp_path / "logs", timeout=60) == [0, 0]
    assert [float((tmp_path / f"ok.sum{r}").read_text()) for r in (0, 1)] == [3.0, 3.0]  # 1 + 2 on both
    started = time.monotonic()
    codes = fork_local(2, PROBE, [str(tmp_path / "fail"), "allreduce-fail1"], tmp_path / "flogs", timeout=60)
    # rank 1 exited 3; rank 0, waiting in the all-reduce for it, was stopped (124) after the grace period
    assert codes == [124, 3] and time.monotonic() - started < 30
    assert json.loads((tmp_path / "flogs" / "exits-node1.json").read_text()) == {"1": 3}


@pytest.mark.distributed
def test_a_launcher_killed_with_sigkill_takes_the_server_and_its_ranks_along(tmp_path):
    script = (f"import sys, time; from real.testbed import forkserver\n"
              f"r = forkserver.start(None, {PROBE!r}, [{str(tmp_path / 'p.json')!r}, 'sleep'], "
              f"{_env()!r}, {str(tmp_path / 'p.log')!r})\n"
              f"print(forkserver._server.proc.pid, r.pid, flush=True); time.sleep(120)\n")
    launcher = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True)
    server_pid, rank_pid = map(int, launcher.stdout.readline().split())
    while not (tmp_path / "p.json").exists():
        time.sleep(0.05)
    launcher.kill()
    launcher.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in (server_pid, rank_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(server_pid) and not _alive(rank_pid)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: a container's init may never reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.distributed
def test_a_forked_rank_imports_no_part_of_torch_the_server_did_not(tmp_path):
    """What a rank imports after the fork costs every rank of every run its CPU time again (torch's first
    optimizer imports torch._dynamo and sympy: 1.5 s of a core here), so the server's PRELOAD must hold it.
    One rank of the compute probe (an executor with its optimizer and DDP module, stepping) runs after
    importing PRELOAD; what it imported on top of the compiler's and torch.distributed's packages is listed
    (torch.profiler's own small modules, a millisecond, may come late)."""
    script = (f"import importlib, os, sys\n"
              f"HEAVY = ('sympy', 'torch._dynamo', 'torch._inductor', 'torch.fx', 'torch.distributed',"
              f" 'torch.nn.parallel')\n"
              f"from real.testbed.forkserver import PRELOAD\n"
              f"for name in PRELOAD: importlib.import_module(name)\n"
              f"before = set(sys.modules)\n"
              f"from real.calibration.ranks import main\n"
              f"sys.argv = ['real.calibration', '--compute', {str(tmp_path / 'c.json')!r}, '--model', 'lenet',"
              f" '--batch-size', '8', '--scheme', 'allreduce', '--slow', '1']\n"
              f"main()\n"
              f"print(sorted(m for m in set(sys.modules) - before if m.startswith(HEAVY)))\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = _env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
