"""A worker rank carrying out a scheme's plan with torch: one handler per action type.

The per-step loop is ``for action in policy.plan(step, steps):
handlers[type(action)](action)``; the scheme's rules live only in its policy
(syncsim.schemes). Handlers may look at the step's other *actions* (Compute
runs its backward under DDP's ``no_sync`` when the step has no
AllReduceGradients) but never at the scheme's type.

- AllReduceGradients: DDP's bucketed, overlapped all-reduce, which runs inside
  Compute's backward (torch DDP launches each bucket from an autograd hook);
  this handler notes its span and applies the mean gradient (optimizer step).
- LocalUpdate: optimizer step on the worker's own replica.
- AverageParameters: torch's ``PeriodicModelAverager`` (period 1: the policy,
  not the averager, decides when) in fp32; in fp16/bf16 the flat parameters
  are cast, all-reduced and cast back, since torch's averager has no compression.
- Push / WaitForClock / Pull: real.pushing, over real.server.Client.
- LocalUpdate: the action's optimiser: "sgd" (the run's SGD) or "adamw"
  (torch.optim.AdamW with the run's lr and torch's defaults), each keeping its
  own state over the run.
- LowRankAllReduce (PowerSGD), SparseAllGather (top-k), OuterStep (DiLoCo):
  real.compressed.
- ReduceScatterGradients, ShardedOptimizerStep, AllGatherParameters (ZeRO,
  FSDP): real.sharded, with torch's ZeroRedundancyOptimizer or FSDP2.

Versions follow the glossary: replica schemes count all-reduce steps (PowerSGD
and top-k steps too), sharded optimiser steps, averaging rounds and outer
steps; local steps read and are applied to the version of the last sync and
are stamped with the next averaging's (or outer step's) time. PS versions are the first server's (it
writes those updates rows).
"""

from __future__ import annotations

import contextlib
import hashlib
import statistics
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.nn.parallel import DistributedDataParallel as DDP

from real.compressed import CompressedHandlers
from real.heartbeat import Quiet
from real.hooks import CountingHookState, counting_hook
from real.models import flat_params, param_layers, param_shapes, whole
from real.pushing import PushPullHandlers
from real.sharded import ShardedHandlers
from real.trace import Recorder
from real.wire import WIRE_DTYPES, value_bytes
from syncsim.schemes import (
    AllGatherParameters,
    AllReduceGradients,
    AverageParameters,
    Compute,
    LocalUpdate,
    LowRankAllReduce,
    OuterStep,
    Pull,
    Push,
    ReduceScatterGradients,
    ShardedOptimizerStep,
    SparseAllGather,
    WaitForClock,
)

__all__ = ["Executor", "checksum", "flat_params"]

# Backward takes about twice the forward (Kaplan et al. 2020; syncsim's
# DEFAULT_BACKWARD_FRACTION): a --slow rank sleeps (factor-1)·3·forward
# between forward and backward, so its buckets are also late, as on a slow GPU.
COMPUTE_PER_FORWARD = 3.0
# That forward is timed once, warm: the median of WARM_FORWARDS forwards run
# back to back at the rank's first step. A slow GPU runs its kernels factor
# times as long, but not the host's wake-up after a wait for peers (a step
# right after idling computes longer: syncsim's Workload.idle_cost), and each
# step's own forward carries that wake-up: a sleep sized from it multiplied the
# wake-up by 1 + (factor-1)·3 (the small model's slowed worker, factor 3, took
# 7.4 ms a step in a 200 Mbit/s asynchronous run where its calibration said 3.2).
WARM_FORWARDS = 5
# Timed in two processes, that median differs by a tenth or more (the larger model's warm forward: 5.5-7.0
# ms in four processes one after another here), and a calibration's slowed rank and the run it predicts
# slept 31-34 ms and 25 ms a step: a config can give the forward to size from (RunConfig.slow), as
# studies.validation gives the run the one its compute probe timed.


# LocalUpdate.optimizer -> the worker's own optimiser on (parameters, the run's lr), torch's defaults otherwise.
# "sgd" is not here: it is the run's own SGD (Executor.optimizer), which the all-reduce steps share.
LOCAL_OPTIMIZERS = {
    "adamw": lambda params, lr: torch.optim.AdamW(params, lr=lr),
}


def checksum(model: torch.nn.Module) -> str:
    return hashlib.sha256(flat_params(model).cpu().numpy().tobytes()).hexdigest()[:16]


