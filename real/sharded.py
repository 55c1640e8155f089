"""The executor's handlers for sharded data parallelism (ZeRO 1-3, FSDP), carried out by torch's own tools.

A mixin of real.executor.Executor. Which tool runs a plan is read off the plan, never off the scheme's type
(docs/architecture.md): its StateLayout says where the gradients live, its AllGatherParameters actions when
the parameters are gathered.

- Gradients replicated (every worker holds the whole gradient, only the optimiser's state is sharded: ZeRO
  stage 1): torch.distributed.optim.ZeroRedundancyOptimizer, which "shards its states across ranks" and,
  "after parameters are updated locally, each rank will broadcast its parameters to all other peers"
  (its docstring). Each parameter belongs to one rank (its sorted-greedy partition), not to contiguous equal
  slices: with SGD, whose update is elementwise, the values are the same.

  - ReduceScatterGradients: the gradients of the parameters each rank owns are reduced (torch.distributed
    .reduce, a sum) to that rank, which divides them by W: every worker contributes its whole gradient and
    receives the mean of its own shard only. torch's recipe pairs the optimiser with DDP instead, whose
    all-reduce gives every rank every mean; the action says reduce-scatter, and this is one.
  - ShardedOptimizerStep: ZeroRedundancyOptimizer.step(): the rank's local optimiser steps its shard, then
    every rank broadcasts its shard (one public call does both).
  - AllGatherParameters (phase "step"): those broadcasts; its trace row is the span of that step() call
    (the local SGD step included, a small part of it) and the bytes of every parameter.

- Gradients sharded (ZeRO-2, ZeRO-3, FSDP): FSDP2's ``fully_shard`` (torch.distributed.fsdp) on a DeviceMesh
  of the workers' process group. Units: the plan's forward gather's units, each the modules whose parameters
  it holds (a unit that would split a module's parameters is refused: FSDP2 shards whole modules), or the
  whole model when the plan gathers only after the step (ZeRO-2). ``reshard_after_forward`` is given
  explicitly: True when the plan gathers again before backward (torch 2.13 keeps its root unit unsharded
  after forward only when the argument is left to its default). 16-bit precision is FSDP2's
  MixedPrecisionPolicy(param_dtype=reduce_dtype=the wire dtype): parameters gathered, computed with and
  gradients reduce-scattered in 16 bits, the sharded master and the optimiser in fp32.
  FSDP2 runs its collectives from its own module hooks; the executor hands it its collectives through the
  public ``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter`` (torch's own
  ``all_gather_single`` / ``reduce_scatter_single``, as FSDP2's defaults call them), which note each one's
  span and bytes (an all-gather the gathered bytes, a reduce-scatter its input: what the actions count).

  - AllGatherParameters "forward": the first unit's ``unshard()`` before Compute (its parameters are needed
    at once); FSDP2's pre-forward hooks gather the others (one unit ahead with ``prefetch``:
    ``set_modules_to_forward_prefetch``). "backward": FSDP2's pre-backward hooks, during Compute (with its
    default implicit prefetch one unit ahead, which has no public switch). "step": every unit's
    ``unshard()`` after the optimiser step (ZeRO-2: the next forward then gathers nothing).
  - ReduceScatterGradients: FSDP2's post-backward reduce-scatter of each unit, during Compute.
  - ShardedOptimizerStep: torch.optim.SGD on the sharded parameters (DTensors).

  Each gather and reduce-scatter action's trace row spans its collectives and carries their bytes; at the
  step's last sharded action every collective FSDP2 ran must belong to one of the step's actions, one per
  unit each, or the run stops (FSDP2 did not do what the plan says). On CPU with gloo every collective
  blocks, so prefetching changes when a gather is issued, not what it overlaps. FSDP2 pads each parameter's
  first dimension to a multiple of W (torch.chunk); its collectives then carry more than the actions count.
  At one worker FSDP2 runs no collective at all: the rows carry 0 bytes.

A sharded step makes one new version, at its optimiser step (syncsim.schemes.actions).
"""

from __future__ import annotations

import collections
import contextlib
import math

import torch
import torch.distributed as dist
from torch import nn

from real.heartbeat import OWN, mark
from real.wire import value_bytes
from syncsim.schemes import SHARDED_ACTIONS, AllGatherParameters, ReduceScatterGradients
from syncsim.schemes.policy import REPLICATED

