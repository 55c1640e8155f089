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
two drift apart by float32 rounding, ~1e-7 relative per step (measured: bf16
local SGD bit for bit, asynchronous PS 4e-8, fp16 all-reduce 4e-7). With a
16-bit wire a value within that drift of a rounding boundary can round to
either side, one wire step apart; such elements are a handful in 100 k, so
every element must be within one wire step and all but 0.1% within float32
drift. A real fault — a dropped gradient, a missing 1/W, a
sum for a mean — moves most elements by far more.

One difference in semantics is out of these runs' reach: the replay
loss-scales fp16 gradients (GradScaler's defaults, docs/convergence.md) and
skips a step whose scaled gradient overflows, while the executor's fp16
all-reduce on CPU sends unscaled gradients (torch's fp16_compress_hook; only
CUDA AMP adds a GradScaler). They agree while no scaled gradient reaches
fp16's 65,504 — here, and asserted by ``replayer.skipped == 0``.
"""

from __future__ import annotations

import pytest
import torch

from real.replay import TorchProblem, load_log
from syncsim.convergence import Replayer
from tests.real.runs import ASYNC, FP16, LOCAL, PS_SYNC, SSP

pytestmark = pytest.mark.distributed

RUNS = {"ps_sync": PS_SYNC, "async": ASYNC, "ssp": SSP, "localsgd": LOCAL, "allreduce_fp16": FP16}
DRIFT = 1e-6  # float32 against float64 over a few steps, on weights of ~0.05
# One step of each wire format relative to the value: its machine epsilon (torch.finfo(dtype).eps, the gap
# from 1 to the next value: 2**-7 for bf16, 2**-10 for fp16), the largest relative gap between neighbours.
# Not the unit roundoff (half that): a value that rounds to the other side lands a whole step away
# (bf16 local SGD: a weight of 5.4e-4 one step, 3.8e-6, from its replay, where 2**-8 of it is 2.1e-6).
WIRE_STEP = {"fp32": 0.0, "bf16": torch.finfo(torch.bfloat16).eps, "fp16": torch.finfo(torch.float16).eps}


@pytest.mark.parametrize("name", RUNS)
def test_replaying_a_runs_update_log_ends_at_its_final_parameters(real_run, name):
    args = RUNS[name]
    run = real_run(*args, torchrun=3) if args is PS_SYNC else real_run(*args)
    config = run.summary["config"]
    problem = TorchProblem(model=config["model"], data=config["data"], seed=config["seed"])
    replayer = Replayer(load_log(run.out), problem, lr=config["lr"], seed=config["seed"]).run()
    assert replayer.version == len(set(run.updates.version_applied)) and replayer.skipped == 0
    replayed = torch.from_numpy(replayer.parameters()).float()
    # the authoritative parameters: the server's shard (one server), or the replicas' common value
    real = run.params(config["world"] if config["servers"] else 0)
    off = (replayed - real).abs()
    one_step = real.abs() * WIRE_STEP[load_log(run.out).scheme.precision] + DRIFT
    assert (off <= one_step).all(), f"{int((off > one_step).sum())} elements off, worst {float(off.max()):.3g}"
    assert (off > DRIFT).float().mean() <= 1e-3, f"{int((off > DRIFT).sum())} elements beyond float32 drift"
    # the run moved the parameters far beyond the tolerance, so agreement is not trivial
    assert (real - torch.from_numpy(problem.init(0)).float()).abs().max() > 1e3 * DRIFT
