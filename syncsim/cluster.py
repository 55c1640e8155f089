"""GPUs, the links between them, parameter-server hosts, and how GPUs misbehave.

A cluster is ``nodes`` hosts with ``gpus_per_node`` GPUs each. GPUs on one node
talk over ``intra`` (NVLink, PCIe); nodes talk over ``inter`` (InfiniBand,
Ethernet). Parameter servers, when a scheme uses them, are ``servers`` extra
hosts reached over ``server_link`` (by default ``inter``). Heterogeneity is a
per-GPU ``speed`` factor, noise is ``jitter`` (coefficient of variation of
compute time), and stragglers are a per-step probability of a ``slowdown``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from syncsim.config import ConfigFile, check_float, check_int, check_positive
from syncsim.units import parse_bandwidth, parse_time

__all__ = ["Link", "Cluster", "CLUSTER_PRESETS"]


@dataclass(frozen=True)
class Link:
    """A point-to-point link: ``bandwidth`` in bytes/s (or "100Gbit/s"), ``latency`` in s (or "5us")."""

    bandwidth: float | str
    latency: float | str = 0.0

    def __post_init__(self) -> None:
        bandwidth = parse_bandwidth(self.bandwidth, "Link.bandwidth")
        latency = parse_time(self.latency, "Link.latency")
        object.__setattr__(self, "bandwidth", check_positive("Link", "bandwidth", bandwidth))
        object.__setattr__(self, "latency", check_float("Link", "latency", latency, low=0.0))

    def transfer_time(self, nbytes: float) -> float:
        """alpha + n/B: the time to send one message of ``nbytes`` over an idle link."""
        return self.latency + nbytes / self.bandwidth  # type: ignore[operator]


def _as_link(owner: str, name: str, value: object) -> Link | None:
    if value is None or isinstance(value, Link):
        return value
    if isinstance(value, dict):
        return Link(**value)
    raise ValueError(f"{owner}.{name} must be a Link (or a dict with bandwidth, latency), got {value!r}")


@dataclass(frozen=True)
class Cluster(ConfigFile):
    json_key: ClassVar[str] = "cluster"
    tuple_fields: ClassVar[tuple[str, ...]] = ("speed",)

    nodes: int = 1
    gpus_per_node: int = 1
    intra: Link | None = None
    inter: Link | None = None
    servers: int = 0
    server_link: Link | None = None
    speed: tuple[float, ...] | None = None
    """Per-GPU speed factors (1.0 = nominal; 0.5 = computes twice as long); length = gpus."""
    jitter: float = 0.0
    """Coefficient of variation of each compute time (lognormal noise, mean preserved)."""
    straggler_prob: float = 0.0
    """Probability that a GPU straggles on a given step."""
    straggler_slowdown: float = 1.0
    """Compute-time multiplier of a straggling step (>= 1)."""
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        owner = "Cluster"
        object.__setattr__(self, "nodes", check_int(owner, "nodes", self.nodes, 1))
        object.__setattr__(self, "gpus_per_node", check_int(owner, "gpus_per_node", self.gpus_per_node, 1))
        object.__setattr__(self, "servers", check_int(owner, "servers", self.servers, 0))
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
        if self.speed is not None:
            speed = tuple(self.speed) if isinstance(self.speed, Sequence) and not isinstance(self.speed, str) else None
            if speed is None:
                raise ValueError(f"Cluster.speed must be a sequence of per-GPU factors, got {self.speed!r}")
            if len(speed) != self.gpus:
                raise ValueError(f"Cluster.speed must have one factor per GPU ({self.gpus}), got {len(speed)}")
            speed = tuple(check_positive(owner, f"speed[{i}]", s) for i, s in enumerate(speed))
            object.__setattr__(self, "speed", speed)
        object.__setattr__(self, "jitter", check_float(owner, "jitter", self.jitter, low=0.0, high=10.0))
        object.__setattr__(self, "straggler_prob",
                           check_float(owner, "straggler_prob", self.straggler_prob, low=0.0, high=1.0))
        object.__setattr__(self, "straggler_slowdown",
                           check_float(owner, "straggler_slowdown", self.straggler_slowdown, low=1.0))

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
    def worker_net(self) -> Link:
        """A worker's own network link to hosts outside its node (``inter``, else ``intra``)."""
        link = self.inter or self.intra
        if link is None:
            # a single GPU with no links: any traffic would be to itself.
            return Link(bandwidth=float("1e30"), latency=0.0)
        return link

    def with_gpus(self, gpus: int) -> Cluster:
        """The same hardware scaled to ``gpus`` GPUs: whole nodes when possible, else one partial node."""
        gpus = check_int("Cluster", "gpus", gpus, 1)
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



# Sourced cluster presets: 8 GPUs per node on NVLink, one NIC per GPU.
# - "a100-100g": NVIDIA DGX A100-class node. NVLink 3 gives 600 GB/s per GPU in
#   both directions together (NVIDIA A100 datasheet), i.e. 300 GB/s each way;
#   nodes on 100 Gbit/s Ethernet/InfiniBand per GPU, a common cloud fabric
#   (e.g. AWS p4d: 400 Gbit/s per 8 GPUs is less; 100G per GPU is the usual
#   on-prem HDR-100 build). Latencies: ~2 us NVLink hop, ~5 us RDMA NIC-to-NIC.
# - "h100-400g": NVIDIA DGX H100: NVLink 4 at 900 GB/s per GPU both ways
#   (450 GB/s each way) and one 400 Gbit/s ConnectX-7 NDR NIC per GPU
#   (NVIDIA DGX H100 datasheet).
CLUSTER_PRESETS: dict[str, dict] = {
    "a100-100g": dict(
        nodes=1, gpus_per_node=8,
        intra=Link(bandwidth="300GB/s", latency="2us"),
        inter=Link(bandwidth="100Gbit/s", latency="5us"),
    ),
    "h100-400g": dict(
        nodes=1, gpus_per_node=8,
        intra=Link(bandwidth="450GB/s", latency="2us"),
        inter=Link(bandwidth="400Gbit/s", latency="5us"),
    ),
}
