"""Bytes per GPU (syncsim.memory): ZeRO's table exactly, FSDP's buffers, the presets' GPU memory, the Llama
preset, and what simulate and the CLI say about a configuration that does not fit."""

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from syncsim import Cluster, Link, Workload, simulate
from syncsim.cli import main
from syncsim.decoders import LLAMA2_7B, llama_train_flops_per_token
from syncsim.memory import Memory, estimate, optimizer_bytes
from syncsim.schemes import parse

GIB = 2**30


def cluster(gpus: int, memory=None) -> Cluster:
    return Cluster.homogeneous(gpus, Link("10GB/s"), gpu_memory=memory)


def workload(params: int, **kw) -> Workload:
    return Workload(param_bytes=4.0 * params, compute_time="10ms", **kw)


params_ = st.integers(1, 10**11)
gpus_ = st.integers(1, 4096)


# Basis: Rajbhandari et al. 2020 (ZeRO), section 5.1 and figure 1: mixed-precision Adam keeps 2Ψ of fp16
# parameters, 2Ψ of fp16 gradients and KΨ = 12Ψ of optimiser state (fp32 master copy, momentum, variance);
# partitioning over N_d GPUs gives 4Ψ + 12Ψ/N_d (P_os, stage 1), 2Ψ + 14Ψ/N_d (P_os+g, stage 2) and
# 16Ψ/N_d (P_os+g+p, stage 3); plain data parallelism keeps all 16Ψ.
@given(params_, gpus_, st.sampled_from(["bf16", "fp16"]))
def test_zero_s_table_in_mixed_precision(psi, n, precision):
    work = workload(psi)
    state = {stage: estimate(cluster(n), work, f"zero:stage={stage},precision={precision}").state
             for stage in (1, 2, 3)}
    assert state[1] == pytest.approx(4 * psi + 12 * psi / n, rel=1e-12)
    assert state[2] == pytest.approx(2 * psi + 14 * psi / n, rel=1e-12)
    assert state[3] == pytest.approx(16 * psi / n, rel=1e-12)
    fsdp = estimate(cluster(n), work, f"fsdp:precision={precision}")
    assert fsdp.state == pytest.approx(16 * psi / n, rel=1e-12)  # FSDP's FULL_SHARD is ZeRO-3's partitioning
    assert (fsdp.parameters, fsdp.gradients, fsdp.optimizer) == pytest.approx((2 * psi / n, 2 * psi / n,
                                                                               12 * psi / n), rel=1e-12)


# Basis: in fp32 the working copy is the master (no copy): 4Ψ parameters, 4Ψ gradients, Adam's two fp32
# moments 8Ψ (Kingma & Ba 2015), partitioned as ZeRO partitions them; 16Ψ in all, as in mixed precision.
@given(params_, gpus_)
def test_zero_in_fp32(psi, n):
    work = workload(psi)
    assert optimizer_bytes(4) == 8 and optimizer_bytes(2) == 12
    assert estimate(cluster(n), work, "zero:stage=1").state == pytest.approx(8 * psi + 8 * psi / n, rel=1e-12)
    assert estimate(cluster(n), work, "zero:stage=2").state == pytest.approx(4 * psi + 12 * psi / n, rel=1e-12)
    assert estimate(cluster(n), work, "zero:stage=3").state == pytest.approx(16 * psi / n, rel=1e-12)
    for text in ("allreduce", "allreduce:precision=fp16", "localsgd"):  # 16-bit on the wire only: fp32 replicas
        assert estimate(cluster(n), work, text).state == pytest.approx(16 * psi, rel=1e-12)


def test_other_schemes_keep_what_they_keep():
    psi, n = 1000, 4
    work = workload(psi)
    # a parameter server's workers hold parameters and gradients; the servers hold the optimiser's state
    assert estimate(cluster(n), work, "ps").state == 8 * psi
    # top-k and PowerSGD keep an fp32 error-feedback residual; DiLoCo every fragment's outer value and momentum
    assert estimate(cluster(n), work, "topk").other == 4 * psi
    assert estimate(cluster(n), work, "allreduce:compression=powersgd").other == 4 * psi
    assert estimate(cluster(n), work, "diloco").other == 8 * psi
    assert estimate(cluster(n), work, "diloco:outer_momentum=0").other == 4 * psi


def test_buffers_at_the_peak():
    layers = [1e8, 5e8, 5e8, 2e8, 2e8]  # FSDP units of >= 4e8 bytes: 6e8, 5e8, 4e8 (fp32 bytes)
    work = Workload(param_bytes=None, layers=layers, compute_time="10ms")
    c = cluster(8)
    # FULL_SHARD with prefetch: two neighbouring units gathered and one unit's gradient awaiting its
    # reduce-scatter, at the working precision (bf16: half the fp32 bytes)
    assert estimate(c, work, "fsdp:precision=bf16").transient == (6e8 + 5e8 + 6e8) / 2
    assert estimate(c, work, "fsdp:precision=bf16,prefetch=false").transient == (6e8 + 6e8) / 2
    # SHARD_GRAD_OP keeps every unit gathered from forward to backward
    assert estimate(c, work, "fsdp:precision=bf16,reshard=false").transient == (15e8 + 6e8) / 2
    # ZeRO-2 holds a bucket of gradients until it is reduce-scattered; ZeRO-1 keeps all of them anyway
    # DDP-like buckets in reverse layer order: 2e8 + 2e8 + 5e8 + 5e8, then 1e8
    assert estimate(c, work, "zero:stage=2,bucket_bytes=1e9").transient == 1.4e9
    assert estimate(c, work, "zero:stage=1").transient == 0.0
    assert estimate(c, work, "allreduce").transient == 0.0


