"""``python -m real.calibration --probe|--compute|--sharing|--server|--sharded|--machine FILE ...``: one rank of a
calibration probe, started by the measure_* function that launches it (on the testbed's hosts, or forked
locally); rank 0 writes the probe's timings to FILE."""

from __future__ import annotations

from real.calibration import compute_probe, link_probe, machine_probe, server_probe, sharded_probe, sharing_probe
from real.calibration.machine_probe import MAX_REPEATS
from real.calibration.messages import PRECISIONS, parse_at, parse_gather
from syncsim.arguments import ArgumentParser, check_count, integer, number
from syncsim.files import check_out_file

__all__ = ["main"]

MODES = ("probe", "compute", "sharing", "server", "sharded", "machine")  # the probes, each named by its output option


def _parser() -> ArgumentParser:
    from real.config import MODELS

    ap = ArgumentParser(prog="python -m real.calibration", description=__doc__.splitlines()[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--probe", help="(a rank of) the link probe: write the sweeps here")
    what.add_argument("--compute", help="(a rank of) the compute probe: write the timings here")
    what.add_argument("--sharing", help="(a rank of) the sharing probe: write the collisions here")
    what.add_argument("--server", help="(a rank of) the server probe: write the requests' timings here")
    what.add_argument("--sharded", help="(a rank of) the sharded probe: write its collectives' timings here")
    what.add_argument("--machine", help="(a rank of) the user calibration's probe (real.calibrate): write it here")
    ap.add_argument("--size", type=integer, default=2**20,
                    help="bytes of each transfer of the sharing probe, of the server probe's payload")
    ap.add_argument("--lone", type=number, default=0.0, help="seconds a lone transfer of --size takes (offsets)")
    ap.add_argument("--repeats", type=integer, default=5)
    ap.add_argument("--idle", type=number, default=0.0, help="seconds each link rests before a timed transfer")
    ap.add_argument("--at", default="", help="the link probe also times these all-reduces, BYTES:PRECISION,... "
                                             "(the runs' own sizes)")
    ap.add_argument("--gather", default="", help="the link probe also times these top-k exchanges, VALUES:PRECISION,"
                                                 "... (an all-gather of VALUES int32 indices, then of VALUES values)")
    ap.add_argument("--after", type=number, default=0.0,
                    help="seconds of CPU time each rank computes after its part of each --at or --gather timing "
                         "(a step's compute)")
    ap.add_argument("--no-sweep", action="store_true", help="the link probe times only --at and --gather")
    ap.add_argument("--precisions", default=",".join(PRECISIONS),
                    help="the link probe's sweep times all-reduces at these wire precisions (fp32 always)")
    ap.add_argument("--precision", default="fp32", choices=PRECISIONS, help="the server probe's wire precision")
    ap.add_argument("--model", default="lenet", choices=MODELS)
    ap.add_argument("--batch-size", type=integer, default=32)
    ap.add_argument("--scheme", default="allreduce",
                    help="the scheme whose worker step the compute probe times (the sharded probe: its collectives)")
    ap.add_argument("--slow", type=number, default=1.0, help="the compute probe's last rank is this many times slower")
    ap.add_argument("--powersgd-rank", type=integer, default=1,
                    help="the user calibration's PowerSGD rank (its compress_flops)")
    return ap


def _check(args) -> tuple[str, str]:
    """(the probe's mode, its output file), every option checked; ValueError naming the first bad one."""
    from real.config import MAX_SLOW, SAMPLE_BYTES
    from syncsim.limits import check_memory
    from syncsim.schemes import parse

    mode = next(m for m in MODES if getattr(args, m) is not None)
    out = getattr(args, mode)
    check_out_file(out, f"--{mode}")
    check_count("--size", args.size, 1 if mode == "server" else 4, None if mode == "server" else 2**30)
    if not 0 <= args.lone <= 60:
        raise ValueError(f"--lone must be between 0 and 60 seconds, got {args.lone:g}")
    check_count("--repeats", args.repeats, 1, MAX_REPEATS)
    check_count("--batch-size", args.batch_size, 1)
    check_count("--powersgd-rank", args.powersgd_rank, 1, 2**20)
    try:
        parse(args.scheme)
    except ValueError as err:
        raise ValueError(f"--scheme: {err}") from None
    check_memory("--batch-size", args.batch_size, "samples of a batch", SAMPLE_BYTES, "lower --batch-size")
    if not 1 <= args.slow <= MAX_SLOW:
        raise ValueError(f"--slow must be between 1 and {MAX_SLOW:g}, got {args.slow:g}")
    if not 0 <= args.idle <= 60:
        raise ValueError(f"--idle must be between 0 and 60 seconds, got {args.idle:g}")
    if not 0 <= args.after <= 60:
        raise ValueError(f"--after must be between 0 and 60 seconds, got {args.after:g}")
    return mode, out


def _precisions(text: str) -> tuple[str, ...]:
    """``--precisions``' entries, fp32 first; ValueError naming the option for one that is not a precision."""
    precisions = tuple(dict.fromkeys(["fp32", *filter(None, text.split(","))]))
    if unknown := [p for p in precisions if p not in PRECISIONS]:
        raise ValueError(f"--precisions: each must be one of {sorted(PRECISIONS)}, got {unknown[0]!r}")
    return precisions


def main(argv: list[str] | None = None) -> int:
    """One rank of the probe the options name; 0 (bad options exit 2 with a line naming the option)."""
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        mode, out = _check(args)
        at, gather, precisions = parse_at(args.at), parse_gather(args.gather), _precisions(args.precisions)
    except ValueError as err:
        ap.error(str(err))
    if mode == "probe":
        link_probe.link_rank(out, args.repeats, args.idle, at, sweep_sizes=not args.no_sweep, precisions=precisions,
                             gather=gather, after=args.after)
    elif mode == "sharing":
        sharing_probe.sharing_rank(out, args.size, args.repeats, args.idle, args.lone)
    elif mode == "server":
        server_probe.server_rank(out, args.size, args.precision, args.repeats, args.idle)
    elif mode == "sharded":
        sharded_probe.sharded_rank(out, args.scheme, args.model, args.repeats, args.idle)
    elif mode == "machine":
        machine_probe.machine_rank(out, args.repeats, args.model, args.batch_size, powersgd_rank=args.powersgd_rank)
    else:
        compute_probe.compute_rank(out, args.model, args.batch_size, args.scheme, args.slow)
    return 0
