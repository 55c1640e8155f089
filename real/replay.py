"""Replay a real run's update log with syncsim.convergence, on the model and data the run trained.

The real executor and the replay carry out the same plans with the same
semantics (syncsim.schemes.actions), so a run's ``updates.csv`` — which version
each gradient read and was applied to — replayed by ``syncsim.convergence`` on
the same model, initial weights, data order and optimiser must end at the
run's final parameters, up to float32-against-float64 rounding. This module is
the adapter, nothing more: ``TorchProblem`` is a convergence ``Problem`` backed
by one of real/'s torch models and real/data.py's batches, and ``load_log``
reads a run's output folder into an ``UpdateLog``. The replay's rules stay in
syncsim/convergence/replay.py.

    log = load_log("results/real/ps-async")
    problem = TorchProblem(model="mlp", data="synthetic", seed=0)
    replayer = Replayer(log, problem, lr=0.05, seed=0).run()
    replayer.parameters()        # the run's final server parameters, as float64
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from real.config import DATA, MODELS
from real.data import Dataset, load
from real.models import build, param_layers, param_shapes
from syncsim.config import check_choice, check_int
from syncsim.convergence import Problem, UpdateLog
from syncsim.schemes import parse

__all__ = ["TorchProblem", "load_log"]


class _RunBatches:
    """real/data.py's data order behind the replay's ``indices(worker, step)``."""

    def __init__(self, dataset: Dataset, batch_size: int, workers: int):
        self.dataset, self.batch_size, self.workers = dataset, batch_size, workers

    def indices(self, worker: int, step: int) -> np.ndarray:
        return self.dataset.indices(worker, step, self.workers, self.batch_size).cpu().numpy()


@dataclass(frozen=True)
class TorchProblem(Problem):
    """Mean cross-entropy of one of real/'s models on its seeded data set, as a flat float64 problem.

    ``init`` is the model's initial weights for ``seed`` (every rank builds the
    same), ``gradient`` loads the parameters into the model (float32, as the
    ranks hold them) and runs forward and backward on the samples, and
    ``sampler`` hands out each worker's batch in real/data.py's order.
    ``evaluate`` is the loss and accuracy on the first ``eval_samples`` samples
    (the real data sets have no held-out split).
    """

    model: str = "mlp"
    data: str = "synthetic"
    seed: int = 0
    eval_samples: int = 512
    metrics = ("loss", "accuracy")

    def __post_init__(self) -> None:
        check_choice("TorchProblem", "model", self.model, MODELS)
        check_choice("TorchProblem", "data", self.data, DATA)
        object.__setattr__(self, "seed", check_int("TorchProblem", "seed", self.seed, 0))
        object.__setattr__(self, "eval_samples", check_int("TorchProblem", "eval_samples", self.eval_samples, 1))

    @cached_property
    def net(self) -> torch.nn.Module:
        return build(self.model, self.seed)

    @cached_property
    def dataset(self) -> Dataset:
        return load(self.data, self.seed)

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """The model's parameter tensors' shapes, in the flat parameters' order (what PowerSGD views as
        matrices: syncsim.compression.layout)."""
        return param_shapes(self.net)

    @property
    def dim(self) -> int:
        return sum(p.numel() for p in self.net.parameters())

    @property
    def samples(self) -> int:
        return len(self.dataset)

    def init(self, seed: int) -> np.ndarray:
        return _flat(p.detach() for p in build(self.model, self.seed).parameters())

    def _load(self, x: np.ndarray) -> None:
        flat = torch.from_numpy(np.asarray(x, dtype=np.float32))
        offset = 0
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def gradient(self, x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        self._load(x)
        idx = torch.as_tensor(indices)
        self.net.zero_grad(set_to_none=True)
        F.cross_entropy(self.net(self.dataset.x[idx]), self.dataset.y[idx]).backward()
        return _flat(p.grad for p in self.net.parameters())

    def evaluate(self, x: np.ndarray) -> dict[str, float]:
        self._load(x)
        n = min(self.eval_samples, self.samples)
        with torch.no_grad():
            logits = self.net(self.dataset.x[:n])
            labels = self.dataset.y[:n]
            loss = float(F.cross_entropy(logits, labels))
            accuracy = float((logits.argmax(1) == labels).float().mean())
        return {"loss": loss, "accuracy": accuracy}

    def sampler(self, batch_size: int, workers: int, seed: int) -> _RunBatches:
        return _RunBatches(self.dataset, batch_size, workers)


def _flat(tensors) -> np.ndarray:
    return torch.cat([t.reshape(-1).float() for t in tensors]).numpy().astype(np.float64)


def load_log(out: str | Path) -> UpdateLog:
    """The update log of the real run written to ``out`` (its summary.json and updates.csv), with the plan
    the run's executor made: for the model's layers and tensor shapes (real.executor.Executor)."""
    out = Path(out)
    config = json.loads((out / "summary.json").read_text())["config"]
    model = build(config["model"], config["seed"])
    layers = param_layers(model)
    policy = parse(config["scheme"]).policy(sum(layers), layers=layers, shapes=param_shapes(model))
    return UpdateLog(policy, config["world"], config["steps"], config["batch_size"],
                     pd.read_csv(out / "updates.csv"))
