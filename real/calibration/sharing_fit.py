"""How two colliding transfers split a link, in syncsim.network's terms (Link.newcomer_weight and
Link.sharing_spread), fitted to the sharing probe's trials (no torch, no I/O)."""

from __future__ import annotations

import math

__all__ = ["simulate_collision", "fit_sharing", "WEIGHT_RANGE"]

WEIGHT_RANGE = 64.0  # newcomer weights are fitted within [1/64, 64]


def simulate_collision(starts: list[float], size: float, bandwidth: float, alpha: float, burst: float,
                       weight: float) -> list[float]:
    """When each of the transfers of ``size`` bytes started at ``starts`` ends on one syncsim link."""
    import simpy

    from syncsim.network import SharedLink

    env = simpy.Environment()
    link = SharedLink(env, bandwidth, burst=burst, newcomer_weight=weight)
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
    lone transfer later, or at once) through one shaper, and timed when each ended. The link's rate
    fixes when the pair is done; how the two ends split that is what the newer flow's weight w sets.
    Each trial's w minimises the squared error of its two ends relative to each transfer's duration,
    searched on a log grid from 1/WEIGHT_RANGE to WEIGHT_RANGE and refined around the best point.
    ``weight`` is the geometric mean of the trials' w (the newer flow's mean preference),
    ``spread`` the standard deviation of their log (how widely collisions scatter), ``weights`` the
    geometric mean per pattern, ``residual`` the root-mean-square relative error of the ends with each
    trial's own w (how well the form fits) and ``residual_fair`` the same with w = 1 (equal sharing)."""
    import numpy as np

    def errors(weight: float, trial: dict) -> list[float]:
        ends = simulate_collision(trial["starts"], size, bandwidth, alpha, burst, weight)
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
