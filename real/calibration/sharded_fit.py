"""How long a sharded scheme's collectives keep the links busy, as syncsim prices them, and the traffic
factors that make that price equal a measurement (real.calibration.sharded_probe measures it).

The simulator prices ZeRO's and FSDP's reduce-scatters and parameter all-gathers as NCCL's rings run them
(syncsim.collectives: every GPU sends (p - 1)/p of the bytes, both directions of every link busy at once).
A backend that runs them otherwise is described by ``Cluster.reducescatter_traffic`` and
``allgather_traffic``, multipliers of the ring's byte term. ``fit_traffic`` gives them from the step's
collectives as timed: the multipliers that make the simulator's own price of those collectives (a simulation
of the step with no compute, ``simulated_collectives``) equal the measured seconds. NCCL's ring is 1.
"""

from __future__ import annotations

__all__ = ["KINDS", "fit_traffic", "simulated_collectives"]

KINDS = ("reducescatter", "allgather")


def simulated_collectives(cluster, workload, scheme: str) -> dict[str, float]:
    """Seconds per step syncsim spends in each of KINDS for ``scheme`` on ``cluster`` with ``workload``'s
    layers and no compute to overlap: the sum of the kind's spans of one worker's middle step."""
    from syncsim import simulate

    steps = 4
    trace = simulate(cluster.replace(jitter=0.0), workload.replace(compute_time=1e-9), scheme, steps=steps,
                     seed=0).trace
    step = trace[(trace["worker"] == 0) & (trace["step"] == steps // 2)]
    return {kind: float((step.end - step.start)[step.kind == kind].sum()) for kind in KINDS}


def fit_traffic(measured: dict[str, float], cluster, workload, scheme: str) -> dict[str, float]:
    """{"reducescatter_traffic", "allgather_traffic"}: for each kind, the multiplier of the ring's byte
    term that makes the simulator's price of the step's collectives of that kind equal ``measured[kind]``
    (seconds per step). The price is linear in the multiplier (syncsim.collectives.allgather_time), so two
    simulations, at 1 and 2, give it; a kind the step does not issue keeps 1. Within Cluster's bounds."""
    at_one = simulated_collectives(cluster.replace(reducescatter_traffic=1.0, allgather_traffic=1.0), workload, scheme)
    at_two = simulated_collectives(cluster.replace(reducescatter_traffic=2.0, allgather_traffic=2.0), workload, scheme)
    factors = {}
    for kind in KINDS:
        slope = at_two[kind] - at_one[kind]
        if slope <= 0 or kind not in measured:
            factors[f"{kind}_traffic"] = 1.0
            continue
        fixed = at_one[kind] - slope
        factors[f"{kind}_traffic"] = min(100.0, max(0.1, (measured[kind] - fixed) / slope))
    return factors
