"""The replay's compressed and DiLoCo steps against independent re-implementations.

Each reference below is a straightforward loop over steps and workers written here, from the
papers and the semantics in syncsim/schemes/actions.py, without syncsim.compression or the replay's
optimisers: PowerSGD with error feedback and warm start (Vogels et al. 2019, as torch's
powerSGD_hook arranges it), top-k with error feedback (Stich et al. 2018) and DiLoCo (Douillard et
al. 2023; fragments as streaming DiLoCo, 2025) with inner AdamW or SGD and outer Nesterov SGD. The
replay of a simulated run must land on the same parameters, version by version, to 1e-9 relative.
What the references share with the replay is only what is not under test: the problem's gradient,
the sampler's minibatches, and the documented seeding of PowerSGD's first Q.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from syncsim import Cluster, Link, Workload, simulate
from syncsim.compression import orthonormalise
from syncsim.convergence import Digits, LogisticRegression, Quadratic, Replayer, Sampler


@dataclass(frozen=True)
class ShapedQuadratic(Quadratic):
    """A Quadratic whose flat parameters are the tensors ``layout`` laid end to end."""

    layout: tuple[tuple[int, ...], ...] = ()

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return self.layout or ((self.dim,),)


def run(workers: int, batch: int, scheme: str, steps: int, seed: int = 0):
    cluster = Cluster.homogeneous(workers, Link("10Gbit/s", "5us"))
    return simulate(cluster, Workload(param_bytes=64.0, compute_time="10ms", batch_size=batch), scheme,
                    steps=steps, seed=seed)


def versions(result, problem, lr, momentum=0.0, seed=0) -> list[np.ndarray]:
    """The authoritative parameters at version 0, 1, 2, ... of a replay."""
    replayer = Replayer(result, problem, lr, momentum, seed)
    states = [replayer.parameters().copy()]
    replayer.run(on_version=lambda v, t, n: states.append(replayer.parameters().copy()) and False)
    return states


def assert_same(actual, expected, problem) -> None:
    """Equal to 1e-9 relative (LogisticRegression sums float32 products: 1e-5)."""
    rtol = 1e-5 if isinstance(problem, LogisticRegression) else 1e-9
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * max(1.0, float(np.abs(expected).max())))

SHAPED = ShapedQuadratic(tuple(np.linspace(0.2, 1.8, 12 + 3 + 10)), noise=0.5, pool=32, seed=3,
                         layout=((4, 3), (3,), (2, 5)))
DIGITS = Digits(channels=2, hidden=4)
BATCH = 3


def rounded(x, precision: str) -> np.ndarray:
    """``x`` as the wire carries it: numpy's float16 cast, torch's bfloat16 cast, or as it is."""
    x = np.asarray(x, dtype=np.float64)
    if precision == "fp16":
        return x.astype(np.float16).astype(np.float64)
    if precision == "bf16":
        return torch.from_numpy(x.copy()).to(torch.bfloat16).double().numpy()
    return x.copy()


def wire_mean(rows, precision: str) -> np.ndarray:
    """An all-reduce's mean: each row sent, the mean sent back."""
    total = np.zeros_like(np.asarray(rows[0], dtype=float))
    for row in rows:
        total = total + rounded(row, precision)
    return rounded(total / len(rows), precision)


def gram_schmidt(a: np.ndarray) -> np.ndarray:
    """Orthonormal columns, one column at a time (modified Gram–Schmidt, one pass)."""
    q = np.array(a, dtype=float)
    for i in range(q.shape[1]):
        for j in range(i):
            q[:, i] -= (q[:, j] @ q[:, i]) * q[:, j]
        q[:, i] /= np.linalg.norm(q[:, i])
    return q


def gradients(problem, x, sampler, t, workers):
    return [problem.gradient(x, sampler.indices(w, t)) for w in range(workers)]


