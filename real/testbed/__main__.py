"""Run a scheme on the emulated network: ``python -m real.testbed [--hosts N] [--bandwidth B] -- <real.run options>``.

``python -m real.testbed --hosts 3 --bandwidth 200Mbit/s -- --scheme ps --servers 1 --world 2`` builds
the testbed (real.testbed.namespaces), starts one torchrun *node* per host (real.testbed.launcher,
real.agent: multi-node c10d rendezvous, one rank per node), merges the outputs, tears the testbed down
and prints the summary; SIGINT/SIGTERM stop the nodes and keep what was done. ``python -m real.testbed
--check`` is ``python -m studies.validation --quick``: this process becomes that program (check).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from real.interrupt import Interrupted, raise_on_signals
from real.testbed.launcher import MAX_RUN_TIMEOUT, run
from real.testbed.namespaces import QUEUE, Testbed, TestbedUnavailable
from syncsim.arguments import ArgumentParser, fail, integer, number

__all__ = ["main", "check"]

STUDY = "studies.validation"  # the study --check is, run as its own program


def check(prefix: str, options: list[str]) -> None:
    """Become ``python -m studies.validation --quick --prefix PREFIX OPTIONS``; never returns.

    The check is that study's quick preset exactly, so the process is replaced by it (os.execv) rather
    than importing it: the testbed's modules never import studies/ (the study imports them), and the
    study's own output, exit code and signal handling (SIGINT/SIGTERM unwind its testbeds and remove
    their namespaces) are the check's, with no parent process to forward a signal or hold a second
    handler."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", STUDY, "--quick", "--prefix", prefix, *options])


def main(argv: list[str] | None = None) -> int:
    from real.config import RunConfig

    raise_on_signals()  # SIGINT/SIGTERM unwind through the Testbed's __exit__, which removes the namespaces
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, theirs = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = ArgumentParser(prog="python -m real.testbed", description=__doc__.splitlines()[0],
                        epilog="Options after -- are real.run's (see docs/real.md).")
    ap.add_argument("--hosts", type=integer, help="hosts (default: the run's ranks, world + servers)")
    ap.add_argument("--bandwidth", default="200Mbit/s", help="each link's rate, each direction")
    ap.add_argument("--queue", default=QUEUE, help="tbf latency: longest wait in a shaper (deep enough to lose "
                                                  "no packet; real.testbed.namespaces.QUEUE)")
    ap.add_argument("--prefix", default="sstb", help="namespace name prefix")
    ap.add_argument("--run-timeout", type=number, default=600.0, help="seconds before the nodes are stopped")
    ap.add_argument("--check", action="store_true",
                    help="python -m studies.validation --quick: predicted against measured (its options after --)")
    args = ap.parse_args(ours)
    if args.check:
        check(args.prefix, theirs)
    try:
        if not 0 < args.run_timeout <= MAX_RUN_TIMEOUT:
            raise ValueError(f"--run-timeout must be in (0, {MAX_RUN_TIMEOUT:g}] seconds, got {args.run_timeout:g}")
        cfg = RunConfig.from_argv(theirs, prog="python -m real.testbed")
        hosts = cfg.ranks if args.hosts is None else args.hosts
        if hosts != cfg.ranks:
            raise ValueError(f"--hosts must equal the run's ranks, world + servers = {cfg.ranks}; got {hosts}")
        bed = Testbed(hosts=hosts, bandwidth=args.bandwidth, prefix=args.prefix, queue=args.queue)
    except ValueError as err:
        return fail("real.testbed", err)
    try:
        with bed:
            code, message = run(bed, cfg, timeout=args.run_timeout)
    except TestbedUnavailable as err:
        return fail("real.testbed", err)
    except Interrupted as err:  # while the testbed was being built or torn down
        print(f"real.testbed: interrupted by {err.name}; namespaces removed", file=sys.stderr)
        return err.exit_code
    if code:
        print(f"real.testbed: {message}" + ("" if code == 1 else f"; partial outputs in {cfg.out}/ "
                                             "(summary.json has complete=false)"), file=sys.stderr)
        return code
    from real.run import describe

    summary = json.loads((Path(cfg.out) / "summary.json").read_text())
    print("real.testbed: " + describe(summary, cfg, f" on {hosts} hosts, {args.bandwidth} links"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
