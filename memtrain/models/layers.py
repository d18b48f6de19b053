"""Affine layers (x @ W + b) forward and backward, and model outputs -> predictions in the target shape."""

from __future__ import annotations

import math

import numpy as np

from memtrain.models.protocol import DataSpec


def affine(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x @ w + b as a new float32 array (one temporary: the output)."""
    out = np.matmul(x, w)
    np.add(out, b, out=out)
    return out


def affine_grads(x: np.ndarray, dz: np.ndarray, gw: np.ndarray, gb: np.ndarray) -> None:
    """Summed gradients of an affine layer, written in place: gw = x^T dz, gb = column sums of dz."""
    np.matmul(x.T, dz, out=gw)
    np.sum(dz, axis=0, out=gb)


def as_rows(x: np.ndarray) -> np.ndarray:
    """Features as a float32 2-D array (no copy when they already are)."""
    x = np.asarray(x, dtype=np.float32)
    return x.reshape(len(x), math.prod(x.shape[1:]))


def regression_output(out: np.ndarray, spec: DataSpec) -> np.ndarray:
    """Rows x K outputs -> the shape targets are stored in: [n] for a scalar target, else [n, *target_shape]."""
    if spec.target_shape and math.prod(spec.target_shape) == out.shape[1]:
        return out.reshape((len(out), *spec.target_shape))
    return out[:, 0] if out.shape[1] == 1 else out


def gaussian(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    """float32 normal(0, std) draws from ``rng`` (the only randomness a model's init may use)."""
    out = rng.standard_normal(shape, dtype=np.float32)
    out *= np.float32(std)
    return out
