"""Torch module factories for tests/test_torch.py: good ones, and each kind memtrain must refuse at start."""

from __future__ import annotations

import torch
from torch import nn


def mlp(spec, hidden: int = 16) -> nn.Module:
    return nn.Sequential(nn.Linear(spec.n_features, hidden), nn.Tanh(), nn.Linear(hidden, spec.n_classes))


def bn_dropout(spec, hidden: int = 16, dropout: float = 0.3) -> nn.Module:
    """BatchNorm (running statistics: buffers) and dropout (randomness) in one small net."""
    return nn.Sequential(nn.Linear(spec.n_features, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(hidden, spec.n_classes))


def slow_to_build(spec, cpu_seconds: float = 0.3) -> nn.Module:
    """mlp, after ``cpu_seconds`` of CPU spent building it (as importing a framework costs a process)."""
    import time

    started = time.process_time()
    while time.process_time() - started < cpu_seconds:
        pass
    return mlp(spec)


def frozen_first_layer(spec, hidden: int = 8) -> nn.Module:
    net = mlp(spec, hidden)
    net[0].requires_grad_(False)
    return net


def raises(spec, hidden: int = 16) -> nn.Module:
    raise ValueError(f"no net with {hidden} hidden units today")


def wrong_width(spec) -> nn.Module:
    return nn.Linear(spec.n_features, spec.n_classes + 2)


def wrong_input(spec) -> nn.Module:
    return nn.Linear(spec.n_features + 1, spec.n_classes)


def not_a_module(spec) -> object:
    return {"weight": torch.zeros(3)}


def integer_parameter(spec) -> nn.Module:
    net = mlp(spec)
    net.register_parameter("counts", nn.Parameter(torch.zeros(3, dtype=torch.int64), requires_grad=False))
    return net


def lazy(spec) -> nn.Module:
    return nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, spec.n_classes))


def tied(spec) -> nn.Module:
    net = nn.Sequential(nn.Linear(spec.n_features, spec.n_features), nn.Linear(spec.n_features, spec.n_features),
                        nn.Linear(spec.n_features, spec.n_classes))
    net[1].weight = net[0].weight
    return net


def summed_loss(output, target):  # not per row: must be refused
    return nn.functional.cross_entropy(output, target, reduction="sum")


def per_row_loss(output, target):
    return nn.functional.cross_entropy(output, target, reduction="none") * 2.0


def regressor(spec, hidden: int = 8) -> nn.Module:
    return nn.Sequential(nn.Linear(spec.n_features, hidden), nn.Tanh(), nn.Linear(hidden, spec.n_targets))
