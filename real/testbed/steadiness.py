"""How steady this machine's speed is: one process timing the same training step in consecutive windows.

Every prediction ``studies.validation`` makes is calibrated minutes to seconds before the run it is
compared with (a compute probe, then the run). It can be no closer to the run than the machine's own
speed a few seconds later is to its speed now. This module measures that floor without any model in it:
one process (one torch thread, as every rank of a run has) trains ``model`` on a fixed batch back to back
for ``seconds``, and the mean step time of each ``window`` is one sample of the machine's speed.

- ``spread``: slowest window over fastest, less one: how far apart two measurements of the same work
  can lie on this machine.
- ``change(lag)``: |t[i + lag] / t[i] - 1| over every pair of windows ``lag`` apart: how much the
  speed measured now misses the speed ``lag`` windows later, i.e. the error of a perfect model given a
  probe that ran ``lag`` windows before the run.

On the 2-core virtual machine this project is developed on, the small model's step (0.54-0.88 ms)
ran in slow spells of 5-10 s, up to 60 % slower, with nothing else running: 5 s later the speed had
changed by a median 8 %, and by more than 15 % one time in five (docs/real.md, *The machine's own
steadiness*).

``python -m real.testbed.steadiness [--model mlp] [--seconds 60] [--window 1] [--out FILE.json]`` prints
the figures; ``studies.validation`` measures them at its start and quotes them in its summary.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

__all__ = ["Steadiness", "measure_steadiness", "training_step", "relative_changes", "main", "LAG_SECONDS"]

LAG_SECONDS = 5.0  # about how long before a run its compute probe ran in the validation study


def relative_changes(step_times, lag: int) -> np.ndarray:
    """|t[i + lag] / t[i] - 1| for every i: how far each window's speed lies from the one ``lag`` later."""
    times = np.asarray(step_times, dtype=float)
    if lag < 1:
        raise ValueError(f"relative_changes: lag must be a whole number of windows >= 1, got {lag!r}")
    if len(times) <= lag:
        return np.empty(0)
    return np.abs(times[lag:] / times[:-lag] - 1)


@dataclass(frozen=True)
class Steadiness:
    """Mean step times (seconds) of consecutive windows of ``window`` seconds, training ``model`` at
    ``batch_size``, one process, back to back."""

    model: str
    batch_size: int
    window: float
    step_times: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.window > 0:
            raise ValueError(f"Steadiness.window must be > 0 seconds, got {self.window!r}")
        times = np.asarray(self.step_times, dtype=float)
        if len(times) < 2 or not np.all(np.isfinite(times) & (times > 0)):
            raise ValueError("Steadiness.step_times must hold two or more positive step times, "
                             f"got {list(self.step_times)!r}")

    @property
    def spread(self) -> float:
        """Slowest window over fastest, less one."""
        return max(self.step_times) / min(self.step_times) - 1

    def lag_windows(self, seconds: float = LAG_SECONDS) -> int:
        """``seconds`` as a whole number of windows (at least one)."""
        return max(1, round(seconds / self.window))

    def change(self, seconds: float = LAG_SECONDS) -> dict[str, float]:
        """Median, 90th percentile and maximum of relative_changes ``seconds`` apart, and the share of
        pairs that changed by more than 15 % (the validation's bound on one configuration)."""
        changes = relative_changes(self.step_times, self.lag_windows(seconds))
        if not len(changes):
            return {"median": float("nan"), "p90": float("nan"), "max": float("nan"), "over_15": float("nan")}
        return {"median": float(np.median(changes)), "p90": float(np.quantile(changes, 0.9)),
                "max": float(changes.max()), "over_15": float((changes > 0.15).mean())}

    def line(self, seconds: float = LAG_SECONDS) -> str:
        """One sentence for a summary."""
        lag = self.lag_windows(seconds) * self.window
        change = self.change(seconds)
        fastest, slowest = min(self.step_times) * 1e3, max(self.step_times) * 1e3
        return (f"{self.model}'s step at batch {self.batch_size}, one process timed in {len(self.step_times)} "
                f"windows of {self.window:g} s, ran {fastest:.2f}-{slowest:.2f} ms "
                f"({self.spread:.0%} apart); {lag:g} s later its speed had changed by a median {change['median']:.1%}, "
                f"p90 {change['p90']:.1%}, and by more than 15% in {change['over_15']:.0%} of pairs: "
                "the floor under any prediction calibrated seconds before its run")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Steadiness:
        data = json.loads(text)
        return cls(model=data["model"], batch_size=int(data["batch_size"]), window=float(data["window"]),
                   step_times=tuple(float(t) for t in data["step_times"]))


