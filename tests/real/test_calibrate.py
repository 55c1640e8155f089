"""Calibration writes a file that syncsim's Cluster and Workload load as they are."""

from __future__ import annotations

import json

import numpy as np
import pytest

from real.calibrate import fit_linear, fit_theil_sen
from syncsim.cluster import Cluster
from syncsim.workload import Workload
from tests.real.conftest import run_cli


def test_fit_recovers_alpha_and_beta():
    n = np.array([1e3, 1e4, 1e5, 1e6, 1e7])
    a, b, r2, res = fit_linear(n, 50e-6 + n / 2e9)
    assert a == pytest.approx(50e-6) and 1 / b == pytest.approx(2e9) and r2 == pytest.approx(1.0)
    assert max(map(abs, res)) < 1e-9


def test_theil_sen_keeps_the_line_when_a_minority_of_pairs_is_disturbed():
    # Basis (Sen 1968): the slope is the median of pairwise slopes, so it is the true one whenever more
    # than half of the pairs of different sizes join undisturbed timings; the intercept is the median of
    # t - b n, true whenever more than half of the timings are undisturbed. Four sizes, five timings each,
    # two stalls at one size and one at another: 107 of the 150 pairs of different sizes are clean.
    sizes = np.repeat([2.0**18, 2.0**19, 2.0**20, 2.0**21], 5)
    t = 2e-3 + sizes / 110e6
    stalled = t.copy()
    stalled[[5, 7, 12]] += 20e-3
    a, b, r2, res = fit_theil_sen(sizes, stalled)
    assert a == pytest.approx(2e-3, rel=1e-9) and 1 / b == pytest.approx(110e6, rel=1e-9)
    assert sorted(i for i, r in enumerate(res) if abs(r) > 1e-9) == [5, 7, 12]  # only the stalls are off the line
    assert fit_linear(sizes, stalled)[1] != pytest.approx(b, rel=1e-3)  # least squares is pulled by them
    assert fit_theil_sen(sizes, t)[2] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least two sizes"):
        fit_theil_sen(np.full(5, 2.0**19), t[:5])


@pytest.mark.distributed
def test_calibration_file_loads_into_cluster_and_workload(tmp_path):
    out = tmp_path / "cal.json"
    proc = run_cli(["--model", "mlp", "--world", "2", "--servers", "1", "--repeats", "2", "--out", str(out)],
                   module="real.calibrate", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cluster, workload = Cluster.from_json(out), Workload.from_json(out)
    fit = json.loads(out.read_text())["fit"]
    assert cluster.gpus == 2 and cluster.servers == 1
    assert cluster.inter.bandwidth == pytest.approx(fit["allreduce"]["bandwidth"])
    # per-hop latency from the ping-pong; the all-reduce's intercept less 2(p-1) hops is the launch cost
    assert cluster.inter.latency == pytest.approx(fit["pingpong"]["alpha"])
    assert cluster.collective_latency == pytest.approx(max(0.0, fit["allreduce"]["intercept"]
                                                           - 2 * fit["pingpong"]["alpha"]))
    assert cluster.server_net.bandwidth == pytest.approx(fit["pingpong"]["bandwidth"])
    assert workload.param_bytes == 101_770 * 4 and workload.compute_time > 0
    assert 0 < workload.backward_fraction < 1
    for name in ("allreduce", "pingpong"):
        assert fit[name]["bandwidth"] > 1e7 and fit[name]["alpha"] >= 0 and np.isfinite(fit[name]["r2"])
    assert set(fit["compute"]) == {"fp32", "amp"}
    # the workload's compute time is the one measured with every rank computing at once
    assert workload.compute_time == pytest.approx(fit["compute"]["fp32"]["compute_time_concurrent"])
