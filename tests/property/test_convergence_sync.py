"""Synchronous schemes on a replayed problem: linearity, identical replicas, local SGD vs all-reduce."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from syncsim.convergence import LogisticRegression, LossScaling, Quadratic, Replayer, Sampler
from tests.property.convergence_cases import CONVERGENCE, assert_same, jitters, run, seeds, versions

problems = st.one_of(
    st.builds(Quadratic, eigenvalues=st.lists(st.floats(0.1, 2.0), min_size=1, max_size=4).map(tuple),
              noise=st.floats(0.0, 1.0), pool=st.integers(8, 64), seed=seeds),
    st.builds(LogisticRegression, features=st.integers(1, 8), samples=st.integers(8, 64), test_samples=st.just(16),
              seed=seeds),
)


@settings(CONVERGENCE)
@given(problem=problems, workers=st.integers(1, 5), batch=st.integers(1, 6), steps=st.integers(1, 6),
       scheme=st.sampled_from(["allreduce", "ps"]), momentum=st.sampled_from([0.0, 0.9]), jitter=jitters,
       seed=seeds)
def test_data_parallel_equals_one_worker_with_the_combined_batch(problem, workers, batch, steps, scheme, momentum,
                                                                 jitter, seed):
    # Basis: the gradient of a mean loss is linear in the samples, so the mean
    # of W minibatch gradients of b samples is the gradient of their union of
    # W·b samples (the sampler lays a step's W minibatches out as exactly the
    # one-worker minibatch of W·b); the optimiser then sees the same gradient.
    many = versions(run(workers, batch, scheme, steps, seed, jitter), problem, 0.3, momentum, seed)
    one = versions(run(1, workers * batch, scheme, steps, seed), problem, 0.3, momentum, seed)
    assert len(many) == len(one) == steps + 1
    for a, b in zip(many, one):
        assert_same(a, b, problem)


@settings(CONVERGENCE)
@given(problem=problems, workers=st.integers(2, 5), steps=st.integers(2, 8),
       scheme=st.sampled_from(["allreduce", "ps", "localsgd:period=1", "localsgd:period=3",
                               "localsgd:period=2,warmup_steps=2"]),
       precision=st.sampled_from(["fp32", "fp16", "bf16"]), momentum=st.sampled_from([0.0, 0.9]),
       jitter=jitters, seed=seeds)
def test_every_synchronisation_leaves_identical_replicas(problem, workers, steps, scheme, precision, momentum,
                                                         jitter, seed):
    # Basis: a synchronisation hands every worker the same bytes — the reduced
    # gradient (applied by optimisers whose states were themselves equal), the
    # averaged parameters, or one server version — so the replicas agree bit
    # for bit afterwards, whatever rounding the wire does.
    scheme = f"{scheme}{',' if ':' in scheme else ':'}precision={precision}"
    result = run(workers, 3, scheme, steps, seed, jitter)
    replayer = Replayer(result, problem, 0.2, momentum, seed)
    synced = []

    def at_version(version, time, applied):
        if replayer.home == "replicas":
            assert all(np.array_equal(row, replayer.replicas[0], equal_nan=True) for row in replayer.replicas)
            synced.append(version)

    inputs: dict[int, list[np.ndarray]] = {}
    replayer.run(on_version=at_version,
                 on_compute=lambda w, t, x: inputs.setdefault(t, []).append(x.copy()) if replayer.pulled[w] else None)
    # Pulling workers (synchronous PS) read one server version per step: the same bytes for all.
    for step, xs in inputs.items():
        assert len(xs) == workers
        assert all(np.array_equal(x, xs[0], equal_nan=True) for x in xs), f"step {step}"
    assert synced or inputs, "no synchronisation was checked"
    assert replayer.version == result.versions


@settings(CONVERGENCE)
@given(problem=problems, workers=st.integers(1, 5), batch=st.integers(1, 4), steps=st.integers(1, 8),
       momentum=st.sampled_from([0.0, 0.5]), jitter=jitters, seed=seeds)
def test_local_sgd_with_period_one_equals_allreduce(problem, workers, batch, steps, momentum, jitter, seed):
    # Basis: with plain SGD each worker's local step is x - lr·g_w, and the
    # average of the W results is x - lr·mean(g): the all-reduce step. Local
    # SGD keeps per-worker optimiser state, which in general breaks this; for
    # heavy-ball momentum it does not, since the buffers are linear in the
    # gradients and their mean obeys the all-reduce buffer's recursion (see
    # tests/unit/test_convergence_parts.py and docs/convergence.md).
    local = versions(run(workers, batch, "localsgd:period=1", steps, seed, jitter), problem, 0.3, momentum, seed)
    reduce = versions(run(workers, batch, "allreduce", steps, seed, jitter), problem, 0.3, momentum, seed)
    assert len(local) == len(reduce) == steps + 1
    for a, b in zip(local, reduce):
        assert_same(a, b, problem)


@settings(CONVERGENCE)
@given(problem=problems, workers=st.integers(1, 4), batch=st.integers(1, 4), steps=st.integers(1, 6),
       precision=st.sampled_from(["fp16", "bf16"]), momentum=st.sampled_from([0.0, 0.9]), seed=seeds)
def test_allreduce_with_a_16_bit_wire_is_the_mean_of_rounded_gradients(problem, workers, batch, steps, precision,
                                                                        momentum, seed):
    # Basis: an all-reduce sends each worker's gradient at the wire precision
    # and the reduced mean travels back at it too; nothing else is rounded.
    # fp16 gradients are loss-scaled by S before the wire and divided by S in
    # fp32 after (GradScaler's recipe; S small enough here never to overflow).
    # Rounding is written out with numpy's float16 and torch's bfloat16.
    scale = 256.0
    result = run(workers, batch, f"allreduce:precision={precision}", steps, seed)
    replayed = versions(result, problem, 0.3, momentum, seed, LossScaling(init_scale=scale))

    def rounded(v):
        if precision == "fp16":
            return np.asarray(v, dtype=np.float64).astype(np.float16).astype(np.float64)
        return torch.from_numpy(np.asarray(v, dtype=np.float64)).to(torch.bfloat16).double().numpy()

    s = scale if precision == "fp16" else 1.0
    sampler = Sampler(problem.samples, batch, workers, seed)
    x = np.asarray(problem.init(seed), dtype=float).copy()
    velocity = np.zeros_like(x)
    expected = [x.copy()]
    for t in range(steps):
        sent = [rounded(problem.gradient(x, sampler.indices(w, t)) * s) for w in range(workers)]
        velocity = momentum * velocity + rounded(np.mean(sent, axis=0)) / s
        x = x - 0.3 * velocity
        expected.append(x.copy())
    assert len(replayed) == len(expected)
    for a, b in zip(replayed, expected):
        assert_same(a, b, problem)
