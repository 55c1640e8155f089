"""``python -m studies.validation`` (or ``python -m real.testbed --check``): syncsim against the testbed.

1. On a 2-host testbed, real.calibrate's probe (run as a 2-node torchrun) measures the compute time of
   one batch with both hosts computing and sweeps ping-pong and all-reduce over 16 KiB..4 MiB; the sweep
   stops at 4 MiB because at 25 MB/s calibrate's 64 MiB points alone would take over a minute.
   real.calibrate.fit_linear fits the closed forms to the messages of at least ten tbf bursts: the
   all-reduce fit becomes the workers' link, the ping-pong fit the server link, as real.calibrate does.
2. The scheme runs for real: allreduce on 2 hosts, then a synchronous parameter server on 3 hosts
   (2 workers + 1 server), ``--steps`` steps each.
3. syncsim simulates both on the fitted Cluster and the measured Workload; the table shows predicted
   and measured steady-state step time and their ratio. Results go to OUT/check.json.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]

SWEEP = tuple(2**k for k in range(14, 23))  # 16 KiB .. 4 MiB, ×2 apart
SCHEMES = (("allreduce", 0), ("ps", 1))  # (scheme, servers)


def main(argv: list[str] | None = None) -> int:
    from real.calibrate import MAX_REPEATS
    from real.config import MODELS
    from syncsim.arguments import ArgumentParser, check_count, fail, integer
    from syncsim.files import check_out_dir

    ap = ArgumentParser(prog="python -m studies.validation", description=__doc__.splitlines()[0])
    ap.add_argument("--bandwidth", default="200Mbit/s", help="each link's rate, each direction")
    ap.add_argument("--model", default="lenet", choices=MODELS)
    ap.add_argument("--steps", type=integer, default=30)
    ap.add_argument("--batch-size", type=integer, default=32)
    ap.add_argument("--repeats", type=integer, default=5, help="repeats per message size in the sweep")
    ap.add_argument("--prefix", default="sstb", help="namespace name prefix")
    ap.add_argument("--out", default="results/testbed/check")
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        import real.calibrate as calibrate

        calibrate.probe(args.probe, args.repeats, args.model, args.batch_size, sizes=SWEEP)
        return 0

    from real.calibrate import link_fits, measure_compute
    from real.config import RunConfig
    from real.interrupt import Interrupted, raise_on_signals
    from real.testbed import Testbed, TestbedConfig, TestbedUnavailable, run, torchrun_on
    from syncsim import simulate
    from syncsim.cluster import Cluster, Link
    from syncsim.files import write_atomic

    raise_on_signals()  # SIGINT/SIGTERM unwind through each Testbed's __exit__, which removes the namespaces
    try:
        out = check_out_dir(args.out)
        configs = {scheme: RunConfig(scheme=scheme, world=2, servers=servers, model=args.model, steps=args.steps,
                                     batch_size=args.batch_size, out=str(out / scheme))
                   for scheme, servers in SCHEMES}
        check_count("--repeats", args.repeats, 1, MAX_REPEATS)
        TestbedConfig(hosts=3, bandwidth=args.bandwidth, prefix=args.prefix)  # fails before anything is built
    except ValueError as err:
        return fail("studies.validation", err)
    measured = {}
    try:
        with Testbed(hosts=2, bandwidth=args.bandwidth, prefix=args.prefix) as bed:
            probe_file = out / "probe.json"
            codes = torchrun_on(bed, "studies.validation", ["--probe", str(probe_file), "--repeats", str(args.repeats),
                                                       "--model", args.model, "--batch-size", str(args.batch_size)],
                                out / "probe-logs", timeout=180)
            if any(codes):
                print(f"studies.validation: probe failed ({codes}); see {out}/probe-logs/", file=sys.stderr)
                return 1
            measured["allreduce"] = run(bed, configs["allreduce"], timeout=180)
        with Testbed(hosts=3, bandwidth=args.bandwidth, prefix=args.prefix) as bed:
            measured["ps"] = run(bed, configs["ps"], timeout=180)
    except TestbedUnavailable as err:
        return fail("studies.validation", err)
    except Interrupted as err:
        print(f"studies.validation: interrupted by {err.name}; namespaces removed", file=sys.stderr)
        return err.exit_code
    for scheme, (code, message) in measured.items():
        if code:
            print(f"studies.validation: {scheme}: {message}", file=sys.stderr)
            return 1

    probe = json.loads(probe_file.read_text())
    # A full token bucket lets its burst pass at veth speed, so a message within a few bursts of it comes
    # out faster than the link (ping-pong of 16 KiB ran at 65-104 MB/s behind a 25 MB/s link); from ten
    # bursts up that head start is under a tenth of the transfer.
    link_config = TestbedConfig(bandwidth=args.bandwidth)
    fits = link_fits(probe, min_bytes=10 * link_config.burst)
    # The probe timed compute with both hosts computing at once, as in a run (real.calibrate does the same).
    workload = measure_compute(args.model, args.batch_size, amp=False)
    workload = workload.replace(compute_time=probe["compute_concurrent"]["fp32"])
    link = Link(bandwidth=fits["allreduce"]["bandwidth"], latency=fits["allreduce"]["alpha"])
    server_link = Link(bandwidth=fits["pingpong"]["bandwidth"], latency=fits["pingpong"]["alpha"])
    rows = []
    for scheme, servers in SCHEMES:
        cluster = Cluster.homogeneous(gpus=2, link=link, servers=servers,
                                      server_link=server_link if servers else None, name="testbed",
                                      collective_latency=fits["allreduce"]["launch"])
        predicted = simulate(cluster, workload, scheme, steps=args.steps, seed=0).step_time
        summary = json.loads((out / scheme / "summary.json").read_text())
        rows.append({"scheme": scheme, "hosts": 2 + servers, "predicted": predicted,
                     "measured": summary["step_time"], "ratio": predicted / summary["step_time"]})
    nominal = link_config.bandwidth
    result = {"bandwidth_nominal": nominal, "fits": fits, "compute_time": workload.compute_time,
              "param_bytes": workload.param_bytes, "model": args.model, "batch_size": args.batch_size,
              "steps": args.steps, "rows": rows}
    write_atomic(out / "check.json", json.dumps(result, indent=1))
    print(f"studies.validation: {args.model}, batch {args.batch_size}, {workload.param_bytes / 1e6:.2f} MB of "
          f"parameters, compute {workload.compute_time * 1e3:.2f} ms per step with 2 hosts computing")
    for name, fit in fits.items():
        print(f"studies.validation: {name:9s} fit: B {fit['bandwidth'] / 1e6:6.2f} MB/s "
              f"({fit['bandwidth'] / nominal:.0%} of the {nominal / 1e6:.1f} MB/s link), "
              f"alpha {fit['alpha'] * 1e6:7.1f} us, R² {fit['r2']:.4f}")
    print(f"{'scheme':10s} {'hosts':>5s} {'predicted ms':>13s} {'measured ms':>12s} {'ratio':>6s}")
    for r in rows:
        print(f"{r['scheme']:10s} {r['hosts']:5d} {r['predicted'] * 1e3:13.1f} {r['measured'] * 1e3:12.1f} "
              f"{r['ratio']:6.2f}")
    print(f"studies.validation: wrote {out}/check.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
