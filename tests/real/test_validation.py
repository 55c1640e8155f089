"""The validation study's quick preset on the emulated network: every scheme kind predicted within a loose bound."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from studies import validation

ROOT = Path(__file__).resolve().parents[2]
# Loose: CI machines are shared and timing is noisy; the study's own targets (median 5 %, max 15 %)
# are for a quiet machine and reported by the full grid, not asserted here.
LOOSE_MEDIAN, LOOSE_MAX = 0.15, 0.35
# A straggler under a parameter server is a known miss, in one direction (docs/real.md, "What remains"):
# the simulator keeps the workers in the alternating schedule, the testbed slides them through
# colliding transfers. Measured on the straggler row at batch 32: -28 %, -29 % (quiet machine), -35 %,
# -36 % (CI); at the quick preset's batch 256: -5 %, -6 %; with the slowed step measured by the probe
# (studies.validation.slow_speed), five repeats at batch 256: -30 % .. +3 %, median -9 %. Held to its own
# one-sided bound, so that the miss, where it shows, is neither hidden nor allowed to grow without a failure.
KNOWN_STRAGGLER_MIN = -0.5
# The one-worker row sends nothing: it compares a compute calibration with a compute-only run taken a
# few seconds apart, and this machine's compute speed wanders between them. Five repeats of the quick
# preset (python -m studies.repeatability, docs/real.md "Repeatability") measured its step time with a
# coefficient of variation of 13 % and its calibration with 12 %, and its error from -43 % to +11 %
# (median -14 %). Its own bound sits outside that measured range, so it fails on a broken calibration or
# run (a dropped phase, a unit slip: a factor of two), not on the drift.
BASELINE_MAX = 0.6


@pytest.mark.testbed
def test_quick_validation_predicts_every_row_within_a_loose_bound(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "studies.validation", "--quick", "--out", str(tmp_path),
                           "--prefix", "sstbval"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = pd.read_csv(tmp_path / "validation.csv", keep_default_na=False, na_values=[""])
    assert len(data) == len(validation.quick_grid()) and not validation.failed(data).any(), data["error"].tolist()
    errors = data["rel_error"].abs()
    shown = data[list(validation.KEY) + ["rel_error"]]
    straggler_ps = (data["slow"] > 1) & data["scheme"].str.startswith("ps")
    baseline = (data["world"] == 1) & (data["servers"] == 0)
    assert baseline.sum() == 1 and errors[baseline].max() <= BASELINE_MAX, shown
    # the known miss and the baseline are held to their own bounds, not counted in what the others must meet
    others = ~straggler_ps & ~baseline
    assert errors[others].median() <= LOOSE_MEDIAN and errors[others].max() <= LOOSE_MAX, shown
    known = data.loc[straggler_ps, "rel_error"]
    assert len(known) and known.between(KNOWN_STRAGGLER_MIN, LOOSE_MAX).all(), shown
    asynchronous = data[data["scheme"] == "ps:mode=async"].iloc[0]
    assert asynchronous["measured_staleness_mean"] > 0 and asynchronous["predicted_staleness_mean"] > 0
    assert "step time: median |error|" in proc.stdout and (tmp_path / "parity.png").exists()
