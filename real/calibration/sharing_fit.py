"""How two colliding transfers split a link, in syncsim.network's terms (Link.newcomer_weight and
Link.sharing_spread), fitted to the sharing probe's trials; and how much longer a transfer into a host
takes while the host sends (fit_duplex) (no torch, no I/O)."""

from __future__ import annotations

import math

__all__ = ["simulate_collision", "fit_sharing", "fit_duplex", "WEIGHT_RANGE"]

WEIGHT_RANGE = 64.0  # newcomer weights are fitted within [1/64, 64]


def simulate_collision(starts: list[float], size: float, bandwidth: float, alpha: float, burst: float,
                       weight: float, sender_burst: float = 0.0) -> list[float]:
    """When each of the transfers of ``size`` bytes started at ``starts`` ends on one syncsim link; with
    ``sender_burst``, each sender's own bucket (pushes from shaped hosts into the server's shaper)."""
    import simpy

    from syncsim.network import SharedLink

    env = simpy.Environment()
    link = SharedLink(env, bandwidth, burst=burst, newcomer_weight=weight, sender_burst=sender_burst)
    ends = [math.nan] * len(starts)
    first = min(starts)

    def flow(i: int, start: float):
        yield env.timeout(start - first)
        yield link.transfer(size)
        ends[i] = env.now + first + alpha

    for i in sorted(range(len(starts)), key=starts.__getitem__):
        env.process(flow(i, starts[i]))
    env.run()
    return ends


def fit_sharing(trials: list[dict], bandwidth: float, alpha: float, burst: float, size: float) -> dict:
    """How the measured collisions split the link, in syncsim.network's terms (Link.newcomer_weight and
    Link.sharing_spread).

    Each trial started two transfers of ``size`` bytes at measured instants (the second a fraction of a
    lone transfer later, or at once) through one shaper, and timed when each ended. "into" trials are
    replayed as the simulator runs pushes into a server, each sender's own bucket (``burst``: the
    testbed's hosts all have the same) served first (syncsim.network's sender_burst); "out" trials
    leave one host, whose own shaper is the one they share. The link's rate
    fixes when the pair is done; how the two ends split that is what the newer flow's weight w sets.
    Each trial's w minimises the squared error of its two ends relative to each transfer's duration,
    searched on a log grid from 1/WEIGHT_RANGE to WEIGHT_RANGE and refined around the best point.
    ``weight`` is the geometric mean of the trials' w (the newer flow's mean preference),
    ``spread`` the standard deviation of their log (how widely collisions scatter), ``weights`` the
    geometric mean per pattern, ``residual`` the root-mean-square relative error of the ends with each
    trial's own w (how well the form fits) and ``residual_fair`` the same with w = 1 (equal sharing)."""
    import numpy as np

    def errors(weight: float, trial: dict) -> list[float]:
        ends = simulate_collision(trial["starts"], size, bandwidth, alpha, burst, weight,
                                  sender_burst=burst if trial["pattern"] == "into" else 0.0)
        return [(e - m) / (m - s) for e, m, s in zip(ends, trial["ends"], trial["starts"])]

    def cost(weight: float, trial: dict) -> float:
        return float(np.mean(np.square(errors(weight, trial))))

    def best(trial: dict) -> float:
        grid = np.geomspace(1 / WEIGHT_RANGE, WEIGHT_RANGE, 61)
        i = int(np.argmin([cost(w, trial) for w in grid]))
        fine = np.geomspace(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)], 41)
        return float(min(fine, key=lambda w: cost(w, trial)))

    if len(trials) < 2:
        raise ValueError(f"fit_sharing needs at least 2 trials to tell a spread, got {len(trials)}")
    logs = np.log([best(trial) for trial in trials])
    patterns = [trial["pattern"] for trial in trials]

    def rms(weights) -> float:
        return float(np.sqrt(np.mean([e * e for w, t in zip(weights, trials) for e in errors(w, t)])))

    return {"weight": float(np.exp(logs.mean())), "spread": float(logs.std(ddof=1)),
            "weights": {p: float(np.exp(np.mean([x for x, q in zip(logs, patterns) if q == p])))
                        for p in sorted(set(patterns))},
            "trial_weights": [float(w) for w in np.exp(logs)],
            "residual": rms(np.exp(logs)), "residual_fair": rms([1.0] * len(trials))}


def fit_duplex(trials: list[dict], bandwidth: float, alpha: float, burst: float, size: float) -> dict:
    """How much longer each of two transfers of ``size`` bytes crossing one host's link in opposite
    directions took than a lone one (syncsim's price: ``alpha`` + (size - ``burst``)/``bandwidth``).

    Each of the sharing probe's "turns" trials is one turn of two peers taking turns at the host: flow 0
    a peer's transfer into the host (a push), flow 1 the host's transfer out to the other peer (a pull's
    reply), started together. ``duplex_stretches`` is flow 0's measured duration over that price, one per
    trial: the sample Link.crossing_stretch draws from; ``duplex_stretch`` their mean and
    ``duplex_stretch_reply`` flow 1's. NaN (and no per-trial values) without trials."""
    import numpy as np

    if not trials:
        return {"duplex_stretch": math.nan, "duplex_stretch_reply": math.nan, "duplex_stretches": []}
    lone = simulate_collision([0.0], size, bandwidth, alpha, burst, 1.0)[0]
    stretch = np.array([[(e - s) / lone for s, e in zip(t["starts"], t["ends"])] for t in trials])
    return {"duplex_stretch": float(stretch[:, 0].mean()), "duplex_stretch_reply": float(stretch[:, 1].mean()),
            "duplex_stretches": [float(x) for x in stretch[:, 0]]}
