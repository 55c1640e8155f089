"""The models a real run trains; all take (batch, 1, 28, 28) images and give 10 logits."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["build", "MODELS", "param_layers", "param_shapes", "flat_params", "whole"]


def lenet() -> nn.Module:
    # The seed article's LeNet with its flattened size corrected: after two
    # 5×5 convolutions and 2×2 pools a 28×28 input is 50×4×4 = 800 features
    # (the article's 4450 matches no input size); syncsim's "lenet" workload
    # preset counts the same 431,080 parameters.
    return nn.Sequential(
        nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(20, 50, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10),
    )


def mlp() -> nn.Module:
    # 101,770 parameters: small enough for fast multi-rank tests on two cores.
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


def mlp_large() -> nn.Module:
    # 7.9 M parameters (31.6 MB of fp32 gradient per step): communication
    # dominates on loopback, and with the default 25 MiB DDP bucket cap the
    # gradient spans two buckets, so bucketing and overlap are exercised.
    return nn.Sequential(
        nn.Flatten(), nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
        nn.Linear(2048, 1024), nn.ReLU(), nn.Linear(1024, 10),
    )


MODELS = {"lenet": lenet, "mlp": mlp, "mlp-large": mlp_large}


def build(name: str, seed: int) -> nn.Module:
    """The model ``name`` with initial weights fixed by ``seed``: every rank builds the same replica."""
    torch.manual_seed(seed)
    return MODELS[name]()


def param_layers(model: nn.Module) -> tuple[float, ...]:
    """fp32 bytes per parameter tensor in forward order: the ``layers`` a syncsim Workload takes."""
    return tuple(float(p.numel() * 4) for p in model.parameters() if p.requires_grad)


def param_shapes(model: nn.Module) -> tuple[tuple[int, ...], ...]:
    """The shape of each parameter tensor in forward order: the ``shapes`` a syncsim Workload takes (what a
    low-rank compressor views as matrices, syncsim.compression.layout)."""
    return tuple(tuple(int(d) for d in p.shape) for p in model.parameters() if p.requires_grad)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` whole: itself, or a sharded DTensor (FSDP2's parameters) gathered with ``full_tensor()``,
    a collective every rank of its mesh must call at once."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def flat_params(model: nn.Module) -> torch.Tensor:
    """The model's parameters whole, flat, in fp32, in ``model.parameters()`` order."""
    return torch.cat([whole(p.detach()).reshape(-1).float() for p in model.parameters()])
