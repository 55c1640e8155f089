"""Faults on the emulated-network testbed: named like real.run's, bounded, and nothing outlives the launcher.

On the testbed each rank is a node of its own, under its own torch agent (python -m real.agent) in a
network namespace. A rank killed with SIGKILL must be named with the signal (its agent records how
its rank ended); an interrupted launcher must stop the nodes and keep what was done; a launcher
killed with SIGKILL must take every agent and rank with it (the parent-death signal at each link of
launcher → agent → rank), and its namespaces are removed by the next testbed that starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from real.faults import processes_of, wait_for_step
from real.heartbeat import Beat
from real.testbed import Testbed
from real.testbed.namespaces import namespaces
from tests.real.conftest import ROOT
from tests.real.test_faults import SLACK

pytestmark = [pytest.mark.testbed, pytest.mark.distributed]

PREFIX = "sstbfault"  # distinct from the CLI's default and from test_testbed's
RUN = ("--scheme", "allreduce", "--world", "2", "--model", "mlp", "--batch-size", "8", "--timeout", "4",
       "--steps", "400")
FAILURE_GRACE = 5.0  # real.testbed stops the other nodes this long after one fails, then gives them 5 s more


def start(out) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "real.testbed", "--prefix", PREFIX, "--", *RUN, "--out", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_rank_killed_on_the_testbed_is_named_and_the_others_stopped(tmp_path):
    out = tmp_path / "run"
    proc = start(out)
    beat = wait_for_step(proc, out, 1, 3)
    killed = time.time()
    os.kill(beat.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    assert time.time() - killed < SLACK + 2 * FAILURE_GRACE
    summary = json.loads((out / "summary.json").read_text())
    first = summary["first_failure"]
    assert (first["rank"], first["how"], first["detail"]) == (1, "signal", "SIGKILL") and first["step"] >= 3
    assert summary["complete"] is False and processes_of(str(out)) == []
    assert namespaces(PREFIX) == []


def test_an_interrupted_testbed_stops_the_nodes_keeps_the_record_and_removes_its_namespaces(tmp_path):
    out = tmp_path / "run"
    proc = start(out)
    for rank in (0, 1):  # both, not only rank 0: its peer may still be finishing step 2
        wait_for_step(proc, out, rank, 3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert err.strip().splitlines()[-1].startswith("real.testbed: interrupted by SIGTERM: stopped the nodes")
    assert "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and all(done >= 3 for done in summary["steps_done"])
    assert processes_of(str(out)) == [] and namespaces(PREFIX) == []


def test_a_testbed_killed_with_sigkill_takes_its_nodes_along_and_the_next_one_cleans_up(tmp_path):
    out = tmp_path / "run"
    proc = start(out)
    wait_for_step(proc, out, 0, 3)
    pids = [Beat.read(out, rank).pid for rank in range(2)]
    left = namespaces(PREFIX)
    assert len(left) == 3  # two hosts and the bridge
    killed = time.monotonic()
    proc.kill()
    proc.communicate(timeout=30)
    while processes_of(str(out)) and time.monotonic() - killed < SLACK:
        time.sleep(0.05)
    assert processes_of(str(out)) == [], f"agents or ranks {pids} outlived the launcher"
    # a SIGKILLed launcher cannot remove its namespaces; the next testbed with this prefix does
    assert set(namespaces(PREFIX)) == set(left)
    with Testbed(hosts=1, prefix=PREFIX) as bed:
        assert set(namespaces(PREFIX)) == {*bed.host_ns, bed.bridge_ns}
    assert namespaces(PREFIX) == []
