"""What slows or preempts a rank's compute on this machine: one process times a training step back to
back inside a testbed host while two saturating TCP flows cross the links (no model in the traffic), and
beside processes that only keep a core busy (no model, no network).

The flows stand for a parameter server's: host 1 sends to host 0 (a push) and host 0 to host 2 (a pull),
both as fast as their shapers let them; the timed process runs in host 1, as a worker does. Each rate's
line gives the step's median, its 99th percentile, and the share of steps over TAIL times the median (the
tail that knocks two asynchronous workers out of turn, the one real.validation.prediction cuts), with the
rate the flows carried, so a line whose traffic did not flow shows it. Busy processes stand for a run's other
processes (the server's threads, the other workers) wanting the cores while a worker computes: with two
of them, three processes want two cores and the scheduler hands each out in slices of milliseconds.
``python -m real.testbed.preemption`` (as root) prints one line per rate, without traffic first and last,
then one per number of busy processes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

__all__ = ["StepTiming", "time_under_traffic", "time_beside_busy", "TAIL", "in_tail", "tail_share", "main"]

# A step over TAIL times its median is in the tail: the small model's parameter-server workers at
# 200 Mbit/s had 4-10 % of their compute phases there (5-12 ms against a median of 1.2 ms), the same runs
# at 50 Mbit/s and 1 Gbit/s at most 1.3 %, and the lognormal of the compute probe's spread (a coefficient
# of variation of 0.19) puts about one phase in 10^13 there.
TAIL = 4.0
PORTS = (5301, 5302)
WARM_STEPS = 50  # allocator and autograd caches
SETTLE = 1.0  # seconds for the flows to fill their shapers before the timing starts


def in_tail(times) -> np.ndarray:
    """Which of ``times`` lie over TAIL times their median."""
    times = np.asarray(times, dtype=float)
    return times > TAIL * np.median(times)


def tail_share(step_times) -> float:
    """The share of ``step_times`` over TAIL times their median."""
    return float(np.mean(in_tail(step_times)))


def _role(name: str, *args) -> list[str]:
    """The command that runs this module as one of the processes it starts (main's ``roles``)."""
    return [sys.executable, "-m", "real.testbed.preemption", name, *map(str, args)]


@dataclass(frozen=True)
class StepTiming:
    """One condition's timing: its ``label`` (a rate, "no traffic", "2 busy processes"), the steps' times
    (seconds) and, where flows ran, the bytes per second they carried together while the steps were timed."""

    label: str
    step_times: tuple[float, ...]
    carried: float | None = None

    def line(self) -> str:
        times = np.asarray(self.step_times)
        flows = "" if self.carried is None else f", the flows carried {self.carried * 8 / 1e6:.0f} Mbit/s"
        return (f"{self.label}: {len(times)} steps, median {np.median(times) * 1e3:.3f} ms, p99 "
                f"{np.percentile(times, 99) * 1e3:.2f} ms, max {times.max() * 1e3:.1f} ms, over {TAIL:g}x the "
                f"median {tail_share(times):.2%}{flows}")


def time_under_traffic(rate: str | None, seconds: float, model: str = "mlp", batch_size: int = 32,
                       prefix: str = "sstp") -> StepTiming:
    """``model``'s training step timed back to back for ``seconds`` in host 1 of a three-host testbed at
    ``rate`` (a bandwidth string), while host 1 sends to host 0 and host 0 to host 2 as fast as the
    shapers let them; with ``rate`` None the same hosts (at 1 Gbit/s) carry nothing."""
    from real.testbed import Testbed

    with Testbed(hosts=3, bandwidth=rate or "1Gbit/s", prefix=prefix) as testbed:
        sinks, sources = [], []
        if rate:
            listen = seconds + SETTLE + 30  # the sinks outlive the timing; they are told when to stop
            sinks = [testbed.popen(host, _role("_sink", port, listen), stdout=subprocess.PIPE, text=True)
                     for host, port in ((0, PORTS[0]), (2, PORTS[1]))]
            time.sleep(0.3)
            sources = [testbed.popen(src, _role("_source", testbed.ips[dst], port))
                       for src, dst, port in ((1, 0, PORTS[0]), (0, 2, PORTS[1]))]
            time.sleep(SETTLE)
        try:
            timer = testbed.run(1, _role("_timer", model, batch_size, seconds), timeout=seconds + 120,
                                capture_output=True, text=True, check=True)
        except BaseException:
            for process in sinks:  # nothing to read: no sink outlives its namespace
                process.kill()
                process.wait()
            raise
        finally:
            for process in sources:
                process.kill()
                process.wait()
        result = json.loads(timer.stdout)
        carried = 0.0
        for sink in sinks:
            sink.terminate()
            out, _ = sink.communicate(timeout=30)
            carried += _carried(json.loads(out.splitlines()[-1]), result["start"], result["end"])
    times = tuple(result["times"])
    return StepTiming(rate, times, carried) if rate else StepTiming("no traffic", times)


def time_beside_busy(competitors: int, seconds: float, model: str = "mlp", batch_size: int = 32) -> StepTiming:
    """``model``'s training step timed back to back for ``seconds`` while ``competitors`` processes spin
    (a Python loop each: no model, no network), all on this machine's cores."""
    busy = [subprocess.Popen(_role("_busy")) for _ in range(competitors)]
    try:
        timer = subprocess.run(_role("_timer", model, batch_size, seconds), timeout=seconds + 120,
                               capture_output=True, text=True, check=True)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    label = f"{competitors} busy process{'' if competitors == 1 else 'es'} beside it"
    return StepTiming(label, tuple(json.loads(timer.stdout)["times"]))


def _carried(log: list[list[float]], start: float, end: float) -> float:
    """Bytes per second a sink received between ``start`` and ``end`` (time.time()), from its log of
    (time, bytes so far) pairs."""
    stamps = np.array(log, dtype=float).reshape(-1, 2)
    inside = stamps[(stamps[:, 0] >= start) & (stamps[:, 0] <= end)]
    if len(inside) < 2:
        return 0.0
    return float((inside[-1, 1] - inside[0, 1]) / (inside[-1, 0] - inside[0, 0]))


def _sink(port: int, seconds: float) -> None:
    """Accept one connection, read it until it ends, ``seconds`` pass or SIGTERM comes; print a JSON log
    of (time, bytes so far), about ten entries a second."""
    import signal
    import socket

    log: list[list[float]] = []
    signal.signal(signal.SIGTERM, lambda *_: (print(json.dumps(log), flush=True), sys.exit(0)))
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(1)
    server.settimeout(seconds)
    connection, _ = server.accept()
    buffer, total, end, last = bytearray(1 << 20), 0, time.time() + seconds, 0.0
    while time.time() < end:
        got = connection.recv_into(buffer)
        if not got:
            break
        total += got
        now = time.time()
        if now - last >= 0.1:
            log.append([now, total])
            last = now
    print(json.dumps(log), flush=True)
    # Told to stop from here on (the flow ended first), exit as told: the handler's second print and
    # SystemExit would land in the interpreter's exit handlers and print a traceback there.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _source(host: str, port: int) -> None:
    """Connect to ``host``:``port`` and send until killed."""
    import socket

    for _ in range(100):
        try:
            connection = socket.create_connection((host, port))
            break
        except OSError:
            time.sleep(0.05)
    else:
        raise SystemExit(f"real.testbed.preemption: could not connect to {host}:{port}")
    data = bytes(1 << 20)
    while True:
        connection.sendall(data)


def _busy() -> None:
    """Keep one core busy until killed."""
    while True:
        pass


def _timer(model: str, batch_size: int, seconds: float) -> None:
    """Time ``model``'s training step (real.testbed.steadiness.training_step, one torch thread) back to
    back for ``seconds``; print the times and the wall-clock start and end as JSON."""
    import torch

    from real.testbed.steadiness import training_step

    torch.set_num_threads(1)
    step = training_step(model, batch_size)
    for _ in range(WARM_STEPS):
        step()
    times, start = [], time.time()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        began = time.perf_counter()
        step()
        times.append(time.perf_counter() - began)
    print(json.dumps({"times": times, "start": start, "end": time.time()}))


def _competitors(text: str) -> list[int]:
    """``--competitors``: comma-separated counts of busy processes, each 0 to 8; ValueError naming it."""
    from syncsim.arguments import check_count, integer

    try:
        return [check_count("--competitors", integer(n), 0, 8) for n in text.split(",") if n.strip()]
    except argparse.ArgumentTypeError as err:
        raise ValueError(f"--competitors: {err}") from None


def main(argv: list[str] | None = None) -> int:
    from real.models import MODELS
    from real.testbed.namespaces import shapable_rates
    from syncsim.arguments import ArgumentParser, number

    argv = sys.argv[1:] if argv is None else argv
    roles = {"_sink": lambda a: _sink(int(a[0]), float(a[1])), "_source": lambda a: _source(a[0], int(a[1])),
             "_timer": lambda a: _timer(a[0], int(a[1]), float(a[2])), "_busy": lambda a: _busy()}
    if argv and argv[0] in roles:  # the processes this command starts in the testbed's hosts
        roles[argv[0]](argv[1:])
        return 0
    ap = ArgumentParser(prog="python -m real.testbed.preemption", description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="50Mbit/s,200Mbit/s,1Gbit/s", help="comma-separated link rates")
    ap.add_argument("--competitors", default="1,2", help="comma-separated numbers of busy processes")
    ap.add_argument("--seconds", type=number, default=12.0, help="how long to time each condition")
    ap.add_argument("--model", default="mlp", choices=sorted(MODELS), help="real.models name to train")
    args = ap.parse_args(argv)
    try:
        rates = shapable_rates(args.rates, "--rates")
        counts = _competitors(args.competitors)
        if not 2 <= args.seconds <= 600:
            raise ValueError(f"--seconds must be between 2 and 600, got {args.seconds:g}")
    except ValueError as err:
        ap.error(str(err))
    for rate in [None, *rates, None]:
        print(f"real.testbed.preemption: {time_under_traffic(rate, args.seconds, args.model).line()}", flush=True)
    for count in counts:
        print(f"real.testbed.preemption: {time_beside_busy(count, args.seconds, args.model).line()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
