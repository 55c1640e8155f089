"""Hypothesis profiles for the convergence property tests (test_convergence_*.py).

tests/conftest.py already loads the project-wide "ci"/"dev" profile; these two
are registered beside it, not loaded globally, so they change no other test.
The convergence tests apply one with ``@settings(CONVERGENCE)`` (see
convergence_cases.py): "convergence-ci" when CI is set — derandomized (the same
examples every run, so a red build reproduces and never flakes), enough
examples to mean something, no per-example deadline (shared CI cores make
timing noisy); "convergence-dev" otherwise — fresh random examples, fewer;
"convergence-mutation" with HYPOTHESIS_PROFILE=mutation — derandomised, fewer, no shrinking.
Each example simulates and replays a small run, so the counts are set to keep
the whole property folder within about three minutes on two cores.
"""

from hypothesis import HealthCheck, settings

from tests.conftest import MUTATION_EXAMPLES, NO_SHRINK

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
               print_blob=True)
settings.register_profile("convergence-ci", derandomize=True, max_examples=100, **_COMMON)
settings.register_profile("convergence-dev", max_examples=25, **_COMMON)
settings.register_profile("convergence-mutation", settings.get_profile("convergence-ci"), phases=NO_SHRINK,
                          max_examples=MUTATION_EXAMPLES)
