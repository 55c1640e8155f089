"""The link probe: a ping-pong between two testbed hosts and all-reduces over every host at each wire
precision, swept over message sizes, and a run's own all-reduces and top-k exchanges timed at their sizes;
measure_link runs it on a testbed and fits the links (real.calibration.link_fit)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from real.calibration.cache import cached, check_online, recorded, slug, store
from real.calibration.link_fit import fit_links
from real.calibration.messages import PRECISIONS, encode_at, valid_at, valid_gather
from real.calibration.timing import SMALL, SMALL_REPEATS, at_repeats, busy, interleaved, refill_idle, timed_once
from syncsim.files import write_atomic

__all__ = ["SWEEP", "measure_link", "link_rank"]

SWEEP = tuple(2**k for k in range(12, 23))  # 4 KiB .. 4 MiB, ×2 apart


def measure_link(bandwidth: str, folder: Path, prefix: str = "sstb", repeats: int = 5,
                 message_bytes: float | None = None, hosts: int = 2, now: tuple[tuple[int, str], ...] = (),
                 precisions: tuple[str, ...] = ("fp32",), gathers: tuple[tuple[int, str], ...] = (),
                 after: float = 0.0, keep: str = "") -> dict:
    """Probe a testbed of ``hosts`` hosts at ``bandwidth``; {"probe": raw sweeps, "burst": tbf bucket,
    "fits": fit_links, "now": the timings of ``now``, "gather_now": those of ``gathers``, "exits_now": how
    far apart the ranks left each of those, timing by timing}, the rates fitted around ``message_bytes`` when given
    (see fit_links). The sweep is cached; the fit is made from it each time. It times all-reduces at each
    of ``precisions`` (fp32 always), a quarter of its time each: a study sweeps only the precisions its
    schemes send, and a cached sweep that lacks one asked for is measured again.

    ``now`` are a run's own all-reduces, (bytes, precision) as wire_bytes gives them, timed at every call
    and never cached, at_repeats times each after busy rests; fit_links takes a collective's time at the
    run's size from those timings. Called in the minute before the run, they time its collective as the
    machine is then: on this 2-core machine a collective that the cores rather than the shaper pace
    drifts with the machine's load by more than any model's error (at 1 Gbit/s the same two-host 407 kB
    all-reduce, timed this way in launches a minute apart, took a median 3.9, 8.4, 13.5 and 6.0 ms),
    and a grid's rows run up to half an hour after its link probes.

    The all-reduces run over every host, so a run's collectives are timed with its own number of ranks:
    gloo's ring moves 2(p-1) chunks of n/p through each link, and how TCP paces those through a shaper
    and how long the ranks' threads wait for this machine's two cores depend on p (measured at 1 Gbit/s,
    a 407 kB all-reduce took 4-6 ms over two hosts and 6-9 ms over four). The ping-pong always runs
    between hosts 0 and 1.

    A run with several all-reduces a step (PowerSGD's P and Q rounds) gives them all in ``now``: the
    launch is then fitted so that the closed forms' total passes through their timed total (fit_links'
    ``sizes``). ``gathers`` are a run's all-gathers, (values k, precision): top-k's k int32 indices and
    then its k values at the precision, the two all-gathers real.executor sends a step, timed together
    as one round like ``now`` (never cached; ``gather_now`` in the result) and fitted as
    ``allgather_<precision>`` (fit_links' ``gather``).

    ``after`` (seconds of a core's time: what a run's rank computes between its collectives) is computed by
    each rank once its part of each ``now`` and ``gathers`` timing is over (timing.work), as a run's rank
    starts its next step when it leaves a collective. Ranks
    leave a gloo ring milliseconds apart, and on this machine's two cores those that left first and
    compute take the cores from those still finishing: four hosts' 1.7 MB all-reduce at 1 Gbit/s, timed
    alternately, took a mean 21.8-23.1 ms with the ranks idle after it and 27.8-29.5 ms with them busy
    15 or 30 ms, where the grid's run of it took 29.3 ms from its last rank's entry to its last exit.

    With ``keep`` (a label: a study's row) the timings of ``now`` and ``gathers`` are also kept, as
    ``now-<bandwidth>-h<hosts>-<keep>.json`` (real.calibration.cache.recorded): still timed afresh at
    every call, and read back inside offline(), so a finished study's rows can be predicted again."""
    if not (isinstance(after, (int, float)) and 0 <= after <= 60):
        raise ValueError(f"measure_link: after must be between 0 and 60 seconds (a run's compute step), got {after!r}")
    swept, fresh, gathered = _requests(precisions, now, gathers)
    name = f"{slug(bandwidth)}-h{hosts}"

    def measure(at: list, sweep_sizes: bool = True, tag: str = "", swept: list[str] = swept,
                gather: list = ()) -> dict:
        check_online(f"the link probe at {bandwidth} ({name + tag})")  # a sweep to redo, or a run's own sizes
        return _run_link_probe(bandwidth, folder, name + tag, prefix, hosts, repeats,
                               ["--at", encode_at(at), "--precisions", ",".join(swept)]
                               + (["--gather", encode_at(gather)] if gather else [])
                               + (["--after", repr(float(after))] if gather or at else [])
                               + ([] if sweep_sizes else ["--no-sweep"]))

    path = folder / f"link-{name}.json"
    measured = cached(path, lambda: measure([]))
    had = [precision for precision in PRECISIONS if f"allreduce_{precision}" in measured["probe"]]
    if set(swept) - set(had):  # a precision asked for now was not swept: sweep it and those the cache had
        measured = measure([], swept=sorted(set(swept) | set(had), key=list(PRECISIONS).index))
        store(path, measured)
    timed = {}
    if fresh or gathered:
        def time_now() -> dict:
            return measure(fresh, sweep_sizes=False, tag="-now", gather=gathered)["probe"]

        timed = recorded(folder / f"now-{name}-{slug(keep)}.json", time_now) if keep else time_now()
    timed_now, gather_now, exits_now = timed.get("at_size", []), timed.get("at_gather", []), timed.get("at_exits", [])
    probe = measured["probe"] | {"at_size": timed_now, "at_gather": gather_now}
    # every all-reduce the run sends a step, when it sends several (PowerSGD's two rounds)
    sizes = tuple(size for size, _ in fresh) if len(fresh) > 1 else ()
    fits = fit_links(probe, measured["burst"], message_bytes, sizes=sizes,
                     gather=gathered[0][0] if gathered else None)
    return measured | {"fits": fits, "now": timed_now, "gather_now": gather_now, "exits_now": exits_now}


def _requests(precisions, now, gathers) -> tuple[list[str], list[tuple[int, str]], list[tuple[int, str]]]:
    """measure_link's arguments checked: (the precisions to sweep, fp32 first; the run's all-reduces; its
    top-k exchanges), each list sorted and without repeats; ValueError naming the first that is not valid."""
    if unknown := set(precisions) - set(PRECISIONS):
        raise ValueError(f"measure_link: precisions must be among {sorted(PRECISIONS)}, got {sorted(unknown)}")
    swept = sorted(set(precisions) | {"fp32"}, key=list(PRECISIONS).index)  # fp32: the plain "allreduce" curve
    fresh = sorted({(int(size), str(precision)) for size, precision in now})
    for size, precision in fresh:
        if not valid_at(size, precision):
            raise ValueError(f"measure_link: now entry ({size!r}, {precision!r}) must be a precision of "
                             f"{sorted(PRECISIONS)} and a positive whole number of its elements' bytes")
    gathered = sorted({(int(values), str(precision)) for values, precision in gathers})
    for values, precision in gathered:
        if not valid_gather(values, precision):
            raise ValueError(f"measure_link: gathers entry ({values!r}, {precision!r}) must be a positive number "
                             f"of values and a precision of {sorted(PRECISIONS)}")
    return swept, fresh, gathered


def _run_link_probe(bandwidth: str, folder: Path, name: str, prefix: str, hosts: int, repeats: int,
                    argv: list[str]) -> dict:
    """The link probe's ranks (``python -m real.calibration --probe``, with ``argv``) on a fresh testbed;
    {"bandwidth", "hosts", "burst", "probe": what rank 0 wrote}."""
    from real.testbed.launcher import torchrun_on
    from real.testbed.namespaces import Testbed

    probe_file = folder / f"probe-{name}.json"
    with Testbed(hosts=hosts, bandwidth=bandwidth, prefix=prefix) as bed:
        argv = ["--probe", str(probe_file), "--repeats", str(repeats), *argv, "--idle", str(refill_idle(bed.config))]
        codes = torchrun_on(bed, "real.calibration", argv, folder / "logs", timeout=900, agent=False)
    if any(codes):
        raise RuntimeError(f"link probe at {bandwidth} on {hosts} hosts failed (node exit codes {codes}); "
                           f"logs in {folder}/logs")
    return {"bandwidth": bandwidth, "hosts": hosts, "burst": bed.config.burst,
            "probe": json.loads(probe_file.read_text())}


# -- what the ranks run -------------------------------------------------------------
def link_rank(out: str, repeats: int, idle: float, at: list[tuple[int, str]], sweep_sizes: bool = True,
              precisions: tuple[str, ...] = PRECISIONS, gather: list[tuple[int, str]] = (),
              after: float = 0.0) -> None:
    """Ping-pong (ranks 0 and 1, fp32) and all-reduce (every rank, at each of ``precisions``) over SWEEP,
    then the all-reduces of ``at`` ((bytes, precision): the runs' own sizes) and the top-k exchanges of
    ``gather`` ((values k, precision): an all-gather of k int32 indices, then one of k values, as
    real.executor sends them) at_repeats times each, in turns, each after ``idle`` seconds of busy and
    followed by ``after`` seconds of it (timed_once); ``sweep_sizes`` False times only those."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    result: dict = {"world": dist.get_world_size(), "idle": idle}
    if sweep_sizes:
        result |= _sweeps(repeats, idle, precisions)
    result["after"] = after
    result["at_size"], result["at_gather"], result["at_exits"] = _run_collectives(at, gather, idle, after)
    if dist.get_rank() == 0:
        write_atomic(out, json.dumps(result))
    dist.destroy_process_group()


def _sweeps(repeats: int, idle: float, precisions: tuple[str, ...]) -> dict:
    """The ping-pong's one-way times and each precision's all-reduce times over SWEEP: rows (size, median,
    every timing)."""
    import torch
    import torch.distributed as dist

    from real.wire import WIRE_DTYPES, value_bytes

    rank = dist.get_rank()

    def pingpong(buf):
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)

    def sweep(actions: list, per: float = 1.0, from_last: bool = False) -> list[tuple]:
        # small messages are quick and their times noisy on a shared machine: time them more often
        rounds = [repeats * (SMALL_REPEATS if size <= SMALL else 1) for size in SWEEP]
        times = interleaved(rounds, lambda k: timed_once(actions[k], idle, from_last) / per)
        return [(size, statistics.median(t), t) for size, t in zip(SWEEP, times)]

    result = {}
    bufs = [torch.zeros(size // 4) for size in SWEEP]
    result["pingpong"] = sweep([lambda buf=buf: pingpong(buf) for buf in bufs], per=2.0)  # one way
    for precision in precisions:
        bufs = [torch.zeros(size // value_bytes(precision), dtype=WIRE_DTYPES[precision]) for size in SWEEP]
        result[f"allreduce_{precision}"] = sweep([lambda buf=buf: dist.all_reduce(buf) for buf in bufs],
                                                 from_last=True)
    result["allreduce"] = result["allreduce_fp32"]
    return result


def _run_collectives(at: list[tuple[int, str]], gather: list[tuple[int, str]], idle: float,
                     after: float = 0.0) -> tuple[list, list, list]:
    """(at_size, at_gather, at_exits): every timing of each all-reduce of ``at`` and each top-k exchange of
    ``gather``, at_repeats times each, in turns, each after ``idle`` seconds of busy and followed by
    ``after`` seconds of it; and for each of those (in that order) how long before the last rank every
    rank left it, timing by timing (timed_once's ``exits``)."""
    import torch
    import torch.distributed as dist

    from real.wire import WIRE_DTYPES, value_bytes

    bufs = [torch.zeros(size // value_bytes(precision), dtype=WIRE_DTYPES[precision]) for size, precision in at]
    world = dist.get_world_size()
    exchanges = []  # top-k's: its indices and values, and the lists every rank's are gathered into
    for values, precision in gather:
        index, value = torch.zeros(values, dtype=torch.int32), torch.zeros(values, dtype=WIRE_DTYPES[precision])
        exchanges.append((index, value, [torch.empty_like(index) for _ in range(world)],
                          [torch.empty_like(value) for _ in range(world)]))

    def exchange(j: int) -> None:
        index, value, indices, every = exchanges[j]
        dist.all_gather(indices, index)
        dist.all_gather(every, value)

    exits: list[list] = [[] for _ in range(len(at) + len(exchanges))]

    def at_once(k: int) -> float:
        action = (lambda: dist.all_reduce(bufs[k])) if k < len(at) else (lambda: exchange(k - len(at)))
        return timed_once(action, idle, from_last=True, rest=busy, after=after, exits=exits[k])

    # one round of each sets how many it gets (at_repeats): the ranks agree, as every round's time is their max
    times = interleaved([at_repeats(at_once(k)) for k in range(len(at) + len(exchanges))], at_once)
    kept = [spreads[-len(t):] for spreads, t in zip(exits, times)]  # the timed rounds', not the first and warm-up
    return ([[size, precision, t] for (size, precision), t in zip(at, times)],
            [[values, precision, t] for (values, precision), t in zip(gather, times[len(at):])],
            [[*item, spreads] for item, spreads in zip([*at, *gather], kept)])
