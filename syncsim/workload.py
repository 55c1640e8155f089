"""What one worker computes per step: parameter bytes, compute time, batch size.

A workload's ``compute_time`` is one forward+backward pass of ``batch_size``
samples on one nominal GPU; ``backward_fraction`` of it is the backward pass,
which is when gradient buckets become ready for overlapped all-reduce.
``layers`` lists parameter bytes per layer in forward order, so buckets can be
formed as DDP does (in reverse order, as gradients appear during backward).
``idle_cost`` is what a step computes longer when its worker sat idle before it
(waiting for parameter servers): a processor that idled starts again with cold
caches and a lowered clock. A worker waiting for a collective is not idle: the
collective's reduction runs on its own processor (gloo's threads on the CPU,
NCCL's kernels on the GPU), and the simulator charges it nothing. Measured on
this project's 2-core testbed machine, the small model's step of 0.45 ms took
1.04 ms after 5 ms idle and 1.56 ms after 20 ms, and LeNet's 13.0 ms step 14.7 ms
after 5 ms (real.calibration.compute_probe measures the curve for each configuration).
GPUs drop their clocks when idle too; a workload calibrated back to back leaves
it out (the default, no cost). ``compress_flops`` and ``scan_rate`` are the
worker's rates for a gradient compressor's own work (PowerSGD's products, top-k's
selection, DiLoCo's outer step), physical rates charged for the work each action
does, never a factor per scheme; unset (the default) that work is free.
``activation_bytes`` is what one sample's forward keeps for its backward (syncsim.memory counts it,
times ``batch_size``, in a worker's peak memory); unset (the default) it is unknown and not counted.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from syncsim.config import ConfigFile, check_float, check_int, check_positive
from syncsim.decoders import (
    LLAMA2_7B,
    llama_activation_bytes,
    llama_layers,
    llama_shapes,
    llama_train_flops_per_token,
)
from syncsim.limits import MAX_PARAM_BYTES
from syncsim.units import FP32_BYTES, parse_size, parse_time

__all__ = ["Workload", "WORKLOAD_PRESETS", "WORKLOAD_NOTES", "estimate_step_time", "PEAK_FLOPS"]


# Backward costs about twice the forward (one matmul for input gradients, one
# for weight gradients): the usual 1:2 split behind the 6·N·tokens training
# FLOP count of Kaplan et al. 2020, "Scaling Laws for Neural Language Models".
DEFAULT_BACKWARD_FRACTION = 2.0 / 3.0


@dataclass(frozen=True)
class Workload(ConfigFile):
    json_key: ClassVar[str] = "workload"
    tuple_fields: ClassVar[tuple[str, ...]] = ("layers", "shapes")

    param_bytes: float | str
    """Bytes of parameters (fp32 master copy) = bytes of one full gradient."""
    compute_time: float | str
    """Seconds for one forward+backward of ``batch_size`` samples on a speed-1.0 GPU."""
    batch_size: int = 32
    """Samples per worker per step."""
    layers: tuple[float, ...] | None = None
    """Parameter bytes per layer, forward order; must sum to ``param_bytes``."""
    backward_fraction: float = DEFAULT_BACKWARD_FRACTION
    idle_cost: tuple[tuple[float, float], ...] = ()
    """(idle seconds, extra compute seconds) points, idle strictly increasing: a step that starts after its
    worker idled g seconds (waiting for servers, not in a collective) computes ``idle_extra(g)`` longer
    (linear from (0, 0) through the points, the last point's extra beyond it). Empty: no cost."""
    shapes: tuple[tuple[int, ...], ...] | None = None
    """Shape of each parameter tensor, forward order (what low-rank compression needs: PowerSGD views
    a tensor as rows = shape[0] by the rest); their values × 4 bytes must sum to ``param_bytes``.
    None: unknown (syncsim.schemes.allreduce.default_shapes then assumes square-ish matrices)."""
    compress_flops: float | None = None
    """FLOP/s the worker reaches on a compressor's dense arithmetic: PowerSGD's thin products P = ΔQ,
    Q = ΔᵀP̂ and P̂Qᵀ and its Gram–Schmidt (``LowRankAllReduce.flops``), charged where each falls: before
    round one, between the rounds, after round two. Thin products (rank ≪ rows, cols) run at memory
    bandwidth, far below a GPU's peak; ``python -m real.calibrate`` times them at the model's own
    matrix shapes. None (the default): not modelled, the arithmetic takes no time."""
    scan_rate: float | None = None
    """Values/s of one pass of the worker over a gradient-sized array: what each elementwise pass of a
    compressor (adding the residual, a magnitude, a comparison, a subtraction, a copy) and top-k's
    partition cost per value. Charged for the passes syncsim.compression makes (counted by
    syncsim.compression.work.compression_work): top-k's selection and error feedback before its all-gather and its
    scatter-add after it, PowerSGD's error feedback, DiLoCo's pseudo-gradient and outer optimiser step
    over the fragment. ``python -m real.calibrate`` times a partition of the gradient's size, the
    costliest pass (numpy's elementwise passes run about twice as fast, so this errs towards slow).
    None (the default): not modelled, the passes take no time."""
    activation_bytes: float | str | None = None
    """Bytes of activations one sample's forward pass keeps for its backward, all layers together, at the
    precision the model computes in: a worker holds ``batch_size`` times this at the end of its forward, its
    memory's peak (syncsim.memory; Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models", section 4, count it per tensor a layer saves). None (the default): unknown, and not
    counted, so a memory estimate without it is a lower bound."""
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        owner = "Workload"
        for rate in ("compress_flops", "scan_rate"):
            value = getattr(self, rate)
            if value is not None:
                object.__setattr__(self, rate, check_positive(owner, rate, value))
        if self.activation_bytes is not None:
            activations = parse_size(self.activation_bytes, "Workload.activation_bytes")
            object.__setattr__(self, "activation_bytes", check_float(owner, "activation_bytes", activations,
                                                                     low=0.0))
        object.__setattr__(self, "shapes", _check_shapes(self.shapes))
        layers = self.layers
        if layers is not None:
            if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
                raise ValueError(f"Workload.layers must be a sequence of per-layer byte counts, got {layers!r}")
            layers = tuple(parse_size(b, f"Workload.layers[{i}]") for i, b in enumerate(layers))
            if not layers:
                raise ValueError("Workload.layers must be a non-empty sequence of positive byte counts, got ()")
            for i, b in enumerate(layers):
                if b <= 0:
                    raise ValueError(f"Workload.layers[{i}] must be a positive byte count, got {b:g}")
        param_bytes = sum(layers) if self.param_bytes is None and layers else parse_size(
            self.param_bytes, "Workload.param_bytes")
        param_bytes = check_positive(owner, "param_bytes", param_bytes)
        if param_bytes > MAX_PARAM_BYTES:
            raise ValueError(f"Workload.param_bytes must be at most 1 PiB ({MAX_PARAM_BYTES:.4g} bytes, "
                             f"syncsim.limits.MAX_PARAM_BYTES), got {param_bytes:g}")
        object.__setattr__(self, "param_bytes", param_bytes)
        if layers is not None and abs(sum(layers) - param_bytes) > 1e-6 * param_bytes:
            raise ValueError(f"Workload.layers sum to {sum(layers):g} bytes but param_bytes is {param_bytes:g}")
        object.__setattr__(self, "layers", layers)
        compute_time = parse_time(self.compute_time, "Workload.compute_time")
        object.__setattr__(self, "compute_time", check_positive(owner, "compute_time", compute_time))
        object.__setattr__(self, "batch_size", check_int(owner, "batch_size", self.batch_size, 1))
        object.__setattr__(self, "backward_fraction",
                           check_float(owner, "backward_fraction", self.backward_fraction, low=0.0, high=1.0))
        object.__setattr__(self, "idle_cost", _check_idle_cost(self.idle_cost))
        if self.shapes is not None:
            values = sum(math.prod(shape) for shape in self.shapes)
            if values * FP32_BYTES != param_bytes:
                raise ValueError(f"Workload.shapes hold {values:,} values ({values * FP32_BYTES:,} bytes) but "
                                 f"param_bytes is {param_bytes:g}")

    def idle_extra(self, idle: float) -> float:
        """Extra compute seconds of a step that starts after its worker idled ``idle`` seconds (idle_cost)."""
        points = self.idle_cost
        if not points or idle <= 0:
            return 0.0
        i = bisect.bisect_left(points, (idle,))
        if i == len(points):
            return points[-1][1]
        (g0, e0), (g1, e1) = ((0.0, 0.0) if i == 0 else points[i - 1]), points[i]
        return e0 + (e1 - e0) * (idle - g0) / (g1 - g0)

    @property
    def params(self) -> int:
        """Number of fp32 parameters."""
        return int(round(self.param_bytes / FP32_BYTES))  # type: ignore[operator]

    @property
    def layer_bytes(self) -> tuple[float, ...]:
        """Per-layer bytes; one layer holding everything when ``layers`` is not given."""
        return self.layers if self.layers is not None else (self.param_bytes,)  # type: ignore[return-value]

    # -- constructors ---------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Workload:
        """A sourced model (see ``WORKLOAD_PRESETS``); ``overrides`` replace fields."""
        if name not in WORKLOAD_PRESETS:
            raise ValueError(f"unknown workload preset {name!r}; choose one of {', '.join(sorted(WORKLOAD_PRESETS))}")
        spec = dict(WORKLOAD_PRESETS[name])
        spec.update(overrides)
        return cls(name=name, **spec)

    @classmethod
    def from_torch(cls, module: Any, example_input: Any, *, repeats: int = 5, warmup: int = 2,
                   name: str | None = None) -> Workload:
        """Per-layer parameter bytes of ``module`` and its forward/backward time measured here.

        ``example_input`` is one batch (its first dimension is the batch size). The parameters'
        shapes become ``shapes`` (what PowerSGD compresses) when they are all fp32, the unit
        ``shapes`` counts in.
        The loss is the sum of the outputs: the backward cost does not depend on
        which scalar is differentiated.
        """
        import torch  # lazily: the simulator itself never needs torch

        repeats = check_int("Workload.from_torch", "repeats", repeats, 1)
        layers = [p.numel() * p.element_size() for p in module.parameters() if p.requires_grad]
        tensors = [p for p in module.parameters() if p.requires_grad]
        shapes = (tuple(tuple(int(d) for d in p.shape) or (1,) for p in tensors)
                  if all(p.element_size() == FP32_BYTES for p in tensors) else None)
        if not layers:
            raise ValueError("Workload.from_torch: the module has no trainable parameters")
        batch = int(example_input.shape[0])
        forward, backward = [], []
        for i in range(warmup + repeats):
            module.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            out = module(example_input)
            loss = out.float().sum()
            t1 = time.perf_counter()
            loss.backward()
            if example_input.is_cuda:
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            if i >= warmup:
                forward.append(t1 - t0)
                backward.append(t2 - t1)
        fwd, bwd = sorted(forward)[len(forward) // 2], sorted(backward)[len(backward) // 2]
        return cls(param_bytes=float(sum(layers)), compute_time=fwd + bwd, batch_size=batch,
                   layers=tuple(float(b) for b in layers), backward_fraction=bwd / (fwd + bwd), shapes=shapes,
                   name=name or type(module).__name__.lower())


# -- presets --------------------------------------------------------------------
# Reference GPU: NVIDIA A100, 312 TFLOP/s dense bf16/fp16 (A100 datasheet).
A100_PEAK_FLOPS = 312e12
# Dense 16-bit (bf16) tensor-core peaks per GPU, from NVIDIA's datasheets, which print twice these "with sparsity":
# A100 (SXM) "BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS*"; H100 SXM "BF16 Tensor Core 1,979 teraFLOPS" (footnote:
# with sparsity); H200 "BFLOAT16 Tensor Core 1,979 TFLOPS" (with sparsity); V100 SXM2 "Tensor Performance 125 TFLOPS"
# (fp16, no sparsity then). A GPU run below its datasheet's power or clocks (Meta's 500 W Grand Teton H100) has a
# lower peak no datasheet states; studies that divide by these take the datasheet's.
PEAK_FLOPS = {"A100": A100_PEAK_FLOPS, "H100-SXM": 1979e12 / 2, "H200": 1979e12 / 2, "V100-SXM2": 125e12}


def _check_shapes(shapes: Any) -> tuple[tuple[int, ...], ...] | None:
    if shapes is None:
        return None
    if isinstance(shapes, (str, bytes)) or not hasattr(shapes, "__iter__"):
        raise ValueError(f"Workload.shapes must be a sequence of tensor shapes (sequences of positive "
                         f"integers), got {shapes!r}")
    checked = []
    for i, shape in enumerate(shapes):
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__") or not len(shape):
            raise ValueError(f"Workload.shapes[{i}] must be a non-empty sequence of positive integers, got {shape!r}")
        dims = tuple(shape)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
            raise ValueError(f"Workload.shapes[{i}] must hold positive integers, got {shape!r}")
        checked.append(dims)
    if not checked:
        raise ValueError("Workload.shapes must name at least one tensor, got ()")
    return tuple(checked)


def _check_idle_cost(points: Any) -> tuple[tuple[float, float], ...]:
    if isinstance(points, (str, bytes)) or not hasattr(points, "__iter__"):
        raise ValueError(f"Workload.idle_cost must be a sequence of (idle seconds, extra seconds) pairs, "
                         f"got {points!r}")
    checked: list[tuple[float, float]] = []
    for i, pair in enumerate(points):
        try:
            idle, extra = pair
        except (TypeError, ValueError):
            raise ValueError(f"Workload.idle_cost[{i}] must be a pair (idle seconds, extra seconds), "
                             f"got {pair!r}") from None
        idle = check_positive("Workload", f"idle_cost[{i}] idle", idle)
        extra = check_float("Workload", f"idle_cost[{i}] extra", extra, low=0.0)
        if checked and idle <= checked[-1][0]:
            raise ValueError(f"Workload.idle_cost: idle times must increase, got {checked[-1][0]!r} then {idle!r}")
        checked.append((idle, extra))
    return tuple(checked)


def estimate_step_time(train_flops_per_sample: float, batch_size: int, mfu: float,
                       peak_flops: float = A100_PEAK_FLOPS) -> float:
    """Seconds for one step: training FLOPs / (peak × model-FLOPs utilisation).

    Same accounting as nanoGPT's ``estimate_mfu`` and PaLM's MFU (Chowdhery et
    al. 2022, appendix B): training FLOPs = 3 × forward FLOPs.
    """
    return train_flops_per_sample * batch_size / (peak_flops * mfu)


def _conv_layers() -> tuple[float, ...]:
    # The seed article's LeNet, corrected for 28×28 MNIST: conv 1→20 (5×5),
    # pool, conv 20→50 (5×5), pool leaves 50×4×4 = 800 features (not 4450),
    # then Linear(800, 500) and Linear(500, 10). Parameters per layer
    # (weights + biases), fp32 bytes.
    params = (20 * 1 * 5 * 5 + 20, 50 * 20 * 5 * 5 + 50, 800 * 500 + 500, 500 * 10 + 10)
    return tuple(float(FP32_BYTES * p) for p in params)


# The same LeNet's tensors (torch's layout: conv weights out × in × kh × kw, linear weights out × in).
_LENET_SHAPES = ((20, 1, 5, 5), (20,), (50, 20, 5, 5), (50,), (500, 800), (500,), (10, 500), (10,))


def _gpt2_shapes(layers: int = 12, width: int = 768, vocab: int = 50257, context: int = 1024) -> tuple:
    # GPT-2 small as nanoGPT builds it (model.py): token and position embeddings, then per block
    # ln_1, attn.c_attn (3·width × width + bias), attn.c_proj, ln_2, mlp.c_fc (4·width), mlp.c_proj,
    # and ln_f; the output layer shares the token embedding (weight tying): 124,439,808 values.
    # Linear weights in torch's (out, in) layout.
    norm = ((width,), (width,))
    block = (*norm, (3 * width, width), (3 * width,), (width, width), (width,), *norm,
             (4 * width, width), (4 * width,), (width, 4 * width), (width,))
    return ((vocab, width), (context, width), *(block * layers), *norm)


# Model FLOP utilisation assumptions: convolutional nets train far below
# tensor-core peak (batch norm and activations are memory-bound), ~10% on
# A100, in line with the ~2,600 img/s mixed-precision ResNet-50 throughput
# NVIDIA publishes for one A100 (DeepLearningExamples, ResNet50 v1.5);
# transformer pre-training reaches 35-50% (Narayanan et al. 2021, "Efficient
# Large-Scale Language Model Training on GPU Clusters", report 52% at scale).
_CNN_MFU = 0.10
_TRANSFORMER_MFU = 0.35

WORKLOAD_PRESETS: dict[str, dict] = {
    # LeNet: 431,080 parameters (counted above); 2.3 MFLOP forward per 28×28
    # image. Far too small to fill a GPU: a step is bound by ~30 kernel
    # launches at ~10 us each, so 1 ms is the reference step time.
    "lenet": dict(param_bytes=sum(_conv_layers()), layers=_conv_layers(), shapes=_LENET_SHAPES,
                  compute_time=1e-3, batch_size=64),
    # ResNet-50: 25,557,032 parameters and 4.09 GFLOPs forward per 224×224
    # image (torchvision model card, ResNet50_Weights.IMAGENET1K_V1).
    "resnet50": dict(param_bytes=25_557_032 * FP32_BYTES,
                     compute_time=estimate_step_time(3 * 4.09e9, 64, _CNN_MFU), batch_size=64),
    # VGG-16: 138,357,544 parameters and 15.47 GFLOPs forward per image
    # (torchvision model card, VGG16_Weights.IMAGENET1K_V1).
    "vgg16": dict(param_bytes=138_357_544 * FP32_BYTES,
                  compute_time=estimate_step_time(3 * 15.47e9, 64, _CNN_MFU), batch_size=64),
    # BERT-large: 336M parameters (Devlin et al. 2019 quote 340M); training
    # FLOPs 6·N per token (Kaplan et al. 2020); sequence length 128 (phase 1).
    "bert-large": dict(param_bytes=336_000_000 * FP32_BYTES,
                       compute_time=estimate_step_time(6 * 336e6 * 128, 32, _TRANSFORMER_MFU), batch_size=32),
    # GPT-2 (124M): 124,439,808 parameters (nanoGPT's count for the 124M
    # model); 6·N FLOPs per token, 1,024-token sequences.
    "gpt2": dict(param_bytes=124_439_808 * FP32_BYTES, shapes=_gpt2_shapes(),
                 compute_time=estimate_step_time(6 * 124_439_808 * 1024, 8, _TRANSFORMER_MFU), batch_size=8),
    # Llama 2 7B: 6,738,415,616 parameters (counted from its published configuration above), one 4096-token
    # sequence per worker and step (1,024 workers then make Llama 2's batch of 4M tokens, Touvron et al. 2023,
    # section 2.2), PaLM's FLOPs per token at 35 % of A100 peak; its blocks as layers, its tensors as shapes.
    "llama2-7b": dict(param_bytes=sum(llama_layers(**LLAMA2_7B)), layers=llama_layers(**LLAMA2_7B),
                      shapes=llama_shapes(**LLAMA2_7B),
                      compute_time=estimate_step_time(llama_train_flops_per_token(**LLAMA2_7B) * 4096, 1,
                                                      _TRANSFORMER_MFU),
                      batch_size=1, activation_bytes=llama_activation_bytes(**LLAMA2_7B)),
}
# One line per preset for `syncsim presets`: what it is and where its numbers come from.
WORKLOAD_NOTES: dict[str, str] = {
    "lenet": "the seed article's LeNet corrected for 28x28 MNIST (800 -> 500 -> 10), 431,080 parameters; "
             "launch-bound, 1 ms per step",
    "resnet50": "25,557,032 parameters, 4.09 GFLOPs per 224x224 image (torchvision model card); 10% of A100 peak",
    "vgg16": "138,357,544 parameters, 15.47 GFLOPs per image (torchvision model card); 10% of A100 peak",
    "bert-large": "336M parameters (Devlin et al. 2019), 6 N FLOPs per token (Kaplan et al. 2020), 128-token "
                  "sequences; 35% of A100 peak (Narayanan et al. 2021)",
    "gpt2": "124,439,808 parameters (nanoGPT's GPT-2 small), 6 N FLOPs per token, 1,024-token sequences; "
            "35% of A100 peak",
    "llama2-7b": "Llama 2 7B, 6,738,415,616 parameters from its published config (Touvron et al. 2023), one "
                 "4096-token sequence, 6N + 12LHQT FLOPs per token (PaLM, appendix B); 35% of A100 peak; "
                 "activations 19.3 GiB per sequence (Korthikanti et al. 2022's count, FlashAttention)",
}
