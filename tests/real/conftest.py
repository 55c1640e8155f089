"""Shared runs of the real executor: each configuration is launched once per test session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_cli(args: list[str], timeout: float = 120, module: str = "real.run") -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", module, *args] if module else args
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


class Run:
    def __init__(self, out: Path, proc: subprocess.CompletedProcess, seconds: float):
        self.out, self.proc, self.seconds = out, proc, seconds
        self.summary = json.loads((out / "summary.json").read_text())
        self.trace = pd.read_csv(out / "trace.csv")
        self.updates = pd.read_csv(out / "updates.csv")
        self.results = {int(p.stem.split("rank")[1]): json.loads(p.read_text())
                        for p in (out / "ranks").glob("result-rank*.json")}

    def params(self, rank: int):
        """A rank's final parameters saved by --save-params, flat: a worker's state dict, or a server's shard."""
        import torch

        saved = torch.load(self.out / "ranks" / f"params-rank{rank}.pt")
        return torch.cat([v.reshape(-1) for v in saved.values()]) if isinstance(saved, dict) else saved


@pytest.fixture(scope="session")
def real_run(tmp_path_factory):
    cache: dict[tuple, Run] = {}

    def launch(*args: str, torchrun: int | None = None) -> Run:
        key = (args, torchrun)
        if key not in cache:
            out = tmp_path_factory.mktemp("real")
            t0 = time.time()
            if torchrun:
                proc = run_cli([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                "--nproc-per-node", str(torchrun), "-m", "real.worker", *args, "--out", str(out)],
                               module=None)
            else:
                proc = run_cli([*args, "--out", str(out)])
            assert proc.returncode == 0, proc.stderr[-3000:]
            cache[key] = Run(out, proc, time.time() - t0)
        return cache[key]

    return launch
