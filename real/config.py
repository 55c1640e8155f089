"""The options of one real run, validated before any process starts.

Following torchtitan's job config: one dataclass, field docs, ``__post_init__``
checks that name the field, the value and what is allowed. ``python -m
real.run`` and ``python -m real.worker`` parse the same command line into it,
so a bad option fails in the launcher (before ranks start) and the ranks see
exactly the launcher's options (``to_argv`` writes them back).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from functools import cached_property
from typing import NamedTuple

from syncsim.arguments import ArgumentParser, integer, number
from syncsim.config import check_bool, check_choice, check_float, check_int
from syncsim.files import check_out_dir
from syncsim.limits import MAX_GPUS, RUN_BYTES_PER_RANK_STEP, check_memory
from syncsim.schemes import parse

__all__ = ["RunConfig", "Slowdown", "Failure", "MODELS", "DATA", "parser", "needs_servers"]

MODELS = ("lenet", "mlp", "mlp-large")
DATA = ("synthetic", "digits")
BACKENDS = ("gloo", "nccl")
DEVICES = ("cpu", "cuda")
FAIL_MODES = ("crash", "hang")
MAX_TIMEOUT = 86400.0  # seconds: --timeout at most a day
MAX_SLOW = 1000.0  # --slow factor: a rank 1000 times slower is already a hung one
MAX_FORWARD = 60.0  # --slow's FORWARD, seconds
MAX_SEED = 2**63 - 1  # torch.manual_seed takes a 64-bit seed
# What one sample costs a rank at most (input, activations and their gradients, for the models
# in real.models: LeNet's 28x28 input makes about 20k activations): 256 KiB is a generous bound.
SAMPLE_BYTES = 256 * 2**10


class Slowdown(NamedTuple):
    """One ``--slow`` entry, RANK:FACTOR[:FORWARD] (RunConfig.slow)."""

    rank: int
    factor: float
    forward: float | None = None
    """Seconds of the forward the rank's sleep is sized from; None: its own forward, timed warm."""


class Failure(NamedTuple):
    """One ``--fail`` entry, RANK:STEP[:crash|hang] (RunConfig.fail)."""

    rank: int
    step: int
    mode: str = "crash"


def needs_servers(scheme, steps: int = 2) -> bool:
    """Whether ``scheme`` (a spec string or a parsed Scheme) talks to parameter-server ranks
    (syncsim.schemes.Policy.needs_servers). Which actions occur does not depend on the model's size,
    so a nominal size stands in for it."""
    spec = parse(scheme) if isinstance(scheme, str) else scheme
    return spec.policy(4.0).needs_servers(steps)


def _pairs(owner: str, value: str | tuple | list, kinds: tuple, need: int) -> tuple:
    """``"1:2.5,3:4"`` (or ((1, 2.5), (3, 4))) -> ((1, 2.5), (3, 4)), each field checked by ``kinds``;
    each item has at least ``need`` fields (the rest are optional).

    The text form is exactly ITEM[,ITEM...] with ASCII numbers: no empty item, no stray comma.
    """
    form = f"RunConfig.{owner} must look like {_FORMS[owner]}"
    if isinstance(value, str):
        raw = [tuple(part.strip().split(":")) for part in value.split(",")] if value.strip() else []
    elif isinstance(value, (tuple, list)):
        raw = [tuple(item) if isinstance(item, (tuple, list)) else (item,) for item in value]
    else:
        raise ValueError(f"{form}, got {value!r}")
    items = []
    for pieces in raw:
        if not need <= len(pieces) <= len(kinds):
            raise ValueError(f"{form}, got {':'.join(map(str, pieces))!r}")
        try:
            items.append(tuple(kind(p) for kind, p in zip(kinds, pieces)))
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            raise ValueError(f"{form}, got {':'.join(map(str, pieces))!r}") from None
    return tuple(items)


def _as_int(value: object) -> int:
    return integer(value) if isinstance(value, str) else check_int("RunConfig", "rank or step", value, 0)


def _as_float(value: object) -> float:
    return number(value) if isinstance(value, str) else check_float("RunConfig", "factor", value)


def _one_entry_per_rank(owner: str, entries: tuple, given: tuple, verb: str) -> None:
    """Refuse a rank given twice in ``--slow`` or ``--fail``: it would follow one entry and silently drop the
    other (a rank is slowed by one factor and fails once). ``given``: the entries as given, for the message."""
    if len({entry.rank for entry in entries}) < len(entries):
        raise ValueError(f"RunConfig.{owner}: a rank is {verb} twice in {given!r}; give each rank once")


