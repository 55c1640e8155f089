"""real.testbed.window: the bytes a TCP flow keeps in flight through the testbed's shapers."""

from __future__ import annotations

import socket
import subprocess
import threading

import pytest

from real.testbed.window import InFlight, main, measure, measure_window, parse_ss

# `ss -tinH state established` as iproute2 6.1 prints it (a state filter drops the state column; `unacked`
# is absent when 0): a pusher's connection to the server with 80 segments out of 120 allowed, and the
# store's connection with nothing in flight.
SHOWN = """0      1448   10.213.1.103:41234 10.213.1.101:45678
\t bbr wscale:7,7 rto:201 rtt:5.5/1.2 mss:1448 pmtu:1500 rcvmss:536 cwnd:120 unacked:80 notsent:4096
0      0      10.213.1.103:51234 10.213.1.101:29400
\t bbr wscale:7,7 rto:201 rtt:0.1/0.05 mss:1448 pmtu:1500 rcvmss:536 cwnd:10 bytes_acked:301
"""


def test_ss_lines_give_each_connection_s_bytes_in_flight_and_window():
    # Basis: ss(8) prints a connection's unacknowledged segments (`unacked`), its congestion window (`cwnd`,
    # in segments) and its segment size (`mss`); bytes in flight are unacked x mss.
    first, second = parse_ss(SHOWN)
    assert (first.local, first.peer, first.in_flight, first.cwnd) == ("10.213.1.103:41234", "10.213.1.101:45678",
                                                                      80 * 1448, 120 * 1448)
    assert (second.in_flight, second.cwnd) == (0, 10 * 1448)
    assert parse_ss("") == [] and parse_ss("garbage line\n\t no fields here\n") == []


def test_the_ss_lines_of_a_real_connection_parse():
    # A loopback connection with bytes on their way: this machine's own ss shows it, and the parse finds it.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = f":{server.getsockname()[1]}"
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    sender = threading.Thread(target=lambda: client.sendall(b"x" * 4_000_000))
    sender.start()
    try:
        shown = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True, text=True).stdout
    finally:
        while sender.is_alive():
            peer.recv(1 << 20)
        sender.join()
        for end in (client, peer, server):
            end.close()
    ours = [s for s in parse_ss(shown) if s.peer.endswith(port) or s.local.endswith(port)]
    assert len(ours) == 2 and all(s.cwnd > 0 for s in ours)


def test_the_window_is_the_median_congestion_window_of_both_roles_pooled():
    flight = InFlight("1Gbit/s", 1000, 3, {"push": [100, 200], "reply": [300]},
                      {"push": [1000, 2000, 4000], "reply": [3000, 5000]})
    assert flight.window == 3000.0
    assert InFlight("1Gbit/s", 1000, 3, {"push": [], "reply": []}, {"push": [], "reply": []}).window == 0.0
    line = flight.line(125e6)
    assert line.startswith("1Gbit/s, 1,000 B, 3 pushes with a reply: push 0 kB in flight (p90 0 kB;")
    assert line.endswith("window (Link.window) 3 kB")


@pytest.mark.parametrize("argv, message", [
    (["--pushes", "0"], "--pushes must be between 1 and 6, got 0"),
    (["--repeats", "0"], "--repeats must be between 1 and 1,000, got 0"),
    (["--rates", "0"], "--rates '0': TestbedConfig.bandwidth must be at least 1kbit/s"),
    (["--rates", ","], "--rates must name at least one rate"),
    (["--size", "2"], "--size must be at least 4 bytes, got 2"),
])
def test_the_command_refuses_bad_input_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.testbed
def test_pushes_crossing_a_reply_on_the_testbed_keep_a_window_in_flight(tmp_path):
    # Basis: a sender keeps at most its congestion window unacknowledged, so every sample in flight is at
    # most its own window, and a 1.7 MB transfer through a 200 Mbit/s shaper has some in flight whenever a
    # sampler looks (about 70 ms of them per trial). The study's cached form reads the same probe.
    flight = measure("200Mbit/s", 1_724_320, pushes=2, repeats=3, prefix="sstbwt")
    for role in ("push", "reply"):
        assert flight.samples[role], role
    assert 1448 <= flight.window <= 4 * 1_724_320
    cached = measure_window("200Mbit/s", tmp_path, 1_724_320, prefix="sstbwt", repeats=1)
    assert cached["window"] > 0 and (tmp_path / "window-200Mbit-s-1724320.json").exists()
