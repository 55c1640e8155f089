"""Every scheme's real arithmetic against a reference written out here, in plain torch.

Each reference is computed in this file from the run's inputs alone — the
seeded model, the documented batch layout of real/data.py, plain SGD — and
states the fact it rests on. None calls the executor, the server or the
replay, so a bug there cannot hide in the reference too. The runs are small
(gloo, 1–3 workers, mlp, a few steps) and shared with the other distributed
tests (tests/real/runs.py).

Tolerances. The ranks run one thread (OMP_NUM_THREADS=1) and so does this
file, so a gradient of the same batch on the same weights is computed by the
same kernels in the same order: per-worker references reproduce the runs bit
for bit in practice, and are held to 1e-7 absolute (weights are ~0.05, a
float32 ulp there is ~4e-9). A combined-batch reference sums the W·B samples in
one reduction where the run sums two halves, so it is held to 1e-5, far below
what any real fault moves (a missing gradient moves weights by lr·|g| ≈ 1e-3).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from real.data import load
from real.models import build
from tests.real.runs import ASYNC_ONE, FP16, LOCAL, LOCAL_ONE, PS_SYNC, SSP, option

pytestmark = pytest.mark.distributed

SAME_KERNELS = 1e-7     # per-worker references: the same float32 operations as the ranks
COMBINED = 1e-5         # combined-batch references: the same sum in another order


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- the references' building blocks ---------------------------------------------------
def setting(args: tuple) -> tuple[str, int, int, int]:
    return option(args, "--model"), int(option(args, "--world")), int(option(args, "--steps")), \
        int(option(args, "--batch-size"))


def batch(data, worker: int, step: int, world: int, size: int):
    # real/data.py's documented layout: worker w's batch at step t is positions
    # [(t·W + w)·B, (t·W + w + 1)·B) of one seeded permutation, wrapping around
    start = (step * world + worker) * size
    idx = data.order[torch.arange(start, start + size) % len(data.y)]
    return data.x[idx], data.y[idx]


def gradient(net, x, y) -> list[torch.Tensor]:
    net.zero_grad(set_to_none=True)
    F.cross_entropy(net(x), y).backward()
    return [p.grad.detach().clone() for p in net.parameters()]


def descend(net, grads, lr: float) -> None:
    """Plain SGD, as torch.optim.SGD without momentum: p ← p − lr·g."""
    with torch.no_grad():
        for p, g in zip(net.parameters(), grads):
            p.add_(g, alpha=-lr)


def flat(net) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def assign(net, values: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(values[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def wire_sum(tensors, dtype: torch.dtype) -> torch.Tensor:
    """The sum of tensors sent in ``dtype``: each rounded to it, and added in it, as gloo reduces a tensor
    in its own dtype (a 16-bit value is added in float and rounded back)."""
    total = tensors[0].to(dtype)
    for t in tensors[1:]:
        total = total + t.to(dtype)
    return total.float()


def combined_batch_sgd(args: tuple, lr: float) -> torch.Tensor:
    """One process, one model, SGD on the union of the step's W batches."""
    model, world, steps, size = setting(args)
    net, data = build(model, 0), load("synthetic", 0)
    for t in range(steps):
        parts = [batch(data, w, t, world, size) for w in range(world)]
        descend(net, gradient(net, torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])), lr)
    return flat(net)


def lr_of(run) -> float:
    return float(run.summary["config"]["lr"])


# -- synchronous parameter server ----------------------------------------------------------
def test_synchronous_ps_equals_one_process_on_the_combined_batch(real_run):
    # Basis: the servers apply a round's W gradients weighted 1/W each, i.e.
    # their mean, and the gradient of a mean loss is linear in the samples, so
    # the mean of W batch gradients is the gradient of their union: one SGD
    # step of one process on the combined batch of W·B samples.
    run = real_run(*PS_SYNC, torchrun=3)
    world = int(option(PS_SYNC, "--world"))
    want = combined_batch_sgd(PS_SYNC, lr_of(run))
    for rank in range(world + 1):  # every worker's last pull, and the server's own shard
        torch.testing.assert_close(run.params(rank), want, rtol=0, atol=COMBINED, msg=f"rank {rank}")


# -- local SGD -----------------------------------------------------------------------------
def test_local_sgd_with_period_one_equals_the_combined_batch(real_run):
    # Basis: with plain SGD, averaging W replicas that each took x − lr·g_w
    # gives x − lr·mean(g): the all-reduce step, which is one process on the
    # combined batch (the gradient is linear in the samples).
    run = real_run(*LOCAL_ONE)
    want = combined_batch_sgd(LOCAL_ONE, lr_of(run))
    for rank in range(int(option(LOCAL_ONE, "--world"))):
        torch.testing.assert_close(run.params(rank), want, rtol=0, atol=COMBINED, msg=f"rank {rank}")


def local_sgd(args: tuple, lr: float, warmup: int, average_after: set[int], dtype: torch.dtype) -> torch.Tensor:
    """W replicas stepping independently on their own batches, with exact (wire-rounded) means at the sync points.

    Warm-up steps all-reduce the gradients as torch's compress hooks send them
    (each cast to ``dtype`` and divided by W there, summed in ``dtype``);
    averaging sends each replica in ``dtype``, sums in ``dtype`` and divides
    by W in fp32. W = 2 here, so dividing before or after the sum is exact
    either way (a power of two) and the two orders agree.
    """
    model, world, steps, size = setting(args)
    data = load("synthetic", 0)
    nets = [build(model, 0) for _ in range(world)]
    for t in range(steps):
        grads = [gradient(net, *batch(data, w, t, world, size)) for w, net in enumerate(nets)]
        if t < warmup:
            mean = [wire_sum([g[i].to(dtype) / world for g in grads], dtype) for i in range(len(grads[0]))]
            for net in nets:
                descend(net, mean, lr)
            continue
        for net, g in zip(nets, grads):
            descend(net, g, lr)
        if t in average_after:
            average = wire_sum([flat(net) for net in nets], dtype) / world
            for net in nets:
                assign(net, average)
    return flat(nets[0])


