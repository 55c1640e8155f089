"""Shared test settings.

Hypothesis runs derandomised when CI is set (``.ci/run`` sets it), so a red build reproduces;
HYPOTHESIS_PROFILE picks another profile otherwise ("dev" by default; tests/mutation.py uses "mutation").

Tests marked ``testbed`` need root and iproute2; where those are missing they skip, saying why,
unless SYNCSIM_REQUIRE_TESTBED=1 (``.ci/run`` sets it as root), which makes the missing
prerequisite a failure: a machine that can run the emulated-network tests must not pass CI
by skipping them.
"""

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=150,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=30, suppress_health_check=[HealthCheck.too_slow])
# tests/mutation.py: derandomised like CI but fewer examples, and no shrinking (a killed mutant needs no
# minimal example). A mutant these examples miss may still be one CI would kill: survivors err on the safe side.
MUTATION_EXAMPLES = 25
settings.register_profile("mutation", settings.get_profile("ci"), phases=NO_SHRINK, max_examples=MUTATION_EXAMPLES)
PROFILE = "ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev")
settings.load_profile(PROFILE)


def pytest_runtest_setup(item):
    if item.get_closest_marker("testbed") is None:
        return
    from real.testbed import unavailable

    why = unavailable()
    if why is None:
        return
    if os.environ.get("SYNCSIM_REQUIRE_TESTBED") == "1":
        pytest.fail(f"SYNCSIM_REQUIRE_TESTBED=1 but {why}", pytrace=False)
    pytest.skip(why)
