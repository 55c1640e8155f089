"""ZeRO (stages 1-3) and FSDP carried out for real (gloo, 2 ranks, mlp, a few steps), by torch's own tools.

Stage 1 runs on torch.distributed.optim.ZeroRedundancyOptimizer, the rest on FSDP2's fully_shard
(real.sharded). Each run is checked as the other schemes' runs are: against a reference written out here in
plain torch from the run's inputs alone (the seeded model, real/data.py's batch layout, SGD on the mean
gradient: ZeRO and FSDP shard where state lives, not the update, Rajbhandari et al. 2020, section 5, and
torch's FSDP2 docs), never calling the executor or the replay; its bytes against the actions' ``nbytes``,
row by row; its sync actions and versions against the simulator's on the same spec; and its update log
replayed by syncsim.convergence against its final parameters.

Tolerances. The ranks and this file run one thread, so a worker's gradient on the same weights comes out of
the same kernels bit for bit, and with two workers the mean is one addition and an exact halving, whichever
collective makes it (a reduce, a reduce-scatter, DDP's all-reduce): the runs match their references to
float32 rounding of the weights (SAME_KERNELS), as the compressed schemes' two-worker runs do.
"""

from __future__ import annotations

import pytest
import torch

from real.data import load
from real.models import build
from syncsim.schemes import AllGatherParameters, ReduceScatterGradients, parse
from tests.real.runs import option
from tests.real.test_compression_schemes import (
    DRIFT,
    SAME_KERNELS,
    assert_the_simulator_agrees,
    assign,
    batch,
    communication_by_step,
    flat,
    flat_gradient,
    one_thread,  # noqa: F401  (autouse: the ranks and the references run one thread)
    replay,
    setting,
)

pytestmark = pytest.mark.distributed

COMMON = ("--world", "2", "--model", "mlp", "--batch-size", "16", "--steps", "4", "--save-params",
          "--record-checksums")
RUNS = {
    "zero1": ("--scheme", "zero:stage=1", *COMMON),       # ZeroRedundancyOptimizer
    "zero2": ("--scheme", "zero:stage=2", *COMMON),       # FSDP2, gathered after the step
    "zero3": ("--scheme", "zero:stage=3", *COMMON),       # FSDP2, gathered before forward and backward
    "fsdp_keep": ("--scheme", "fsdp:reshard=false", *COMMON),
    # 401,500 fp32 bytes: the first Linear's weight and bias (401,920) make one unit, the second Linear another
    "fsdp_units": ("--scheme", "fsdp:unit_bytes=401500", *COMMON),
    "fsdp_bf16": ("--scheme", "fsdp:precision=bf16", *COMMON),
}
FP32 = [name for name in RUNS if parse(option(RUNS[name], "--scheme")).precision == "fp32"]


def reference(args: tuple) -> torch.Tensor:
    """Synchronous data-parallel SGD, written out: every step, each worker's gradient on its own batch; the
    mean over workers, sent at the wire precision (each gradient rounded to it, summed in it, halved); one
    SGD step on fp32 weights. At 16 bits the workers compute in that precision too, on the weights rounded
    to it, as FSDP2's MixedPrecisionPolicy(param_dtype=reduce_dtype) casts a unit's parameters and its
    inputs (cast_forward_inputs) before the forward, and the fp32 weights step with the mean cast back."""
    world, steps, size, lr, precision = setting(args)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    master, data = build("mlp", 0), load("synthetic", 0)
    worker = build("mlp", 0).to(dtype)
    for step in range(steps):
        assign(worker, flat(master).to(dtype))
        parts = []
        for w in range(world):
            x, y = batch(data, w, step, world, size)
            parts.append(flat_gradient(worker, x.to(dtype), y).to(dtype))
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        assign(master, flat(master) - lr * (total / world).float())
    return flat(master)


