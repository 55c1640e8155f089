"""An emulated cluster network on one machine: one network namespace per host, rate-limited links.

Layout: namespaces ``<name>-h<i>`` (one per host) and ``<name>-br``
holding a Linux bridge, so nothing is added to the machine's own network namespace. Host i has one
interface ``tb0`` with address 10.213.1.(101+i)/24, the peer end of its veth pair ``v<i>`` sits on
the bridge. A token-bucket filter (tbf) limits both ends' egress: ``tb0`` shapes what the host sends,
``v<i>`` what it receives. A namespace has no route beyond its /24, so no packet can leave the testbed.
This kernel has no netem: bandwidth is emulated, latency is not (it is whatever the veths give, tens
of microseconds, and is measured by studies.validation). real.testbed.launcher runs schemes on it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from syncsim.config import check_int
from syncsim.units import parse_bandwidth, parse_size, parse_time

__all__ = ["TestbedConfig", "Testbed", "TestbedUnavailable", "unavailable", "shapable_rates", "HOST_IFACE", "QUEUE"]

HOST_IFACE = "tb0"
# Host i has address 10.213.1.(101+i): three-digit final octets keep string order equal to host order,
# which is how c10d orders nodes (see real.testbed.launcher).
FIRST_OCTET = 101
# tbf burst: a bucket of b bytes lets b bytes pass at veth speed, so any transfer finishes up to b/rate
# early; a real link serialises every frame at its rate (burst of one frame). tc-tbf(8) asks for at least
# rate/HZ (4 ms at this kernel's CONFIG_HZ=250) so the bucket refills between timer ticks; with high-
# resolution timers (CONFIG_HIGH_RES_TIMERS=y here, tbf's watchdog is an hrtimer) 1 ms of traffic
# sustains the rate too: measured at 200 Mbit/s, gloo all-reduce of 4 MiB ran at 23.2 MB/s with a
# 15 kB bucket, 23.9 MB/s with the rate/HZ one (100 kB), 21.7 MB/s with 3 kB, while ping-pong times of
# 16-256 KiB messages came out up to 2.5x too fast with 100 kB. Hence rate x 1 ms, at least 10 frames.
BURST_TIME = 1e-3
MIN_BURST = 10 * 1514
# tbf queue (its ``latency``: the longest a packet may wait, so rate x QUEUE bytes of room): deep enough
# that no run here ever loses a packet, as the fabrics data-parallel training runs on do not
# (InfiniBand's link-level credits hold a sender back instead; RoCE deployments pause with PFC). TCP on
# these veths has a round trip of tens of microseconds, so its window grows until a transfer's whole
# message is in flight, and a shallow shaper drops what it cannot hold: with a 20 ms queue, 60 steps of
# two synchronous parameter-server workers of the small model at 50 Mbit/s retransmitted 28,486 segments,
# and the stalls after a loss (up to the 200 ms retransmission timeout) made steps wander (one took 698 ms
# where the link needs 272 ms); with 2 s none were dropped and the slowest step took 281 ms (and a
# sub-grid's 50 Mbit/s runs wandered over their windows by a median 1.2 %, not 4.4 %). 2 s holds every host's message at
# once at the slowest rate the studies use (four pushes of the larger model, 6.9 MB, at 50 Mbit/s: 1.1 s).
QUEUE = "2s"
# ip-netns(8): `ip netns exec NAME` bind-mounts each file of /etc/netns/NAME/ over its namesake in /etc.
# Each host gets its own hosts file (this machine's hostname is its own address, so a lookup of it or of
# a peer is answered locally) and a resolv.conf naming no server (glibc then asks 127.0.0.1, inside the
# namespace): no name lookup is ever sent anywhere.
NETNS_ETC = Path("/etc/netns")


class TestbedUnavailable(RuntimeError):
    pass


def unavailable() -> str | None:
    """Why a testbed cannot be built here (for pytest skips), or None."""
    if os.geteuid() != 0:
        return "the testbed needs root (network namespaces, veth pairs, tc qdiscs)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"the testbed needs iproute2; not found on PATH: {', '.join(missing)}"
    return None


def shapable_rates(text: str, flag: str) -> list[str]:
    """The comma-separated link rates of a command's ``flag`` (``text``), each one the testbed can shape
    (TestbedConfig's own check), blanks dropped; ValueError naming the flag and the rate otherwise."""
    rates = [rate.strip() for rate in text.split(",") if rate.strip()]
    for rate in rates:
        bandwidth = parse_bandwidth(rate, flag)
        try:
            TestbedConfig(bandwidth=bandwidth)
        except ValueError as err:
            raise ValueError(f"{flag} {rate!r}: {err}") from None
    return rates


@dataclass(frozen=True)
class TestbedConfig:
    __test__ = False  # not a pytest test class despite its name
    hosts: int = 2
    """Hosts, each its own network namespace; a run puts one rank on each."""
    bandwidth: float | str = "200Mbit/s"
    """Rate of each host's link, each direction (bytes/s, or a string with units)."""
    queue: float | str = QUEUE
    """tbf ``latency``: longest a packet may wait in a shaper before it is dropped; the default holds every
    transfer of the studies' runs, so none loses a packet (see QUEUE). ``Testbed.dropped`` counts losses."""
    prefix: str = "sstb"
    """Start of every namespace name; leftovers of dead runs with this prefix are removed at start."""
    burst: float | str | None = None
    """tbf bucket size in bytes; None: 1 ms of traffic, at least 10 frames (see BURST_TIME)."""

    def __post_init__(self) -> None:
        owner = "TestbedConfig"
        object.__setattr__(self, "hosts", check_int(owner, "hosts", self.hosts, 1))
        if self.hosts > 255 - FIRST_OCTET:
            raise ValueError(f"{owner}.hosts must be at most {255 - FIRST_OCTET} (one /24), got {self.hosts}")
        object.__setattr__(self, "bandwidth", parse_bandwidth(self.bandwidth, f"{owner}.bandwidth"))
        if self.bandwidth * 8 < 8e3:  # tc rates below 1 kbit/s round to nothing
            raise ValueError(f"{owner}.bandwidth must be at least 1kbit/s, got {self.bandwidth * 8:g} bit/s")
        object.__setattr__(self, "queue", parse_time(self.queue, f"{owner}.queue"))
        if not 1e-3 <= self.queue <= 10.0:
            raise ValueError(f"{owner}.queue must be between 1ms and 10s, got {self.queue:g} s")
        burst = max(self.bandwidth * BURST_TIME, MIN_BURST) if self.burst is None else parse_size(self.burst)
        if not 1514 <= burst <= 2**30:
            raise ValueError(f"{owner}.burst must be between one Ethernet frame (1514 B) and 1 GiB, got {burst:g}")
        object.__setattr__(self, "burst", int(burst))
        if not re.fullmatch(r"[a-z][a-z0-9]{0,11}", self.prefix):
            raise ValueError(f"{owner}.prefix must be 1-12 lowercase letters or digits starting with a letter, "
                             f"got {self.prefix!r}")


def _ip(*args: str, timeout: float = 10.0, check: bool = True) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode:
        raise TestbedUnavailable(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _remove_namespace(ns: str) -> None:
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
    # Processes left inside are ours (only this module starts anything there); a namespace with live
    # processes would outlive `ip netns del`, keeping its veths and bridge.
    for pid in _ip("ip", "netns", "pids", ns, check=False).split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _ip("ip", "netns", "del", ns, check=False)


def namespaces(prefix: str) -> list[str]:
    names = [line.split()[0] for line in _ip("ip", "netns", "list").splitlines() if line.strip()]
    return [n for n in names if n.startswith(prefix)]


class Testbed:
    __test__ = False  # not a pytest test class despite its name

    def __init__(self, hosts: int = 2, bandwidth: float | str = "200Mbit/s", prefix: str = "sstb",
                 queue: float | str = QUEUE, burst: float | str | None = None):
        self.config = TestbedConfig(hosts=hosts, bandwidth=bandwidth, queue=queue, prefix=prefix, burst=burst)
        # The pid in the name tells leftovers of dead runs from a testbed another process is using.
        self.name = f"{prefix}{os.getpid()}x{uuid.uuid4().hex[:4]}"
        self.ips = tuple(f"10.213.1.{FIRST_OCTET + i}" for i in range(hosts))
        self.bridge_ns = f"{self.name}-br"
        self.host_ns = tuple(f"{self.name}-h{i}" for i in range(hosts))

    def __enter__(self) -> Testbed:
        reason = unavailable()
        if reason:
            raise TestbedUnavailable(reason)
        self.remove_leftovers(self.config.prefix)
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def remove_leftovers(prefix: str) -> None:
        for ns in namespaces(prefix):
            match = re.fullmatch(re.escape(prefix) + r"(\d+)x[0-9a-f]+-(br|h\d+)", ns)
            if match and not Path(f"/proc/{match.group(1)}").exists():  # its run's process is gone
                _remove_namespace(ns)

    def _create(self) -> None:
        cfg = self.config
        rate = f"{int(cfg.bandwidth * 8)}bit"
        shaper = ["tbf", "rate", rate, "burst", str(cfg.burst), "latency", f"{cfg.queue * 1e3:g}ms"]
        br = self.bridge_ns
        _ip("ip", "netns", "add", br)
        _ip("ip", "-n", br, "link", "set", "lo", "up")
        _ip("ip", "-n", br, "link", "add", "br0", "type", "bridge")
        _ip("ip", "-n", br, "link", "set", "br0", "up")
        for i, (ns, ip) in enumerate(zip(self.host_ns, self.ips)):
            _ip("ip", "netns", "add", ns)
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            # also IPv4-mapped IPv6 forms: torch's TCPStore listens dual-stack and looks its peers up so
            peers = "".join(f"{pre}{addr} {self.name}-h{j}\n" for j, addr in enumerate(self.ips)
                            for pre in ("", "::ffff:"))
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{ip} {socket.gethostname()}\n{peers}")
            (etc / "resolv.conf").write_text("# syncsim testbed: no name server\n")
            # Created inside the bridge namespace with its peer born inside the host's: neither end
            # ever exists in the machine's own namespace.
            _ip("ip", "-n", br, "link", "add", f"v{i}", "type", "veth", "peer", "name", HOST_IFACE, "netns", ns)
            _ip("ip", "-n", br, "link", "set", f"v{i}", "master", "br0")
            _ip("ip", "-n", ns, "link", "set", "lo", "up")
            _ip("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", HOST_IFACE)
            _ip("tc", "-n", ns, "qdisc", "add", "dev", HOST_IFACE, "root", *shaper)
            _ip("tc", "-n", br, "qdisc", "add", "dev", f"v{i}", "root", *shaper)
            _ip("ip", "-n", ns, "link", "set", HOST_IFACE, "up")
            _ip("ip", "-n", br, "link", "set", f"v{i}", "up")

    def close(self) -> None:
        for ns in (*self.host_ns, self.bridge_ns):
            _remove_namespace(ns)
        try:
            NETNS_ETC.rmdir()  # only if empty: another tool's per-namespace files stay
        except OSError:
            pass

    def dropped(self) -> int:
        """Packets the testbed's shapers (every host's and the bridge's) have dropped since it was built."""
        total = 0
        for ns, device in [(ns, HOST_IFACE) for ns in self.host_ns] + [(self.bridge_ns, f"v{i}")
                                                                        for i in range(len(self.host_ns))]:
            shown = _ip("tc", "-n", ns, "-s", "qdisc", "show", "dev", device, "root")
            match = re.search(r"\(dropped (\d+),", shown)
            if match is None:
                raise TestbedUnavailable(f"tc -s qdisc on {device} in {ns} shows no drop count: {shown.strip()!r}")
            total += int(match.group(1))
        return total

    def congestion_control(self, host: int = 0) -> str:
        """The TCP congestion control of ``host``'s namespace (each namespace takes the machine's default when
        it is made): whether two flows into one shaper take turns or keep in step depends on it (a bare
        push loop at 200 Mbit/s, started together: 271-300 ms a step under cubic, in step; 163-168 ms
        under bbr or reno, in turns; docs/log.md, "2026-12-07, evening")."""
        setting = "/proc/sys/net/ipv4/tcp_congestion_control"
        return _ip("ip", "netns", "exec", self.host_ns[host], "cat", setting).strip()

    def describe(self) -> dict:
        """What a run's record says of the network it ran on: the config (bytes/s, seconds, bytes) and each
        host's congestion control."""
        return dataclasses.asdict(self.config) | {
            "congestion_control": [self.congestion_control(h) for h in range(len(self.host_ns))]}

    def command(self, host: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.host_ns[host], *argv]

    def run(self, host: int, argv: list[str], timeout: float = 60.0, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(host, argv), timeout=timeout, **kwargs)

    def popen(self, host: int, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(host, argv), start_new_session=True, **kwargs)


