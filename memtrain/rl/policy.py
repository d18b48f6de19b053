"""An actor-critic MLP in numpy on one flat parameter vector (the unit weight files hold).

Two separate trunks, one for the actor and one for the critic (tanh hidden layers, ``hidden`` wide each):
the choice of CleanRL's and Stable-Baselines3's PPO for classic control. With separate trunks the value
loss cannot pull the policy's features, so ``vf_coef`` needs no tuning against the policy's loss.

Heads: a categorical head (one logit per action) for a Discrete action space, or a diagonal Gaussian
head (a mean per action dimension and a state-independent ``log_std`` vector, a parameter) for a Box;
and a scalar value head. The parameters live in a ``ParamLayout`` (memtrain/models/params.py); every
function computes in the dtype of the flat vector it is given (float32 in training, float64 in the tests
that check the gradient against finite differences).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from memtrain.models.layers import affine, affine_grads
from memtrain.models.params import ParamLayout
from memtrain.rl.envs import DISCRETE, Spaces

LOG_2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True)
class Forward:
    """A forward pass over a batch: ``out`` (logits or Gaussian means, [N, n]), ``log_std`` ([n], Gaussian
    only), ``value`` ([N]), and what the backward pass needs (each trunk's activations)."""

    out: np.ndarray
    log_std: np.ndarray | None
    value: np.ndarray
    actor: list[np.ndarray] = field(repr=False)
    critic: list[np.ndarray] = field(repr=False)


@dataclass(frozen=True)
class Policy:
    """The architecture: ``spaces`` (memtrain/rl/envs.py) and the hidden widths of each trunk."""

    spaces: Spaces
    hidden: tuple[int, ...] = (64, 64)

    @property
    def discrete(self) -> bool:
        return self.spaces.kind == DISCRETE

    @cached_property
    def layout(self) -> ParamLayout:
        """``pi.{i}.w``/``pi.{i}.b`` (actor trunk), ``pi.out.*``, ``v.{i}.*`` (critic trunk), ``v.out.*``, then
        ``log_std`` for a Gaussian head."""
        shapes: dict[str, tuple[int, ...]] = {}
        for trunk, width in (("pi", self.spaces.n), ("v", 1)):
            fan_in = self.spaces.obs_dim
            for i, h in enumerate(self.hidden):
                shapes[f"{trunk}.{i}.w"], shapes[f"{trunk}.{i}.b"] = (fan_in, h), (h,)
                fan_in = h
            shapes[f"{trunk}.out.w"], shapes[f"{trunk}.out.b"] = (fan_in, width), (width,)
        if not self.discrete:
            shapes["log_std"] = (self.spaces.n,)
        return ParamLayout.from_shapes(shapes)

    def init(self, rng: np.random.Generator) -> np.ndarray:
        """Initial float32 parameters: orthogonal weights (gain sqrt 2 in the trunks, 0.01 on the policy's
        output, 1 on the value's), zero biases, ``log_std`` 0 -- CleanRL's initialisation."""
        flat = np.zeros(self.layout.size, dtype=np.float32)
        views = self.layout.views(flat)
        for trunk, out_gain in (("pi", 0.01), ("v", 1.0)):
            for i in range(len(self.hidden)):
                views[f"{trunk}.{i}.w"][...] = orthogonal(rng, views[f"{trunk}.{i}.w"].shape, math.sqrt(2.0))
            views[f"{trunk}.out.w"][...] = orthogonal(rng, views[f"{trunk}.out.w"].shape, out_gain)
        return flat

    def forward(self, flat: np.ndarray, obs: np.ndarray) -> Forward:
        """The heads for a batch of observations ``obs`` [N, obs_dim], in ``flat``'s dtype."""
        views = self.layout.views(flat)
        x = np.asarray(obs, dtype=flat.dtype).reshape(-1, self.spaces.obs_dim)
        actor, critic = self._trunk(views, "pi", x), self._trunk(views, "v", x)
        out = affine(actor[-1], views["pi.out.w"], views["pi.out.b"])
        value = affine(critic[-1], views["v.out.w"], views["v.out.b"])[:, 0]
        return Forward(out, None if self.discrete else views["log_std"], value, actor, critic)

    def _trunk(self, views: dict[str, np.ndarray], trunk: str, x: np.ndarray) -> list[np.ndarray]:
        """The inputs and every hidden layer's tanh output."""
        layers = [x]
        for i in range(len(self.hidden)):
            layers.append(np.tanh(affine(layers[-1], views[f"{trunk}.{i}.w"], views[f"{trunk}.{i}.b"])))
        return layers

    def log_prob(self, fwd: Forward, actions: np.ndarray) -> np.ndarray:
        """log pi(action | obs) per row; ``actions``: [N] integers (categorical) or [N, n] (Gaussian)."""
        if self.discrete:
            logp = log_softmax(fwd.out)
            return np.take_along_axis(logp, np.asarray(actions, np.int64)[:, None], axis=1)[:, 0]
        z = (np.asarray(actions, fwd.out.dtype) - fwd.out) * np.exp(-fwd.log_std)
        return np.sum(-0.5 * z * z - fwd.log_std - 0.5 * LOG_2PI, axis=1)

    def entropy(self, fwd: Forward) -> np.ndarray:
        """The entropy of the action distribution per row."""
        if self.discrete:
            logp = log_softmax(fwd.out)
            return -np.sum(np.exp(logp) * logp, axis=1)
        per_row = np.sum(fwd.log_std + 0.5 * (1.0 + LOG_2PI))
        return np.full(len(fwd.out), per_row, dtype=fwd.out.dtype)

    def sample(self, fwd: Forward, rng: np.random.Generator) -> np.ndarray:
        """One action per row drawn with ``rng`` (a fixed number of draws per row: one uniform for a categorical
        head, n normals for a Gaussian one). Categorical: int64 [N]; Gaussian: float32 [N, n]."""
        if self.discrete:
            cdf = np.cumsum(np.exp(log_softmax(fwd.out.astype(np.float64))), axis=1)
            u = rng.random(len(cdf))[:, None] * cdf[:, -1:]
            return np.minimum(np.sum(cdf <= u, axis=1), self.spaces.n - 1).astype(np.int64)
        noise = rng.standard_normal(fwd.out.shape)
        return (fwd.out.astype(np.float64) + np.exp(fwd.log_std.astype(np.float64)) * noise).astype(np.float32)

    def greedy(self, fwd: Forward) -> np.ndarray:
        """The most likely action per row (the first on ties; the mean for a Gaussian head)."""
        if self.discrete:
            return np.argmax(fwd.out, axis=1).astype(np.int64)
        return fwd.out.astype(np.float32)

    def gradient(self, flat: np.ndarray, fwd: Forward, actions: np.ndarray, d_logp: np.ndarray,
                 d_entropy: np.ndarray, d_value: np.ndarray) -> np.ndarray:
        """The gradient w.r.t. ``flat`` of a loss whose derivatives by each row's log-prob of its action, entropy
        and value are ``d_logp``, ``d_entropy``, ``d_value`` ([N] each): the chain rule through heads and trunks."""
        grad = np.zeros_like(flat)
        views, grads = self.layout.views(flat), self.layout.views(grad)
        d_out = self._head_grads(fwd, actions, d_logp, d_entropy, grads)
        self._backward(views, grads, "pi", fwd.actor, d_out)
        self._backward(views, grads, "v", fwd.critic, np.asarray(d_value, flat.dtype)[:, None])
        return grad

    def _head_grads(self, fwd: Forward, actions: np.ndarray, d_logp: np.ndarray, d_entropy: np.ndarray,
                    grads: dict[str, np.ndarray]) -> np.ndarray:
        dtype = fwd.out.dtype
        d_logp, d_entropy = np.asarray(d_logp, dtype)[:, None], np.asarray(d_entropy, dtype)[:, None]
        if self.discrete:
            logp = log_softmax(fwd.out)
            p = np.exp(logp)
            entropy = -np.sum(p * logp, axis=1, keepdims=True)
            d_out = -p * d_logp  # d log p_a / d z = onehot(a) - p
            np.add.at(d_out, (np.arange(len(d_out)), np.asarray(actions, np.int64)), d_logp[:, 0])
            d_out -= d_entropy * p * (logp + entropy)  # d H / d z_j = -p_j (log p_j + H)
            return d_out
        inv_std = np.exp(-fwd.log_std)
        z = (np.asarray(actions, dtype) - fwd.out) * inv_std
        # d log p / d mean = z / std; d log p / d log_std = z^2 - 1; d H / d log_std = 1
        grads["log_std"][...] = np.sum(d_logp * (z * z - 1.0), axis=0) + np.sum(d_entropy)
        return d_logp * z * inv_std

    def _backward(self, views: dict[str, np.ndarray], grads: dict[str, np.ndarray], trunk: str,
                  layers: list[np.ndarray], d_out: np.ndarray) -> None:
        d = np.ascontiguousarray(d_out, dtype=layers[0].dtype)
        names = [f"{trunk}.{i}" for i in range(len(self.hidden))] + [f"{trunk}.out"]
        for depth in range(len(names) - 1, -1, -1):
            name = names[depth]
            affine_grads(layers[depth], d, grads[f"{name}.w"], grads[f"{name}.b"])
            if depth:
                d = (d @ views[f"{name}.w"].T) * (1.0 - layers[depth] * layers[depth])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - np.max(logits, axis=1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))


def orthogonal(rng: np.random.Generator, shape: tuple[int, ...], gain: float) -> np.ndarray:
    """A (semi-)orthogonal ``shape`` matrix times ``gain``, from ``rng`` (the QR of a Gaussian matrix, signs fixed)."""
    rows, cols = shape
    a = rng.standard_normal((max(rows, cols), min(rows, cols)))
    q, r = np.linalg.qr(a)
    q *= np.sign(np.diag(r))
    return (gain * (q if rows >= cols else q.T)).astype(np.float32)
