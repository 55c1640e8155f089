"""real.testbed.server_probe: the server's own time per request, fitted to the simulator's price."""

import pytest

from real.testbed.server_probe import fit_service
from syncsim import Cluster, Link, Workload, simulate


def test_the_fit_recovers_a_known_time_per_request_from_the_simulator_s_own_one_worker_run():
    # Independent of fit_service's closed form: the timings are the simulator's own push-and-wait and pull
    # of one worker on a bucketed link with a known service; the fit must give that service back.
    alpha, rate, burst, size, service = 1.5e-4, 23.8e6, 25_000.0, 407_080.0, 0.7e-3
    link = Link(rate, alpha, burst=burst)
    cluster = Cluster.homogeneous(1, link, servers=1, server_link=link, server_service=service)
    trace = simulate(cluster, Workload(size, 0.02, batch_size=32), "ps", steps=4).trace
    kinds = trace[trace["step"] == 2].set_index("kind")
    push_wait = kinds.loc["wait", "end"] - kinds.loc["push", "start"]
    pull = kinds.loc["pull", "end"] - kinds.loc["pull", "start"]
    timings = {"push_wait": [push_wait], "pull": [pull]}
    assert fit_service(timings, alpha, rate, burst, size) == pytest.approx(service, rel=1e-9)
    # with no service the same run fits none
    plain = Cluster.homogeneous(1, link, servers=1, server_link=link)
    trace = simulate(plain, Workload(size, 0.02, batch_size=32), "ps", steps=4).trace
    kinds = trace[trace["step"] == 2].set_index("kind")
    timings = {"push_wait": [kinds.loc["wait", "end"] - kinds.loc["push", "start"]],
               "pull": [kinds.loc["pull", "end"] - kinds.loc["pull", "start"]]}
    assert fit_service(timings, alpha, rate, burst, size) == pytest.approx(0.0, abs=1e-12)


def test_a_server_faster_than_its_link_s_price_fits_no_negative_time_and_missing_timings_are_refused():
    assert fit_service({"push_wait": [1e-3], "pull": [1e-3]}, 1e-4, 1e6, 0.0, 1e5) == 0.0  # priced 0.2 s
    with pytest.raises(ValueError, match="pull timings"):
        fit_service({"push_wait": [1e-3], "pull": []}, 1e-4, 1e6, 0.0, 1e5)
