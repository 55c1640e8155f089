"""ZeRO and FSDP on a replayed problem: sharding changes where state lives, not the arithmetic."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from syncsim.convergence import LogisticRegression, Quadratic, Replayer
from tests.property.convergence_cases import CONVERGENCE, assert_same, jitters, run, seeds, versions

problems = st.one_of(
    st.builds(Quadratic, eigenvalues=st.lists(st.floats(0.1, 2.0), min_size=1, max_size=7).map(tuple),
              noise=st.floats(0.0, 1.0), pool=st.integers(8, 64), seed=seeds),
    st.builds(LogisticRegression, features=st.integers(1, 8), samples=st.integers(8, 64), test_samples=st.just(16),
              seed=seeds),
)
sharded = st.sampled_from(["zero", "zero:stage=2", "zero:stage=3", "zero:overlap=false", "fsdp",
                           "fsdp:reshard=false", "fsdp:prefetch=false"])


@settings(CONVERGENCE)
@given(problem=problems, workers=st.integers(1, 9), batch=st.integers(1, 4), steps=st.integers(1, 6),
       scheme=sharded, momentum=st.sampled_from([0.0, 0.9]), jitter=jitters, seed=seeds)
def test_sharded_schemes_apply_the_allreduce_update(problem, workers, batch, steps, scheme, momentum, jitter, seed):
    # Basis: ZeRO (Rajbhandari et al. 2020, section 5) and FSDP (Zhao et al. 2023) reduce-scatter the gradients
    # and let each worker step its 1/W shard with its shard of the mean gradient and of the optimiser's state;
    # the optimiser works elementwise, so the shards stepped apart are the parameters stepped whole with the
    # mean gradient, and every worker then gathers them: the all-reduce step, version by version, bit for bit
    # at fp32 (where the wire rounds nothing), with more workers than parameters too (empty shards).
    ours = versions(run(workers, batch, scheme, steps, seed, jitter), problem, 0.3, momentum, seed)
    reference = versions(run(workers, batch, "allreduce", steps, seed, jitter), problem, 0.3, momentum, seed)
    assert len(ours) == len(reference) == steps + 1
    for a, b in zip(ours, reference):
        assert_same(a, b, problem)


@settings(CONVERGENCE)
@given(problem=problems, workers=st.integers(2, 6), steps=st.integers(2, 6), scheme=sharded,
       precision=st.sampled_from(["fp16", "bf16"]), momentum=st.sampled_from([0.0, 0.9]), jitter=jitters,
       seed=seeds)
def test_every_worker_computes_on_the_gathered_shards(problem, workers, steps, scheme, precision, momentum, jitter,
                                                      seed):
    # Basis: a gather hands every worker the same bytes, every shard as it crossed the wire, after every
    # worker's shard step; so at each compute, every worker holds exactly the 16-bit rounding of the master
    # parameters (the fp32 shards the optimiser steps), and all workers hold the same.
    sep = "," if ":" in scheme else ":"
    result = run(workers, 3, f"{scheme}{sep}precision={precision}", steps, seed, jitter)
    replayer = Replayer(result, problem, 0.2, momentum, seed)
    seen: dict[int, list[np.ndarray]] = {}

    def on_compute(w, t, x):
        if t > 0:  # from the second step on, every compute follows a gather
            np.testing.assert_array_equal(x, replayer.wire.send(replayer.master))
        seen.setdefault(t, []).append(x.copy())

    replayer.run(on_compute=on_compute)
    for step, xs in seen.items():
        assert len(xs) == workers and all(np.array_equal(x, xs[0], equal_nan=True) for x in xs), f"step {step}"
    assert replayer.version == result.versions == steps
    assert replayer.home == "shards" and replayer.parameters() is replayer.master


@settings(CONVERGENCE)
@given(problem=problems, workers=st.integers(1, 5), steps=st.integers(1, 5), momentum=st.sampled_from([0.0, 0.9]),
       precision=st.sampled_from(["fp32", "fp16", "bf16"]), jitter=jitters, seed=seeds)
def test_zero_3_and_full_shard_fsdp_are_one_algorithm(problem, workers, steps, momentum, precision, jitter, seed):
    # Basis: FSDP's FULL_SHARD is ZeRO-3's partitioning (Zhao et al. 2023, section 2): the same gathers, the
    # same reduce-scatter and shard steps in the same order; their buckets and units change only timing.
    zero = versions(run(workers, 2, f"zero:stage=3,precision={precision}", steps, seed, jitter), problem, 0.3,
                    momentum, seed)
    fsdp = versions(run(workers, 2, f"fsdp:precision={precision}", steps, seed, jitter), problem, 0.3, momentum, seed)
    for a, b in zip(zero, fsdp):
        np.testing.assert_array_equal(a, b)
