"""The component table: what NCCL reaches on each kind of hardware, the same constants for every dataset."""

from __future__ import annotations

from syncsim import Link

__all__ = ["INTRA", "NET_LATENCY", "LAUNCH", "NIC_EFFICIENCY"]

# A dataset's JSON names its intra-node component ("model": {"intra": ...}); the rates are NCCL's
# own (src/graph/topo.h): NVLink = links x per-link rate, A100 12 x 20.0 GB/s, H100/H200 18 x 20.6,
# V100 6 x 20.0, P100 4 x 18.0; PCIe Gen3 x16 12 GB/s (PCI_BW). Per-step latencies are those
# NCCL's tuner gives its bandwidth (Simple) protocol (src/graph/tuning.cc, NCCL 2.20): 3.4 us
# per NVLink step, 5.7 us per PCIe step, 14 us per network step, 8.4 us base latency.
INTRA = {"A100": Link("240GB/s", "3.4us"), "H100": Link("370.8GB/s", "3.4us"),
         "H200": Link("370.8GB/s", "3.4us"), "V100-SXM2": Link("120GB/s", "3.4us"),
         "P100-SXM2": Link("72GB/s", "3.4us"), "PCIe3": Link("12GB/s", "5.7us")}
NET_LATENCY = "14us"
LAUNCH = "8.4us"
# NICs reach 96 % of their line rate under NCCL: "We usually consider 24GB/s is the peak performance
# per 200G NIC (12 GB/s for 100G NICs)" (NCCL maintainer, NVIDIA/nccl-tests issue 119).
NIC_EFFICIENCY = 0.96
