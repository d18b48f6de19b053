"""Torch modules for the example jobs: ``factory(spec, **options) -> torch.nn.Module``.

memtrain calls a factory with the dataset's ``DataSpec`` (``spec.n_features``, ``spec.feature_shape``,
``spec.n_classes``, ...) and every other key of the job's ``[model]`` table, under
``torch.manual_seed(train.seed)``. Rows arrive as float32 ``[n, *spec.feature_shape]``, normalized.
"""

from __future__ import annotations

import math

from torch import nn


def make_cnn(spec, channels: int = 16, hidden: int = 64, dropout: float = 0.1) -> nn.Module:
    """A small CNN for square images stored as flat rows: the digits' 64 features are 1x8x8 pixels."""
    side = math.isqrt(spec.n_features)
    if side * side != spec.n_features:
        raise ValueError(f"make_cnn needs square images, got {spec.n_features} features per row")
    return nn.Sequential(
        nn.Unflatten(1, (1, side, side)),
        nn.Conv2d(1, channels, kernel_size=3, padding=1),
        nn.BatchNorm2d(channels),
        nn.ReLU(),
        nn.Conv2d(channels, 2 * channels, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(2 * channels * (side // 2) ** 2, hidden),
        nn.ReLU(),
        nn.Linear(hidden, spec.n_classes),
    )


def make_mlp(spec, hidden: tuple[int, ...] = (64,), dropout: float = 0.0) -> nn.Module:
    """Linear layers with ReLU (and optional dropout) between them; scores for each class."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = spec.n_features
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU(), nn.Dropout(dropout)]
        width = size
    layers.append(nn.Linear(width, spec.n_classes))
    return nn.Sequential(*layers)
