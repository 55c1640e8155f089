"""Stale gradients on a quadratic: the fixed-delay stability bound, and descent under bounded staleness."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from syncsim.convergence import Quadratic, Replayer, delay_bound, replay
from syncsim.convergence.stability import delay_spectral_radius
from tests.property.convergence_cases import CONVERGENCE, jitters, run, seeds


def fixed_delay_run(tau: int, versions: int):
    """An asynchronous PS of tau+1 identical workers: after warm-up every gradient is exactly tau versions old."""
    workers = tau + 1
    result = run(workers, 1, "ps:mode=async", steps=math.ceil(versions / workers))
    staleness = result.updates["staleness"].to_numpy()
    assert list(staleness[:workers]) == list(range(workers)), "warm-up: the i-th push is i versions stale"
    assert (staleness[workers:] == tau).all(), "after warm-up every staleness is exactly tau"
    return result


@settings(CONVERGENCE)
@given(tau=st.integers(0, 3), eigenvalue=st.floats(0.5, 5.0), below=st.booleans(),
       margin=st.floats(0.05, 0.2), seed=seeds)
def test_fixed_delay_converges_below_the_bound_and_diverges_above(tau, eigenvalue, below, margin, seed):
    # Basis: x[t+1] = x[t] - a·x[t-tau] converges iff a < 2·sin(π/(2(2τ+1)))
    # (Levin & May 1976). Each push applies its gradient with weight 1/W, so
    # with W = tau+1 workers the per-update coefficient is a = lr·λ/W.
    a = delay_bound(tau) * ((1 - margin) if below else (1 + margin))
    rho = delay_spectral_radius(a, tau)
    assert (rho < 1) == below
    # enough versions for the dominant mode to shrink or grow by 10^4
    versions = math.ceil(math.log(1e4) / abs(math.log(rho))) + 4 * (tau + 1)
    result = fixed_delay_run(tau, versions)
    workers = tau + 1
    problem = Quadratic((eigenvalue,))
    replayer = Replayer(result, problem, lr=a * workers / eigenvalue, seed=seed)
    xs = [replayer.parameters()[0]]
    replayer.run(on_version=lambda v, t, n: xs.append(replayer.parameters()[0]) and False)
    # The replay is exactly the delay recurrence, driven by the table's staleness...
    expected = [xs[0]]
    for v, stale in enumerate(result.updates["staleness"].to_numpy()):
        expected.append(expected[v] - a * expected[v - stale])
    np.testing.assert_allclose(xs, expected, rtol=1e-9, atol=1e-300)
    # ...and its size over the last few oscillations (the dominant roots are
    # complex for tau > 0, so a single |x| can sit near a zero crossing) has
    # shrunk or grown by orders of magnitude.
    size = max(abs(x) for x in xs[-4 * (2 * tau + 1):])
    if below:
        assert size < 1e-2 * abs(xs[0])
    else:
        assert size > 1e2 * abs(xs[0])


def test_the_bound_takes_its_known_values():
    # 2·sin(π/2), 2·sin(π/6), 2·sin(π/10) = 1/golden ratio, 2·sin(π/14)
    assert [round(delay_bound(t), 3) for t in range(4)] == [2.0, 1.0, 0.618, 0.445]


@settings(CONVERGENCE)
@given(eigenvalues=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=4).map(tuple), workers=st.integers(2, 4),
       staleness=st.integers(0, 3), fraction=st.floats(0.1, 0.95), jitter=jitters,
       straggler_prob=st.sampled_from([0.0, 0.2]), seed=seeds)
def test_loss_decreases_under_bounded_staleness_with_a_step_inside_the_bound(
        eigenvalues, workers, staleness, fraction, jitter, straggler_prob, seed):
    # Basis: on a diagonal quadratic each coordinate follows
    # x[v+1] = x[v] - a·x[r(v)] with v - r(v) ≤ τ (the largest staleness the
    # run produced) and a = lr·λ/W. If a ≤ 1 and a·τ < 1, then
    # |x[v+1]| ≤ (1-a)|x[v]| + a·|x[v] - x[r]| ≤ (1 - a(1 - aτ))·M, with M the
    # largest |x| over the last 2τ versions: no |x| ever exceeds its start and
    # the maximum shrinks geometrically. So the loss never rises above its
    # initial value and ends below it.
    result = run(workers, 2, f"ps:staleness={staleness}", 40, seed, jitter, straggler_prob, slowdown=4.0)
    tau = int(result.updates["staleness"].max())
    a_max = fraction * min(1.0, 1.0 / tau) if tau else fraction
    problem = Quadratic(eigenvalues)
    curve = replay(result, problem, lr=a_max * workers / max(eigenvalues), seed=seed, every=1)
    loss = curve["loss"].to_numpy()
    assert np.all(loss <= loss[0] * (1 + 1e-12))
    assert loss[-1] < loss[0]
