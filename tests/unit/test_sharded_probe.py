"""real.calibration.sharded_probe's fit: the traffic factors that make syncsim's price of a sharded step's
collectives equal what the testbed measured."""

from __future__ import annotations

import pytest

from real.calibration.sharded_fit import fit_traffic, simulated_collectives
from syncsim import Cluster, Link, Workload

LAYERS = (401_408.0, 512.0, 5_120.0, 40.0)  # the small model's fp32 tensors (real.models "mlp")
WORKLOAD = Workload(param_bytes=sum(LAYERS), compute_time="1ms", batch_size=32, layers=LAYERS)
CLUSTER = Cluster.homogeneous(2, Link(bandwidth="200Mbit/s", latency="180us"), collective_latency="1.1ms")


@pytest.mark.parametrize("scheme", ["zero:stage=1", "zero:stage=2", "zero:stage=3", "fsdp", "fsdp:reshard=false"])
@pytest.mark.parametrize("scatter, gather", [(1.0, 1.0), (2.15, 1.02), (0.6, 3.4)])
def test_the_fit_recovers_the_factors_a_step_was_priced_with(scheme, scatter, gather):
    # Basis: allgather_time is linear in its traffic factor (syncsim.collectives), so a measurement that is the
    # simulator's own price at known factors is fitted back to them, to float rounding.
    measured = simulated_collectives(CLUSTER.replace(reducescatter_traffic=scatter, allgather_traffic=gather),
                                     WORKLOAD, scheme)
    fitted = fit_traffic(measured, CLUSTER, WORKLOAD, scheme)
    assert fitted == pytest.approx({"reducescatter_traffic": scatter, "allgather_traffic": gather}, rel=1e-9)


def test_a_step_s_collectives_are_priced_by_kind():
    # ZeRO-3 gathers the parameters twice a step (before forward and before backward) and reduce-scatters the
    # gradient once, each a ring pass of (p - 1)/p of the bytes: at two workers the gathers cost twice the scatter
    spent = simulated_collectives(CLUSTER, WORKLOAD, "zero:stage=3")
    assert spent["allgather"] == pytest.approx(2 * spent["reducescatter"], rel=1e-9)
    assert spent["reducescatter"] > 0


def test_a_measurement_outside_the_cluster_s_bounds_is_clipped_to_them():
    fitted = fit_traffic({"reducescatter": 1e3, "allgather": 0.0}, CLUSTER, WORKLOAD, "fsdp")
    assert fitted == {"reducescatter_traffic": 100.0, "allgather_traffic": 0.1}