_FORMS = {"slow": "RANK:FACTOR[:FORWARD] (e.g. 1:3, or 1:3:0.005)", "fail": "RANK:STEP[:crash|hang] (e.g. 1:5)"}


@dataclass(frozen=True)
class RunConfig:
    scheme: str = "allreduce"
    """Scheme spec in syncsim's grammar, e.g. "ps:staleness=2" (see syncsim.schemes.parse)."""
    world: int = 2
    """Worker ranks (they compute gradients)."""
    servers: int = 0
    """Parameter-server ranks; ranks world..world+servers-1. Only for schemes that push/pull."""
    model: str = "lenet"
    data: str = "synthetic"
    steps: int = 20
    """Steps per worker."""
    batch_size: int = 32
    """Samples per worker per step."""
    lr: float = 0.05
    """Learning rate of the workers' optimiser: plain SGD, or AdamW (torch's defaults otherwise) where the
    scheme's local steps say so (``diloco``'s ``inner=adamw``); the servers' SGD."""
    backend: str = "gloo"
    device: str = "cpu"
    seed: int = 0
    out: str = "results/real"
    slow: tuple = ()
    """((rank, factor[, forward]), ...): that rank computes ``factor`` times slower. After each forward it
    sleeps (factor - 1) x real.executor.COMPUTE_PER_FORWARD x ``forward`` seconds; without ``forward`` the
    rank times its own forward, warm, at its first step. A calibration that timed the slowed rank gives
    the forward it used, so that the run it predicts sleeps exactly as long (real.calibration.compute_probe).
    Read by name as ``slowdowns`` (Slowdown records)."""
    fail: tuple = ()
    """((rank, step[, "crash"|"hang"]), ...): that rank dies (or hangs) when it reaches ``step``. Read by name
    as ``failures`` (Failure records)."""
    amp: bool = False
    """Forward/backward under autocast (also switched on by ``amp=true`` in the scheme)."""
    timeout: float = 30.0
    """Process-group timeout in seconds: a hung peer ends the run after about this long."""
    record_checksums: bool = False
    """Store every worker's parameter checksum after every step (tests use it; costs a hash per step)."""
    save_params: bool = False
    """Save each worker's final parameters (state dict), and each server's final shard (flat fp32), as
    ``ranks/params-rank<R>.pt`` in ``out``."""

    def __post_init__(self) -> None:
        owner = "RunConfig"
        try:
            spec = parse(self.scheme)
        except ValueError as err:
            raise ValueError(f"RunConfig.scheme: {err}") from None
        object.__setattr__(self, "scheme", str(spec))
        object.__setattr__(self, "world", check_int(owner, "world", self.world, 1, MAX_GPUS))
        object.__setattr__(self, "servers", check_int(owner, "servers", self.servers, 0, MAX_GPUS))
        check_choice(owner, "model", self.model, MODELS)
        check_choice(owner, "data", self.data, DATA)
        object.__setattr__(self, "steps", check_int(owner, "steps", self.steps, 1))
        check_memory("RunConfig.steps", self.steps, "steps of one rank", RUN_BYTES_PER_RANK_STEP, "lower --steps")
        object.__setattr__(self, "batch_size", check_int(owner, "batch_size", self.batch_size, 1))
        check_memory("RunConfig.batch_size", self.batch_size, "samples in a batch", SAMPLE_BYTES, "lower --batch-size")
        object.__setattr__(self, "lr", check_float(owner, "lr", self.lr, low=0.0, low_open=True))
        object.__setattr__(self, "seed", check_int(owner, "seed", self.seed, 0, MAX_SEED))
        # a day is far beyond any wait of a healthy run; timedelta overflows past 10^9 days
        object.__setattr__(self, "timeout", check_float(owner, "timeout", self.timeout, low=1.0, high=MAX_TIMEOUT))
        check_choice(owner, "backend", self.backend, BACKENDS)
        check_choice(owner, "device", self.device, DEVICES)
        self._check_servers()
        self._check_sharded()
        self._check_backend()
        # stored as given (2 or 3 fields an entry), the form to_argv writes and summary.json records
        object.__setattr__(self, "slow", _pairs("slow", self.slow, (_as_int, _as_float, _as_float), need=2))
        object.__setattr__(self, "fail", _pairs("fail", self.fail, (_as_int, _as_int, str), need=2))
        self._check_slowdowns()
        self._check_failures()
        object.__setattr__(self, "amp", check_bool(owner, "amp", self.amp))
        for flag in ("record_checksums", "save_params"):
            object.__setattr__(self, flag, check_bool(owner, flag, getattr(self, flag)))
        # last: the one check that touches the file system, once every other option is known good
        check_out_dir(self.out, "RunConfig.out")

    def _check_servers(self) -> None:
        pushes = needs_servers(self.spec, self.steps)
        if pushes and self.servers < 1:
            raise ValueError(f"RunConfig.servers: scheme {self.scheme!r} pushes to parameter servers; "
                             f"give --servers K with K >= 1 (got {self.servers})")
        if not pushes and self.servers:
            raise ValueError(f"RunConfig.servers: scheme {self.scheme!r} uses no parameter servers; "
                             f"drop --servers (got {self.servers})")

    def _check_backend(self) -> None:
        if self.device == "cuda" or self.backend == "nccl":
            import torch

            if not torch.cuda.is_available():
                raise ValueError(f"RunConfig.backend/device: {self.backend}/{self.device} needs CUDA, "
                                 "and torch.cuda.is_available() is False here; use --backend gloo --device cpu")
        if self.backend == "nccl" and self.device != "cuda":
            raise ValueError("RunConfig.backend: nccl moves CUDA tensors only; add --device cuda")

    def _check_slowdowns(self) -> None:
        for entry in self.slowdowns:
            rank = entry.rank
            self._check_rank("slow", rank)
            check_float("RunConfig", f"slow[{rank}]", entry.factor, low=1.0, high=MAX_SLOW)
            if entry.forward is not None and rank >= self.world:
                raise ValueError(f"RunConfig.slow[{rank}]: rank {rank} is a server, which runs no forward to size "
                                 f"its sleep from (a slowed server takes FACTOR times its work); give RANK:FACTOR")
            if entry.forward is not None:  # a forward pass of over a minute is no straggler's sleep to emulate
                check_float("RunConfig", f"slow[{rank}].forward", entry.forward, low=0.0, high=MAX_FORWARD)
        _one_entry_per_rank("slow", self.slowdowns, self.slow, "slowed")

    def _check_failures(self) -> None:
        for entry in self.failures:
            self._check_rank("fail", entry.rank)
            check_int("RunConfig", f"fail[{entry.rank}].step", entry.step, 0)
            if entry.step >= self.steps:
                raise ValueError(f"RunConfig.fail: step {entry.step} is past the last step ({self.steps - 1})")
            check_choice("RunConfig", "fail mode", entry.mode, FAIL_MODES)
        _one_entry_per_rank("fail", self.failures, self.fail, "named")

    def _check_sharded(self) -> None:
        """What real.sharded does not run, refused before any rank starts (docs/memory.md, "Running sharded
        schemes for real"); read off the plan and its StateLayout, as the executor chooses its tool."""
        from syncsim.schemes import SHARDED_ACTIONS
        from syncsim.schemes.policy import REPLICATED

        policy = self.spec.policy(4.0)
        if not any(issubclass(kind, SHARDED_ACTIONS) for kind in policy.action_types(self.steps)):
            return
        if self.use_amp:
            raise ValueError(f"RunConfig.amp: scheme {self.scheme!r} shards its state, and its precision is already "
                             f"the working precision of its parameters and gradients (for FSDP2, its "
                             f"MixedPrecisionPolicy); autocast over it is not run: drop --amp and amp=true, and "
                             f"give precision=bf16 for 16-bit compute")
        if policy.layout.gradients == REPLICATED and self.spec.precision != "fp32":
            raise ValueError(f"RunConfig.scheme: {self.scheme!r} keeps whole gradients and shards the optimiser's "
                             f"state (ZeRO stage 1): it runs on torch's ZeroRedundancyOptimizer, which steps and "
                             f"broadcasts each parameter in the one dtype the model holds it in: it keeps "
                             f"no fp32 master beside a {self.spec.precision} working copy, so {self.spec.precision} "
                             f"mixed precision is not run; use precision=fp32, or zero:stage=2 (FSDP2 runs it)")

    def _check_rank(self, name: str, rank: int) -> None:
        if not 0 <= rank < self.ranks:
            raise ValueError(f"RunConfig.{name}: rank {rank} is not one of the {self.ranks} ranks "
                             f"(0..{self.ranks - 1}: {self.world} workers then {self.servers} servers)")

    # -- derived ------------------------------------------------------------------
    @property
    def ranks(self) -> int:
        return self.world + self.servers

    @cached_property
    def spec(self):
        return parse(self.scheme)

    @cached_property
    def actions(self) -> frozenset:
        """Every action the scheme's plan emits over the run; which actions occur does not depend
        on the model's size, so a nominal size stands in for it."""
        return frozenset(self.spec.policy(4.0).actions(self.steps))

    @property
    def use_amp(self) -> bool:
        return self.amp or self.spec.amp

    @cached_property
    def slowdowns(self) -> tuple[Slowdown, ...]:
        """``slow``'s entries by name."""
        return tuple(Slowdown(*entry) for entry in self.slow)

    @cached_property
    def failures(self) -> tuple[Failure, ...]:
        """``fail``'s entries by name."""
        return tuple(Failure(*entry) for entry in self.fail)

    def slow_factor(self, rank: int) -> float:
        return next((entry.factor for entry in self.slowdowns if entry.rank == rank), 1.0)

    def slow_forward(self, rank: int) -> float | None:
        """The forward time (seconds) ``rank``'s sleep is sized from, when the config gives it."""
        return next((entry.forward for entry in self.slowdowns if entry.rank == rank), None)

    def failure(self, rank: int) -> tuple[int, str] | None:
        """(step, mode) at which ``rank`` fails, or None."""
        return next(((entry.step, entry.mode) for entry in self.failures if entry.rank == rank), None)

    # -- command line -------------------------------------------------------------
    @classmethod
    def from_argv(cls, argv: list[str] | None = None, prog: str = "python -m real.run") -> RunConfig:
        args = vars(parser(prog).parse_args(argv))
        return cls(**args)

    def to_argv(self) -> list[str]:
        argv = []
        for f in fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                if value:
                    argv.append(flag)
            elif f.name in ("slow", "fail"):
                if value:
                    argv += [flag, ",".join(":".join(map(str, item)) for item in value)]
            else:
                argv += [flag, str(value)]
        return argv


