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

from syncsim.config import check_choice, check_float, check_int
from syncsim.schemes import Pull, Push, WaitForClock, parse

__all__ = ["RunConfig", "MODELS", "DATA", "parser"]

MODELS = ("lenet", "mlp", "mlp-large")
DATA = ("synthetic", "digits")
BACKENDS = ("gloo", "nccl")
DEVICES = ("cpu", "cuda")
FAIL_MODES = ("crash", "hang")
# Actions that talk to parameter-server ranks: a plan containing any of them needs servers.
SERVER_ACTIONS = (Push, WaitForClock, Pull)


def _pairs(owner: str, text: str | tuple, kinds: tuple) -> tuple:
    """``"1:2.5,3:4"`` -> ((1, 2.5), (3, 4)) with each field converted by ``kinds``."""
    if isinstance(text, tuple):
        return text
    items = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        pieces = part.split(":")
        need = len(kinds) - (1 if kinds[-1] is str else 0)
        if not need <= len(pieces) <= len(kinds):
            raise ValueError(f"RunConfig.{owner} must look like {_FORMS[owner]}, got {part!r}")
        try:
            items.append(tuple(kind(p) for kind, p in zip(kinds, pieces)))
        except ValueError:
            raise ValueError(f"RunConfig.{owner} must look like {_FORMS[owner]}, got {part!r}") from None
    return tuple(items)


_FORMS = {"slow": "RANK:FACTOR (e.g. 1:3)", "fail": "RANK:STEP[:crash|hang] (e.g. 1:5)"}


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
    backend: str = "gloo"
    device: str = "cpu"
    seed: int = 0
    out: str = "results/real"
    slow: tuple = ()
    """((rank, factor), ...): that rank computes ``factor`` times slower."""
    fail: tuple = ()
    """((rank, step[, "crash"|"hang"]), ...): that rank dies (or hangs) when it reaches ``step``."""
    amp: bool = False
    """Forward/backward under autocast (also switched on by ``amp=true`` in the scheme)."""
    timeout: float = 30.0
    """Process-group timeout in seconds: a hung peer ends the run after about this long."""
    record_checksums: bool = False
    """Store every worker's parameter checksum after every step (tests use it; costs a hash per step)."""
    save_params: bool = False
    """Save each worker's final parameters as params-rank<R>.pt in ``out``."""

    def __post_init__(self) -> None:
        owner = "RunConfig"
        try:
            spec = parse(self.scheme)
        except ValueError as err:
            raise ValueError(f"RunConfig.scheme: {err}") from None
        object.__setattr__(self, "scheme", str(spec))
        object.__setattr__(self, "world", check_int(owner, "world", self.world, 1))
        object.__setattr__(self, "servers", check_int(owner, "servers", self.servers, 0))
        check_choice(owner, "model", self.model, MODELS)
        check_choice(owner, "data", self.data, DATA)
        object.__setattr__(self, "steps", check_int(owner, "steps", self.steps, 1))
        object.__setattr__(self, "batch_size", check_int(owner, "batch_size", self.batch_size, 1))
        object.__setattr__(self, "lr", check_float(owner, "lr", self.lr, low=0.0, low_open=True))
        object.__setattr__(self, "seed", check_int(owner, "seed", self.seed, 0))
        object.__setattr__(self, "timeout", check_float(owner, "timeout", self.timeout, low=1.0))
        check_choice(owner, "backend", self.backend, BACKENDS)
        check_choice(owner, "device", self.device, DEVICES)
        # Which topology the scheme needs is read off its plan (the actions it
        # emits), not off its type: see DESIGN.md, "the one rule".
        needs_servers = any(isinstance(a, SERVER_ACTIONS) for a in self.actions)
        if needs_servers and self.servers < 1:
            raise ValueError(f"RunConfig.servers: scheme {self.scheme!r} pushes to parameter servers; "
                             f"give --servers K with K >= 1 (got {self.servers})")
        if not needs_servers and self.servers:
            raise ValueError(f"RunConfig.servers: scheme {self.scheme!r} uses no parameter servers; "
                             f"drop --servers (got {self.servers})")
        if self.device == "cuda" or self.backend == "nccl":
            import torch

            if not torch.cuda.is_available():
                raise ValueError(f"RunConfig.backend/device: {self.backend}/{self.device} needs CUDA, "
                                 "and torch.cuda.is_available() is False here; use --backend gloo --device cpu")
        if self.backend == "nccl" and self.device != "cuda":
            raise ValueError("RunConfig.backend: nccl moves CUDA tensors only; add --device cuda")
        slow = _pairs("slow", self.slow, (int, float))
        fail = _pairs("fail", self.fail, (int, int, str))
        for rank, factor in slow:
            self._check_rank("slow", rank)
            check_float(owner, f"slow[{rank}]", factor, low=1.0)
        for item in fail:
            self._check_rank("fail", item[0])
            check_int(owner, f"fail[{item[0]}].step", item[1], 0)
            if item[1] >= self.steps:
                raise ValueError(f"RunConfig.fail: step {item[1]} is past the last step ({self.steps - 1})")
            if len(item) > 2:
                check_choice(owner, "fail mode", item[2], FAIL_MODES)
        object.__setattr__(self, "slow", slow)
        object.__setattr__(self, "fail", fail)
        if not isinstance(self.amp, bool):
            raise ValueError(f"RunConfig.amp must be true or false, got {self.amp!r}")

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
        return frozenset(a for plan in self.spec.policy(4.0).plans(self.steps) for a in plan)

    @property
    def use_amp(self) -> bool:
        return self.amp or self.spec.amp

    def slow_factor(self, rank: int) -> float:
        return dict(self.slow).get(rank, 1.0)

    def failure(self, rank: int) -> tuple[int, str] | None:
        for item in self.fail:
            if item[0] == rank:
                return item[1], (item[2] if len(item) > 2 else "crash")
        return None

    # -- command line -------------------------------------------------------------
    @classmethod
    def from_argv(cls, argv: list[str] | None = None) -> RunConfig:
        args = vars(parser().parse_args(argv))
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


def parser() -> argparse.ArgumentParser:
    d = RunConfig()
    p = argparse.ArgumentParser(description="Run a syncsim scheme for real with torch.distributed.")
    p.add_argument("--scheme", default=d.scheme, help='scheme spec, e.g. "allreduce:precision=fp16", '
                   '"ps:staleness=2", "localsgd:period=4,warmup_steps=2"')
    p.add_argument("--world", type=int, default=d.world, help="worker ranks")
    p.add_argument("--servers", type=int, default=d.servers, help="parameter-server ranks (ps schemes)")
    p.add_argument("--model", default=d.model, help=f"one of {', '.join(MODELS)}")
    p.add_argument("--data", default=d.data, help=f"one of {', '.join(DATA)}")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--backend", default=d.backend, help="gloo or nccl")
    p.add_argument("--device", default=d.device, help="cpu or cuda")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default=d.out, help="output folder")
    p.add_argument("--slow", default="", help="RANK:FACTOR[,...] make a rank compute FACTOR times slower")
    p.add_argument("--fail", default="", help="RANK:STEP[:crash|hang][,...] kill (or hang) a rank at a step")
    p.add_argument("--amp", action="store_true", help="autocast forward/backward (bf16 on CPU, fp16 on CUDA)")
    p.add_argument("--timeout", type=float, default=d.timeout, help="process-group timeout, seconds")
    p.add_argument("--record-checksums", action="store_true", help="checksum parameters after every step")
    p.add_argument("--save-params", action="store_true", help="save final parameters per worker")
    return p
