"""``python -m real.testbed.launch_bench``: how long a short testbed run takes with its ranks forked
(real.testbed.forkserver) against each started as ``ip netns exec NS python -m real.worker``.

Both ways run the same configuration on a fresh testbed each time, in turns (started, forked, started,
...), so both see the same machine load; each time is the whole run as a study pays for it, from the
launcher's call to the merged outputs. The first forked run also starts the fork server. Needs root and
iproute2.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

from syncsim.arguments import ArgumentParser, check_count, fail, integer

__all__ = ["main"]

MAX_RUNS = 100


def time_run(cfg_fields: dict, bandwidth: str, fork: bool, out: str) -> float:
    from real.config import RunConfig
    from real.testbed import Testbed, run

    cfg = RunConfig(**cfg_fields, out=out)
    started = time.perf_counter()
    with Testbed(hosts=cfg.ranks, bandwidth=bandwidth, prefix="sslaunch") as bed:
        code, message = run(bed, cfg, timeout=300, agent=False, fork=fork)
    if code:
        raise RuntimeError(message)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="real.testbed.launch_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=integer, default=3, help="runs of each way (default 3)")
    ap.add_argument("--scheme", default="ps", help="the runs' scheme (default ps)")
    ap.add_argument("--world", type=integer, default=2, help="workers (default 2)")
    ap.add_argument("--servers", type=integer, default=1, help="parameter servers (default 1)")
    ap.add_argument("--model", default="mlp", help="model (default mlp)")
    ap.add_argument("--steps", type=integer, default=8, help="steps per run (default 8)")
    ap.add_argument("--bandwidth", default="1Gbit/s", help="each host's link (default 1Gbit/s)")
    args = ap.parse_args(argv)
    try:
        from real.config import RunConfig
        from real.testbed import TestbedConfig, unavailable

        check_count("--runs", args.runs, 1, MAX_RUNS)
        fields = dict(scheme=args.scheme, world=args.world, servers=args.servers, model=args.model,
                      steps=args.steps, batch_size=16)
        ranks = RunConfig(**fields, out=tempfile.gettempdir()).ranks
        TestbedConfig(hosts=ranks, bandwidth=args.bandwidth)
        reason = unavailable()
        if reason:
            raise ValueError(reason)
    except ValueError as err:
        return fail("real.testbed.launch_bench", err)
    times: dict[str, list[float]] = {"started": [], "forked": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for way in times:
                times[way].append(time_run(fields, args.bandwidth, way == "forked", f"{tmp}/{way}{i}"))
                print(f"  run {i + 1}, {way}: {times[way][-1]:.2f} s", flush=True)
    started, forked = statistics.median(times["started"]), statistics.median(times["forked"])
    print(f"real.testbed.launch_bench: {args.scheme} on {args.world} workers + {args.servers} servers ({ranks} hosts), "
          f"{args.model}, {args.steps} steps at {args.bandwidth}, median of {args.runs}")
    print(f"  started (ip netns exec python -m): {started:.2f} s;  forked: {forked:.2f} s;  "
          f"saved {started - forked:.2f} s a run (x{started / forked:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