def parser(prog: str = "python -m real.run") -> argparse.ArgumentParser:
    # the defaults, read off the fields: RunConfig() itself would check the default output folder
    d = argparse.Namespace(**{f.name: f.default for f in fields(RunConfig)})
    p = ArgumentParser(prog=prog, description="Run a syncsim scheme for real with torch.distributed.")
    p.add_argument("--scheme", default=d.scheme, help='scheme spec, e.g. "allreduce:precision=fp16", '
                   '"ps:staleness=2", "localsgd:period=4,warmup_steps=2", "allreduce:compression=powersgd,rank=2", '
                   '"topk:ratio=0.01", "diloco:period=8,fragments=2"')
    p.add_argument("--world", type=integer, default=d.world, help="worker ranks")
    p.add_argument("--servers", type=integer, default=d.servers, help="parameter-server ranks (ps schemes)")
    p.add_argument("--model", default=d.model, help=f"one of {', '.join(MODELS)}")
    p.add_argument("--data", default=d.data, help=f"one of {', '.join(DATA)}")
    p.add_argument("--steps", type=integer, default=d.steps)
    p.add_argument("--batch-size", type=integer, default=d.batch_size)
    p.add_argument("--lr", type=number, default=d.lr, help="learning rate (SGD, or the scheme's AdamW local steps)")
    p.add_argument("--backend", default=d.backend, help="gloo or nccl")
    p.add_argument("--device", default=d.device, help="cpu or cuda")
    p.add_argument("--seed", type=integer, default=d.seed)
    p.add_argument("--out", default=d.out, help="output folder")
    p.add_argument("--slow", default="", help="RANK:FACTOR[:FORWARD][,...] make a rank compute FACTOR times "
                   "slower (its sleep sized from FORWARD seconds, or from its own forward timed warm)")
    p.add_argument("--fail", default="", help="RANK:STEP[:crash|hang][,...] kill (or hang) a rank at a step")
    p.add_argument("--amp", action="store_true", help="autocast forward/backward (bf16 on CPU, fp16 on CUDA)")
    p.add_argument("--timeout", type=number, default=d.timeout, help="process-group timeout, seconds")
    p.add_argument("--record-checksums", action="store_true", help="checksum parameters after every step")
    p.add_argument("--save-params", action="store_true", help="save final parameters per worker (and shard per server)")
    return p
