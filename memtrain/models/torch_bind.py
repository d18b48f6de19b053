"""Mapped weight views + a torch module -> its loss and summed gradient, written into the mapped gradient buffer.

Zero-copy both ways: the trained parameters are bound as views of the read-only weight map (no copy of
the weights per task) and the gradient ends up in the worker's mapped gradient buffer. Buffers
(running statistics) and frozen parameters are the exception: a module may update them in place, so
they get small private copies, and what the forward pass changed is reported as (new - old) * rows.

Four ways to bind were measured (``python -m benchmarks.torch_binding``; docs/torch.md has
the figures): ``torch.func.functional_call`` with a dict of views, then either ``torch.autograd.grad``
and one copy into the buffer, or ``.grad`` preset to views of the buffer (backward adds into them); and
the same two with the module's own parameters pointed at the views (``param.data = view``). They give
bitwise identical gradients; ``CHOSEN`` is the one the worker uses.

Traps handled here: a tensor made from a read-only map only warns, but writing to it would crash the
process -- nothing here writes to one (buffers are copies, gradients go to the writable map);
``zero_grad()`` defaults to ``set_to_none=True`` and would silently drop ``.grad`` views -- never
called, the views are zeroed by hand; and a module keeps no view after a task (``unbind``), so a
retired weight file is never pinned or read through a stale binding.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

Arrays = dict[str, np.ndarray]
Forward = Callable[[Any], Any]  # x -> module output, with the weights bound


@dataclass(frozen=True)
class Slots:
    """The tensors of a module, in layout order: trained parameters, then buffers and frozen parameters."""

    module: Any  # torch.nn.Module
    trained: tuple[tuple[str, Any], ...]  # (name, Parameter)
    state: tuple[tuple[str, Any], ...]  # (name, Tensor): the module's own buffer or frozen parameter

    @property
    def trained_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.trained)


def as_tensor(array: np.ndarray) -> Any:
    """A tensor sharing ``array``'s memory, read-only maps included (torch warns about those; we never write).

    A writable array takes the plain path: ``warnings.catch_warnings`` costs about 10 us a call, most of what
    binding a small module's tensors cost a task (a gradient task makes 9 of these for a 2-layer MLP)."""
    import torch

    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def as_tensors(arrays: Iterable[np.ndarray]) -> list[Any]:
    """``as_tensor`` of each of ``arrays``, with the warning about read-only maps silenced once for all of them."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return [torch.from_numpy(array) for array in arrays]


def private_state(slots: Slots, weights: Arrays) -> dict[str, Any]:
    """Writable copies of the buffers and frozen parameters, in the module's own dtypes."""
    return {name: as_tensor(weights[name]).to(dtype=tensor.dtype, copy=True) for name, tensor in slots.state}


def report_state(slots: Slots, weights: Arrays, grads: Arrays, updated: dict[str, Any], rows: int) -> None:
    """What the forward pass did to each buffer, (new - old) * rows, into its slot of the gradient buffer."""
    import torch

    scale = np.float32(rows)
    for name, _ in slots.state:
        out = as_tensor(grads[name])
        torch.sub(updated[name].detach().to(torch.float32), as_tensor(weights[name]), out=out)
        out.mul_(scale)


def copy_grads(slots: Slots, grads: Arrays, computed: tuple[Any, ...]) -> None:
    for (name, _), grad in zip(slots.trained, computed, strict=True):
        target = as_tensor(grads[name])
        if grad is None:  # a parameter the loss does not depend on
            target.zero_()
        else:
            target.copy_(grad)


def zeroed_views(slots: Slots, grads: Arrays) -> list[Any]:
    views = [as_tensor(grads[name]) for name in slots.trained_names]
    for view in views:
        view.zero_()
    return views


