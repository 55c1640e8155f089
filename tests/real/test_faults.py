"""Every fault ends a real run in bounded time, naming the rank that failed, how and at which step.

For each scheme family a rank crashes (raises), hangs (sleeps in its own work) or is killed with
SIGKILL from outside, and a parameter server is killed; the launcher itself is interrupted with
SIGINT and SIGTERM, and killed with SIGKILL. Each run must end soon after the fault (a hang:
--timeout after it), exit non-zero, leave summary.json with ``complete: false`` and the first
cause, and leave no process of the run behind. The facts relied on: torch's agent stops the other
ranks when one exits (it polls every 0.1 s); a hung rank's watchdog ends it after --timeout
(real.heartbeat); the kernel's parent-death signal ends ranks whose launcher died (real.lifeline).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from real.config import RunConfig
from real.faults import processes_of, wait_for_step
from real.heartbeat import Beat
from tests.real.conftest import ROOT, run_cli

pytestmark = pytest.mark.distributed

TIMEOUT = 4  # --timeout of these runs, seconds: a hung rank is ended this long after its last progress
SLACK = 12.0  # seconds allowed beyond the fault (or the timeout) on a loaded 2-core machine: agent polling,
# stopping the other ranks, interpreter exits and the merge
STEPS = 400  # long enough that a run is still going when the test acts on it
COMMON = ("--model", "mlp", "--batch-size", "8", "--timeout", str(TIMEOUT))


def start(args: tuple[str, ...], out: Path) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "real.run", *args, *COMMON, "--out", str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, out: Path) -> tuple[float, str, dict]:
    """Wait for the launcher; (the time it ended, its stderr, summary.json)."""
    _, err = proc.communicate(timeout=180)
    ended = time.time()
    assert processes_of(str(out)) == [], "processes of the run outlived it"
    return ended, err, json.loads((out / "summary.json").read_text())


def assert_named(summary: dict, err: str, rank: int, how: str, step: int | None) -> None:
    first = summary["first_failure"]
    assert summary["complete"] is False
    assert (first["rank"], first["how"]) == (rank, how), summary["error"]
    if step is not None:
        assert first["step"] == step, summary["error"]
    # the launcher's own line comes last and names the first cause first
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"real.run: run failed: rank {rank} ("), last


# scheme family -> (options, a rank to fail); every failure below is at step 2
INJECTED = [
    pytest.param(("--scheme", "allreduce", "--world", "2"), 1, "crash", id="allreduce-crash"),
    pytest.param(("--scheme", "ps", "--world", "2", "--servers", "1"), 0, "crash", id="ps-crash"),
    pytest.param(("--scheme", "localsgd:period=2", "--world", "2"), 1, "crash", id="localsgd-crash"),
    pytest.param(("--scheme", "allreduce", "--world", "2"), 1, "hang", id="allreduce-hang"),
    pytest.param(("--scheme", "ps:staleness=1", "--world", "2", "--servers", "1"), 1, "hang", id="ps-hang"),
    pytest.param(("--scheme", "ps:mode=async", "--world", "2", "--servers", "1"), 2, "hang", id="ps-server-hang"),
    pytest.param(("--scheme", "localsgd:period=2", "--world", "2"), 0, "hang", id="localsgd-hang"),
]


@pytest.mark.parametrize("args,rank,mode", INJECTED)
def test_a_crashed_or_hung_rank_ends_the_run_in_bounded_time_naming_it(tmp_path, args, rank, mode):
    out = tmp_path / "run"
    proc = start((*args, "--steps", "6", "--fail", f"{rank}:2:{mode}"), out)
    ended, err, summary = finish(proc, out)
    assert proc.returncode == 1, err[-3000:]
    assert_named(summary, err, rank, "exception" if mode == "crash" else "hang", 2)
    fault = Beat.read(out, rank).time  # the failing rank's last progress: the crash or the start of the hang
    bound = SLACK + (TIMEOUT if mode == "hang" else 0.0)
    assert ended - fault < bound, f"ended {ended - fault:.1f} s after the fault"


KILLED = [
    pytest.param(("--scheme", "allreduce", "--world", "2"), 1, id="allreduce-worker"),
    pytest.param(("--scheme", "ps:mode=async", "--world", "2", "--servers", "1"), 0, id="ps-worker"),
    pytest.param(("--scheme", "ps", "--world", "2", "--servers", "1"), 2, id="ps-server"),
    pytest.param(("--scheme", "localsgd:period=2", "--world", "2"), 0, id="localsgd-worker"),
]


@pytest.mark.parametrize("args,rank", KILLED)
def test_a_rank_killed_with_sigkill_is_named_with_the_signal_and_its_step(tmp_path, args, rank):
    out = tmp_path / "run"
    proc = start((*args, "--steps", str(STEPS)), out)
    beat = wait_for_step(proc, out, rank, 3)
    killed = time.time()
    os.kill(beat.pid, signal.SIGKILL)
    ended, err, summary = finish(proc, out)
    assert proc.returncode == 1, err[-3000:]
    assert_named(summary, err, rank, "signal", None)
    assert summary["first_failure"]["detail"] == "SIGKILL"
    assert summary["first_failure"]["step"] >= 3
    # the other ranks lost a peer or were stopped: none of them is named first
    assert ended - killed < SLACK, f"ended {ended - killed:.1f} s after the kill"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_launcher_stops_the_ranks_and_keeps_what_was_done(tmp_path, signum):
    out = tmp_path / "run"
    proc = start(("--scheme", "allreduce", "--world", "2", "--steps", str(STEPS)), out)
    for rank in (0, 1):  # both, not only rank 0: its peer may still be finishing step 2
        wait_for_step(proc, out, rank, 3)
    interrupted = time.time()
    proc.send_signal(signum)
    ended, err, summary = finish(proc, out)
    assert proc.returncode == 128 + signum
    name = signal.Signals(signum).name
    # one line, no traceback (torch's agent and the ranks stay quiet on an interrupt)
    assert err.strip() == f"real.run: interrupted by {name}: stopped the ranks; partial outputs in {out}/ " \
                          f"(summary.json has complete=false)", err[-3000:]
    assert summary["complete"] is False and summary["error"] == f"interrupted by {name}"
    assert all(done >= 3 for done in summary["steps_done"]) and len(summary["steps_done"]) == 2
    assert ended - interrupted < SLACK


def test_ranks_die_with_a_launcher_killed_by_sigkill(tmp_path):
    out = tmp_path / "run"
    proc = start(("--scheme", "ps", "--world", "2", "--servers", "1", "--steps", str(STEPS)), out)
    wait_for_step(proc, out, 0, 3)
    ranks = [Beat.read(out, rank).pid for rank in range(3)]
    killed = time.monotonic()
    proc.kill()  # SIGKILL: the launcher cannot stop anything itself
    proc.communicate(timeout=30)
    while processes_of(str(out)) and time.monotonic() - killed < SLACK:
        time.sleep(0.05)
    assert processes_of(str(out)) == [], f"ranks {ranks} outlived their launcher"
    # the ranks were killed mid-run: none of them wrote a summary claiming completion
    assert not (out / "summary.json").exists()


BAD = [
    (dict(scheme="gossip"), "unknown scheme 'gossip'"),
    (dict(scheme="allreduce:precision=fp8"), "precision must be one of"),
    (dict(world=0), "RunConfig.world must be an integer >= 1"),
    (dict(scheme="allreduce", servers=1), "uses no parameter servers"),
    (dict(scheme="ps"), "give --servers K"),
    (dict(scheme="ps:mode=async", servers=1, slow="5:2"), "rank 5 is not one of the 3 ranks"),
    (dict(fail="1:99"), "past the last step"),
    (dict(model="resnet"), "RunConfig.model must be one of"),
]


@pytest.mark.parametrize("kwargs,message", BAD)
def test_bad_options_are_refused_with_a_clear_message(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        RunConfig(**kwargs)


def test_nccl_without_cuda_is_refused():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="needs CUDA"):
        RunConfig(backend="nccl", device="cuda")


@pytest.mark.parametrize("argv,message", [
    (["--scheme", "ps", "--world", "2"], "give --servers K"),
    (["--world", "0"], "world must be an integer >= 1"),
    (["--backend", "nccl", "--device", "cuda"], "needs CUDA"),
])
def test_the_launcher_refuses_bad_options_before_starting_ranks(tmp_path, argv, message):
    import torch

    if "nccl" in argv and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    out = tmp_path / "bad"
    proc = run_cli([*argv, "--out", str(out)], timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()  # no rank ever started, nothing written

