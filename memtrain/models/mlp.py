"""Multi-layer perceptron: params W1, b1, ..., W{L+1}, b{L+1}; hidden activations relu|tanh; softmax
cross-entropy (classification) or 0.5 * squared error (regression) on the output layer.

The benchmark model: one batch costs three matmuls per layer (forward, weight gradient, input
gradient -- the last one skipped for the first layer), all float32; activations are applied in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from memtrain.errors import InputError
from memtrain.models.checks import CLASSIFICATION, check_choice, check_sizes, output_width, require_classes
from memtrain.models.layers import affine, affine_grads, as_rows, gaussian, regression_output
from memtrain.models.losses import (
    class_indices,
    regression_targets,
    softmax,
    softmax_xent,
    softmax_xent_grad,
    squared_error_grad,
)
from memtrain.models.protocol import DataSpec

Params = dict[str, np.ndarray]
ACTIVATIONS = ("relu", "tanh")


@dataclass(frozen=True)
class MLP:
    spec: DataSpec
    hidden: tuple[int, ...] = (64,)
    activation: str = "relu"

    additive: ClassVar[bool] = False
    thread_safe: ClassVar[bool] = True  # loss_and_grad keeps no state: the server's task threads may share it

    def __post_init__(self) -> None:
        check_sizes("model.hidden", self.hidden)
        check_choice("model.activation", self.activation, ACTIVATIONS)
        require_classes("mlp", self.spec)

    @property
    def classifier(self) -> bool:
        return self.spec.task == CLASSIFICATION

    @property
    def widths(self) -> tuple[int, ...]:
        """Layer widths from input to output: D, hidden..., C or K."""
        return (self.spec.n_features, *self.hidden, output_width(self.spec))

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        for layer, (fan_in, fan_out) in enumerate(zip(self.widths, self.widths[1:], strict=False), start=1):
            shapes[f"W{layer}"] = (fan_in, fan_out)
            shapes[f"b{layer}"] = (fan_out,)
        return shapes

    def init(self, rng: np.random.Generator) -> Params:
        """Normal weights drawn layer by layer: He (std sqrt(2/fan_in)) for relu layers, Glorot
        (std sqrt(2/(fan_in+fan_out))) for tanh layers and the linear output layer; zero biases."""
        params: Params = {}
        last = len(self.widths) - 1
        for layer, (fan_in, fan_out) in enumerate(zip(self.widths, self.widths[1:], strict=False), start=1):
            he = self.activation == "relu" and layer < last
            std = math.sqrt(2.0 / fan_in) if he else math.sqrt(2.0 / (fan_in + fan_out))
            params[f"W{layer}"] = gaussian(rng, (fan_in, fan_out), std)
            params[f"b{layer}"] = np.zeros(fan_out, dtype=np.float32)
        return params

    def _forward(self, params: Params, x: np.ndarray) -> list[np.ndarray]:
        """[x, a1, ..., aL, output scores]: every layer's input plus the final scores."""
        acts = [x]
        for layer in range(1, len(self.widths)):
            h = affine(acts[-1], params[f"W{layer}"], params[f"b{layer}"])
            if layer < len(self.widths) - 1:
                if self.activation == "relu":
                    np.maximum(h, np.float32(0), out=h)
                else:
                    np.tanh(h, out=h)
            acts.append(h)
        return acts

    def _output_loss(self, scores: np.ndarray, y: np.ndarray, grad: bool) -> float:
        if self.classifier:
            labels = class_indices(y, self.spec.n_classes)
            return softmax_xent_grad(scores, labels) if grad else softmax_xent(scores, labels)
        return squared_error_grad(scores, regression_targets(y, self.spec.n_targets))

    def _activation_grad(self, da: np.ndarray, a: np.ndarray) -> None:
        """da <- da * f'(pre-activation), from the post-activation a: relu' = [a > 0], tanh' = 1 - a^2."""
        if self.activation == "relu":
            np.multiply(da, a > 0, out=da)
        else:
            slope = np.square(a)
            np.subtract(np.float32(1), slope, out=slope)
            np.multiply(da, slope, out=da)

    def loss_and_grad(self, params: Params, x: np.ndarray, y: np.ndarray, grads: Params) -> float:
        acts = self._forward(params, as_rows(x))
        dz = acts.pop()
        loss = self._output_loss(dz, y, grad=True)
        for layer in range(len(self.widths) - 1, 0, -1):
            a = acts.pop()
            affine_grads(a, dz, grads[f"W{layer}"], grads[f"b{layer}"])
            if layer > 1:
                dz = np.matmul(dz, params[f"W{layer}"].T)
                self._activation_grad(dz, a)
        return loss

    def loss(self, params: Params, x: np.ndarray, y: np.ndarray) -> float:
        return self._output_loss(self._forward(params, as_rows(x))[-1], y, grad=False)

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        scores = self._forward(params, as_rows(x))[-1]
        return np.argmax(scores, axis=1) if self.classifier else regression_output(scores, self.spec)

    def predict_proba(self, params: Params, x: np.ndarray) -> np.ndarray:
        if not self.classifier:
            raise InputError("model 'mlp' gives probabilities only for classification data",
                             found=f"task {self.spec.task!r}")
        return softmax(self._forward(params, as_rows(x))[-1])