class FunctionalGrad:
    """functional_call with a dict of views; torch.autograd.grad; one copy into the gradient buffer."""

    name = "functional_call + autograd.grad + copy"

    def gradient(self, slots: Slots, weights: Arrays, grads: Arrays, loss_of: Callable[[Forward], Any],
                 rows: int) -> float:
        import torch
        from torch.func import functional_call

        bound = [as_tensor(weights[name]).requires_grad_() for name in slots.trained_names]
        state = private_state(slots, weights)
        tensors = {**dict(zip(slots.trained_names, bound, strict=True)), **state}
        loss = loss_of(lambda x: functional_call(slots.module, tensors, (x,)))
        copy_grads(slots, grads, torch.autograd.grad(loss, bound, allow_unused=True))
        report_state(slots, weights, grads, state, rows)
        return float(loss.detach())


class FunctionalGradViews:
    """functional_call with a dict of views whose ``.grad`` are zeroed views of the gradient buffer."""

    name = "functional_call + .grad views"

    def gradient(self, slots: Slots, weights: Arrays, grads: Arrays, loss_of: Callable[[Forward], Any],
                 rows: int) -> float:
        from torch.func import functional_call

        bound = [as_tensor(weights[name]).requires_grad_() for name in slots.trained_names]
        for tensor, view in zip(bound, zeroed_views(slots, grads), strict=True):
            tensor.grad = view  # backward adds into it, in place
        state = private_state(slots, weights)
        tensors = {**dict(zip(slots.trained_names, bound, strict=True)), **state}
        loss = loss_of(lambda x: functional_call(slots.module, tensors, (x,)))
        loss.backward()
        report_state(slots, weights, grads, state, rows)
        return float(loss.detach())


class DataGrad:
    """The module's own parameters pointed at the views (``param.data = view``); autograd.grad; one copy."""

    name = "param.data = view + autograd.grad + copy"

    def gradient(self, slots: Slots, weights: Arrays, grads: Arrays, loss_of: Callable[[Forward], Any],
                 rows: int) -> float:
        import torch

        with bound_module(slots, weights) as state:
            loss = loss_of(slots.module)
            params = [param for _, param in slots.trained]
            copy_grads(slots, grads, torch.autograd.grad(loss, params, allow_unused=True))
            report_state(slots, weights, grads, state, rows)
        return float(loss.detach())


class DataGradViews:
    """The module's own parameters pointed at the views, their ``.grad`` at zeroed views of the buffer."""

    name = "param.data = view + .grad views"

    def gradient(self, slots: Slots, weights: Arrays, grads: Arrays, loss_of: Callable[[Forward], Any],
                 rows: int) -> float:
        with bound_module(slots, weights) as state:
            for (_, param), view in zip(slots.trained, zeroed_views(slots, grads), strict=True):
                param.grad = view
            loss = loss_of(slots.module)
            loss.backward()
            report_state(slots, weights, grads, state, rows)
        return float(loss.detach())


@contextmanager
def bound_module(slots: Slots, weights: Arrays) -> Iterator[dict[str, Any]]:
    """The module's parameters as views of ``weights`` and its buffers loaded from them, for one call."""
    import torch

    try:
        for (_, param), view in zip(slots.trained, as_tensors(weights[name] for name in slots.trained_names),
                                    strict=True):
            param.data = view
        with torch.no_grad():
            for name, tensor in slots.state:
                tensor.copy_(as_tensor(weights[name]))
        yield dict(slots.state)
    finally:
        unbind(slots)


def unbind(slots: Slots) -> None:
    """Drop every reference to mapped memory: a module keeps no view of a weight file between tasks.

    Its parameters are left empty: the module is used only through a binding afterwards (``TorchModel``
    builds a fresh one for ``to_module``)."""
    import torch

    for _, param in slots.trained:
        param.data = torch.empty(0)
        param.grad = None


BINDINGS = {"functional_grad": FunctionalGrad(), "functional_grad_views": FunctionalGradViews(),
            "data_grad": DataGrad(), "data_grad_views": DataGradViews()}
# The fastest measured (docs/torch.md), closest to the floor of the same computation on private
# parameters: no functional_call re-parametrization per call, no separate gradient copy.
CHOSEN = "data_grad_views"