__all__ = ["ShardedHandlers", "module_units", "CountedAllGather", "CountedReduceScatter", "zero_owners",
           "reduce_to_owners"]


def module_units(model: nn.Module, units: tuple[float, ...] | None, bytes_per_value: int) -> list[list[nn.Module]]:
    """The modules of each of a plan's units, forward order: [[model]] for one unit (or ``units`` None).

    ``units``: each unit's parameter bytes at ``bytes_per_value`` per value (AllGatherParameters.units), groups of
    consecutive parameter tensors in ``model.parameters()`` order (real.models.param_layers). A unit is the
    topmost modules owning its tensors; a module whose tensors fall in two units cannot be one FSDP unit."""
    if units is None or len(units) <= 1:
        return [[model]]
    named = list(model.named_parameters())
    groups, current, total = [], [], 0.0
    for name, param in named:
        current.append(name)
        total += param.numel() * bytes_per_value
        if len(groups) < len(units) and math.isclose(total, units[len(groups)], rel_tol=1e-9):
            groups.append(current)
            current, total = [], 0.0
        elif len(groups) >= len(units) or total > units[len(groups)]:
            raise ValueError(f"the plan's units ({len(units)}: {units}) do not fall on the model's parameter "
                             f"tensors ({[n for n, _ in named]})")
    if current or len(groups) != len(units):
        raise ValueError(f"the plan's units ({len(units)}) hold {len(groups)} groups of the model's tensors")
    modules = dict(model.named_modules())
    unit_of: dict[str, int] = {}
    for index, names in enumerate(groups):
        for name in names:
            owner = name.rpartition(".")[0]
            if owner == "":
                raise ValueError(f"parameter {name!r} belongs to the model itself, which FSDP2 wraps last (the root "
                                 f"unit): the plan's units need it in a module of its own")
            if unit_of.setdefault(owner, index) != index:
                raise ValueError(f"module {owner!r} has parameters in units {unit_of[owner]} and {index} of the "
                                 f"plan, and FSDP2's fully_shard shards whole modules: the scheme's unit size must "
                                 f"put the units' boundaries between modules")
    for owner, index in unit_of.items():  # a unit's module must not hold another unit's module
        for other, elsewhere in unit_of.items():
            if other.startswith(owner + ".") and elsewhere != index:
                raise ValueError(f"module {owner!r} (unit {index}) holds {other!r} (unit {elsewhere}): FSDP2 "
                                 f"cannot shard a module apart from a module inside it")
    result = []
    for index in range(len(groups)):
        owners = [o for o, i in unit_of.items() if i == index]
        top = [o for o in owners if not any(o.startswith(p + ".") for p in owners if p != o)]
        result.append([modules[o] for o in top])
    return result


def zero_owners(zero, params: list, group, device) -> list[tuple[int, list]]:
    """(rank, the parameters it owns) for every rank of ``group``, as ZeroRedundancyOptimizer ``zero`` over
    ``params`` partitioned them: each rank's local optimiser (the docstring's "local optimizer instance in
    each rank") holds its own, and the ranks tell each other once, at setup (a collective)."""
    local = {id(p) for g in zero.optim.param_groups for p in g["params"]}
    mine = torch.tensor([id(p) in local for p in params], dtype=torch.uint8, device=device)
    masks = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(masks, mine, group=group)
    owners = torch.stack(masks).cpu()
    if not (owners.sum(0) == 1).all():
        raise RuntimeError("ZeroRedundancyOptimizer's ranks do not each own a parameter once")
    return [(rank, [p for p, own in zip(params, owners[rank]) if own]) for rank in range(len(masks))]


def reduce_to_owners(owned: list[tuple[int, list]], group, waiting=contextlib.nullcontext) -> int:
    """ZeRO-1's reduce-scatter: each owner's parameters' gradients, flat, reduced (a sum) to that owner,
    which divides its own by W (the mean, in fp32) and puts it back in their ``.grad``; the bytes this rank
    sent. ``waiting``: the context each reduce runs in (the executor's wait for peers)."""
    sent = 0
    me, world = dist.get_rank(group), dist.get_world_size(group)
    for owner, params in owned:
        if not params:
            continue
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        with waiting():
            dist.reduce(flat, group_dst=owner, group=group)
        sent += flat.numel() * flat.element_size()
        if owner == me:
            flat.div_(world)
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
    return sent


