"""Any CPU ``torch.nn.Module`` actor-critic as a policy on one flat float32 parameter vector.

The module is made by the job's ``model.factory`` (``"module:callable"``), called as
``factory(obs_dim, n, kind, **options)`` (``kind``: "discrete" or "continuous") under a torch seed from the
job's; its ``forward(obs)`` returns ``(out, value)``: logits (discrete) or Gaussian means (continuous), [N, n],
and V(obs), [N]; a continuous policy has a parameter ``log_std`` of shape [n]. memtrain/models/torch_module.py
checks it as it checks every torch model (CPU, real floating point, no tied weights, ...); buffers (running
statistics) are refused here: an actor-critic's forward in a worker must not change state.

The weights are the module's parameters, in ``named_parameters()`` order, in a ``ParamLayout``; the forward
pass binds them as views of the flat vector (``torch.func.functional_call``, no copy: the worker's mapped
version) and has the same interface as the numpy ``Policy`` (memtrain/rl/policy.py), whose log-probabilities,
entropies, sampling and greedy actions it shares. ``gradient`` runs autograd through the module for the loss
sum(d_logp * logp + d_entropy * entropy + d_value * value), whose gradient is the chain rule ``ppo_loss`` and
``a2c_loss`` ask for, so both losses work with either policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from memtrain.errors import InputError
from memtrain.models.params import ParamLayout
from memtrain.models.registry import code_on_path, import_object, user_code
from memtrain.models.torch_bind import as_tensor
from memtrain.models.torch_module import check_module, require_torch
from memtrain.rl.envs import CONTINUOUS, Spaces
from memtrain.rl.policy import Forward, Policy


def build_actor_critic(factory: str, spaces: Spaces, options: dict[str, Any], seed: int,
                       code_dir: str | None = None) -> Any:
    """The module ``factory`` makes for ``spaces``, checked; InputError naming what does not fit."""
    torch = require_torch()
    with code_on_path(code_dir):
        make = import_object(factory, "model factory")
        if not callable(make):
            raise InputError(f"model factory {factory!r} is not callable",
                             expected="a function (obs_dim, n, kind, **options)", found=type(make).__name__)
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(int(seed))
            with user_code(f"model factory {factory!r}",
                           hint=f"it was called with ({spaces.obs_dim}, {spaces.n}, {spaces.kind!r}) and options "
                                f"{options or '{}'}"):
                module = make(spaces.obs_dim, spaces.n, spaces.kind, **options)
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"model factory {factory!r} did not return a torch.nn.Module", expected="a torch.nn.Module",
                         found=type(module).__name__)
    check_module(module, factory)
    buffers = [name for name, _ in module.named_buffers()]
    if buffers:
        raise InputError(f"model factory {factory!r}: an actor-critic with buffers cannot act in a worker",
                         expected="parameters only (no BatchNorm running statistics)", found=", ".join(buffers))
    params = dict(module.named_parameters())
    if spaces.kind == CONTINUOUS and (params.get("log_std") is None or tuple(params["log_std"].shape) != (spaces.n,)):
        found = "none" if "log_std" not in params else f"shape {tuple(params['log_std'].shape)}"
        raise InputError(f"model factory {factory!r}: a continuous action needs a parameter log_std",
                         expected=f"log_std of shape ({spaces.n},)", found=found)
    return module.float()


@dataclass(frozen=True, eq=False)
class TorchPolicy(Policy):
    """``Policy``'s interface over a torch module (``spaces`` and the module; ``hidden`` is unused)."""

    module: Any = field(default=None, repr=False)

    @cached_property
    def layout(self) -> ParamLayout:
        return ParamLayout.from_shapes({name: tuple(p.shape) for name, p in self.module.named_parameters()})

    def init(self, rng: np.random.Generator) -> np.ndarray:
        """The module's own initial parameters (made under the job's torch seed), as one float32 vector."""
        flat = np.zeros(self.layout.size, np.float32)
        views = self.layout.views(flat)
        for name, param in self.module.named_parameters():
            views[name][...] = param.detach().numpy()
        return flat

    def _call(self, params: dict[str, Any], obs: Any) -> tuple[Any, Any]:
        import torch

        out = torch.func.functional_call(self.module, params, (obs,))
        n, rows = self.spaces.n, obs.shape[0]
        if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)
                and tuple(out[0].shape) == (rows, n) and tuple(out[1].reshape(-1).shape) == (rows,)):
            parts = (str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__
                     for t in (out if isinstance(out, tuple) else ()))
            found = f"({', '.join(parts)})" if isinstance(out, tuple) else type(out).__name__
            raise InputError("the actor-critic's forward gave the wrong outputs",
                             expected=f"(out [{rows}, {n}], value [{rows}])", found=found)
        return out[0], out[1].reshape(-1)

    def _params(self, flat: np.ndarray, requires_grad: bool) -> dict[str, Any]:
        views = self.layout.views(flat)
        return {name: as_tensor(view).detach().requires_grad_(requires_grad) for name, view in views.items()}

    def forward(self, flat: np.ndarray, obs: np.ndarray) -> Forward:
        """The heads for ``obs`` [N, obs_dim], the parameters bound as views of ``flat`` (no copy)."""
        torch = require_torch()
        x = as_tensor(np.ascontiguousarray(np.asarray(obs, flat.dtype).reshape(-1, self.spaces.obs_dim)))
        with torch.no_grad():
            out, value = self._call(self._params(flat, False), x)
        views = self.layout.views(flat)
        return Forward(out.numpy(), None if self.discrete else views["log_std"], value.numpy(), [x.numpy()], [])

    def gradient(self, flat: np.ndarray, fwd: Forward, actions: np.ndarray, d_logp: np.ndarray,
                 d_entropy: np.ndarray, d_value: np.ndarray) -> np.ndarray:
        """Autograd of sum(d_logp * logp + d_entropy * entropy + d_value * value) w.r.t. ``flat``."""
        torch = require_torch()
        params = self._params(flat, True)
        out, value = self._call(params, as_tensor(fwd.actor[0]))
        d = {k: torch.from_numpy(np.asarray(v, flat.dtype)) for k, v in
             (("logp", d_logp), ("entropy", d_entropy), ("value", d_value))}
        if self.discrete:
            logp_all = torch.log_softmax(out, dim=1)
            logp = logp_all.gather(1, torch.from_numpy(np.asarray(actions, np.int64))[:, None])[:, 0]
            entropy = -(logp_all.exp() * logp_all).sum(dim=1)
        else:
            log_std = params["log_std"]
            z = (torch.from_numpy(np.asarray(actions, flat.dtype)) - out) * torch.exp(-log_std)
            logp = (-0.5 * z * z - log_std - 0.5 * float(np.log(2 * np.pi))).sum(dim=1)
            entropy = (log_std + 0.5 * (1.0 + float(np.log(2 * np.pi)))).sum().expand(out.shape[0])
        total = (d["logp"] * logp).sum() + (d["entropy"] * entropy).sum() + (d["value"] * value).sum()
        grads = torch.autograd.grad(total, list(params.values()), allow_unused=True)
        flat_grad = np.zeros_like(flat)
        views = self.layout.views(flat_grad)
        for name, grad in zip(params, grads, strict=True):
            views[name][...] = 0 if grad is None else grad.numpy()
        return flat_grad


def torch_policy(factory: str, spaces: Spaces, options: dict[str, Any] | None = None, *, seed: int = 0,
                 code_dir: str | None = None) -> TorchPolicy:
    """The ``TorchPolicy`` of the job's ``[model]`` (kind = "torch") for ``spaces``."""
    module = build_actor_critic(factory, spaces, dict(options or {}), seed, code_dir)
    return TorchPolicy(spaces, (), module=module)