# -- PowerSGD -----------------------------------------------------------------------------------------
def powersgd_reference(problem, workers, steps, rank, min_compression, precision, lr, momentum, seed):
    """Parameters after every step of PowerSGD with error feedback and warm start, then SGD."""
    sampler = Sampler(problem.samples, BATCH, workers, seed)
    x = np.asarray(problem.init(seed), dtype=float).copy()
    velocity = np.zeros_like(x)
    errors = [np.zeros_like(x) for _ in range(workers)]
    # torch's rule: a tensor is rows = shape[0] by the rest; compressed when it saves min_compression×
    tensors, start = [], 0
    for shape in problem.shapes:
        rows = shape[0]
        cols = math.prod(shape) // rows
        r = min(rank, rows, cols)
        tensors.append((slice(start, start + rows * cols), rows, cols,
                        r if min_compression * r * (rows + cols) < rows * cols else 0))
        start += rows * cols
    compressed = [t for t in tensors if t[3]]
    qs = [gram_schmidt(np.random.default_rng([seed, i]).standard_normal((cols, r)))
          for i, (_, _, cols, r) in enumerate(compressed)]
    states = [x.copy()]
    for t in range(steps):
        deltas = [g + e for g, e in zip(gradients(problem, x, sampler, t, workers), errors)]
        applied = np.zeros_like(x)
        for where, _, _, r in tensors:
            if not r:
                applied[where] = wire_mean([d[where] for d in deltas], precision)
        for i, (where, rows, cols, _) in enumerate(compressed):
            ms = [d[where].reshape(rows, cols) for d in deltas]
            p_hat = gram_schmidt(wire_mean([m @ qs[i] for m in ms], precision))
            qs[i] = wire_mean([m.T @ p_hat for m in ms], precision)
            applied[where] = (p_hat @ qs[i].T).reshape(-1)
        errors = [d - applied for d in deltas]
        velocity = momentum * velocity + applied
        x = x - lr * velocity
        states.append(x.copy())
    return states


@pytest.mark.parametrize("problem,workers,rank,min_compression,precision,momentum", [
    (SHAPED, 3, 2, 0.0, "fp32", 0.0),
    (SHAPED, 2, 2, 1.0, "fp32", 0.9),
    (SHAPED, 3, 1, 2.0, "bf16", 0.5),
    (SHAPED, 1, 3, 0.0, "fp16", 0.0),
    (DIGITS, 3, 1, 2.0, "fp32", 0.9),
    (DIGITS, 2, 1, 0.0, "fp16", 0.0),
])
def test_powersgd_replay_matches_an_independent_loop(problem, workers, rank, min_compression, precision, momentum):
    steps, lr, seed = 5, 0.1, 7
    scheme = f"allreduce:compression=powersgd,rank={rank},min_compression={min_compression},precision={precision}"
    replayed = versions(run(workers, BATCH, scheme, steps, seed), problem, lr, momentum, seed)
    expected = powersgd_reference(problem, workers, steps, rank, min_compression, precision, lr, momentum, seed)
    assert len(replayed) == len(expected) == steps + 1
    for a, b in zip(replayed, expected):
        assert_same(a, b, problem)


# -- top-k --------------------------------------------------------------------------------------------
def topk_reference(problem, workers, steps, ratio, precision, lr, momentum, seed):
    """Parameters after every step of top-k with error feedback, all-gathered, then SGD."""
    sampler = Sampler(problem.samples, BATCH, workers, seed)
    x = np.asarray(problem.init(seed), dtype=float).copy()
    n = len(x)
    k = max(1, min(n, math.ceil(ratio * n - 1e-9)))
    velocity = np.zeros_like(x)
    errors = [np.zeros_like(x) for _ in range(workers)]
    states = [x.copy()]
    for t in range(steps):
        total = np.zeros_like(x)
        for w, g in enumerate(gradients(problem, x, sampler, t, workers)):
            delta = g + errors[w]
            chosen = np.argsort(-np.abs(delta), kind="stable")[:k]   # largest first, ties: lower index
            sent = rounded(delta[chosen], precision)
            errors[w] = delta.copy()
            errors[w][chosen] = delta[chosen] - sent
            total[chosen] += sent
        velocity = momentum * velocity + total / workers
        x = x - lr * velocity
        states.append(x.copy())
    return states


