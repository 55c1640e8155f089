"""The emulated-network testbed: namespaces come and go, the rate limit holds, multi-node torchrun runs on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from real.calibration.server_fit import fit_service
from real.calibration.server_probe import measure_server
from real.calibration.sharded_probe import measure_sharded
from real.calibration.sharing_probe import SHARING_OFFSETS, measure_sharing, turns
from real.config import RunConfig
from real.testbed import Testbed, TestbedConfig, run
from real.testbed.namespaces import NETNS_ETC, namespaces

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "sstbtest"  # distinct from the CLI's default, so a test never removes a user's leftovers

# Two ranks all-reduce SIZE bytes REPEATS times (after one warm-up); rank 0 prints the fastest time: a link's
# rate is what its fastest transfer shows, since a stall of this shared machine only ever adds time (one CI
# run's median of five 4 MiB all-reduces came out at 18.3 MB/s behind the 25 MB/s shaper), and no transfer
# can beat the shaper by more than its bucket (25 kB of the 4 MiB).
ALLREDUCE = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
buf = torch.zeros(int(sys.argv[1]) // 4)
times = []
for i in range(int(sys.argv[2]) + 1):
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(buf)
    times.append(time.perf_counter() - t0)
if dist.get_rank() == 0:
    print(min(times[1:]))
dist.destroy_process_group()
"""


