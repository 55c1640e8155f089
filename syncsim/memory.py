"""Bytes per GPU: the training state a worker keeps, its buffers at the peak, and its activations.

Read off the scheme's policy (``Policy.layout``, a ``StateLayout``), never off the scheme's type. With Ψ the
model's parameters (``Workload.params``), W workers and v the working precision's bytes per value
(``StateLayout.value_bytes``: the scheme's precision for ZeRO and FSDP, whose gathers carry the parameters
the workers compute with; fp32 for schemes that only cast what crosses the wire):

- parameters: v·Ψ, or v·Ψ/W when sharded;
- gradients: v·Ψ, or v·Ψ/W when sharded;
- optimiser state: K·Ψ, or K·Ψ/W when sharded, or none on the workers (a parameter server's); Adam's two
  moments in fp32 (8 bytes per parameter; Kingma & Ba 2015) and, when v is 16-bit, an fp32 master copy
  (4 more; Micikevicius et al. 2018, "Mixed Precision Training"): K = 12 in mixed precision, ZeRO's K
  (Rajbhandari et al. 2020, section 3.1), 8 in fp32. Adam is assumed whatever optimiser the replay runs:
  it is what large models are trained with, and what ZeRO's memory table counts;
- other per-worker state (``StateLayout.extra_bytes`` per parameter: an error-feedback residual, DiLoCo's
  outer copy and its momentum);
- transient buffers at the peak (``StateLayout.transient``: the units gathered at once, a unit's gradient
  awaiting its reduce-scatter);
- activations: ``Workload.activation_bytes`` × ``batch_size`` (held at the end of the forward pass), or
  unknown when the workload does not give them.

So ZeRO's table (section 5.1, figure 1, mixed precision, v = 2): stage 1 4Ψ + 12Ψ/W, stage 2 2Ψ + 14Ψ/W,
stage 3 16Ψ/W; plain data parallelism 16Ψ. The peak adds the transient buffers and the activations at
once, an upper bound by at most one unit's activations (the backward frees them as it goes). Left out: the
CUDA context, the allocator's fragmentation, communication buffers (NCCL's), DDP's bucket copies of the
gradients (``gradient_as_bucket_view=False``), and activation checkpointing.

``simulate`` flags, and does not refuse, a configuration that does not fit: ``SimResult.memory.fits`` is
False when the peak (even without activations) exceeds ``Cluster.gpu_memory``, True when the full peak
fits, None when it cannot tell (no GPU memory given, or activations unknown and the rest fits). A study
over many configurations then still runs, and says which would not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from syncsim.schemes.policy import ON_SERVERS, SHARDED, StateLayout

__all__ = ["Memory", "estimate", "state_bytes", "ADAM_STATE_BYTES", "MASTER_BYTES", "optimizer_bytes"]

ADAM_STATE_BYTES = 8
"""Adam's first and second moments, fp32 each, per parameter."""
MASTER_BYTES = 4
"""The fp32 master copy of a parameter whose working copy is 16-bit (mixed precision)."""


def optimizer_bytes(value_bytes: int) -> int:
    """K: optimiser-state bytes per parameter, Adam's moments and, below 32-bit work, the fp32 master copy."""
    return ADAM_STATE_BYTES + (MASTER_BYTES if value_bytes < 4 else 0)


def state_bytes(layout: StateLayout, params: float, workers: int) -> tuple[float, float, float, float]:
    """(parameters, gradients, optimiser state, other) bytes per worker of ``params`` parameters over
    ``workers`` workers."""
    v = layout.value_bytes

    def share(where: str) -> float:
        return params / workers if where == SHARDED else params

    optimizer = 0.0 if layout.optimizer == ON_SERVERS else optimizer_bytes(v) * share(layout.optimizer)
    return v * share(layout.parameters), v * share(layout.gradients), optimizer, layout.extra_bytes * params


@dataclass(frozen=True)
class Memory:
    """One worker's memory, bytes: its state, its buffers at the peak, its activations (None: unknown)."""

    parameters: float
    gradients: float
    optimizer: float
    other: float
    transient: float
    activations: float | None
    capacity: float | None
    """The GPU's memory (``Cluster.gpu_memory``), None when not given."""

    @property
    def state(self) -> float:
        """Parameters, gradients, optimiser state and other state: what the worker keeps between steps."""
        return self.parameters + self.gradients + self.optimizer + self.other

    @property
    def peak(self) -> float:
        """State, transient buffers and activations together; without activations when they are unknown (then a
        lower bound)."""
        return self.state + self.transient + (self.activations or 0.0)

    @property
    def complete(self) -> bool:
        """Whether the activations are counted (the peak is then not merely a lower bound)."""
        return self.activations is not None

    @property
    def fits(self) -> bool | None:
        """False: the peak exceeds the GPU's memory; True: the whole peak fits; None: cannot tell."""
        if self.capacity is None:
            return None
        if self.peak > self.capacity:
            return False
        return True if self.complete else None

    def describe(self) -> str:
        """One line: the peak, the GPU's memory and the verdict, then the parts."""
        gib = 2.0**30
        parts = [f"params {self.parameters / gib:.2f}", f"grads {self.gradients / gib:.2f}",
                 f"optimizer {self.optimizer / gib:.2f}"]
        if self.other:
            parts.append(f"other {self.other / gib:.2f}")
        if self.transient:
            parts.append(f"buffers {self.transient / gib:.2f}")
        if self.complete:
            parts.append(f"activations {self.activations / gib:.2f}")  # type: ignore[operator]
        head = f"{self.peak / gib:.2f} GiB" + ("" if self.complete else " + activations (not given)")
        if self.capacity is not None:
            left = (self.capacity - self.peak) / gib
            verdict = {True: "fits", False: "DOES NOT FIT", None: f"{left:.2f} GiB left for them"}[self.fits]
            head += f" of {self.capacity / gib:.2f} GiB: {verdict}"
        return f"{head} ({' + '.join(parts)} GiB)"


def estimate(cluster, workload, scheme) -> Memory:
    """The memory one worker of ``scheme`` training ``workload`` on ``cluster`` needs at its peak."""
    from syncsim.schemes import parse

    scheme = parse(scheme)
    layout = scheme.policy(workload.param_bytes, workload.layers, workload.backward_fraction,
                           workload.shapes).layout
    parameters, gradients, optimizer, other = state_bytes(layout, workload.params, cluster.gpus)
    activations = (None if workload.activation_bytes is None
                   else float(workload.activation_bytes) * workload.batch_size)
    return Memory(parameters=parameters, gradients=gradients, optimizer=optimizer, other=other,
                  transient=float(layout.transient), activations=activations, capacity=cluster.gpu_memory)