def _own(message: str) -> ValueError:
    """A refusal of this rank's own, marked so (real.heartbeat.mark): setup runs as a wait for peers
    (real.worker), which would report it as a peer's failure."""
    refused = ValueError(message)
    mark(refused, OWN)
    return refused


class _Counted:
    """An FSDP2 custom collective (FSDPModule.set_custom_all_gather / set_custom_reduce_scatter; the interface
    of torch/distributed/fsdp/_fully_shard/_fsdp_api.py: ``allocate`` and ``__call__``, matched by duck
    typing, since the interface's classes are not exported): torch's own collective, as FSDP2's default calls
    it, with (kind, start, end, bytes) appended to ``log`` and (start, end) to ``spans``. The span is the
    call's: a gloo collective blocks until it is done; an asynchronous one (NCCL) returns at launch."""

    def __init__(self, log: list, now, heartbeat, spans) -> None:
        self.log, self.now, self.heartbeat, self.spans = log, now, heartbeat, spans

    def _note(self, kind: str, start: float, nbytes: int) -> None:
        end = self.now()
        self.log.append((kind, start, end, nbytes))
        self.spans.append((start, end))

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class CountedAllGather(_Counted):
    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        start = self.now()
        with self.heartbeat.waiting_for_peers():
            work = dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)
        # the gathered bytes: what every worker holds once it is done (AllGatherParameters.nbytes)
        self._note("allgather", start, output_tensor.numel() * output_tensor.element_size())
        return work


class CountedReduceScatter(_Counted):
    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        start = self.now()
        with self.heartbeat.waiting_for_peers():
            work = dist.reduce_scatter_single(output=output_tensor, input=input_tensor, group=group, op=op,
                                              async_op=async_op)
        # the whole gradient each worker contributes (ReduceScatterGradients.nbytes)
        self._note("reducescatter", start, input_tensor.numel() * input_tensor.element_size())
        return work


