"""Parameter-server schemes on a replayed problem: SSP clocks, SSP(0) = synchronous PS, async W=1 = SGD."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from syncsim.convergence import LogisticRegression, LossScaling, Quadratic, Sampler
from tests.property.convergence_cases import CONVERGENCE, assert_same, jitters, run, seeds, versions

problems = st.one_of(
    st.builds(Quadratic, eigenvalues=st.lists(st.floats(0.1, 2.0), min_size=1, max_size=4).map(tuple),
              noise=st.floats(0.0, 1.0), pool=st.integers(8, 64), seed=seeds),
    st.builds(LogisticRegression, features=st.integers(1, 8), samples=st.integers(8, 64), test_samples=st.just(16),
              seed=seeds),
)


@settings(CONVERGENCE)
@given(workers=st.integers(2, 5), staleness=st.integers(0, 3), steps=st.integers(2, 20), jitter=jitters,
       straggler_prob=st.sampled_from([0.0, 0.2]), seed=seeds)
def test_ssp_clock_gap_is_within_the_bound(workers, staleness, steps, jitter, straggler_prob, seed):
    # Basis: SSP (Ho et al. 2013) lets a worker start step t+1 only once every
    # worker has pushed at least t+1-s gradients (its clock is t+1).
    result = run(workers, 2, f"ps:staleness={staleness}", steps, seed, jitter, straggler_prob, slowdown=4.0)
    updates, trace = result.updates, result.trace
    pushes = [np.sort(updates.loc[updates["worker"] == w, "time_applied"].to_numpy()) for w in range(workers)]
    assert all(len(p) == steps for p in pushes)
    starts = trace[trace["kind"] == "compute"]
    checked = 0
    for w, t, start in zip(starts["worker"], starts["step"], starts["start"]):
        if t == 0:
            continue
        slowest = min(np.searchsorted(p, start, side="right") for p in pushes)
        assert slowest >= t - staleness, f"worker {w} started step {t} when the slowest had pushed {slowest}"
        checked += 1
    assert checked == workers * (steps - 1)


@settings(CONVERGENCE)
@given(problem=problems, workers=st.integers(1, 5), steps=st.integers(1, 8), jitter=jitters, seed=seeds)
def test_ssp_with_zero_staleness_equals_synchronous_ps(problem, workers, steps, jitter, seed):
    # Basis: with s = 0 every worker waits for the whole round and then pulls,
    # so all of round t+1's gradients read the version after round t; applied
    # one by one with weight 1/W they sum to the synchronous round's mean step
    # (plain SGD; a server momentum buffer would advance W times instead of once).
    ssp_result = run(workers, 2, "ps:staleness=0", steps, seed, jitter)
    reads = ssp_result.updates.groupby("step")["version_read"]
    assert (reads.min() == reads.max()).all() and list(reads.min()) == [t * workers for t in range(steps)]
    ssp = versions(ssp_result, problem, 0.3, 0.0, seed)
    sync = versions(run(workers, 2, "ps", steps, seed, jitter), problem, 0.3, 0.0, seed)
    assert len(ssp) == workers * steps + 1 and len(sync) == steps + 1
    for k, expected in enumerate(sync):
        assert_same(ssp[k * workers], expected, problem)


@settings(CONVERGENCE)
@given(problem=problems, batch=st.integers(1, 6), steps=st.integers(1, 12), momentum=st.sampled_from([0.0, 0.5, 0.9]),
       seed=seeds)
def test_async_ps_with_one_worker_is_sequential_sgd(problem, batch, steps, momentum, seed):
    # Basis: with one worker every push reads the version its own previous
    # push made (staleness 0) and weighs 1/W = 1: plain sequential SGD, here
    # written out by hand and compared bit for bit.
    result = run(1, batch, "ps:mode=async", steps, seed)
    assert (result.updates["staleness"] == 0).all()
    replayed = versions(result, problem, 0.3, momentum, seed)
    sampler = Sampler(problem.samples, batch, 1, seed)
    x = np.asarray(problem.init(seed), dtype=float).copy()
    velocity = np.zeros_like(x)
    expected = [x.copy()]
    for t in range(steps):
        g = problem.gradient(x, sampler.indices(0, t))
        if momentum:
            velocity = momentum * velocity + g
            x = x - 0.3 * velocity
        else:
            x = x - 0.3 * g
        expected.append(x.copy())
    assert len(replayed) == len(expected)
    for a, b in zip(replayed, expected):
        np.testing.assert_array_equal(a, b)


@settings(CONVERGENCE)
@given(problem=problems, batch=st.integers(1, 6), steps=st.integers(1, 10), precision=st.sampled_from(["fp16", "bf16"]),
       momentum=st.sampled_from([0.0, 0.9]), seed=seeds)
def test_async_ps_with_one_worker_and_a_16_bit_wire_is_sequential_sgd_on_rounded_values(problem, batch, steps,
                                                                                          precision, momentum, seed):
    # Basis: what crosses the wire is rounded to the wire format and nothing
    # else is: the worker computes on the parameters it pulled (rounded; its
    # own fp32 copy before the first pull), pushes its gradient rounded (fp16:
    # loss-scaled by S first and divided by S in fp32 after, GradScaler's
    # recipe, with S small enough here never to overflow), and the server
    # applies it to its fp32 master copy. Rounding is written out with numpy's
    # float16 and torch's bfloat16 casts, not the replay's own.
    scale = 256.0
    result = run(1, batch, f"ps:mode=async,precision={precision}", steps, seed)
    replayed = versions(result, problem, 0.3, momentum, seed, LossScaling(init_scale=scale))

    def rounded(v):
        if precision == "fp16":
            return np.asarray(v, dtype=np.float64).astype(np.float16).astype(np.float64)
        return torch.from_numpy(np.asarray(v, dtype=np.float64)).to(torch.bfloat16).double().numpy()

    sampler = Sampler(problem.samples, batch, 1, seed)
    x = np.asarray(problem.init(seed), dtype=float).copy()
    velocity = np.zeros_like(x)
    expected = [x.copy()]
    for t in range(steps):
        read = x if t == 0 else rounded(x)
        g = problem.gradient(read, sampler.indices(0, t))
        sent = rounded(g * scale) / scale if precision == "fp16" else rounded(g)
        velocity = momentum * velocity + sent
        x = x - 0.3 * velocity
        expected.append(x.copy())
    assert len(replayed) == len(expected)
    for a, b in zip(replayed, expected):
        assert_same(a, b, problem)
