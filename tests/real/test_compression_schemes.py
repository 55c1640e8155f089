"""PowerSGD, top-k and DiLoCo carried out for real (gloo, 2 and 3 ranks, mlp, a few steps).

Each run is checked four ways: against a reference written out here in plain
torch from the run's inputs alone (the seeded model, real/data.py's batch
layout, the scheme's published algorithm), never calling the executor,
syncsim.compression or the replay, so that a bug there cannot hide in the
reference too; its bytes against the actions' ``nbytes``; its sync actions and
version numbering against the simulator's on the same spec; and its update log
replayed by syncsim.convergence against its final parameters.

Tolerances. The ranks and this file run one thread, so a worker's gradient on
the same float32 weights comes out of the same kernels bit for bit. The
compressors' arithmetic is float64 on both sides (numpy in the executor, torch
here: sums in another order, last-bit apart), what crosses the wire is rounded
alike (float32 for fp32, bf16 for bf16) and summed in that dtype by gloo, as
``wire_mean`` does here with two workers. So with two workers the runs match
their references to float32 rounding of the weights (SAME_KERNELS). With
three, gloo adds the three contributions in its own order, float32-apart from
this file's (COMBINED, as the combined-batch references of
test_references.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from real.data import load
from real.models import build, param_layers, param_shapes
from real.replay import TorchProblem, load_log
from syncsim import simulate
from syncsim.cluster import Cluster, Link
from syncsim.convergence import Replayer
from syncsim.schemes import LowRankAllReduce, OuterStep, SparseAllGather, parse
from syncsim.workload import Workload
from tests.real.runs import option
from tests.real.test_simulator import sync_actions

pytestmark = pytest.mark.distributed

COMMON = ("--model", "mlp", "--batch-size", "16", "--save-params", "--record-checksums")
POWERSGD_BF16 = ("--scheme", "allreduce:compression=powersgd,precision=bf16", "--world", "2", "--steps", "5",
                 *COMMON)
POWERSGD_3 = ("--scheme", "allreduce:compression=powersgd,rank=2", "--world", "3", "--steps", "4", *COMMON)
TOPK = ("--scheme", "topk:ratio=0.05", "--world", "2", "--steps", "5", *COMMON)
TOPK_BF16_3 = ("--scheme", "topk:ratio=0.02,precision=bf16", "--world", "3", "--steps", "5", *COMMON)
# AdamW at SGD's default lr 0.05 would throw the small model about; 0.005 trains it
DILOCO = ("--scheme", "diloco:period=4,fragments=2", "--world", "2", "--steps", "6", "--lr", "0.005", *COMMON)
DILOCO_SGD_3 = ("--scheme", "diloco:period=3,inner=sgd,outer_lr=0.5,outer_momentum=0.5", "--world", "3",
                "--steps", "7", *COMMON)
RUNS = {"powersgd_bf16": POWERSGD_BF16, "powersgd_3": POWERSGD_3, "topk": TOPK, "topk_bf16_3": TOPK_BF16_3,
        "diloco": DILOCO, "diloco_sgd_3": DILOCO_SGD_3}

SAME_KERNELS = 1e-7
COMBINED = 1e-5
WIRE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- the references' building blocks ---------------------------------------------------
def setting(args: tuple) -> tuple[int, int, int, float, str]:
    """(world, steps, batch size, lr, wire precision) of a run's arguments."""
    return int(option(args, "--world")), int(option(args, "--steps")), int(option(args, "--batch-size")), \
        float(option(args, "--lr", 0.05)), parse(option(args, "--scheme")).precision


def batch(data, worker: int, step: int, world: int, size: int):
    # real/data.py's documented layout: worker w's batch at step t is positions [(t·W + w)·B, (t·W + w + 1)·B)
    # of one seeded permutation, wrapping around
    start = (step * world + worker) * size
    idx = data.order[torch.arange(start, start + size) % len(data.y)]
    return data.x[idx], data.y[idx]


def flat_gradient(net, x, y) -> torch.Tensor:
    net.zero_grad(set_to_none=True)
    F.cross_entropy(net(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in net.parameters()])


