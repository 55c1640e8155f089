"""real.calibration.server_fit: the server's own time per request, fitted to the simulator's price."""

import pytest

from real.calibration.server_fit import fit_service, simulated_requests


def test_the_simulator_prices_one_worker_s_requests_by_their_closed_form_and_the_fit_inverts_it():
    # Basis (syncsim.engine): a push waits alpha, then its bytes less the bucket pass at B; the clock wait
    # that follows is a request and an answer, 2 alpha; a pull is 2 alpha besides its bytes. The server's
    # time per request adds once to each. The fit, given timings of that closed form plus a known service,
    # must give the service back.
    alpha, rate, burst, size, service = 1.5e-4, 23.8e6, 25_000.0, 407_080.0, 0.7e-3
    wire = (size - burst) / rate
    assert simulated_requests(alpha, rate, burst, size) == pytest.approx((3 * alpha + wire, 2 * alpha + wire),
                                                                        rel=1e-9)
    assert simulated_requests(alpha, rate, burst, size, service) == pytest.approx(
        (3 * alpha + wire + service, 2 * alpha + wire + service), rel=1e-9)
    timings = {"push_wait": [3 * alpha + wire + service] * 2, "pull": [2 * alpha + wire + service] * 2}
    assert fit_service(timings, alpha, rate, burst, size) == pytest.approx(service, rel=1e-9)
    plain = {"push_wait": [3 * alpha + wire], "pull": [2 * alpha + wire]}
    assert fit_service(plain, alpha, rate, burst, size) == pytest.approx(0.0, abs=1e-12)


def test_a_server_faster_than_its_link_s_price_fits_no_negative_time_and_missing_timings_are_refused():
    assert fit_service({"push_wait": [1e-3], "pull": [1e-3]}, 1e-4, 1e6, 0.0, 1e5) == 0.0  # priced 0.2 s
    with pytest.raises(ValueError, match="pull timings"):
        fit_service({"push_wait": [1e-3], "pull": []}, 1e-4, 1e6, 0.0, 1e5)