def test_activations_and_the_verdict():
    # activations: activation_bytes per sample times the batch, held at the end of forward; unknown, not counted
    work = workload(10**9, batch_size=4, activation_bytes="1GiB")
    m = estimate(cluster(8, "80GiB"), work, "zero:stage=3,precision=bf16")
    assert m.activations == 4 * GIB and m.complete
    assert m.peak == m.state + m.transient + 4 * GIB and m.fits is True
    assert estimate(cluster(8, "6GiB"), work, "zero:stage=3,precision=bf16").fits is False  # 7.3 GiB
    unknown = estimate(cluster(8, "80GiB"), workload(10**9), "zero:stage=3")
    assert unknown.activations is None and not unknown.complete and unknown.fits is None
    assert estimate(cluster(8, "1GiB"), workload(10**9), "allreduce").fits is False  # too big even without them
    assert estimate(cluster(8), work, "allreduce").fits is None  # no GPU memory given
    assert "DOES NOT FIT" in estimate(cluster(8, "16GiB"), work, "allreduce").describe()  # 18.9 GiB
    assert "+ activations (not given)" in unknown.describe() and "left for them" in unknown.describe()


def test_gpu_memory_of_the_presets():
    # A100 80GB and H100 80GB, as NVML reports their totals (81,920 and 81,559 MiB)
    assert Cluster.preset("a100-100g").gpu_memory == 81920 * 2**20
    assert Cluster.preset("h100-400g", gpus=64).gpu_memory == 81559 * 2**20
    assert Cluster(gpu_memory="40GiB").gpu_memory == 40 * GIB
    with pytest.raises(ValueError, match="gpu_memory"):
        Cluster(gpu_memory=0)
    with pytest.raises(ValueError, match="activation_bytes"):
        Workload(param_bytes=4, compute_time=1, activation_bytes=-1)


def test_llama_preset_is_its_published_configuration():
    w = Workload.preset("llama2-7b")
    # 6,738,415,616 parameters: Llama 2 7B's count from its published config (embeddings untied)
    assert w.params == 6_738_415_616 and len(w.layers) == 34 and w.layers[1] == 4 * 202_383_360
    assert sum(math.prod(shape) for shape in w.shapes) == w.params
    # PaLM's 6N + 12·L·H·Q·T FLOPs per token, N without the input embedding: 46.09e9 at 4096 tokens
    flops = llama_train_flops_per_token(**LLAMA2_7B)
    assert flops == 6 * (6_738_415_616 - 32000 * 4096) + 12 * 32 * 32 * 128 * 4096
    assert w.compute_time == pytest.approx(flops * 4096 / (312e12 * 0.35))
    # activations: 32 blocks of 16·s·h + 8·s·i bytes, then 4·s·h + 4·s·V (see workload.py)
    s, h, i = 4096, 4096, 11008
    assert w.activation_bytes == 32 * (16 * s * h + 8 * s * i) + 4 * s * h + 4 * s * 32000
    # FSDP's default units (1e8 parameters) are the embedding, each block, and the head
    gather = parse("fsdp").policy(w.param_bytes, w.layers).plan(0, 1)[0]
    assert gather.units == w.layers


def test_simulate_flags_rather_than_refuses():
    w = Workload.preset("llama2-7b")
    res = simulate(Cluster.preset("a100-100g", gpus=8), w, "allreduce", steps=2)
    row = res.summary()
    assert row["fits"] is False and row["memory_per_gpu"] == res.memory.peak > row["gpu_memory"]
    assert row["memory_complete"] is True
    assert simulate(Cluster.preset("a100-100g", gpus=8), w, "fsdp:precision=bf16", steps=2).memory.fits is True


def test_compare_shows_peak_memory_per_gpu(capsys):
    code = main(["compare", "--cluster", "a100-100g", "--gpus", "8", "--workload", "llama2-7b", "--steps", "3",
                 "--scheme", "allreduce", "--scheme", "zero:stage=3,precision=bf16"])
    out = capsys.readouterr().out
    assert code == 0 and "GiB/GPU" in out.splitlines()[1]
    rows = {line.split()[0]: line for line in out.splitlines()[2:4]}
    assert rows["allreduce"].endswith("119.7!") and rows["zero:stage=3,precision=bf16"].endswith("33.7 ")
    assert "does not fit in the GPU's 80.0 GiB" in out
    code = main(["compare", "--cluster", "a100-100g", "--gpus", "8", "--workload", "resnet50", "--steps", "3",
                 "--scheme", "zero", "--json"])
    row = json.loads(capsys.readouterr().out)[0]
    assert code == 0 and row["memory_complete"] is False and row["fits"] is None and row["memory_per_gpu"] > 0
    code = main(["simulate", "--cluster", "a100-100g", "--gpus", "8", "--workload", "llama2-7b", "--steps", "3",
                 "--scheme", "zero:stage=1"])
    assert code == 0 and "DOES NOT FIT" not in (out := capsys.readouterr().out) and "memory/GPU" in out


def test_memory_is_a_dataclass_of_its_parts():
    m = Memory(parameters=1.0, gradients=2.0, optimizer=3.0, other=4.0, transient=5.0, activations=None, capacity=None)
    assert m.state == 10.0 and m.peak == 15.0 and not m.complete
