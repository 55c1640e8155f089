"""A published dataset: its measured rows, where they come from, the hardware they ran on, and whether
the model covers them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from studies.published.components import INTRA, LAUNCH, NET_LATENCY, NIC_EFFICIENCY
from syncsim import Cluster, Link
from syncsim.units import parse_bandwidth

__all__ = ["DATA", "OUTSIDE", "SHARDED_SCHEMES", "sharded_schemes", "HOST_STAGED", "host_staged", "Dataset", "load"]

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "published"
# What the model leaves out, by the name(s) a dataset's "model": {"outside": ...} gives it: what the
# dataset ran (a scheme, a topology, an algorithm NCCL picked), never how well it was predicted.
OUTSIDE = {
    "nvls": "NVLink SHARP (in-switch reduction, NCCL's choice on NVSwitch-3 nodes) is not modelled",
    "fsdp": "FSDP inside each DiLoCo worker: sharded data parallelism nested in another scheme, which the model does "
            "not compose (it runs one scheme per run)",
    "input-pipeline": "real data read from disk: the input pipeline is part of the step (not modelled)",
    "unknown-batch": "the batch size is not published, so the compute time per step is unknown",
    "unknown-configuration": "the models, batches and sequence lengths the figure averages over are not stated in its "
                             "text (image tables only), so no compute time per step can be derived",
    "cube-mesh": "hybrid cube-mesh NVLink (DGX-1): not the switched node the model assumes",
    "ps-on-cpu": "parameters on the host CPU (TensorFlow's parameter-server mode inside one node)",
    "unknown-link": "no rate is stated for the links between nodes (paths over the public internet, or only the "
                    "slowest path's bandwidth), so the network cannot be timed",
    "int8-allreduce": "pseudo-gradients quantised to int8 on the wire and summed in fp32 on the host CPU (a wire "
                      "format the model does not have)",
    "float8-allgather": "FSDP all-gathers the parameters in float8 (a wire format the model does not have)",
    "model-parallel": "data parallelism combined with Megatron tensor (model) parallelism, which the model does not "
                      "have",
}
# The sharded schemes, whose datasets measure tokens/s per GPU and take their compute time from FLOPs (the module's
# docstring, ``sharded_rows``).
SHARDED_SCHEMES = ("zero", "fsdp")


def sharded_schemes(model: dict, rows: pd.DataFrame) -> list[str]:
    """The sharded schemes (``zero:...``, ``fsdp:...``) a dataset ran, per dataset or per row."""
    schemes = {model.get("scheme") or ""} | (set(rows["scheme"].dropna()) if "scheme" in rows else set())
    return sorted(s for s in schemes if s.split(":")[0] in SHARDED_SCHEMES)


# One physical rule for host staging, computed from the stated hardware, the same for every dataset.
# The model's network hop moves a GPU's bytes onto the wire at the NIC's rate. That is GPUDirect RDMA,
# "a direct path for data exchange between the GPU and a third-party peer device using standard
# features of PCI Express" (NVIDIA, GPUDirect RDMA documentation, Overview). Without it NCCL copies
# every network chunk through a host-memory buffer: its net transport puts the buffers in GPU memory
# only when it uses GPUDirect, and then logs the hop "/GDRDMA" (NVIDIA/nccl src/transport/net.cc), and
# its socket (TCP) transport takes host memory only (src/transport/net_socket.cc: ncclSocketPtrSupport
# sets NCCL_PTR_HOST).
# No stated hardware fact gives that copy's rate, so whether the copy or the wire sets the rate cannot
# be predicted: the same no-GPUDirect cluster reached 44 % of a 100G NIC's line rate and 94 % of a
# 10 GbE's (the two hkbu-2080ti-8x4 datasets), one 400G RoCE NIC 30 % (moc-h100-2x1-...). Deciding by
# which of them the model happens to match would be choosing rows by their error, so every dataset
# whose runs cross the network and whose hardware states "gpudirect_rdma": false is outside, whatever
# its error; a dataset that does not state it is predicted as the model assumes (GPUDirect).
HOST_STAGED = "no GPUDirect RDMA: each network hop is copied through host memory (not modelled)"


def host_staged(hardware: dict, rows: pd.DataFrame) -> bool:
    """Whether a dataset's runs cross the network without GPUDirect RDMA, as its hardware states."""
    stated = hardware.get("gpudirect_rdma")
    if stated not in (None, True, False):
        raise ValueError(f"hardware.gpudirect_rdma must be true or false, got {stated!r}")
    return stated is False and bool((rows["nodes"] > 1).any())


@dataclass(frozen=True)
class Dataset:
    id: str
    meta: dict
    rows: pd.DataFrame

    @property
    def hardware(self) -> dict:
        return self.meta["hardware"]

    @property
    def model(self) -> dict:
        return self.meta["model"]

    @property
    def source(self) -> str:
        src = self.meta["source"]
        return src.get("url") or "/".join(str(src[k]) for k in ("repo", "path") if src.get(k))

    def outside_model(self) -> str | None:
        """Why the model does not cover this dataset, or None."""
        labels = self.model.get("outside") or []
        reasons = [OUTSIDE[label] for label in ([labels] if isinstance(labels, str) else labels)]
        if host_staged(self.hardware, self.rows):
            reasons.append(HOST_STAGED)
        return "; ".join(reasons) or None

    def cluster(self, nodes: int, gpus_per_node: int, nic_rate: str | None = None) -> Cluster:
        """The cluster the hardware states; ``nic_rate`` is a row's own link rate where its rows differ in it
        (the CSV's ``nic_rate`` column), else the hardware's."""
        hw = self.hardware
        inter = None
        if nodes > 1:
            stated, where = (nic_rate, "nic_rate column") if nic_rate else (hw["nic_rate"], "hardware.nic_rate")
            rate = parse_bandwidth(stated, f"{self.id}: {where}") * NIC_EFFICIENCY
            inter = Link(rate, NET_LATENCY)
        return Cluster(nodes=nodes, gpus_per_node=gpus_per_node, nics_per_node=int(hw.get("nics_per_node") or 1),
                       intra=INTRA[self.model["intra"]] if gpus_per_node > 1 else None, inter=inter,
                       collective_latency=LAUNCH, name=self.id)


def load(folder: Path = DATA) -> list[Dataset]:
    datasets = []
    for meta_path in sorted(folder.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        datasets.append(Dataset(meta_path.stem, meta, pd.read_csv(meta_path.with_suffix(".csv"))))
    if not datasets:
        raise ValueError(f"no published datasets (*.json + *.csv) under {folder}")
    return datasets
