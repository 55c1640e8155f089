"""GPUs, the links between them, parameter-server hosts, and how GPUs misbehave.

A cluster is ``nodes`` hosts with ``gpus_per_node`` GPUs each. GPUs on one node
talk over ``intra`` (NVLink, PCIe): its bandwidth is what one GPU can send
into the node's fabric, each direction. Nodes talk through their
``nics_per_node`` NICs; ``inter`` is *one* NIC's link (InfiniBand, Ethernet).

How GPUs reach the NICs (rails): GPU i of a node sends its own traffic (a
parameter-server push, say) through NIC ``i mod nics_per_node``; when GPUs
outnumber NICs, the GPUs of one rail share that NIC, so each gets
``nics_per_node / gpus_per_node`` of one NIC's rate. Collectives are not tied
to one GPU's rail: NCCL runs one channel per NIC (or a multiple), so a
collective uses every NIC of the node at once (syncsim.collectives).

``oversubscription`` is the leaf switches' downlink-to-uplink ratio of the
inter-node fabric (1 = full bisection bandwidth, the default). Parameter-server
traffic converges on a few hosts through the fabric's core, so each worker's
share of its NIC is divided by it; ring and tree collectives send to
neighbours, which NCCL orders by topology, and are not slowed by it (see
syncsim.collectives). ``collective_latency`` is the fixed cost of launching
one collective (NCCL's base latency) and ``chunk_bytes`` the granularity at
which multi-phase collectives pipeline.

Parameter servers, when a scheme uses them, are ``servers`` extra hosts
reached over ``server_link`` (by default ``inter``). Heterogeneity is a
per-GPU ``speed`` factor, noise is ``jitter`` (coefficient of variation of
compute time), and stragglers are a per-step probability of a ``slowdown``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import ClassVar

import numpy as np

from syncsim.config import ConfigFile, check_float, check_int, check_positive
from syncsim.limits import MAX_GPUS
from syncsim.units import parse_bandwidth, parse_size, parse_time

__all__ = ["Link", "Cluster", "CLUSTER_PRESETS", "CLUSTER_NOTES", "DEFAULT_CHUNK_BYTES"]

# NCCL's default per-channel buffer (NCCL_BUFFSIZE = 4 MiB, NCCL's environment-
# variable documentation): the unit in which one phase of a collective hands
# data to the next, hence the pipeline granularity of multi-phase collectives.
DEFAULT_CHUNK_BYTES = 4 * 2**20


@dataclass(frozen=True)
class Link:
    """A point-to-point link: ``bandwidth`` in bytes/s (or "100Gbit/s"), ``latency`` in s (or "5us")."""

    bandwidth: float | str
    latency: float | str = 0.0
    burst: float | str = 0.0
    """Bytes a rate-limited link lets through at once after an idle spell, before its rate applies:
    the bucket of a token-bucket shaper (tc-tbf's ``burst``; a cloud NIC's burst allowance), refilled
    at the link's ``refill`` rate. 0 (a plain link): every byte is serialised at the rate."""
    refill: float | str | None = None
    """Bytes/s at which the bucket refills: the shaper's own rate (tc-tbf's ``rate``), at least
    ``bandwidth``. None (the default): ``bandwidth``. The two differ where what crosses the link
    achieves less than the shaper allows (a collective over TCP whose rate includes its reduction
    arithmetic and rounds): the bucket still refills at the shaper's rate, all the time, so what a
    collective sending slower than that took from it comes back while it sends (tc-tbf(8))."""
    newcomer_weight: float = 1.0
    """How flows sharing the link at once divide it (the parameter servers' NICs): the most recently
    started active flow receives this many times the rate of each other one, on average. 1 (the
    default) is equal sharing, which long TCP or RDMA flows of equal RTT converge to (syncsim.network)."""
    sharing_spread: float = 0.0
    """How widely the split of one collision of two flows scatters: the log-sd of the ratio of their
    rates. Every flow draws its own weight exp(sharing_spread / sqrt(2) × Z), Z standard normal, from
    the run's seed, and the newest active flow weighs newcomer_weight times its own (syncsim.network).
    0 (the default): every collision splits alike. TCP flows of a few hundred kB through one shaper do
    not converge within a transfer; real.calibration.sharing_probe measures both values from colliding pairs."""
    crossing_stretch: tuple[float, ...] = ()
    """How much longer a push into the link's host takes while the host itself is sending (the parameter
    servers' NICs: a push arriving while the server answers another worker's pull): a measured sample of
    factors over the push's time on its own, in the order they were measured. The pushes take them in
    that order, from a start drawn from the run's seed (the testbed's stalls come in spells), each held
    (factor - 1) times as long as the server sent while its bytes came in (syncsim.server). On a TCP
    path whose two directions share one host's queues, the push's acknowledgements wait behind the
    host's outgoing data (the likely cause), and its sender stalls now and then for a good part of a
    transfer; the testbed's sharing probe samples the factors with two peers taking turns at a host
    (real.calibration.sharing_probe). Empty (the default): the two directions are independent, as on
    a full-duplex link whose acknowledgements never queue behind data."""
    window: float | str = 0.0
    """Bytes a TCP flow through the link keeps in flight at most (its sender's congestion window; or
    "256KiB"), for the parameter servers' NICs: each push holds at most a window queued at the server's
    incoming link, and a reply, whose acknowledgements wait in that queue, sends at most a window per
    queueing delay (Jacobson, SIGCOMM 1988, the acknowledgement clock; syncsim.window; the round trip
    outside the queue is left out, so a window does not cap a flow on its own). A reply crossing k pushes
    whose windows fill the queue then gets B/k, as each push does, and two replies together twice that,
    as the testbed measured (real.testbed.counterflow); real.testbed.window reads a flow's bytes in
    flight. 0 (the default): no window, as on a credit-based fabric (InfiniBand, RoCE with PFC) whose
    queues stay short."""

    def __post_init__(self) -> None:
        bandwidth = parse_bandwidth(self.bandwidth, "Link.bandwidth")
        latency = parse_time(self.latency, "Link.latency")
        object.__setattr__(self, "bandwidth", check_positive("Link", "bandwidth", bandwidth))
        object.__setattr__(self, "latency", check_float("Link", "latency", latency, low=0.0))
        burst = parse_size(self.burst, "Link.burst")
        object.__setattr__(self, "burst", check_float("Link", "burst", burst, low=0.0))
        if self.refill is not None:
            refill = check_positive("Link", "refill", parse_bandwidth(self.refill, "Link.refill"))
            if refill < self.bandwidth:  # type: ignore[operator]
                raise ValueError(f"Link.refill must be at least Link.bandwidth ({self.bandwidth:g} B/s): a "
                                 f"token bucket refilled slower than the link sends would cap its rate; "
                                 f"got {refill:g} B/s")
            object.__setattr__(self, "refill", refill)
        object.__setattr__(self, "newcomer_weight", check_positive("Link", "newcomer_weight", self.newcomer_weight))
        object.__setattr__(self, "sharing_spread", check_float("Link", "sharing_spread", self.sharing_spread, low=0.0))
        if isinstance(self.crossing_stretch, (str, bytes)) or not hasattr(self.crossing_stretch, "__iter__"):
            raise ValueError(f"Link.crossing_stretch must be a sequence of factors (each at least 1), "
                             f"got {self.crossing_stretch!r}")
        stretch = tuple(check_float("Link", "crossing_stretch", factor, low=1.0) for factor in self.crossing_stretch)
        object.__setattr__(self, "crossing_stretch", stretch)
        window = parse_size(self.window, "Link.window")
        object.__setattr__(self, "window", check_float("Link", "window", window, low=0.0))

    @property
    def refill_rate(self) -> float:
        """Bytes/s at which the bucket refills: ``refill``, or the link's bandwidth."""
        return float(self.bandwidth if self.refill is None else self.refill)  # type: ignore[arg-type]

    def transfer_time(self, nbytes: float) -> float:
        """alpha + max(0, n - burst)/B: the time to send one message of ``nbytes`` over a long-idle link."""
        return self.latency + max(0.0, nbytes - self.burst) / self.bandwidth  # type: ignore[operator]