def test_local_sgd_is_independent_local_steps_then_the_exact_mean_rounded_to_bf16(real_run):
    # Basis: local SGD is W independent SGD runs on each worker's own batches,
    # whose parameters are replaced by their mean at the sync points (Stich
    # 2019); with precision=bf16 what crosses the wire is rounded to bf16. The
    # run: localsgd:period=3,warmup_steps=1 over 7 steps — step 0 all-reduces,
    # steps 1..6 are local, and the replicas are averaged after steps 3 and 6
    # (every third local step; the last step always ends averaged).
    run = real_run(*LOCAL)
    lr, world = lr_of(run), int(option(LOCAL, "--world"))
    want = local_sgd(LOCAL, lr, warmup=1, average_after={3, 6}, dtype=torch.bfloat16)
    for rank in range(world):
        torch.testing.assert_close(run.params(rank), want, rtol=0, atol=SAME_KERNELS, msg=f"rank {rank}")
    # The averaged values crossed the wire in bf16: their sum is on bf16's grid.
    summed = run.params(0) * world
    assert torch.equal(summed.to(torch.bfloat16).float(), summed)
    # ...and the reference tells a wire in fp32 apart (so the check above could fail).
    unrounded = local_sgd(LOCAL, lr, warmup=1, average_after={3, 6}, dtype=torch.float32)
    assert (run.params(0) - unrounded).abs().max() > 100 * SAME_KERNELS


# -- asynchronous parameter server -----------------------------------------------------------
def test_asynchronous_ps_with_one_worker_is_sequential_sgd(real_run):
    # Basis: with one worker every push reads the version its previous push
    # made and weighs 1/W = 1: plain sequential SGD on that worker's batches.
    run = real_run(*ASYNC_ONE)
    model, world, steps, size = setting(ASYNC_ONE)
    assert world == 1 and (run.updates.staleness == 0).all()
    net, data = build(model, 0), load("synthetic", 0)
    for t in range(steps):
        descend(net, gradient(net, *batch(data, 0, t, 1, size)), lr_of(run))
    for rank in (0, 1):  # the worker's last pull, and the server's shard
        torch.testing.assert_close(run.params(rank), flat(net), rtol=0, atol=SAME_KERNELS, msg=f"rank {rank}")


# -- 16-bit communication ------------------------------------------------------------------------
def test_fp16_allreduce_is_the_reference_with_wire_values_rounded_to_fp16(real_run):
    # Basis: with precision=fp16 each gradient crosses the wire as fp16
    # (torch's fp16_compress_hook casts the bucket to fp16 and divides it by
    # W), the sum is taken in fp16, and the optimizer applies the result in
    # fp32: the all-reduce reference with exactly those values rounded.
    run = real_run(*FP16)
    model, world, steps, size = setting(FP16)
    lr, data = lr_of(run), load("synthetic", 0)

    def reference(dtype):
        net = build(model, 0)
        for t in range(steps):
            grads = [gradient(net, *batch(data, w, t, world, size)) for w in range(world)]
            descend(net, [wire_sum([g[i].to(dtype) / world for g in grads], dtype) for i in range(len(grads[0]))],
                    lr)
        return flat(net)

    for rank in range(world):
        torch.testing.assert_close(run.params(rank), reference(torch.float16), rtol=0, atol=SAME_KERNELS)
    # the rounding is visible at this tolerance: an fp32 wire lands elsewhere
    assert (run.params(0) - reference(torch.float32)).abs().max() > 10 * SAME_KERNELS


# -- stale synchronous parallel -----------------------------------------------------------------------
def test_ssp_step_t_starts_only_after_every_push_t_minus_s_was_applied(real_run):
    # Basis: SSP with bound s (Ho et al. 2013): a worker may start step t
    # (its clock is t) only once every worker's push of step t−s−1 — its
    # (t−s)-th push — has been *applied* by the servers. So the version the
    # step's gradient reads already contains each of those pushes, and the
    # step's compute starts after the server logged applying them.
    run = real_run(*SSP)
    world, steps, s = int(option(SSP, "--world")), int(option(SSP, "--steps")), 1
    updates = run.updates.set_index(["worker", "step"])
    compute = run.trace[run.trace.kind == "compute"].set_index(["worker", "step"]).start
    checked = 0
    for w in range(world):
        for t in range(s + 1, steps):
            for other in range(world):
                needed = updates.loc[(other, t - s - 1)]
                assert updates.loc[(w, t)].version_read > needed.version_applied, (w, t, other)
                # times: both from time.time() on this host, logged to 1 µs
                assert compute[(w, t)] >= needed.time_applied - 1e-6, (w, t, other)
                checked += 1
    assert checked == world * (steps - s - 1) * world
    # the bound was binding: the fast workers did wait for the slow one, which computes longer by its
    # sleep each step (--slow 2:40: 39 x 3 warm forwards), for at least half of that extra time
    spans = run.trace[run.trace.kind == "compute"]
    extra = (spans.end - spans.start).groupby(spans.worker == 2).median()
    extra = extra[True] - extra[False]
    waits = run.trace[(run.trace.kind == "wait") & (run.trace.worker != 2)]
    assert extra > 1e-3 and (waits.end - waits.start).max() > extra / 2, (extra, waits)