class ShardedHandlers:
    """ReduceScatterGradients, ShardedOptimizerStep and AllGatherParameters, and the torch machinery they drive."""

    def _setup_sharded(self, actions) -> None:
        self.zero = None
        self.units: list[nn.Module] = []
        self.collectives: list[tuple] = []   # FSDP2's collectives not yet claimed by an action
        # (start, end) of FSDP2's latest collective calls, each its own span (an action's trace row spans all of
        # its units', with the compute between them): what the compute probe takes off a step
        self.collective_spans: collections.deque = collections.deque(maxlen=4096)
        self._open: list = []                # this step's gather and scatter actions awaiting their collectives
        if not any(isinstance(a, SHARDED_ACTIONS) for a in actions):
            return
        gathers = [a for a in actions if isinstance(a, AllGatherParameters)]
        if self.policy.layout.gradients == REPLICATED:
            if any(a.phase != "step" for a in gathers):
                raise _own(f"{self.spec}: a plan that keeps whole gradients but gathers parameters before "
                           f"forward or backward has no torch tool here")
            self._setup_zero()
        else:
            self._setup_fsdp(gathers)

    def _setup_zero(self) -> None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        params = list(self.model.parameters())
        self.zero = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, process_group=self.group,
                                            lr=self.cfg.lr)
        self.optimizer = self.zero
        self.owned = zero_owners(self.zero, params, self.group, self.device)

    def _setup_fsdp(self, gathers) -> None:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if self.slow > 1.0 and self.slow_forward is None:
            # a slowed rank's warm forwards (Executor.warm_forward_time), timed now: under FSDP2 each forward
            # would gather, and the other ranks run no such forwards to meet it
            x, _ = self.data.batch(self.worker, 0, self.cfg.world, self.cfg.batch_size)
            self.slow_forward = self.warm_forward_time(x)
        phases = {a.phase for a in gathers}
        forward = next((a for a in gathers if a.phase == "forward"), None)
        try:
            groups = module_units(self.model, forward.units if forward else None, value_bytes(self.spec.precision))
        except ValueError as err:
            raise _own(f"{self.spec}: {err}") from None
        options = {"mesh": DeviceMesh.from_group(self.group, self.device.type),
                   "reshard_after_forward": "backward" in phases}
        if self.wire_dtype != torch.float32:
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=self.wire_dtype, reduce_dtype=self.wire_dtype)
        if groups == [[self.model]]:
            fully_shard(self.model, **options)
            self.units = [self.model]
        else:
            for modules in groups:
                fully_shard(modules if len(modules) > 1 else modules[0], **options)
            fully_shard(self.model, **options)  # the root: no parameters of its own left
            self.units = [modules[0] for modules in groups]
        for unit in self.units:
            sinks = (self.collectives, self.recorder.now, self.heartbeat, self.collective_spans)
            unit.set_custom_all_gather(CountedAllGather(*sinks))
            unit.set_custom_reduce_scatter(CountedReduceScatter(*sinks))
        if forward is not None and forward.prefetch:
            for unit, following in zip(self.units, self.units[1:]):
                unit.set_modules_to_forward_prefetch([following])
        # on the sharded parameters (DTensors), which model.parameters() lists only while they are resharded
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.cfg.lr)
        if forward is None:
            # gathered only after each step (ZeRO-2): the first step computes on the replicas every worker
            # starts with, so they are gathered once now, before the run's clock starts, as DDP broadcasts
            for unit in self.units:
                unit.unshard()
            self.collectives.clear()
        # collectives per gather or scatter action: one per unit, none at one worker (FSDP2 skips them)
        self.per_action = len(self.units) if dist.get_world_size(self.group) > 1 else 0

    # -- handlers -----------------------------------------------------------------------------
    def reduce_scatter(self, action: ReduceScatterGradients) -> None:
        if self.zero is None:
            return self._claim(action)
        start = self.recorder.now()
        sent = reduce_to_owners(self.owned, self.group, self.heartbeat.waiting_for_peers)
        self._row("reducescatter", [("reducescatter", start, self.recorder.now(), sent)])

    def sharded_step(self, action) -> None:
        start = self.recorder.now()
        self._apply()  # ZeroRedundancyOptimizer.step() (its broadcasts too), or SGD on FSDP2's shards
        end = self.recorder.now()
        self.stepped = (start, end)
        self.recorder.update(self.worker, self.step, self.read_version, self.version, end)
        self.version += 1
        self._settle(action)

    def gather_parameters(self, action: AllGatherParameters) -> None:
        if self.zero is not None:  # phase "step": the broadcasts ZeroRedundancyOptimizer.step() made
            nbytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
            self._row("allgather", [("allgather", *self.stepped, nbytes)])
            return
        if action.phase == "forward":
            self.units[0].unshard()
        elif action.phase == "step":
            for unit in self.units:
                unit.unshard()
        self._claim(action)

    # -- FSDP2's collectives, claimed by the plan's actions ---------------------------------------
    def _claim(self, action) -> None:
        self._open.append(action)
        self._settle(action)

    def _settle(self, action) -> None:
        """Give each open action, in plan order, the first ``per_action`` logged collectives of its kind; at the
        step's last sharded action none may be left over on either side."""
        still = []
        for waiting in self._open:
            kind = waiting.kind
            have = [entry for entry in self.collectives if entry[0] == kind]
            if any(a.kind == kind for a in still) or len(have) < self.per_action:
                still.append(waiting)
                continue
            mine = have[:self.per_action]
            self.collectives[:] = [entry for entry in self.collectives if not any(entry is m for m in mine)]
            self._row(kind, mine)
        self._open = still
        if action is [a for a in self.plan if isinstance(a, SHARDED_ACTIONS)][-1] and (self._open or self.collectives):
            raise RuntimeError(f"{self.spec}: at step {self.step} FSDP2 ran {[e[0] for e in self.collectives]} "
                               f"beyond the plan's actions, or not those of {[a.kind for a in self._open]} "
                               f"({self.per_action} per action expected)")

    def _row(self, kind: str, entries: list[tuple]) -> None:
        now = self.recorder.now()
        start = min((e[1] for e in entries), default=now)
        end = max((e[2] for e in entries), default=now)
        nbytes = sum(e[3] for e in entries)
        self.bytes_sent += nbytes
        self.recorder.span(self.worker, self.step, kind, start, end, nbytes)
