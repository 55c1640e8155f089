"""The validation study's quick preset on the emulated network: every scheme kind predicted within a loose bound."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from real.validation.config import KEY
from real.validation.verdict import failed
from studies import validation

ROOT = Path(__file__).resolve().parents[2]
# Loose: CI machines are shared and timing is noisy; the study's own targets (median 5 %, max 15 %)
# are for a quiet machine and reported by the full grid, not asserted here.
LOOSE_MEDIAN, LOOSE_MAX = 0.15, 0.35
# A straggler under a parameter server is a known miss, in one direction (docs/log.md, "what remained open"):
# the simulator keeps the workers in the alternating schedule, the testbed slides them through
# colliding transfers. Measured on the straggler row at batch 32: -28 %, -29 % (quiet machine), -35 %,
# -36 % (CI); at the quick preset's batch 256: -5 %, -6 %; with the slowed step measured by the probe
# (real.validation.calibration.slow_speed), five repeats at batch 256: -30 % .. +3 %, median -9 %. Held to its own
# one-sided bound, so that the miss, where it shows, is neither hidden nor allowed to grow without a failure.
KNOWN_STRAGGLER_MIN = -0.5
# The one-worker row sends nothing: it compares a compute calibration with a compute-only run taken a
# few seconds apart, and this machine's compute speed wanders between them. Five repeats of the quick
# preset (python -m studies.repeatability, docs/log.md "Five repeats") measured its step time with a
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
    assert len(data) == len(validation.quick_grid()) and not failed(data).any(), data["error"].tolist()
    errors = data["rel_error"].abs()
    shown = data[list(KEY) + ["rel_error"]]
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


# -- the compressing schemes' rows: their compute probe, and a testbed run of each ------------------------------
COMPRESSING = ("allreduce:compression=powersgd,rank=4", "topk:ratio=0.01", "diloco:period=4")
PLANTED = 0.01  # seconds planted in each stage of a compressor's work (and in each outer step): far above the
# noise of two 0.3-second timings of a millisecond step on a loaded machine


def _compressing_rank(rank: int, port: int, folder: str) -> None:
    import json
    import statistics
    import time

    import torch.distributed as dist

    from real import executor
    from real.calibration import compute_probe as calibration
    from syncsim.compression import LowRank, Sparsifier
    from tests.real.test_compute_calibration import _join

    _join(rank, 2, port, calibration, 0.3)
    stages = {(LowRank, "start"), (LowRank, "middle"), (LowRank, "finish"), (Sparsifier, "compress"),
              (executor.Executor, "outer_step")}
    originals = {(owner, name): getattr(owner, name) for owner, name in stages}

    def planted(original):
        def slowed(*args, **kwargs):
            time.sleep(PLANTED)
            return original(*args, **kwargs)
        return slowed

    mine = {}
    for scheme in COMPRESSING:
        plain = calibration.time_worker_steps("mlp", 32, scheme, folder)
        for (owner, name), original in originals.items():
            setattr(owner, name, planted(original))
        slowed = calibration.time_worker_steps("mlp", 32, scheme, folder)
        for (owner, name), original in originals.items():
            setattr(owner, name, original)
        mine[scheme] = {"plain": statistics.fmean(plain["steps"]), "slowed": statistics.fmean(slowed["steps"]),
                        "steps": len(plain["steps"]), "meetings": plain["meetings"]}
    gathered = [None, None]
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        with open(f"{folder}/compressing.json", "w") as f:
            json.dump(gathered, f)
    dist.destroy_process_group()


@pytest.mark.distributed
def test_the_compute_probe_of_a_compressing_scheme_holds_its_compressor_s_work_and_meets_at_its_collectives(
        tmp_path):
    # The executor runs PowerSGD's and top-k's compressors and DiLoCo's outer step inside its step, between
    # its collectives, so the probe that times that step without its communication holds their work (and
    # the study leaves syncsim's compressor rates unset): a delay planted in every stage of that work shows
    # up in the timed step, whole. The ranks meet after each step that synchronises, as a run's workers do.
    import json

    import torch.multiprocessing as mp

    from real.calibration.compute_fit import COMPUTE_WARMUP
    from tests.real.test_compute_calibration import _free_port

    mp.spawn(_compressing_rank, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    first, second = json.loads((tmp_path / "compressing.json").read_text())
    # stages a step: PowerSGD's start, middle and finish; top-k's selection; DiLoCo's outer step every 4th
    for scheme, planted_per_step, every in zip(COMPRESSING, (3 * PLANTED, PLANTED, PLANTED / 4), (1, 1, 4)):
        for r in (first[scheme], second[scheme]):
            assert r["slowed"] - r["plain"] >= 0.9 * planted_per_step, (scheme, r)
            assert (COMPUTE_WARMUP + r["steps"]) % every == 0, (scheme, r)
            assert r["meetings"] == (COMPUTE_WARMUP + r["steps"]) // every, (scheme, r)
        assert first[scheme]["steps"] == second[scheme]["steps"], scheme


@pytest.mark.testbed
def test_a_compressing_scheme_s_row_is_predicted_within_a_loose_bound_and_its_losses_replayed(tmp_path):
    # One top-k row on the testbed, end to end: its all-gathers timed at its k, its run, its prediction,
    # and its logged losses against its schedule replayed (float32 ranks against a float64 replay: far
    # below a percent over a default-length run).
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "studies.validation", "--schemes", "topk:ratio=0.1", "--worlds", "2",
                           "--bandwidths", "200Mbit/s", "--models", "mlp", "--slow", "1", "--steadiness", "0",
                           "--out", str(tmp_path), "--prefix", "sstbvtk"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = pd.read_csv(tmp_path / "validation.csv", keep_default_na=False, na_values=[""])
    assert not failed(data).any(), data["error"].tolist()
    row = data[data["scheme"] == "topk:ratio=0.1"].iloc[0]
    assert abs(row["rel_error"]) <= LOOSE_MAX, row[["predicted_step_time", "measured_step_time"]].to_dict()
    assert row["link_at_size"] > 0 and row["loss_steps"] > 0 and row["loss_rel_max"] < 1e-2
    assert "loss curves:" in proc.stdout


def _gather_rank(rank: int, port: int, out: str) -> None:
    from real.calibration.link_probe import link_rank

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      OMP_NUM_THREADS="1")
    link_rank(out, repeats=1, idle=1e-3, at=[(2760, "fp32")], sweep_sizes=False,
              gather=[(1018, "fp32"), (17, "bf16")])


@pytest.mark.distributed
def test_the_link_probe_times_a_top_k_exchange_at_the_run_s_k_with_its_all_reduces(tmp_path):
    # --gather entries are exchanged as real.executor exchanges top-k's entries (an all-gather of k int32
    # indices, then one of k values), at_repeats times each in turns with the --at all-reduces; the ranks
    # agree on every count, or one would wait at a collective the other never joins.
    import json

    import torch.multiprocessing as mp

    from real.calibration.timing import AT_MAX_REPEATS, AT_REPEATS
    from tests.real.test_compute_calibration import _free_port

    out = tmp_path / "probe.json"
    mp.spawn(_gather_rank, args=(_free_port(), str(out)), nprocs=2, join=True)
    probe = json.loads(out.read_text())
    assert [(size, precision) for size, precision, _ in probe["at_size"]] == [(2760, "fp32")]
    assert [(values, precision) for values, precision, _ in probe["at_gather"]] == [(1018, "fp32"), (17, "bf16")]
    for _, _, timings in probe["at_size"] + probe["at_gather"]:
        assert AT_REPEATS <= len(timings) <= AT_MAX_REPEATS and all(0 < t < 1.0 for t in timings)