@pytest.mark.parametrize("problem,workers,ratio,precision,momentum", [
    (SHAPED, 3, 0.1, "fp32", 0.0),
    (SHAPED, 2, 0.3, "bf16", 0.9),
    (SHAPED, 4, 0.5, "fp16", 0.5),
    (DIGITS, 3, 0.05, "fp32", 0.9),
    (LogisticRegression(features=6, samples=40, test_samples=8, seed=2), 2, 0.34, "fp16", 0.0),
])
def test_topk_replay_matches_an_independent_loop(problem, workers, ratio, precision, momentum):
    steps, lr, seed = 6, 0.2, 11
    replayed = versions(run(workers, BATCH, f"topk:ratio={ratio},precision={precision}", steps, seed), problem, lr,
                        momentum, seed)
    expected = topk_reference(problem, workers, steps, ratio, precision, lr, momentum, seed)
    assert len(replayed) == len(expected) == steps + 1
    for a, b in zip(replayed, expected):
        assert_same(a, b, problem)


# -- DiLoCo -------------------------------------------------------------------------------------------
def diloco_reference(problem, workers, steps, period, fragments, inner, outer_lr, outer_momentum, precision, lr,
                     momentum, seed):
    """The outer parameters after every outer step of DiLoCo (one version per step that has any)."""
    sampler = Sampler(problem.samples, BATCH, workers, seed)
    x0 = np.asarray(problem.init(seed), dtype=float)
    n = len(x0)
    replicas = [x0.copy() for _ in range(workers)]
    outer, buffer = x0.copy(), np.zeros(n)
    # inner state per worker: SGD's momentum buffer, or AdamW's two moments
    sgd_v = [np.zeros(n) for _ in range(workers)]
    adam_m = [np.zeros(n) for _ in range(workers)]
    adam_v = [np.zeros(n) for _ in range(workers)]
    beta1, beta2, eps, decay = 0.9, 0.999, 1e-8, 0.01
    gap = period // fragments
    states = [outer.copy()]
    for t in range(steps):
        for w in range(workers):
            g = problem.gradient(replicas[w], sampler.indices(w, t))
            if inner == "sgd":
                sgd_v[w] = momentum * sgd_v[w] + g
                replicas[w] = replicas[w] - lr * sgd_v[w]
            else:
                k = t + 1
                replicas[w] = replicas[w] * (1 - lr * decay)
                adam_m[w] = beta1 * adam_m[w] + (1 - beta1) * g
                adam_v[w] = beta2 * adam_v[w] + (1 - beta2) * g * g
                m_hat = adam_m[w] / (1 - beta1**k)
                v_hat = adam_v[w] / (1 - beta2**k)
                replicas[w] = replicas[w] - lr * m_hat / (np.sqrt(v_hat) + eps)
        if t == steps - 1:
            synced = list(range(fragments))
        elif (t + 1) % gap == 0:
            synced = [((t + 1) // gap - 1) % fragments]
        else:
            continue
        for f in synced:
            lo, hi = f * n // fragments, (f + 1) * n // fragments
            pseudo = wire_mean([outer[lo:hi] - r[lo:hi] for r in replicas], precision)
            buffer[lo:hi] = outer_momentum * buffer[lo:hi] + pseudo
            outer[lo:hi] = outer[lo:hi] - outer_lr * (pseudo + outer_momentum * buffer[lo:hi])
            for r in replicas:
                r[lo:hi] = outer[lo:hi]
        states.append(outer.copy())
    return states


@pytest.mark.parametrize("problem,workers,period,fragments,inner,outer_lr,outer_momentum,precision,lr,momentum", [
    (SHAPED, 3, 3, 1, "adamw", 0.7, 0.9, "fp32", 0.05, 0.0),
    (SHAPED, 2, 4, 2, "adamw", 0.7, 0.9, "bf16", 0.05, 0.0),
    (SHAPED, 3, 2, 2, "sgd", 0.5, 0.5, "fp32", 0.2, 0.5),
    (SHAPED, 2, 6, 3, "sgd", 1.0, 0.9, "fp16", 0.2, 0.0),
    (DIGITS, 2, 4, 4, "adamw", 0.7, 0.9, "fp32", 0.01, 0.0),
    (Quadratic((0.5, 1.0, 1.5, 2.0, 0.3), noise=0.3), 4, 2, 1, "sgd", 0.8, 0.0, "fp32", 0.3, 0.9),
])
def test_diloco_replay_matches_an_independent_loop(problem, workers, period, fragments, inner, outer_lr,
                                                   outer_momentum, precision, lr, momentum):
    steps, seed = 11, 5
    scheme = (f"diloco:period={period},fragments={fragments},inner={inner},outer_lr={outer_lr},"
              f"outer_momentum={outer_momentum},precision={precision}")
    replayed = versions(run(workers, BATCH, scheme, steps, seed), problem, lr, momentum, seed)
    expected = diloco_reference(problem, workers, steps, period, fragments, inner, outer_lr, outer_momentum,
                                precision, lr, momentum, seed)
    assert len(replayed) == len(expected)
    for a, b in zip(replayed, expected):
        assert_same(a, b, problem)


# -- pieces -------------------------------------------------------------------------------------------
def test_orthonormalise_keeps_dependent_columns_orthogonal():
    # A rank-1 mean P at rank 2: the second column is the first's multiple up to rounding. Its residual
    # must still come out orthogonal, so that P̂P̂ᵀ projects (one Gram–Schmidt pass normalised the
    # rounding noise into a unit vector 0.24 from orthogonal, and P̂P̂ᵀM missed M by a fifth).
    rng = np.random.default_rng(0)
    u, v = rng.normal(size=6), rng.normal(size=5)
    m = np.outer(u, v)
    p_hat = orthonormalise(m @ rng.normal(size=(5, 2)))
    np.testing.assert_allclose(p_hat.T @ p_hat, np.eye(2), atol=1e-12)
    np.testing.assert_allclose(p_hat @ (p_hat.T @ m), m, atol=1e-12)
    assert np.array_equal(orthonormalise(np.zeros((4, 2))), np.zeros((4, 2)))


def test_a_problems_tensors_default_to_one_vector_and_must_add_up():
    assert Quadratic((1.0, 2.0, 3.0)).shapes == ((3,),)
    assert sum(math.prod(s) for s in DIGITS.shapes) == DIGITS.dim
    wrong = ShapedQuadratic((1.0, 2.0, 3.0), layout=((2, 2),))
    with pytest.raises(ValueError, match=r"ShapedQuadratic.shapes hold 4 values but its dim is 3"):
        Replayer(run(2, 1, "allreduce:compression=powersgd", 2), wrong, 0.1).run()


def test_adamw_state_is_each_workers_own():
    # Two workers of local AdamW never synchronised until the last step: each counts its own steps
    # and keeps its own moments (a replica's first step is bias-corrected as step 1, whatever others did).
    result = run(2, 2, "diloco:period=8,inner=adamw", 3)
    replayer = Replayer(result, Quadratic((1.0, 2.0), noise=0.5), 0.01, seed=1)
    replayer.run()
    assert replayer.adam_steps.tolist() == [3, 3]
    m, v = replayer.adam_moments
    assert not np.array_equal(m[0], m[1]) and not np.array_equal(v[0], v[1])