def training_step(model: str, batch_size: int) -> Callable[[], None]:
    """One SGD step of ``model`` (real.models) on a run's first batch (real.data), as a function that
    takes it: the work real.testbed's timers repeat, with nothing else in it."""
    import torch

    from real.data import load
    from real.models import build

    net = build(model, 0)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    images, labels = load("synthetic", 0).batch(0, 0, 1, batch_size)

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(images), labels).backward()
        optimizer.step()

    return step


def measure_steadiness(model: str = "mlp", batch_size: int = 32, seconds: float = 60.0, window: float = 1.0,
                       progress=None) -> Steadiness:
    """Train ``model`` (real.models) on one fixed batch, back to back, in this process with one torch
    thread for ``seconds``; the mean step time of each ``window``. ``progress``, if given, is called with
    each window's step time."""
    import torch

    from real.models import MODELS

    if model not in MODELS:
        raise ValueError(f"measure_steadiness: model must be one of {sorted(MODELS)}, got {model!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"measure_steadiness: batch_size must be a positive integer, got {batch_size!r}")
    if not 0 < window <= seconds / 2:
        raise ValueError(f"measure_steadiness: window must be > 0 and at most half of seconds ({seconds!r}), "
                         f"got {window!r}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as every rank of a run (real.testbed.forkserver)
    try:
        step = training_step(model, batch_size)
        for _ in range(20):  # warm: allocator and autograd caches
            step()
        times = []
        for _ in range(max(2, int(seconds / window))):
            start, count = time.perf_counter(), 0
            while time.perf_counter() - start < window:
                step()
                count += 1
            times.append((time.perf_counter() - start) / count)
            if progress is not None:
                progress(times[-1])
    finally:
        torch.set_num_threads(threads)
    return Steadiness(model=model, batch_size=batch_size, window=window, step_times=tuple(times))


def main(argv: list[str] | None = None) -> int:
    from real.config import SAMPLE_BYTES
    from real.models import MODELS
    from syncsim.arguments import ArgumentParser, check_count, integer, number
    from syncsim.files import check_out_file, write_atomic
    from syncsim.limits import check_memory

    ap = ArgumentParser(prog="python -m real.testbed.steadiness", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp", choices=sorted(MODELS), help="real.models name to train")
    ap.add_argument("--batch-size", type=integer, default=32, help="images per step")
    ap.add_argument("--seconds", type=number, default=60.0, help="how long to time")
    ap.add_argument("--window", type=number, default=1.0, help="seconds per sample of the machine's speed")
    ap.add_argument("--lag", type=number, default=LAG_SECONDS, help="seconds between the windows compared")
    ap.add_argument("--out", default=None, help="write the windows' step times here (JSON)")
    args = ap.parse_args(argv)
    try:
        check_count("--batch-size", args.batch_size, 1)
        check_memory("--batch-size", args.batch_size, "samples of a batch", SAMPLE_BYTES, "lower --batch-size")
        if not 2 <= args.seconds <= 3600:
            raise ValueError(f"--seconds must be between 2 and 3600, got {args.seconds:g}")
        if not 0 < args.window <= args.seconds / 2:
            raise ValueError(f"--window must be > 0 and at most half of --seconds ({args.seconds:g}), "
                             f"got {args.window:g}")
        if not 0 < args.lag <= args.seconds / 2:
            raise ValueError(f"--lag must be > 0 and at most half of --seconds ({args.seconds:g}), got {args.lag:g}")
        if args.out is not None:
            check_out_file(args.out, "--out")
    except ValueError as err:
        ap.error(str(err))
    result = measure_steadiness(args.model, args.batch_size, args.seconds, args.window)
    if args.out is not None:
        write_atomic(Path(args.out), result.to_json())
    print(f"real.testbed.steadiness: {result.line(args.lag)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
