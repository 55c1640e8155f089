import pytest

from syncsim import Cluster, Link, Workload
from syncsim.workload import WORKLOAD_PRESETS


def test_link_parses_units():
    link = Link(bandwidth="100Gbit/s", latency="5us")
    assert link.bandwidth == 12.5e9 and link.latency == 5e-6


@pytest.mark.parametrize("kwargs, field", [
    (dict(bandwidth=0), "bandwidth"), (dict(bandwidth=-1), "bandwidth"),
    (dict(bandwidth="1GB/s", latency=-1e-6), "latency"), (dict(bandwidth="1 furlong"), "bandwidth"),
])
def test_link_rejects(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Link(**kwargs)


LINK = Link("10GB/s", "1us")


@pytest.mark.parametrize("kwargs, message", [
    (dict(nodes=0, inter=LINK), "nodes"),
    (dict(nodes=2, gpus_per_node=0, inter=LINK, intra=LINK), "gpus_per_node"),
    (dict(nodes=2), "inter is required"),
    (dict(gpus_per_node=4), "intra is required"),
    (dict(nodes=2, inter=LINK, speed=(1.0,)), "one factor per GPU"),
    (dict(nodes=2, inter=LINK, speed=(1.0, 0.0)), r"speed\[1\]"),
    (dict(jitter=-0.1), "jitter"),
    (dict(straggler_prob=1.5), "straggler_prob"),
    (dict(straggler_slowdown=0.5), "straggler_slowdown"),
    (dict(servers=-1), "servers"),
    (dict(nodes=1.5), "nodes"),
    (dict(intra="fast"), "intra"),
])
def test_cluster_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Cluster(**kwargs)


def test_cluster_shapes_and_presets():
    assert Cluster.homogeneous(16, LINK).gpus == 16
    c = Cluster.preset("a100-100g", gpus=64)
    assert (c.nodes, c.gpus_per_node) == (8, 8) and c.inter.bandwidth == 12e9 and c.nics_per_node == 8
    small = Cluster.preset("h100-400g", gpus=2)
    assert (small.nodes, small.gpus_per_node) == (1, 2)
    with pytest.raises(ValueError, match="gpus=12 does not fill whole nodes"):
        Cluster.preset("a100-100g", gpus=12)
    # per-GPU overrides refer to the scaled cluster
    assert Cluster.preset("a100-100g", gpus=16, speed=[1.0] * 15 + [0.5]).speed[-1] == 0.5
    with pytest.raises(ValueError, match="unknown cluster preset"):
        Cluster.preset("tpu-pod")


def test_cluster_json_round_trip(tmp_path):
    c = Cluster.preset("a100-100g", gpus=16).replace(jitter=0.1, servers=2)
    c.to_json(tmp_path / "c.json")
    assert Cluster.from_json(tmp_path / "c.json") == c


@pytest.mark.parametrize("kwargs, message", [
    (dict(param_bytes=0, compute_time=1), "param_bytes"),
    (dict(param_bytes="1MiB", compute_time="-1ms"), "compute_time"),
    (dict(param_bytes="1MiB", compute_time=1, batch_size=0), "batch_size"),
    (dict(param_bytes=10, compute_time=1, layers=(4, 4)), "sum to"),
    (dict(param_bytes=None, compute_time=1, layers=(4, 0)), r"layers\[1\] must be a positive"),
    (dict(param_bytes=10, compute_time=1, backward_fraction=1.5), "backward_fraction"),
    (dict(param_bytes="lots", compute_time=1), "param_bytes"),
])
def test_workload_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Workload(**kwargs)


def test_presets_are_sourced_sizes():
    # The corrected seed LeNet: conv(1->20,5) conv(20->50,5) Linear(800,500) Linear(500,10).
    lenet = Workload.preset("lenet")
    assert lenet.params == 520 + 25_050 + 400_500 + 5_010
    assert Workload.preset("resnet50").params == 25_557_032
    assert Workload.preset("vgg16").params == 138_357_544
    assert set(WORKLOAD_PRESETS) >= {"lenet", "resnet50", "vgg16", "bert-large", "gpt2"}
    with pytest.raises(ValueError, match="unknown workload preset"):
        Workload.preset("alexnet")


def test_from_torch_matches_lenet_preset():
    torch = pytest.importorskip("torch")
    from torch import nn

    # The seed article's model, with the fully connected input fixed to 800 = 50·4·4.
    model = nn.Sequential(nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(20, 50, 5), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10))
    workload = Workload.from_torch(model, torch.randn(8, 1, 28, 28), repeats=2, warmup=1)
    preset = Workload.preset("lenet")
    assert workload.param_bytes == preset.param_bytes
    assert sum(workload.layers) == workload.param_bytes and len(workload.layers) == 8
    assert workload.batch_size == 8 and workload.compute_time > 0 and 0 < workload.backward_fraction < 1


def test_workload_json_round_trip(tmp_path):
    w = Workload.preset("lenet")
    w.to_json(tmp_path / "w.json")
    assert Workload.from_json(tmp_path / "w.json") == w