@pytest.mark.parametrize("name", RUNS)
def test_sharded_runs_are_synchronous_sgd(real_run, name):
    args = RUNS[name]
    run = real_run(*args)
    want = reference(args)
    for rank in range(2):  # each worker's parameters whole (its shards gathered for --save-params)
        torch.testing.assert_close(run.params(rank), want, rtol=0, atol=SAME_KERNELS, msg=f"rank {rank}")
    per_step = [r["checksums"] for r in run.results.values()]
    assert per_step[0] == per_step[1] and len(set(run.summary["param_checksums"].values())) == 1
    assert (run.updates.staleness == 0).all()
    assert (run.params(0) - flat(build("mlp", 0))).abs().max() > 1e3 * SAME_KERNELS  # it trained


def test_bf16_computes_in_bf16_not_only_on_the_wire(real_run):
    # the fp32 update lands far from a bf16 run: the 16 bits are FSDP2's working precision
    assert (real_run(*RUNS["fsdp_bf16"]).params(0) - reference(RUNS["zero3"])).abs().max() > 100 * SAME_KERNELS


# -- bytes, actions and versions -------------------------------------------------------------
@pytest.mark.parametrize("name", RUNS)
def test_bytes_are_the_actions_nbytes_row_by_row(real_run, name):
    # every dimension 0 of the mlp's tensors is even: FSDP2 pads nothing at two workers
    for worker, step, sent, plan in communication_by_step(real_run(*RUNS[name]), RUNS[name]):
        want = [(a.kind, a.nbytes) for a in plan if isinstance(a, (AllGatherParameters, ReduceScatterGradients))]
        assert sent == want, (worker, step)


@pytest.mark.parametrize("name", RUNS)
def test_the_simulator_carries_out_the_same_actions_and_versions(real_run, name):
    assert_the_simulator_agrees(real_run(*RUNS[name]), RUNS[name])


# -- the replay ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FP32)
def test_replaying_the_update_log_ends_at_the_runs_parameters(real_run, name):
    # as tests/real/test_replay_agreement.py: the replay's sharded master (float64), stepped shard by shard.
    # Not at bf16: the replay computes fp32 gradients on the rounded weights (syncsim.convergence's Wire),
    # FSDP2 computes them in bf16; reference() above checks that run.
    args = RUNS[name]
    run = real_run(*args)
    replayer, log, _ = replay(run)
    assert replayer.version == log.versions == int(option(args, "--steps")) and replayer.skipped == 0
    off = (torch.from_numpy(replayer.parameters()).float() - run.params(0)).abs()
    assert (off <= DRIFT).all(), f"{int((off > DRIFT).sum())} beyond float32 drift, worst {float(off.max()):.3g}"


def test_a_single_worker_fsdp_run_sends_nothing(real_run):
    # FSDP2 skips its collectives at world size 1 (FSDPParamGroup.unshard; the reduce-scatter too): the rows
    # stay, with 0 bytes, and the run is one worker's SGD
    args = ("--scheme", "zero:stage=3", "--world", "1", "--model", "mlp", "--batch-size", "16", "--steps", "3",
            "--save-params")
    run = real_run(*args)
    assert run.summary["bytes_sent"] == {"0": 0}
    assert sorted(set(run.trace.kind)) == ["allgather", "compute", "reducescatter"]
    torch.testing.assert_close(run.params(0), reference(args), rtol=0, atol=SAME_KERNELS)


def test_gradients_are_averaged_not_summed(real_run):
    # a reference stepping with the sum lands far away: the mean is what every worker's shard steps with
    args = RUNS["zero1"]
    world, steps, size, lr, _ = setting(args)
    net, data = build("mlp", 0), load("synthetic", 0)
    for step in range(steps):
        total = sum(flat_gradient(net, *batch(data, w, step, world, size)) for w in range(world))
        assign(net, flat(net) - lr * total)
    assert (real_run(*args).params(0) - flat(net)).abs().max() > 1e3 * SAME_KERNELS