def _as_link(owner: str, name: str, value: object) -> Link | None:
    if value is None or isinstance(value, Link):
        return value
    keys = [f.name for f in fields(Link)]  # bandwidth first: the one without a default
    if isinstance(value, dict):
        if set(value) - set(keys) or "bandwidth" not in value:
            raise ValueError(f"{owner}.{name} takes bandwidth (required), {', '.join(keys[1:-1])} and {keys[-1]}; "
                             f"got keys {sorted(value)}")
        return Link(**value)
    raise ValueError(f"{owner}.{name} must be a Link (or a dict with {', '.join(keys)}), got {value!r}")


@dataclass(frozen=True)
class Cluster(ConfigFile):
    json_key: ClassVar[str] = "cluster"
    tuple_fields: ClassVar[tuple[str, ...]] = ("speed",)

    nodes: int = 1
    gpus_per_node: int = 1
    intra: Link | None = None
    inter: Link | None = None
    nics_per_node: int = 1
    """NICs per node; ``inter`` is one NIC's link. GPU i uses NIC i mod nics_per_node (rails)."""
    oversubscription: float = 1.0
    """Leaf downlink : uplink ratio of the inter-node fabric (1 = full bisection bandwidth)."""
    collective_latency: float | str = 0.0
    """Fixed cost of one collective, on top of its per-hop latencies (NCCL's base latency)."""
    chunk_bytes: float | str = DEFAULT_CHUNK_BYTES
    """Pipeline granularity of multi-phase collectives (NCCL_BUFFSIZE)."""
    reducescatter_traffic: float = 1.0
    """Bytes a reduce-scatter keeps the busiest link busy for, per byte of NCCL's ring, (p − 1)/p·n: 1 for
    NCCL (syncsim.collectives). A backend that runs it otherwise is measured, not assumed: on the testbed,
    gloo's reduce_scatter_single and ZeRO-1's per-owner reduces kept two ranks' links busy about twice as
    long (real.calibration.sharded_probe)."""
    allgather_traffic: float = 1.0
    """The same for the parameter all-gathers of sharded schemes (ZeRO, FSDP): 1 for NCCL's ring."""
    servers: int = 0
    server_link: Link | None = None
    server_service: float | str = 0.0
    """Seconds a parameter-server host adds to each push it takes in and each pull it answers, beyond
    its link's latency and rate: its own work per request (a thread waking, the shard copied, the update
    applied). Measured on the testbed by ``real.calibration.server_probe``; 0 by default."""
    speed: tuple[float, ...] | None = None
    """Per-GPU speed factors (1.0 = nominal; 0.5 = computes twice as long); length = gpus."""
    jitter: float = 0.0
    """Coefficient of variation of each compute time (lognormal noise, mean preserved)."""
    straggler_prob: float = 0.0
    """Probability that a GPU straggles on a given step."""
    straggler_slowdown: float = 1.0
    """Compute-time multiplier of a straggling step (>= 1)."""
    gpu_memory: float | str | None = None
    """Bytes of memory of each GPU (or "80GiB"): what a worker's training state, buffers and activations
    must fit in (syncsim.memory; a result's ``fits``). None (the default): not given, and not checked."""
    host_cores: int | None = None
    """Every GPU's compute runs on one host of this many CPU cores (an emulated cluster on one machine,
    as real.testbed's): the workload's compute_time is a step with every worker computing at once; after a
    collective the workers, leaving it ``exit_spread`` apart, share the cores, and workers that never meet
    at a collective (a parameter server's) share them with whoever computes at the time (syncsim.host).
    None (the default): each GPU computes on its own."""
    exit_spread: float | str = 0.0
    """With ``host_cores``: seconds between the first and the last worker leaving a collective. 0 (the
    default): they leave together, and each computes its drawn time, as the probe's ranks did."""
    host_contention: float | None = None
    """With ``host_cores`` and more GPUs than cores: how many times longer a worker's step takes with every
    worker computing at once than alone (a compute probe of all of them over one of one). None (the
    default): gpus / host_cores, the cores shared evenly with nothing lost to time-slicing."""
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        owner = "Cluster"
        object.__setattr__(self, "nodes", check_int(owner, "nodes", self.nodes, 1, MAX_GPUS))
        object.__setattr__(self, "gpus_per_node", check_int(owner, "gpus_per_node", self.gpus_per_node, 1, MAX_GPUS))
        if self.gpus > MAX_GPUS:
            raise ValueError(f"Cluster.nodes × gpus_per_node must be at most {MAX_GPUS:,} GPUs (syncsim.limits), "
                             f"got {self.nodes:,} × {self.gpus_per_node:,} = {self.gpus:,}")
        object.__setattr__(self, "servers", check_int(owner, "servers", self.servers, 0, MAX_GPUS))
        object.__setattr__(self, "nics_per_node", check_int(owner, "nics_per_node", self.nics_per_node, 1, MAX_GPUS))
        object.__setattr__(self, "oversubscription",
                           check_float(owner, "oversubscription", self.oversubscription, low=1.0))
        launch = parse_time(self.collective_latency, "Cluster.collective_latency")
        object.__setattr__(self, "collective_latency", check_float(owner, "collective_latency", launch, low=0.0))
        service = parse_time(self.server_service, "Cluster.server_service")
        object.__setattr__(self, "server_service", check_float(owner, "server_service", service, low=0.0))
        for name in ("reducescatter_traffic", "allgather_traffic"):
            object.__setattr__(self, name, check_float(owner, name, getattr(self, name), low=0.1, high=100.0))
        chunk = parse_size(self.chunk_bytes, "Cluster.chunk_bytes")
        object.__setattr__(self, "chunk_bytes", check_float(owner, "chunk_bytes", chunk, low=1.0))
        self._check_links()
        if self.speed is not None:
            object.__setattr__(self, "speed", self._checked_speed())
        object.__setattr__(self, "jitter", check_float(owner, "jitter", self.jitter, low=0.0, high=10.0))
        object.__setattr__(self, "straggler_prob",
                           check_float(owner, "straggler_prob", self.straggler_prob, low=0.0, high=1.0))
        object.__setattr__(self, "straggler_slowdown",
                           check_float(owner, "straggler_slowdown", self.straggler_slowdown, low=1.0))
        if self.gpu_memory is not None:
            memory = parse_size(self.gpu_memory, "Cluster.gpu_memory")
            object.__setattr__(self, "gpu_memory", check_positive(owner, "gpu_memory", memory))
        if self.host_cores is not None:
            object.__setattr__(self, "host_cores", check_int(owner, "host_cores", self.host_cores, 1, 2**20))
        spread = parse_time(self.exit_spread, "Cluster.exit_spread")
        object.__setattr__(self, "exit_spread", check_float(owner, "exit_spread", spread, low=0.0, high=3600.0))
        if self.host_contention is not None:
            object.__setattr__(self, "host_contention", check_float(owner, "host_contention", self.host_contention,
                                                                    low=1.0, high=1e3))
            if self.host_cores is None:
                raise ValueError(f"Cluster.host_contention ({self.host_contention!r}) needs host_cores: it says how "
                                 f"workers sharing one host's cores slow each other")
        if self.exit_spread > 0 and self.host_cores is None:
            raise ValueError(f"Cluster.exit_spread ({self.exit_spread!r} s) needs host_cores: the spread only "
                             f"decides how workers sharing one host's cores overlap their compute")

    def _check_links(self) -> None:
        """intra, inter and server_link as Links (a dict becomes one), each required where the shape needs it."""
        owner = "Cluster"
        intra = _as_link(owner, "intra", self.intra)
        inter = _as_link(owner, "inter", self.inter)
        server_link = _as_link(owner, "server_link", self.server_link)
        if self.gpus_per_node > 1 and intra is None:
            raise ValueError(f"Cluster.intra is required when gpus_per_node > 1 "
                             f"(got gpus_per_node={self.gpus_per_node})")
        if self.nodes > 1 and inter is None:
            raise ValueError(f"Cluster.inter is required when nodes > 1 (got nodes={self.nodes})")
        if self.servers > 0 and server_link is None and inter is None:
            raise ValueError("Cluster.server_link (or inter) is required when servers > 0")
        object.__setattr__(self, "intra", intra)
        object.__setattr__(self, "inter", inter)
        object.__setattr__(self, "server_link", server_link)

    def _checked_speed(self) -> tuple[float, ...]:
        """``speed`` as a tuple of one positive factor per GPU: a list, a tuple or a one-dimensional NumPy
        array straight from a sweep."""
        sequence = isinstance(self.speed, Sequence) and not isinstance(self.speed, str)
        vector = isinstance(self.speed, np.ndarray) and self.speed.ndim == 1
        speed = tuple(self.speed) if sequence or vector else None  # type: ignore[arg-type]
        if speed is None:
            raise ValueError(f"Cluster.speed must be a sequence of per-GPU factors, got {self.speed!r}")
        if len(speed) != self.gpus:
            raise ValueError(f"Cluster.speed must have one factor per GPU ({self.gpus}), got {len(speed)}")
        return tuple(check_positive("Cluster", f"speed[{i}]", s) for i, s in enumerate(speed))

    # -- derived ------------------------------------------------------------------
    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def server_net(self) -> Link:
        """The link of each parameter-server host (``server_link``, else ``inter``)."""
        link = self.server_link or self.inter
        if link is None:
            raise ValueError("Cluster has no server_link and no inter link for parameter servers")
        return link

    @property
    def node_bandwidth(self) -> float:
        """Bytes/s one node can send to other nodes: all its NICs together."""
        if self.inter is None:
            return math.inf
        return self.nics_per_node * self.inter.bandwidth  # type: ignore[operator]

    @property
    def worker_bandwidth(self) -> float:
        """Bytes/s one GPU's own traffic gets towards hosts outside its node.

        Its rail's share of the node's NICs (``nics_per_node / gpus_per_node``
        NICs), divided by the fabric's oversubscription: such traffic converges
        on a few hosts through the fabric's core. On a node with no ``inter``
        link, the GPU's ``intra`` link (a single-node cluster reaching its
        servers); with neither, unlimited (one GPU: any traffic is to itself).
        """
        if self.inter is not None:
            return self.node_bandwidth / self.gpus_per_node / self.oversubscription
        if self.intra is not None:
            return self.intra.bandwidth  # type: ignore[return-value]
        return math.inf

    def with_gpus(self, gpus: int) -> Cluster:
        """The same hardware scaled to ``gpus`` GPUs: whole nodes when possible, else one partial node."""
        gpus = check_int("Cluster", "gpus", gpus, 1, MAX_GPUS)
        per_node = min(self.gpus_per_node, gpus)
        if gpus % per_node:
            raise ValueError(f"Cluster {self.name!r}: gpus={gpus} does not fill whole nodes of {per_node} GPUs; "
                             f"choose at most {per_node} or a multiple of {per_node}")
        speed = None if self.speed is None else tuple(self.speed[i % len(self.speed)] for i in range(gpus))
        return self.replace(nodes=gpus // per_node, gpus_per_node=per_node, speed=speed)

    # -- constructors ---------------------------------------------------------------
    @classmethod
    def homogeneous(cls, gpus: int, link: Link, **kwargs: object) -> Cluster:
        """``gpus`` single-GPU nodes, all joined by the same ``link``."""
        return cls(nodes=gpus, gpus_per_node=1, intra=link, inter=link, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def preset(cls, name: str, gpus: int = 8, **kwargs: object) -> Cluster:
        """A sourced cluster (see ``CLUSTER_PRESETS``) scaled to ``gpus`` GPUs."""
        if name not in CLUSTER_PRESETS:
            raise ValueError(f"unknown cluster preset {name!r}; choose one of {', '.join(sorted(CLUSTER_PRESETS))}")
        scaled = cls(name=name, **CLUSTER_PRESETS[name]).with_gpus(gpus)
        # per-GPU overrides such as ``speed`` refer to the scaled cluster
        return scaled.replace(**kwargs) if kwargs else scaled



# Sourced cluster presets: 8 GPUs per node on NVLink/NVSwitch, one NIC per GPU
# (nics_per_node=8, as on NVIDIA DGX A100 and DGX H100). Rates are what NCCL
# reaches, not line rates, and latencies are those of NCCL's bandwidth protocol:
# - NVLink: NCCL models a GPU's NVLink as links x per-link rate (src/graph/
#   topo.h): 12 x 20.0 GB/s = 240 GB/s on A100 (SM80_NVLINK_BW), 18 x 20.6 =
#   370.8 GB/s on H100 (SM90_NVLINK_BW). An NCCL maintainer: "450GB/s is the
#   line rate. With the protocol overhead (~20%) NCCL can get an effective
#   NVLink bandwidth of 370GB/s" (NVIDIA/nccl-tests issue 212).
# - NICs: "We usually consider 24GB/s is the peak performance per 200G NIC
#   (12 GB/s for 100G NICs)" (nccl-tests issue 119); "CX-7 NICs at NDR rate
#   (400Gbps) should achieve up to 48-49GB/s per NIC" (nccl-tests issue 267):
#   96 % of the line rate.
# - Latencies: NCCL's tuner (src/graph/tuning.cc, NCCL 2.20) charges its
#   Simple protocol 3.4 us per NVLink step, 14 us per network step, and a ring
#   8.4 us of base latency.
# "a100-100g": DGX A100-class nodes with 100 Gbit/s per GPU (HDR-100 or 100G
# RoCE rails); "h100-400g": DGX H100, one 400 Gbit/s ConnectX-7 per GPU
# (NVIDIA DGX H100 datasheet). NVLink SHARP (in-switch reduction on H100) is
# not modelled: its single-node all-reduce is faster than these presets say.
# - GPU memory: the A100 80GB and H100 SXM5 80GB datasheets give "80GB" of HBM2e and HBM3; what NVML
#   reports as the device's total (nvidia-smi) is 81,920 MiB on an A100 80GB and 81,559 MiB on an H100 80GB
#   (Modal, "Why does an NVIDIA H100 80GB card offer 85.52 GB?", 2024, a table from NVML), which is what the
#   presets take. The CUDA context and the allocator's caching take some of it (not modelled).
_NCCL_LAUNCH = "8.4us"
CLUSTER_PRESETS: dict[str, dict] = {
    "a100-100g": dict(
        nodes=1, gpus_per_node=8, nics_per_node=8, collective_latency=_NCCL_LAUNCH,
        intra=Link(bandwidth="240GB/s", latency="3.4us"),
        inter=Link(bandwidth="12GB/s", latency="14us"), gpu_memory="81920MiB",
    ),
    "h100-400g": dict(
        nodes=1, gpus_per_node=8, nics_per_node=8, collective_latency=_NCCL_LAUNCH,
        intra=Link(bandwidth="370.8GB/s", latency="3.4us"),
        inter=Link(bandwidth="48GB/s", latency="14us"), gpu_memory="81559MiB",
    ),
}
# One line per preset for `syncsim presets`: what it is and where its numbers come from.
CLUSTER_NOTES: dict[str, str] = {
    "a100-100g": "8 x A100 per node, NVLink 3 at 240 GB/s (NCCL topo.h: 12 x 20 GB/s), one 100 Gbit/s NIC per GPU "
                 "at 12 GB/s (NCCL maintainers, nccl-tests #119); NCCL 2.20 Simple-protocol latencies; A100 80GB "
                 "(81,920 MiB, NVML)",
    "h100-400g": "8 x H100 per node (DGX H100), NVLink 4 at 370.8 GB/s (18 x 20.6 GB/s), one 400 Gbit/s ConnectX-7 "
                 "per GPU at 48 GB/s (nccl-tests #267); no NVLink SHARP; H100 80GB (81,559 MiB, NVML)",
}