def allreduce_seconds(bed: Testbed, hosts: tuple[int, int], addr: str, size: int, repeats: int = 5) -> float:
    procs = []
    try:
        for rank, host in enumerate(hosts):
            env = dict(os.environ, MASTER_ADDR=addr, MASTER_PORT="29511", RANK=str(rank), WORLD_SIZE="2",
                       OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo" if addr == "127.0.0.1" else "tb0")
            procs.append(bed.popen(host, [sys.executable, "-c", ALLREDUCE, str(size), str(repeats)], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    return float(outs[0][0])


def test_config_validation_names_field_value_and_allowed():
    with pytest.raises(ValueError, match=r"TestbedConfig.hosts must be an integer >= 1, got 0"):
        TestbedConfig(hosts=0)
    with pytest.raises(ValueError, match=r"TestbedConfig.bandwidth"):
        TestbedConfig(bandwidth="fast")
    with pytest.raises(ValueError, match=r"TestbedConfig.prefix must be .* got 'Bad-Name'"):
        TestbedConfig(prefix="Bad-Name")
    with pytest.raises(ValueError, match=r"TestbedConfig.burst must be between"):
        TestbedConfig(burst=100)
    assert TestbedConfig(bandwidth="200Mbit/s").burst == 25_000  # 1 ms of traffic


@pytest.mark.testbed
def test_created_and_torn_down_even_when_the_body_raises():
    # a leftover of a dead run with our prefix (its pid is a finished child's) is removed at start
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{PREFIX}{dead.pid}x0000-h0"
    subprocess.run(["ip", "netns", "add", stale], check=True, timeout=10)
    with pytest.raises(RuntimeError, match="boom"):
        with Testbed(hosts=3, bandwidth="200Mbit/s", prefix=PREFIX) as bed:
            assert stale not in namespaces(PREFIX)
            assert set(namespaces(PREFIX)) == {*bed.host_ns, bed.bridge_ns}
            assert bed.ips == ("10.213.1.101", "10.213.1.102", "10.213.1.103")
            shown = bed.run(0, ["tc", "qdisc", "show", "dev", "tb0"], capture_output=True, text=True).stdout
            assert "tbf" in shown and "200Mbit" in shown
            # reachable from its peer through the bridge, and nothing but the testbed's /24 is routed
            probe = "import socket; socket.create_connection(('10.213.1.103', 9), timeout=5)"
            reached = bed.run(1, [sys.executable, "-c", probe], capture_output=True, text=True)
            assert "Connection refused" in reached.stderr  # the packet got there; nobody listens
            routes = bed.run(1, ["ip", "route"], capture_output=True, text=True).stdout
            assert "default" not in routes and "10.213.1.0/24" in routes
            raise RuntimeError("boom")
    assert namespaces(PREFIX) == []
    assert not any((NETNS_ETC / ns).exists() for ns in (*bed.host_ns, bed.bridge_ns))


@pytest.mark.testbed
def test_gloo_allreduce_runs_at_the_emulated_rate():
    size = 4 * 2**20
    with Testbed(hosts=2, bandwidth="200Mbit/s", prefix=PREFIX) as bed:
        limited = size / allreduce_seconds(bed, (0, 1), bed.ips[0], size)
        # the same two ranks on one namespace's loopback: no shaper on the path
        unlimited = size / allreduce_seconds(bed, (0, 0), "127.0.0.1", size)
    # ring all-reduce over 2 ranks moves n bytes each way per rank (2(p-1)/p · n), so n/t is the link's
    # payload rate: 25 MB/s less TCP/IP and Ethernet headers (1448 of every 1514 bytes: 23.9 MB/s)
    assert 20e6 < limited < 30e6, f"{limited / 1e6:.1f} MB/s behind a 25 MB/s link"
    assert unlimited > 4 * limited, f"loopback {unlimited / 1e6:.1f} MB/s vs limited {limited / 1e6:.1f} MB/s"


# Host 2 receives SIZE bytes from each of hosts 0 and 1 at once over plain TCP (the incast of a parameter
# server's pushes); the receiver prints the bytes it got.
RECEIVE = """
import socket, sys, threading
server = socket.create_server((sys.argv[1], 29611))
got = []
def drain(conn):
    n = 0
    while chunk := conn.recv(1 << 16):
        n += len(chunk)
    got.append(n)
threads = []
for _ in range(2):
    conn, _ = server.accept()
    threads.append(threading.Thread(target=drain, args=(conn,)))
    threads[-1].start()
for t in threads:
    t.join()
print(sum(got))
"""
SEND = """
import socket, sys, time
for _ in range(100):
    try:
        conn = socket.create_connection((sys.argv[1], 29611))
        break
    except OSError:
        time.sleep(0.05)
conn.sendall(bytes(int(sys.argv[2])))
conn.close()
"""


@pytest.mark.testbed
def test_the_default_queue_holds_two_hosts_sending_into_one_and_a_shallow_one_drops(tmp_path):
    # Basis: a tbf shaper drops a packet only when its queue, rate x latency bytes, is full (tc-tbf(8)).
    # Two senders each shaped to the rate converge on one receiver's shaper at twice it, so its queue
    # grows by the rate: a 20 ms queue (140 kB at 50 Mbit/s) fills within a 1 MB transfer, and TCP's
    # window on a path of tens of microseconds grows past it; the default (QUEUE) holds both transfers
    # whole, so the runs the studies make on it lose no packet (the fabrics they model are lossless).
    size = 1_000_000
    dropped = {}
    for queue in ("20ms", None):
        with Testbed(hosts=3, bandwidth="50Mbit/s", prefix=PREFIX, **({"queue": queue} if queue else {})) as bed:
            receiver = bed.popen(2, [sys.executable, "-c", RECEIVE, bed.ips[2]], stdout=subprocess.PIPE, text=True)
            senders = [bed.popen(host, [sys.executable, "-c", SEND, bed.ips[2], str(size)]) for host in (0, 1)]
            assert all(sender.wait(timeout=60) == 0 for sender in senders)
            out, _ = receiver.communicate(timeout=60)
            assert int(out) == 2 * size  # TCP delivered every byte either way
            dropped[queue] = bed.dropped()
    assert dropped[None] == 0, f"the default queue dropped packets: {dropped}"
    assert dropped["20ms"] > 0, dropped  # the count sees drops where there are some


@pytest.mark.testbed
@pytest.mark.parametrize("agent", [True, False], ids=["torchrun", "direct"])
def test_multi_node_torchrun_allreduce_run_keeps_replicas_equal(tmp_path, agent):
    cfg = RunConfig(scheme="allreduce", world=2, model="lenet", steps=5, batch_size=16, out=str(tmp_path),
                    record_checksums=True)
    with Testbed(hosts=2, bandwidth="200Mbit/s", prefix=PREFIX) as bed:
        code, message = run(bed, cfg, timeout=120, agent=agent)
    assert code == 0, message
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["complete"] and summary["steps_done"] == [5, 5]
    checksums = summary["param_checksums"]
    assert set(checksums) == {"0", "1"} and len(set(checksums.values())) == 1
    # one torchrun node per host, each with its own log, and the network it ran on: the shapers' rate and
    # every host's TCP congestion control, the machine's default (each namespace takes it when made)
    assert sorted(p.name for p in (tmp_path / "testbed").iterdir()) == ["network.json", "node0.log", "node1.log"]
    network = json.loads((tmp_path / "testbed" / "network.json").read_text())
    default = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    assert network["bandwidth"] == 25e6 and network["hosts"] == 2
    assert network["congestion_control"] == [default, default]
    assert namespaces(PREFIX) == []


@pytest.mark.testbed
def test_the_sharing_probe_times_collisions_the_shaper_can_carry(tmp_path):
    # Two transfers of n bytes through one host's 25 MB/s shaper cannot both be done sooner than
    # (2n - 2b)/B after the first starts (b the bucket, counted for each flow at most), and each ends
    # after it starts. The fit tries w = 1 among its candidates, so each trial's own weight fits at
    # least as well as equal sharing: residual <= residual_fair.
    size, rate = 200_000, 25e6
    link = {"bandwidth": 23.9e6, "alpha": 3e-4}  # the payload rate behind a 25 MB/s link (test above)
    burst = TestbedConfig(hosts=3, bandwidth="200Mbit/s").burst
    got = measure_sharing("200Mbit/s", tmp_path, link, burst, size, prefix=PREFIX, repeats=1)
    trials = [t for t in got["trials"] if t["pattern"] in ("into", "out")]
    assert sorted({(t["pattern"], t["fraction"]) for t in trials}) == sorted(
        (p, f) for p in ("into", "out") for f in SHARING_OFFSETS)
    for t in trials:
        assert all(end > start for start, end in zip(t["starts"], t["ends"])), t
        assert max(t["ends"]) - min(t["starts"]) >= (2 * size - 2 * burst) / rate, t
    assert got["spread"] >= 0 and got["residual"] <= got["residual_fair"] + 1e-12
    assert len(got["trial_weights"]) == len(trials)
    # A push and a reply crossing the host go opposite ways through different shapers, each of which
    # carries one of them: neither can beat its lone time through a 25 MB/s shaper, (n - b)/B.
    crossing = [t for t in got["trials"] if t["pattern"] == "turns"]
    assert len(crossing) == turns(size / rate) and len(got["duplex_stretches"]) == len(crossing)
    for t in crossing:
        assert all(end - start >= (size - burst) / rate for start, end in zip(t["starts"], t["ends"])), t
    assert got["duplex_stretch"] > 0.9 and got["duplex_stretch_reply"] > 0.9
    assert namespaces(PREFIX) == []


@pytest.mark.testbed
@pytest.mark.parametrize("agent", [True, False], ids=["torchrun", "direct"])
def test_a_failed_node_stops_the_others_and_is_named(tmp_path, agent):
    # torch's agents do not stop ranks on other nodes: without the launcher's stop, rank 0 waits forever
    cfg = RunConfig(scheme="allreduce", world=2, model="mlp", steps=4, batch_size=16, out=str(tmp_path),
                    fail="1:2", timeout=10)
    with Testbed(hosts=2, bandwidth="200Mbit/s", prefix=PREFIX) as bed:
        code, message = run(bed, cfg, timeout=60, agent=agent)
    assert code == 1 and message.startswith("run failed: rank 1 (worker) failed at step 2")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["complete"] is False
    assert (summary["first_failure"]["rank"], summary["first_failure"]["how"]) == (1, "exception")
    assert namespaces(PREFIX) == []


def test_cli_rejects_bad_options_before_building_anything():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "real.testbed", "--hosts", "2", "--", "--scheme", "ps",
                           "--world", "2", "--servers", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--hosts must equal the run's ranks" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "real.testbed", "--", "--world", "0"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "RunConfig.world" in proc.stderr


@pytest.mark.testbed
def test_the_server_probe_times_one_worker_s_requests_no_faster_than_the_link_carries_them(tmp_path):
    # One worker and one server at 25 MB/s: a push-and-wait and a pull of n bytes each move n bytes
    # through the shaper, so neither is done before (n - b)/B (b its bucket). The fitted time per request
    # is not negative, and the probe is cached: asked again, nothing runs (no namespaces are left either).
    size, rate = 200_000, 25e6
    burst = TestbedConfig(hosts=2, bandwidth="200Mbit/s").burst
    got = measure_server("200Mbit/s", tmp_path, size, "fp32", prefix=PREFIX, repeats=2)
    assert len(got["push_wait"]) == len(got["pull"]) == 2
    assert all(t >= (size - burst) / rate for t in got["push_wait"] + got["pull"]), got
    assert fit_service(got, 3e-4, 23.9e6, burst, size) >= 0
    assert measure_server("200Mbit/s", tmp_path, size, "fp32", prefix=PREFIX, repeats=2) == got
    assert namespaces(PREFIX) == []


def test_the_sharded_probe_times_a_step_s_collectives_as_fsdp_and_zero_issue_them(tmp_path):
    # FSDP's reshard=true gathers the whole small model twice a step and reduce-scatters it once; at two hosts
    # each moves (p - 1)/p of its 407 kB through a 25 MB/s shaper, so no step's kind is done before that
    # much minus a bucket has crossed (the gathers: twice). ZeRO-1's reduces to the owners and its broadcasts
    # carry as much. Cached: asked again, nothing runs, and no namespace is left.
    half, rate = 407_080 / 2, 25e6
    burst = TestbedConfig(hosts=2, bandwidth="200Mbit/s").burst
    for scheme, gathers in (("fsdp", 2), ("zero:stage=1", 1)):
        got = measure_sharded("200Mbit/s", tmp_path, scheme, "mlp", 2, prefix=PREFIX, repeats=2)
        assert len(got["reducescatter"]) == len(got["allgather"]) == 2
        assert all(t >= (half - burst) / rate for t in got["reducescatter"]), got
        assert all(t >= gathers * (half - burst) / rate for t in got["allgather"]), got
        assert measure_sharded("200Mbit/s", tmp_path, scheme, "mlp", 2, prefix=PREFIX, repeats=2) == got
    assert namespaces(PREFIX) == []

