"""Dynamic loss scaling when fp16 gradients cross the wire."""

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from syncsim.convergence import LossScaling, Quadratic, Replayer, Sampler
from syncsim.convergence.wire import to_fp16
from tests.property.convergence_cases import CONVERGENCE, jitters, run, seeds


@settings(CONVERGENCE)
@given(scheme=st.sampled_from(["allreduce:precision=fp16", "ps:precision=fp16", "ps:mode=async,precision=fp16"]),
       workers=st.integers(1, 4), steps=st.integers(1, 12),
       eigenvalues=st.lists(st.floats(0.5, 2.0), min_size=1, max_size=3).map(tuple),
       above=st.integers(0, 4), momentum=st.sampled_from([0.0, 0.9]), jitter=jitters, seed=seeds)
def test_an_overflowing_step_changes_nothing_and_halves_the_scale(scheme, workers, steps, eigenvalues, above,
                                                                  momentum, jitter, seed):
    # Basis: torch's GradScaler skips optimizer.step() when the scaled
    # gradients hold an inf/NaN and multiplies the scale by backoff_factor
    # (0.5). The start scale is built to overflow: 2^above times the smallest
    # power of two at which worker 0's first scaled gradient exceeds fp16's
    # 65,504, so every example overflows at least once, then the scale settles.
    result = run(workers, 2, scheme, steps, seed, jitter)
    problem = Quadratic(eigenvalues, noise=0.5, pool=32, seed=seed)
    first = problem.gradient(problem.init(seed), Sampler(problem.samples, 2, workers, seed).indices(0, 0))
    with np.errstate(over="ignore"):  # the overflowing casts are the point
        threshold = next(k for k in range(-64, 64) if not np.isfinite(to_fp16(first * 2.0**k)).all())
    replayer = Replayer(result, problem, 0.05, momentum, seed, LossScaling(init_scale=2.0 ** (threshold + above)))
    overflowed: list[int] = []   # workers whose scaled gradient overflowed, since the last version

    def on_compute(w, t, x):
        gradient = problem.gradient(x, replayer.sampler.indices(w, t))
        if not np.isfinite(to_fp16(gradient * replayer.scaler.scale[w])).all():
            overflowed.append(w)

    before = {}

    def snapshot():
        before.update(server=replayer.server.copy(), replicas=replayer.replicas.copy(),
                      server_velocity=replayer.server_velocity.copy(),
                      replica_velocity=replayer.replica_velocity.copy(), scale=replayer.scaler.scale.copy())

    checked = []

    def on_version(version, time, applied):
        if overflowed:
            for name in ("server", "replicas", "server_velocity", "replica_velocity"):
                assert np.array_equal(getattr(replayer, name), before[name]), name
            if replayer.home == "replicas":   # everyone received the same inf: every scaler backs off
                assert np.array_equal(replayer.scaler.scale, before["scale"] * 0.5)
            else:                             # a pushing worker backs off on its own overflow
                for w in set(overflowed):
                    assert replayer.scaler.scale[w] == before["scale"][w] * 0.5
            checked.append(version)
        overflowed.clear()
        snapshot()

    snapshot()
    replayer.run(on_version=on_version, on_compute=on_compute)
    assert checked, "no overflowing step was checked"
    event(f"overflowing steps: {len(checked)}")
    assert replayer.skipped == len(checked)


def test_the_default_scale_overflows_on_a_large_gradient_then_backs_off_until_it_fits():
    # Basis: GradScaler's default start 2^16 times a gradient of ~100 is far
    # beyond fp16's 65,504; each skipped step halves the scale, so the first
    # applied step comes once 2^16·0.5^k·|g| fits — here, after 8 skips.
    result = run(2, 2, "allreduce:precision=fp16", 20)
    problem = Quadratic((100.0,))
    replayer = Replayer(result, problem, 1e-3)
    g0 = abs(100.0 * replayer.parameters()[0])
    with np.errstate(over="ignore"):  # the overflowing casts are the point
        skips = next(k for k in range(64) if np.isfinite(np.float16(2.0**16 * 0.5**k * g0)))
    assert skips > 0
    replayer.run()
    assert replayer.skipped == skips
    assert replayer.scaler.scale[0] == 2.0**16 * 0.5**skips
