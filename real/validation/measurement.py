"""A configuration measured: its scheme run for real by the executor on a testbed of world + servers hosts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from real.validation.config import Config
from real.validation.settings import Settings

if TYPE_CHECKING:
    from syncsim.metrics import SteadyState

__all__ = ["Measurement", "SPREAD_WINDOWS", "measure", "read_steady", "run_spread"]

# A measured run's step time is also timed over this many consecutive windows of its steps; their
# coefficient of variation (measured_spread) is how much this machine's speed wandered during the run.
SPREAD_WINDOWS = 4


@dataclass(frozen=True)
class Measurement:
    """A measured run: its steady state (syncsim.metrics.SteadyState), how much its step time wandered
    (run_spread), the packets the testbed's shapers dropped (None when unknown) and its trace."""

    steady: SteadyState
    spread: float
    dropped: int | None
    trace: pd.DataFrame


def measure(config: Config, settings: Settings, folder: Path, steps: int,
            slow_forward: float | None = None) -> Measurement:
    """Run ``config`` for real on a testbed of world + servers hosts; its steady state (syncsim.metrics),
    how much its step time wandered while it ran (syncsim.metrics.step_time_spread), how many packets
    the testbed's shapers dropped (Testbed.dropped: none, unless its queue is made shallower than QUEUE)
    and its trace (OUT/trace.csv, read once: the replay takes it too).

    A straggler row's slowed worker sizes its sleep from ``slow_forward``, the forward its compute probe
    timed (measure_compute's ``slow_forward``), so that it sleeps as long as the probe's slowed rank,
    whose step the simulator's speed factor is: each timing its own warm forward, a run's slowed worker of
    the larger model slept 25 ms a step where its probe's had slept 31-34 ms, and the local-SGD and fp16
    straggler rows were predicted 15.5 % and 11.4 % slow."""
    from real.config import RunConfig
    from real.interrupt import Interrupted
    from real.testbed import Testbed, run

    slow = ()
    if config.slow > 1:
        slow = ((config.world - 1, config.slow) + ((slow_forward,) if slow_forward is not None else ()),)
    cfg = RunConfig(scheme=config.scheme, world=config.world, servers=config.servers, model=config.model,
                    steps=steps, batch_size=settings.batch_size, out=str(folder), slow=slow, timeout=120)
    with Testbed(hosts=cfg.ranks, bandwidth=config.bandwidth, prefix=settings.prefix) as bed:
        # Started without torchrun's agents: half the processes on this machine's two cores, same ranks.
        code, message = run(bed, cfg, timeout=settings.run_timeout, agent=False)
        dropped = None if code else bed.dropped()  # packets its shapers lost (none with the default QUEUE)
    if code > 128:  # interrupted (the launcher stopped the nodes and kept the record): the study stops too
        raise Interrupted(code - 128)
    if code:
        raise RuntimeError(message)
    trace, steady = read_steady(folder, settings.batch_size, steps, config.world)
    return Measurement(steady, run_spread(trace, steps, config.world), dropped, trace)


def read_steady(folder: Path, batch_size: int, steps: int, world: int) -> tuple[pd.DataFrame, SteadyState]:
    """A run's kept trace (``folder``/trace.csv) and its steady state with its update log (syncsim.metrics),
    as the study measured it; FileNotFoundError when the run's records are gone."""
    from syncsim.metrics import steady_state

    trace = pd.read_csv(folder / "trace.csv")
    return trace, steady_state(trace, pd.read_csv(folder / "updates.csv"), batch_size, steps=steps, workers=world)


def run_spread(trace: pd.DataFrame, steps: int, world: int) -> float:
    """A measured run's measured_spread: how much its step time wandered over SPREAD_WINDOWS windows."""
    from syncsim.metrics import step_time_spread

    return step_time_spread(trace, SPREAD_WINDOWS, steps=steps, workers=world)
