"""The executors agree: a real run's update log, replayed by syncsim.convergence, ends at the run's parameters.

The real executor and the replay carry out the same plans under one semantics
(syncsim.schemes.actions): a gradient is computed on the version the log says
it read, on its worker's own batch, and applied as the action says (mean of a
round, 1/W on arrival, local step, parameter average). So replaying a run's
``updates.csv`` on the same model, initial weights, data order and optimiser
(real.replay.TorchProblem) must reproduce the run's final parameters. A
difference is a bug in one of them.

Tolerance: the replay keeps float64 parameters, the ranks float32, and each
gradient is computed at the float32 rounding of the replay's parameters: the
two drift apart by float32 rounding, ~1e-7 relative per step. With bf16 on
the wire a value within that drift of a bf16 rounding boundary can round to
either side, one bf16 step (2^-8 relative) apart; such elements are a handful
in 100 k, so every element must be within one bf16 step and all but 0.1%
within float32 drift. A real fault — a dropped gradient, a missing 1/W, a
sum for a mean — moves most elements by far more.
"""

from __future__ import annotations

import pytest
import torch

from real.replay import TorchProblem, load_log
from syncsim.convergence import Replayer
from tests.real.runs import ASYNC, LOCAL, PS_SYNC, SSP
from tests.real.test_references import final

pytestmark = pytest.mark.distributed

RUNS = {"ps_sync": PS_SYNC, "async": ASYNC, "ssp": SSP, "localsgd": LOCAL}
DRIFT = 1e-6  # float32 against float64 over a few steps, on weights of ~0.05


@pytest.mark.parametrize("name", RUNS)
def test_replaying_a_runs_update_log_ends_at_its_final_parameters(real_run, name):
    args = RUNS[name]
    run = real_run(*args, torchrun=3) if args is PS_SYNC else real_run(*args)
    config = run.summary["config"]
    problem = TorchProblem(model=config["model"], data=config["data"], seed=config["seed"])
    replayer = Replayer(load_log(run.out), problem, lr=config["lr"], seed=config["seed"]).run()
    assert replayer.version == len(set(run.updates.version_applied))
    replayed = torch.from_numpy(replayer.parameters()).float()
    # the authoritative parameters: the server's shard (one server), or the replicas' common value
    real = final(run, config["world"] if config["servers"] else 0)
    off = (replayed - real).abs()
    one_step = real.abs() * 2.0**-8 + DRIFT if "precision=bf16" in config["scheme"] else DRIFT
    assert (off <= one_step).all(), f"{int((off > one_step).sum())} elements off, worst {float(off.max()):.3g}"
    assert (off > DRIFT).float().mean() <= 1e-3, f"{int((off > DRIFT).sum())} elements beyond float32 drift"
    # the run moved the parameters far beyond the tolerance, so agreement is not trivial
    assert (real - torch.from_numpy(problem.init(0)).float()).abs().max() > 1e3 * DRIFT