def flat(net) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def assign(net, values: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(values[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def sgd(net, gradient: torch.Tensor, lr: float) -> None:
    """torch.optim.SGD without momentum on a float32 net: p ← p − lr·g, g as float32."""
    assign(net, flat(net) - lr * gradient.float())


def wire(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` (float64) as it crosses a wire of ``dtype``, back in float64."""
    return x.to(dtype).double()


def wire_mean(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The all-reduce mean of ``parts`` sent in ``dtype``: each cast to it, summed in it (in worker order),
    the sum divided by W in float64."""
    total = parts[0].to(dtype)
    for part in parts[1:]:
        total = total + part.to(dtype)
    return total.double() / len(parts)


def assert_replicas_equal_reference(run, args, want: torch.Tensor, atol: float) -> None:
    for rank in range(int(option(args, "--world"))):
        torch.testing.assert_close(run.params(rank), want.float(), rtol=0, atol=atol, msg=f"rank {rank}")
    assert len(set(run.summary["param_checksums"].values())) == 1  # the replicas end bit-identical


# -- PowerSGD ----------------------------------------------------------------------------
def powersgd_reference(args: tuple, rank: int, seed: int = 0) -> torch.Tensor:
    """Vogels et al. 2019, algorithm 1 with error feedback and warm start, as torch's powerSGD_hook arranges
    it, in float64: Δ_w = g_w + e_w; a tensor is viewed as shape[0] rows by the rest and compressed when
    2·r·(rows + cols) < rows·cols (r = min(rank, rows, cols), torch's min_compression_rate 2), else sent as
    it is; P_w = M_w·Q, P̂ = an orthonormal basis of mean P (QR here; its columns' signs may differ from
    Gram–Schmidt's, which P̂·Qᵀ does not see), Q_w = M_wᵀ·P̂, applied = P̂·(mean Q)ᵀ, Q ← mean Q,
    e_w = Δ_w − applied. The first Q: a standard normal draw seeded by (seed, index of the compressed
    tensor), orthonormalised, the same on every worker. Every replica applies the same gradient, so one
    net stands for all."""
    world, steps, size, lr, precision = setting(args)
    dtype = WIRE[precision]
    net, data = build("mlp", seed), load("synthetic", seed)
    tensors, start = [], 0
    for shape in param_shapes(net):
        rows, values = shape[0], math.prod(shape)
        cols, r = values // rows, min(rank, shape[0], values // shape[0])
        tensors.append((start, rows, cols, r if 2 * r * (rows + cols) < rows * cols else 0))
        start += values
    compressed = [t for t in tensors if t[3]]
    assert compressed and len(compressed) < len(tensors)  # both kinds occur
    q = {t: torch.linalg.qr(torch.from_numpy(np.random.default_rng([seed, i]).standard_normal((t[2], t[3]))))[0]
         for i, t in enumerate(compressed)}
    errors = [torch.zeros(start, dtype=torch.float64) for _ in range(world)]
    for step in range(steps):
        deltas = [flat_gradient(net, *batch(data, w, step, world, size)).double() + errors[w] for w in range(world)]
        applied = torch.empty(start, dtype=torch.float64)
        for t in tensors:
            lo, rows, cols, r = t
            pieces = [d[lo:lo + rows * cols] for d in deltas]
            if not r:
                applied[lo:lo + rows * cols] = wire_mean([wire(p, dtype) for p in pieces], dtype)
                continue
            matrices = [p.view(rows, cols) for p in pieces]
            p_hat = torch.linalg.qr(wire_mean([wire(m @ q[t], dtype) for m in matrices], dtype))[0]
            q[t] = wire_mean([wire(m.T @ p_hat, dtype) for m in matrices], dtype)
            applied[lo:lo + rows * cols] = (p_hat @ q[t].T).reshape(-1)
        errors = [d - applied for d in deltas]
        sgd(net, applied, lr)
    return flat(net)


@pytest.mark.parametrize("args,rank,atol", [(POWERSGD_BF16, 1, SAME_KERNELS), (POWERSGD_3, 2, COMBINED)],
                         ids=["bf16-2", "fp32-3"])
def test_powersgd_is_low_rank_sgd_with_error_feedback_and_warm_start(real_run, args, rank, atol):
    run = real_run(*args)
    want = powersgd_reference(args, rank)
    assert_replicas_equal_reference(run, args, want, atol)
    # the compression is not the identity: plain all-reduce SGD lands far away
    world, steps, size, lr, _ = setting(args)
    net, data = build("mlp", 0), load("synthetic", 0)
    for step in range(steps):
        sgd(net, sum(flat_gradient(net, *batch(data, w, step, world, size)) for w in range(world)) / world, lr)
    assert (run.params(0) - flat(net)).abs().max() > 100 * atol


# -- top-k -------------------------------------------------------------------------------
def topk_reference(args: tuple, ratio: float) -> torch.Tensor:
    """Stich et al. 2018 (sparsified SGD with memory): Δ_w = g_w + e_w; worker w sends the k = ⌈ratio·n⌉
    entries of largest |Δ_w| (rounded to the wire), keeps e_w = Δ_w − what it sent; every replica applies
    Σ_w (sent_w at its indices) / W. Which of two equal magnitudes is picked does not matter here: the
    gradients' equal magnitudes are zeros, which send and leave nothing."""
    world, steps, size, lr, precision = setting(args)
    dtype = WIRE[precision]
    net, data = build("mlp", 0), load("synthetic", 0)
    n = sum(p.numel() for p in net.parameters())
    k = math.ceil(ratio * n)
    errors = [torch.zeros(n, dtype=torch.float64) for _ in range(world)]
    for step in range(steps):
        applied = torch.zeros(n, dtype=torch.float64)
        for w in range(world):
            delta = flat_gradient(net, *batch(data, w, step, world, size)).double() + errors[w]
            idx = delta.abs().topk(k).indices
            sent = wire(delta[idx], dtype)
            delta[idx] -= sent
            errors[w] = delta
            applied[idx] += sent
        sgd(net, applied / world, lr)
    return flat(net)


@pytest.mark.parametrize("args,ratio", [(TOPK, 0.05), (TOPK_BF16_3, 0.02)], ids=["fp32-2", "bf16-3"])
def test_topk_is_sparsified_sgd_with_memory(real_run, args, ratio):
    # all-gather sums nothing on the wire: three workers match as exactly as two
    run = real_run(*args)
    assert_replicas_equal_reference(run, args, topk_reference(args, ratio), SAME_KERNELS)
    if parse(option(args, "--scheme")).precision == "bf16":
        # the residual kept the bf16 rounding of what was sent: a reference that sends exact values differs
        unrounded = topk_reference(tuple(a.replace(",precision=bf16", "") for a in args), ratio)
        assert (run.params(0) - unrounded).abs().max() > 100 * SAME_KERNELS


# -- DiLoCo ------------------------------------------------------------------------------
def diloco_reference(args: tuple, inner: str, outer_lr: float, momentum: float, fragments: int,
                     synced_after: dict[int, tuple[int, ...]]) -> torch.Tensor:
    """Douillard et al. 2023: W replicas each take steps of the inner optimiser (torch.optim.AdamW or SGD
    at the run's lr) on their own batches; after step t every fragment f in ``synced_after[t]`` (fragment f:
    flat values [⌊f·n/F⌋, ⌊(f+1)·n/F⌋)) is synchronised: Δ = mean_w (θ_f − x_w,f) with θ_f the fragment's
    last outer value, then SGD with Nesterov momentum μ on θ_f (v ← μ·v + Δ; θ_f ← θ_f − lr·(Δ + μ·v)),
    and every replica's fragment becomes θ_f."""
    world, steps, size, lr, _ = setting(args)
    data = load("synthetic", 0)
    nets = [build("mlp", 0) for _ in range(world)]
    make = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[inner]
    optimisers = [make(net.parameters(), lr=lr) for net in nets]
    n = flat(nets[0]).numel()
    bounds = [(f * n // fragments, (f + 1) * n // fragments) for f in range(fragments)]
    theta = [flat(nets[0])[lo:hi].clone() for lo, hi in bounds]
    velocity = [torch.zeros_like(t) for t in theta]
    for step in range(steps):
        for w, (net, opt) in enumerate(zip(nets, optimisers)):
            x, y = batch(data, w, step, world, size)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(x), y).backward()
            opt.step()
        for f in synced_after.get(step, ()):
            lo, hi = bounds[f]
            pseudo = sum(theta[f] - flat(net)[lo:hi] for net in nets) / world
            if momentum:
                velocity[f] = momentum * velocity[f] + pseudo
                pseudo = pseudo + momentum * velocity[f]
            theta[f] = theta[f] - outer_lr * pseudo
            for net in nets:
                values = flat(net)
                values[lo:hi] = theta[f]
                assign(net, values)
    return flat(nets[0])


def test_diloco_is_inner_adamw_steps_and_nesterov_outer_steps_per_fragment(real_run):
    # diloco:period=4,fragments=2 over 6 steps: fragment 0 after steps 1 and 5, fragment 1 after step 3 (every
    # H/F = 2 steps the next fragment), and every fragment after the last step; outer lr 0.7, momentum 0.9
    run = real_run(*DILOCO)
    want = diloco_reference(DILOCO, "adamw", 0.7, 0.9, 2, {1: (0,), 3: (1,), 5: (0, 1)})
    assert_replicas_equal_reference(run, DILOCO, want, SAME_KERNELS)
    # the replicas differed between the outer steps, and agreed after each full one
    world, steps = 2, 6
    a, b = (run.results[w]["checksums"] for w in range(world))
    assert [a[t] == b[t] for t in range(steps)] == [False] * (steps - 1) + [True]
    # an inner SGD would have landed elsewhere: the inner optimiser is AdamW
    assert (run.params(0) - diloco_reference(DILOCO, "sgd", 0.7, 0.9, 2, {1: (0,), 3: (1,), 5: (0, 1)})
            ).abs().max() > 1e3 * SAME_KERNELS


def test_diloco_with_inner_sgd_on_three_workers(real_run):
    # period 3, one fragment, over 7 steps: outer steps after steps 2, 5 and the last, 6
    run = real_run(*DILOCO_SGD_3)
    want = diloco_reference(DILOCO_SGD_3, "sgd", 0.5, 0.5, 1, {2: (0,), 5: (0,), 6: (0,)})
    assert_replicas_equal_reference(run, DILOCO_SGD_3, want, COMBINED)
    a, b = (run.results[w]["checksums"] for w in range(2))
    assert [a[t] == b[t] for t in range(7)] == [False, False, True, False, False, True, True]


# -- bytes, actions and versions -------------------------------------------------------------
def policy_of(args: tuple):
    model = build(option(args, "--model"), 0)
    layers = param_layers(model)
    return parse(option(args, "--scheme")).policy(sum(layers), layers=layers, shapes=param_shapes(model))


def communication_by_step(run, args):
    """Checks that the run completed every step and that each worker sent its policy's wire bytes; yields
    (worker, step, [(kind, bytes) of that step's communication rows, in order], the policy's plan)."""
    s = run.summary
    assert s["complete"] is True and s["error"] is None
    world, steps = int(option(args, "--world")), int(option(args, "--steps"))
    assert s["steps_done"] == [steps] * world and len(run.updates) == world * steps
    policy = policy_of(args)
    assert s["bytes_sent"] == {str(w): policy.wire_bytes(steps) for w in range(world)}
    trace = run.trace[run.trace.kind != "compute"].sort_values(["worker", "step", "start"])
    for (worker, step), rows in trace.groupby(["worker", "step"]):
        yield worker, step, list(zip(rows.kind, rows.bytes.astype(float))), policy.plan(int(step), steps)


@pytest.mark.parametrize("name", RUNS)
def test_bytes_are_the_actions_nbytes_row_by_row(real_run, name):
    args = RUNS[name]
    # each communication row carries its action's bytes: PowerSGD's two all-reduces (P, then Q), top-k's
    # all-gather, each outer step's fragment
    for worker, step, sent, plan in communication_by_step(real_run(*args), args):
        want = []
        for action in plan:
            if isinstance(action, LowRankAllReduce):
                want += [("allreduce", action.p_bytes), ("allreduce", action.q_bytes)]
            elif isinstance(action, (SparseAllGather, OuterStep)):
                want.append((action.kind, action.nbytes))
        assert sent == want, (worker, step)


@pytest.mark.parametrize("name", ["powersgd_3", "topk"])
def test_the_compressor_s_work_is_a_compute_row_before_the_exchange(real_run, name):
    # The validation study's replay takes a run's compute from its compute rows and the calibration counts the
    # compressor's work as compute (real.calibration.compute_probe): so the selection (top-k) or P = ΔQ and
    # its orthogonalisation (PowerSGD) are a compute row of their own, after the step's backward, ending
    # where the first collective's row starts, and not inside that row.
    run = real_run(*RUNS[name])
    for (worker, step), rows in run.trace.sort_values(["worker", "step", "start", "end"]).groupby(["worker", "step"]):
        kinds = list(rows.kind)
        first = kinds.index((SparseAllGather if name == "topk" else LowRankAllReduce).kind)
        assert kinds[:first] == ["compute", "compute"], (worker, step, kinds)
        backward, compressor, exchange = (rows.iloc[i] for i in (0, 1, first))
        assert backward.end <= compressor.start < compressor.end == exchange.start, (worker, step)


def simulated(args: tuple):
    world, steps, size = int(option(args, "--world")), int(option(args, "--steps")), int(option(args, "--batch-size"))
    model = build(option(args, "--model"), 0)
    layers = param_layers(model)
    workload = Workload(param_bytes=sum(layers), compute_time="5ms", batch_size=size, layers=layers,
                        shapes=param_shapes(model))
    cluster = Cluster.homogeneous(gpus=world, link=Link(bandwidth="1GB/s", latency="100us"))
    return simulate(cluster, workload, parse(option(args, "--scheme")), steps=steps, seed=0)


def assert_the_simulator_agrees(run, args):
    """The simulator, on the run's spec, carries out the same sync actions, sends the same bytes per worker,
    and reads and applies the same versions, step by step."""
    res = simulated(args)
    assert sync_actions(res.trace) == sync_actions(run.trace)
    sim_bytes = res.trace[res.trace.kind != "compute"].groupby("worker").bytes.sum()
    assert sim_bytes.to_dict() == run.trace[run.trace.kind != "compute"].groupby("worker").bytes.sum().to_dict()
    key = ["worker", "step"]
    sim = res.updates.sort_values(key)[key + ["version_read", "version_applied"]].reset_index(drop=True)
    real = run.updates.sort_values(key)[key + ["version_read", "version_applied"]].reset_index(drop=True)
    assert sim.astype(int).equals(real.astype(int))


@pytest.mark.parametrize("name", RUNS)
def test_the_simulator_carries_out_the_same_actions_and_versions(real_run, name):
    run = real_run(*RUNS[name])
    assert_the_simulator_agrees(run, RUNS[name])
    assert (run.updates.staleness == 0).all()


# -- the replay ----------------------------------------------------------------------------------
DRIFT = 1e-6
WIRE_STEP = {"fp32": 0.0, "bf16": torch.finfo(torch.bfloat16).eps, "fp16": torch.finfo(torch.float16).eps}


def replay(run):
    """The run's update log replayed on its own problem: (the finished Replayer, the log, the problem)."""
    config = run.summary["config"]
    problem = TorchProblem(model=config["model"], data=config["data"], seed=config["seed"])
    log = load_log(run.out)
    return Replayer(log, problem, lr=config["lr"], seed=config["seed"]).run(), log, problem


@pytest.mark.parametrize("name", RUNS)
def test_replaying_the_update_log_ends_at_the_runs_parameters(real_run, name):
    # as tests/real/test_replay_agreement.py: the replay runs the same compressors (syncsim.compression), one
    # per worker, and takes the means itself; float64 against the ranks' float32
    run = real_run(*RUNS[name])
    replayer, log, problem = replay(run)
    # one version per synchronising step, as the update log counts them
    assert replayer.version == log.versions and replayer.skipped == 0
    replayed = torch.from_numpy(replayer.parameters()).float()
    real = run.params(0)
    off = (replayed - real).abs()
    one_step = real.abs() * WIRE_STEP[log.scheme.precision] + DRIFT
    assert (off <= one_step).all(), f"{int((off > one_step).sum())} elements off, worst {float(off.max()):.3g}"
    assert (off > DRIFT).float().mean() <= 1e-3, f"{int((off > DRIFT).sum())} elements beyond float32 drift"
    assert (real - torch.from_numpy(problem.init(0)).float()).abs().max() > 1e3 * DRIFT
