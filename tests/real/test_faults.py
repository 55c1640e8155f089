"""Dead and hung ranks end the run in bounded time; bad options fail before any process starts."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from real.config import RunConfig
from tests.real.conftest import run_cli

pytestmark = pytest.mark.distributed

TIMEOUT = 8  # process-group timeout of these runs, seconds


def stray_processes(marker: str) -> list[int]:
    """Live processes whose command line mentions ``marker`` (the run's unique output folder)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and int(pid) != os.getpid():
            found.append(int(pid))
    return found


def test_a_dead_rank_ends_the_run_quickly_naming_rank_and_step(tmp_path):
    out = tmp_path / "dead"
    t0 = time.time()
    proc = run_cli(["--scheme", "allreduce", "--world", "2", "--model", "mlp", "--steps", "6",
                    "--fail", "1:2", "--timeout", str(TIMEOUT), "--out", str(out)], timeout=60)
    elapsed = time.time() - t0
    assert proc.returncode != 0
    assert "rank 1 (worker) failed at step 2" in proc.stderr
    # gloo sees the closed connection at once; the launcher's start-up is most of this
    assert elapsed < 30, elapsed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and "rank 1" in summary["error"]
    assert stray_processes(str(out)) == []


def test_a_hung_rank_ends_the_run_after_the_timeout(tmp_path):
    out = tmp_path / "hung"
    t0 = time.time()
    proc = run_cli(["--scheme", "ps:staleness=1", "--world", "2", "--servers", "1", "--model", "mlp",
                    "--steps", "6", "--fail", "1:2:hang", "--timeout", str(TIMEOUT), "--out", str(out)], timeout=90)
    elapsed = time.time() - t0
    assert proc.returncode != 0
    assert "rank 1 stopped without a report at step 2" in proc.stderr
    assert elapsed < TIMEOUT + 30, elapsed
    assert json.loads((out / "summary.json").read_text())["complete"] is False
    assert stray_processes(str(out)) == []


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
    assert message in proc.stderr
    assert not out.exists()  # no rank ever started, nothing written