class Executor(CompressedHandlers, ShardedHandlers, PushPullHandlers):
    def __init__(self, cfg, rank: int, model: torch.nn.Module, data, device: torch.device,
                 workers_group, recorder: Recorder, heartbeat=None, client=None):
        """``client``: the parameter-server client of a plan that pushes and pulls (real.server.Client over
        the run's process group unless one is given: the compute calibration gives one whose network
        costs nothing, real.calibration.compute_probe)."""
        self.cfg, self.rank, self.worker = cfg, rank, rank
        self.spec = cfg.spec
        self.model, self.data, self.device = model, data, device
        self.recorder = recorder
        # beats at each step and around each wait for peers (real.heartbeat), so a watchdog can
        # tell a hung rank from one waiting for it
        self.heartbeat = heartbeat or Quiet()
        self.group = workers_group
        layers = param_layers(model)
        self.param_bytes = sum(layers)
        # the model's own tensor shapes: what a low-rank compressor views as matrices
        self.shapes = param_shapes(model)
        self.policy = self.spec.policy(self.param_bytes, layers=layers, shapes=self.shapes)
        self.optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        self.wire_dtype = WIRE_DTYPES[self.spec.precision]
        self.bytes_sent = 0
        self.version = 0
        self.pending_local: list[int] = []
        self.losses: list[torch.Tensor] = []
        self.checksums: list[str] = []
        self.step = -1
        self.buckets: list[int] = []  # the last all-reduce's bucket sizes (DDP rebuilds them after step 0)
        self.completed = 0
        self.clock = 0  # completed pushes: the clock WaitForClock compares
        self.slow = cfg.slow_factor(rank)
        # the forward a --slow rank's sleep is sized from: the config's, or without one the rank's own, timed
        # warm at its first step
        self.slow_forward: float | None = cfg.slow_forward(rank)
        self.failure = cfg.failure(rank)
        actions = self.policy.actions(cfg.steps)
        kinds = {type(a) for a in actions}
        self._setup_amp(applies_locally=bool(kinds & {AllReduceGradients, LocalUpdate}))
        self._setup_ddp(actions)
        self._setup_averager(kinds)
        self._setup_client(kinds, client)
        self._setup_local_optimizers(actions)
        self._setup_compressors(actions)
        self._setup_outer(actions)
        self._setup_sharded(actions)  # last: FSDP2 replaces the model's parameters, and the optimizer with them
        self.final_checksum: str | None = None
        self.handlers = self._handlers()

    def _handlers(self) -> dict:
        """One handler per action type (docs/architecture.md, "The actions")."""
        return {
            Compute: self.compute, AllReduceGradients: self.allreduce, LocalUpdate: self.local_update,
            AverageParameters: self.average, Push: self.push, WaitForClock: self.wait, Pull: self.pull,
            LowRankAllReduce: self.low_rank, SparseAllGather: self.sparse_allgather, OuterStep: self.outer_step,
            ReduceScatterGradients: self.reduce_scatter, ShardedOptimizerStep: self.sharded_step,
            AllGatherParameters: self.gather_parameters,
        }

    def _setup_ddp(self, actions) -> None:
        """The model under DDP with the counting hook when the plan all-reduces gradients, else as it is."""
        self.net: torch.nn.Module = self.model
        self.hook_state = None
        all_reduces = [a for a in actions if isinstance(a, AllReduceGradients)]
        if not all_reduces:
            return
        # the bucket cap comes from the plan's own action, whichever scheme emitted it
        bucket = all_reduces[0].bucket_bytes
        device = self.device
        self.net = DDP(self.model, process_group=self.group, bucket_cap_mb=bucket / 2**20,
                       device_ids=[device.index] if device.type == "cuda" else None)
        # once the last bucket is launched, backward only waits for the all-reduce
        self.hook_state = CountingHookState(self.group, self.spec.precision,
                                            all_launched=lambda: self.heartbeat.beat(waiting=True))
        self.net.register_comm_hook(self.hook_state, counting_hook)

    def _setup_local_optimizers(self, actions) -> None:
        # a local optimiser other than the run's SGD (LocalUpdate.optimizer), each with its state over the run
        names = sorted({a.optimizer for a in actions if isinstance(a, LocalUpdate)} - {"sgd"})
        self.local_optimizers = {name: LOCAL_OPTIMIZERS[name](self.model.parameters(), self.cfg.lr) for name in names}

    def _setup_averager(self, kinds: set) -> None:
        self.averager = None
        if AverageParameters in kinds:
            # period 1: the policy decides when to average; torch warns that
            # period 1 every step would be pointless, which is not the case here.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                self.averager = PeriodicModelAverager(period=1, warmup_steps=0, process_group=self.group)

    def _setup_amp(self, applies_locally: bool) -> None:
        # bf16 autocast on CPU (CPU autocast's default dtype); on CUDA fp16 +
        # GradScaler, torch's AMP recipe, where this worker's optimizer applies
        # the gradient. Pushed gradients are applied by the servers, which
        # would have to undo a loss scale, so push plans autocast to bf16 (no
        # scaling needed: bf16 has fp32's exponent range).
        # A compressed gradient (PowerSGD, top-k) is not among those applied locally here either: its
        # error-feedback residual would carry a loss scale from one step into the next.
        self.scaler = None
        if not self.cfg.use_amp:
            self.autocast = contextlib.nullcontext
            return
        if self.device.type == "cuda" and not applies_locally:
            self.autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)
        elif self.device.type == "cuda":
            self.autocast = lambda: torch.autocast("cuda", dtype=torch.float16)
            self.scaler = torch.amp.GradScaler("cuda")
        else:
            self.autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)

    # -- the loop -----------------------------------------------------------------
    def run(self) -> None:
        for step in range(self.cfg.steps):
            self.run_step(step)
        if self.client is not None:
            with self.heartbeat.waiting_for_peers():
                self.client.stop()
        # every worker at once: sharded parameters are gathered for it (a collective)
        self.final_checksum = checksum(self.model)

    def run_step(self, step: int) -> None:
        """One step of the plan: what a run repeats, and what the compute calibration times."""
        self.step = step
        self.heartbeat.beat(step)
        self._maybe_fail(step)
        self.plan = plan = self.policy.plan(step, self.cfg.steps)
        self.reduce = next((a for a in plan if isinstance(a, AllReduceGradients)), None)
        for action in plan:
            self.handlers[type(action)](action)
        if self.cfg.record_checksums:
            self.checksums.append(checksum(self.model))
        self.completed += 1

    def _maybe_fail(self, step: int) -> None:
        if self.failure and step >= self.failure[0]:
            if self.failure[1] == "hang":
                while True:
                    time.sleep(3600)
            raise RuntimeError(f"injected failure (--fail {self.rank}:{self.failure[0]})")

    # -- handlers -----------------------------------------------------------------
    def compute(self, action: Compute) -> None:
        x, y = self.data.batch(self.worker, self.step, self.cfg.world, self.cfg.batch_size)
        if self.slow > 1.0 and self.slow_forward is None:
            self.slow_forward = self.warm_forward_time(x)
        if self.hook_state is not None:
            self.hook_state.reset()
            if self.reduce is not None:
                self.hook_state.defer = all(r >= 1.0 for r in self.reduce.ready)
        sync = self.reduce is not None or not isinstance(self.net, DDP)
        start = self.recorder.now()
        self.read_version = self.version
        with contextlib.nullcontext() if sync else self.net.no_sync():
            self.optimizer.zero_grad(set_to_none=True)
            with self.autocast():
                loss = F.cross_entropy(self.net(x), y)
            forward_end = self.recorder.now()
            self.forward_time = forward_end - start  # the calibration reads it too
            if self.slow_wait:
                time.sleep(self.slow_wait)
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        self.heartbeat.beat()  # back to own work (DDP's hook marked the wait for the all-reduce)
        self.backward_end = self.recorder.now()
        self.backward_time = self.backward_end - forward_end  # a slow rank's extra wait included
        self.losses.append(loss.detach())
        # With DDP the backward also waited for the all-reduce; compute ends
        # when the last gradient bucket became ready.
        end = self.backward_end
        if self.reduce is not None and self.hook_state.last_ready is not None:
            end = self.hook_state.last_ready - self.recorder.t0
        self.recorder.span(self.worker, self.step, "compute", start, end)

    @property
    def slow_wait(self) -> float:
        """A --slow rank's sleep per step, (factor - 1) x COMPUTE_PER_FORWARD x slow_forward; 0 for a rank
        not slowed (and before its first step has timed the forward)."""
        if self.slow <= 1.0 or self.slow_forward is None:
            return 0.0
        return (self.slow - 1.0) * COMPUTE_PER_FORWARD * self.slow_forward

    def warm_forward_time(self, x: torch.Tensor) -> float:
        """The median of WARM_FORWARDS forwards of this rank's model on ``x``, back to back after one
        untimed: what a --slow rank's sleep is sized from. The bare module runs them (not DDP's wrapper,
        whose forward would prepare a reduction no backward follows); their graphs are dropped."""
        times = []
        with self.autocast():
            for i in range(WARM_FORWARDS + 1):
                start = time.perf_counter()
                self.model(x)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                if i:
                    times.append(time.perf_counter() - start)
        return statistics.median(times)

    def _apply(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """One step of ``optimizer`` (the run's SGD unless given) on the gradients in ``.grad``."""
        optimizer = self.optimizer if optimizer is None else optimizer
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    def allreduce(self, action: AllReduceGradients) -> None:
        state = self.hook_state
        # Overlapped buckets start as soon as the first is ready; held ones
        # (overlap off) all start when the last is ready.
        launched = state.last_ready if state.defer else state.first_ready
        start = launched - self.recorder.t0 if launched else self.backward_end
        self.buckets = list(state.buckets)
        self.bytes_sent += state.bytes
        self._apply()
        now = self.recorder.now()
        self.recorder.span(self.worker, self.step, "allreduce", start, self.backward_end, state.bytes)
        self.recorder.update(self.worker, self.step, self.read_version, self.version, now)
        self.version += 1

    def local_update(self, action: LocalUpdate) -> None:
        # No trace row: like the optimiser step after an all-reduce, a local
        # update moves no bytes, and the simulator's trace lists only compute
        # and communication (syncsim.recorder.KINDS).
        self._apply(None if action.optimizer == "sgd" else self.local_optimizers[action.optimizer])
        self.pending_local.append(self.step)

    def average(self, action: AverageParameters) -> None:
        start = self.recorder.now()
        params = list(self.model.parameters())
        if self.wire_dtype == torch.float32:
            with self.heartbeat.waiting_for_peers():
                self.averager.average_parameters(params)
        else:
            # Round each replica to the wire format and sum; divide after, in
            # fp32, so small parameters do not underflow before the sum.
            flat = flat_params(self.model).to(self.wire_dtype)
            with self.heartbeat.waiting_for_peers():
                dist.all_reduce(flat, group=self.group)
            self._load_flat(flat.float().div_(self.cfg.world))
        nbytes = sum(p.numel() for p in params) * value_bytes(self.spec.precision)
        self.bytes_sent += nbytes
        end = self.recorder.now()
        self.recorder.span(self.worker, self.step, "average", start, end, nbytes)
        self._fold_local_steps(end)

    def _fold_local_steps(self, end: float) -> None:
        """A sync of the replicas' parameters (an average, an outer step): one new version, into which the
        local steps since the last one are folded (they read, and are applied to, the version it closes)."""
        for step in self.pending_local:
            self.recorder.update(self.worker, step, self.version, self.version, end)
        self.pending_local = []
        self.version += 1


    def _load_flat(self, flat: torch.Tensor) -> None:
        offset = 0
        with torch.no_grad():
            for p in self.model.parameters():
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def _load_slice(self, start: int, values: torch.Tensor) -> None:
        """Set the flat parameters' values [start, start + len(values)) (across tensors as they fall)."""
        stop, offset = start + values.numel(), 0
        with torch.no_grad():
            for p in self.model.parameters():
                lo, hi = max(start, offset), min(stop, offset + p.numel())
                if lo < hi:
                    p.view(-1)[lo - offset:hi - offset].copy_(values[lo - start:hi - start])
                offset += p.numel()

    # -- results ------------------------------------------------------------------
    def result(self) -> dict:
        # unfinished (a failure's report too): none where FSDP2 shards the parameters, whose gathering would
        # wait for peers that may be gone
        final = self.final_checksum if self.final_checksum or self.units else checksum(self.model)
        return {
            "rank": self.rank, "role": "worker", "steps_done": self.completed,
            "bytes_sent": self.bytes_sent,
            "final_loss": float(self.losses[-1]) if self.losses else None,
            "losses": [float(v) for v in self.losses],
            "checksum": final, "checksums": self.checksums, "buckets": self.buckets,
        }

    def state_dict(self) -> dict:
        """The worker's parameters whole (--save-params): its replica, or FSDP2's shards gathered (a collective:
        every worker calls it at once)."""
        return {name: whole(value) for name, value in self.model.state_dict().items()}
