"""Compressed and low-communication schemes on a replayed problem: PowerSGD, top-k, DiLoCo.

Each test states the fact it rests on. The replay's compressors are syncsim.compression's (one per
worker); the optimisers are syncsim.convergence.optimizer's, checked here against torch.optim.
"""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from syncsim.convergence import LogisticRegression, Quadratic, Replayer
from syncsim.convergence.optimizer import AdamW, Nesterov
from syncsim.schemes.diloco import fragment_bounds
from tests.property.convergence_cases import (
    CONVERGENCE,
    assert_same,
    jitters,
    run,
    seeds,
    shaped_quadratics,
    versions,
)

problems = st.one_of(
    shaped_quadratics(),
    st.builds(LogisticRegression, features=st.integers(1, 8), samples=st.integers(8, 64), test_samples=st.just(16),
              seed=seeds),
)
precisions = st.sampled_from(["fp32", "fp16", "bf16"])


def full_rank(problem) -> int:
    """A rank at least min(rows, cols) of every tensor the compressor views as a matrix."""
    return max(min(shape[0], int(np.prod(shape)) // shape[0]) for shape in problem.shapes)


@settings(CONVERGENCE)
@given(problem=shaped_quadratics(), extra=st.integers(0, 2), workers=st.integers(1, 4), batch=st.integers(1, 4),
       steps=st.integers(1, 6), momentum=st.sampled_from([0.0, 0.9]), jitter=jitters, seed=seeds)
def test_powersgd_at_full_rank_equals_allreduce(problem, extra, workers, batch, steps, momentum, jitter, seed):
    # Basis: with rank r >= min(rows, cols) and min_compression 0 every tensor is compressed, and P = M·Q
    # with Q of full rank r (a generic gradient's warm start: Mᵀ·P̂) spans the column space of the mean
    # M, so the orthonormal P̂ does too and P̂·(MᵀP̂)ᵀ = P̂P̂ᵀM = M: the exact mean. The residual each
    # worker keeps is then Δ_w − mean Δ, which sums to 0 over workers, so the next step's mean is the
    # mean gradient again: every step is the all-reduce step.
    rank = full_rank(problem) + extra
    compressed = versions(run(workers, batch, f"allreduce:compression=powersgd,rank={rank},min_compression=0",
                              steps, seed, jitter), problem, 0.3, momentum, seed)
    reduced = versions(run(workers, batch, "allreduce", steps, seed, jitter), problem, 0.3, momentum, seed)
    assert len(compressed) == len(reduced) == steps + 1
    for a, b in zip(compressed, reduced):
        assert_same(a, b, problem)


@settings(CONVERGENCE)
@given(problem=problems, workers=st.integers(1, 4), batch=st.integers(1, 4), steps=st.integers(1, 6),
       momentum=st.sampled_from([0.0, 0.9]), jitter=jitters, seed=seeds)
def test_topk_with_ratio_one_equals_allreduce(problem, workers, batch, steps, momentum, jitter, seed):
    # Basis: with ratio 1, k = n: every worker sends its whole Δ = g + e, its residual is Δ − Δ = 0 (so
    # Δ = g every step), and the all-gathered sum over W is the mean gradient an all-reduce applies.
    sparse = versions(run(workers, batch, "topk:ratio=1", steps, seed, jitter), problem, 0.3, momentum, seed)
    reduced = versions(run(workers, batch, "allreduce", steps, seed, jitter), problem, 0.3, momentum, seed)
    assert len(sparse) == len(reduced) == steps + 1
    for a, b in zip(sparse, reduced):
        assert_same(a, b, problem)


@settings(CONVERGENCE)
@given(problem=problems, workers=st.integers(1, 4), steps=st.integers(1, 6), precision=precisions,
       scheme=st.sampled_from(["allreduce:compression=powersgd,rank=1", "allreduce:compression=powersgd,rank=2",
                               "allreduce:compression=powersgd,rank=1,min_compression=0",
                               "topk:ratio=0.1", "topk:ratio=0.5"]),
       momentum=st.sampled_from([0.0, 0.9]), seed=seeds)
def test_error_feedback_conserves_the_gradient_sum(problem, workers, steps, precision, scheme, momentum, seed):
    # Basis: each worker keeps as its residual exactly what it did not contribute, e_new = Δ − (its
    # share of what was applied), rounding of the wire included, so per step
    # Σ_w sent_w + Σ_w e_w,new = Σ_w (g_w + e_w,old), where Σ_w sent_w = W · (the applied mean):
    # error feedback loses nothing (Stich et al. 2018; Vogels et al. 2019, algorithm 2). Every worker
    # receives the same means, so the replicas stay bit-identical.
    replayer = Replayer(run(workers, 2, f"{scheme},precision={precision}", steps, seed), problem, 0.05,
                        momentum, seed)
    previous = [np.zeros(problem.dim)] * workers
    checked = []

    def at_version(version, time, applied):
        errors = [c.error.copy() for c in replayer.compressors]
        before = sum(g + e for g, e in zip(replayer.gradients, previous))
        after = workers * replayer.reduced + sum(errors)
        scale = max(1.0, float(np.abs(before).max()))
        np.testing.assert_allclose(after, before, rtol=0, atol=1e-12 * workers * scale)
        # and every replica applied the same bytes with equal optimiser state: they stay bit-identical
        assert all(np.array_equal(row, replayer.replicas[0], equal_nan=True) for row in replayer.replicas)
        previous[:] = errors
        checked.append(version)

    replayer.run(on_version=at_version)
    assert checked == list(range(1, steps + 1))


@settings(CONVERGENCE)
@given(problem=problems, workers=st.integers(1, 4), batch=st.integers(1, 4), steps=st.integers(1, 6),
       momentum=st.sampled_from([0.0, 0.9]), jitter=jitters, seed=seeds)
def test_diloco_every_step_with_plain_outer_sgd_equals_allreduce(problem, workers, batch, steps, momentum, jitter,
                                                                  seed):
    # Basis: with H = 1 every worker takes one SGD step x − lr·v_w from the common x, and the outer step
    # with lr 1 and no momentum sets x to x − mean(x − x_w) = mean(x_w) = x − lr·mean(v_w): the all-reduce
    # step. Momentum buffers are linear in the gradients, so mean(v_w) follows the all-reduce buffer's
    # recursion (as local SGD with period 1 does).
    diloco = versions(run(workers, batch, "diloco:period=1,outer_lr=1,outer_momentum=0,inner=sgd", steps, seed,
                          jitter), problem, 0.3, momentum, seed)
    reduced = versions(run(workers, batch, "allreduce", steps, seed, jitter), problem, 0.3, momentum, seed)
    assert len(diloco) == len(reduced) == steps + 1
    for a, b in zip(diloco, reduced):
        assert_same(a, b, problem)


@settings(CONVERGENCE)
@given(problem=problems, workers=st.integers(1, 4), period=st.integers(1, 4), steps=st.integers(1, 9),
       momentum=st.sampled_from([0.0, 0.5]), jitter=jitters, seed=seeds)
def test_diloco_with_plain_outer_sgd_equals_local_sgd(problem, workers, period, steps, momentum, jitter, seed):
    # Basis: with outer lr 1 and no momentum the outer step sets every replica to x − mean(x − x_w) =
    # mean(x_w), the parameter average, at the same steps as localsgd:period=H (every H-th and the last),
    # and both take the same inner SGD steps (per-worker momentum) in between.
    diloco = versions(run(workers, 2, f"diloco:period={period},outer_lr=1,outer_momentum=0,inner=sgd", steps,
                          seed, jitter), problem, 0.3, momentum, seed)
    local = versions(run(workers, 2, f"localsgd:period={period}", steps, seed, jitter), problem, 0.3, momentum,
                     seed)
    assert len(diloco) == len(local)
    for a, b in zip(diloco, local):
        assert_same(a, b, problem)


@settings(CONVERGENCE)
@given(workers=st.integers(1, 4), fragments=st.sampled_from([1, 2, 3]), multiple=st.integers(1, 2),
       steps=st.integers(1, 10), inner=st.sampled_from(["sgd", "adamw"]), precision=precisions, seed=seeds,
       problem=problems)
def test_an_outer_step_leaves_its_fragment_identical_on_every_replica(workers, fragments, multiple, steps, inner,
                                                                      precision, seed, problem):
    # Basis: an outer step hands every worker the same mean pseudo-gradient and the same outer state, so
    # the fragment it synchronises is bit-identical on every replica afterwards and equal to the outer
    # (global) parameters; the run's last step synchronises every fragment, so it ends with W equal
    # replicas; a step's outer steps make one version, as the updates table counts them.
    period = fragments * multiple
    result = run(workers, 2, f"diloco:period={period},fragments={fragments},inner={inner},precision={precision}",
                 steps, seed)
    replayer = Replayer(result, problem, 0.01, 0.0, seed)
    bounds = fragment_bounds(problem.dim, fragments)
    gap = period // fragments

    def at_version(version, time, applied):
        assert replayer.home == "outer"
        step = version * gap - 1    # the step whose outer step made this version (before the last step)
        synced = range(fragments) if version == replayer.log.versions else [(step + 1) // gap - 1]
        for f in synced:
            start, stop = bounds[f % fragments]
            for row in replayer.replicas:
                assert np.array_equal(row[start:stop], replayer.outer[start:stop], equal_nan=True)

    replayer.run(on_version=at_version)
    assert replayer.version == replayer.log.versions
    assert all(np.array_equal(row, replayer.parameters(), equal_nan=True) for row in replayer.replicas)


gradient_runs = st.tuples(st.integers(1, 5), st.integers(1, 6)).flatmap(
    lambda shape: hnp.arrays(np.float64, shape, elements=st.floats(-10, 10, allow_subnormal=False)))


@settings(CONVERGENCE)
@given(gradients=gradient_runs, lr=st.floats(1e-4, 1.0), weight_decay=st.sampled_from([0.0, 0.01, 0.1]),
       start=st.integers(0, 2**16))
def test_adamw_matches_torch(gradients, lr, weight_decay, start):
    # Basis: AdamW is written out as torch.optim.AdamW defines it (decoupled decay, lerp'd first moment,
    # bias corrections 1 − βᵗ); in float64 the two agree to rounding.
    x = np.random.default_rng(start).normal(size=gradients.shape[1])
    param = torch.nn.Parameter(torch.from_numpy(x.copy()))
    reference = torch.optim.AdamW([param], lr=lr, weight_decay=weight_decay)
    ours, m, v = AdamW(lr, weight_decay=weight_decay), np.zeros_like(x), np.zeros_like(x)
    for t, g in enumerate(gradients, start=1):
        param.grad = torch.from_numpy(g.copy())
        reference.step()
        ours.step(x, m, v, t, g)
        expected = param.detach().numpy()
        np.testing.assert_allclose(x, expected, rtol=1e-12, atol=1e-12 * max(1.0, float(np.abs(expected).max())))


@settings(CONVERGENCE)
@given(gradients=gradient_runs, lr=st.floats(1e-3, 1.0), momentum=st.sampled_from([0.0, 0.5, 0.9, 0.99]),
       start=st.integers(0, 2**16))
def test_nesterov_matches_torch(gradients, lr, momentum, start):
    # Basis: torch.optim.SGD(nesterov=True, dampening=0): v ← μv + g (v starts as the first g, which is
    # μ·0 + g); x ← x − lr·(g + μv). Written out the same, float64 agrees to rounding.
    x = np.random.default_rng(start).normal(size=gradients.shape[1])
    param = torch.nn.Parameter(torch.from_numpy(x.copy()))
    reference = torch.optim.SGD([param], lr=lr, momentum=momentum, nesterov=momentum > 0)
    ours, velocity = Nesterov(lr, momentum), np.zeros_like(x)
    for g in gradients:
        param.grad = torch.from_numpy(g.copy())
        reference.step()
        ours.step(x, velocity, g)
        expected = param.detach().numpy()
        np.testing.assert_allclose(x, expected, rtol=1e-12, atol=1e-12 * max(1.0, float(np.abs(expected).max())))


@settings(CONVERGENCE)
@given(workers=st.integers(1, 3), steps=st.integers(1, 6), seed=seeds,
       scheme=st.sampled_from(["allreduce:compression=powersgd,rank=2", "topk:ratio=0.3"]))
def test_compressed_fp16_gradients_are_not_loss_scaled(workers, steps, seed, scheme):
    # Basis (a stated choice, docs/convergence.md): error feedback keeps what the fp16 wire rounds away,
    # underflow included, so compressed gradients cross it unscaled; no step is skipped, no scale moves.
    problem = Quadratic((1e-9, 1.0, 2.0), noise=0.1)
    replayer = Replayer(run(workers, 2, f"{scheme},precision=fp16", steps, seed), problem, 0.1, 0.0, seed)
    replayer.run()
    assert replayer.skipped == 0
    assert np.all(replayer.scaler.scale == replayer.scaler.config.init_scale)
    assert np.all(replayer.scaler.good_steps == 0)
