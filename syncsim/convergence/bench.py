"""Replay speed: 100,000 asynchronous updates on a 1,000-parameter logistic regression.

``python -m syncsim.convergence.bench`` prints the replay's wall time (the
target is at most 10 s on the project's 2-core machine) and, separately, the
time the simulation that produced the update order took.
"""

from __future__ import annotations

import sys
import time

from syncsim import Cluster, Link, Workload, simulate
from syncsim.arguments import ArgumentParser, check_count, fail, integer
from syncsim.convergence.problems import LogisticRegression
from syncsim.convergence.replay import replay
from syncsim.limits import SIM_BYTES_PER_WORKER_STEP, check_memory

__all__ = ["bench"]


def bench(updates: int = 100_000, features: int = 1000, workers: int = 4, seed: int = 0) -> dict:
    # An asynchronous parameter server applies one update per push, so
    # `updates` pushes come from updates / workers steps per worker; jitter
    # makes the arrival order (and the staleness) irregular, as in practice.
    check_count("updates", updates, workers)  # one step per worker at least
    check_memory("updates", updates, "simulated updates", SIM_BYTES_PER_WORKER_STEP, "lower --updates")
    # everything checked before anything runs: the problem's size, then the simulation's
    problem = LogisticRegression(features=features, samples=4096, seed=seed)
    cluster = Cluster.homogeneous(workers, Link("10Gbit/s", "5us"), servers=1, jitter=0.3)
    workload = Workload(param_bytes=4.0 * features, compute_time="10ms", batch_size=32, name="logreg")
    start = time.perf_counter()
    result = simulate(cluster, workload, "ps:mode=async", steps=updates // workers, seed=seed)
    simulated = time.perf_counter() - start
    _ = problem.data  # generating the data set is not part of the replay
    start = time.perf_counter()
    curve = replay(result, problem, lr=0.5, seed=seed)
    replayed = time.perf_counter() - start
    return {"updates": len(result.updates), "params": problem.dim, "replay_s": replayed,
            "updates_per_s": len(result.updates) / replayed, "simulate_s": simulated,
            "final_loss": float(curve["loss"].iloc[-1]), "final_accuracy": float(curve["accuracy"].iloc[-1])}


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m syncsim.convergence.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=integer, default=100_000, help="asynchronous updates to replay (>= 4)")
    parser.add_argument("--features", type=integer, default=1000, help="parameters of the problem")
    args = parser.parse_args(argv)
    try:
        out = bench(args.updates, args.features)
    except ValueError as err:
        return fail("syncsim.convergence.bench", err)
    print(f"replayed {out['updates']:,} updates on {out['params']:,} parameters in {out['replay_s']:.2f} s "
          f"({out['updates_per_s']:,.0f} updates/s); simulating them took {out['simulate_s']:.2f} s; "
          f"final held-out loss {out['final_loss']:.3f}, accuracy {out['final_accuracy']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
