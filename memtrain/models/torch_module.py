"""A factory name + options + DataSpec + seed -> a checked float32 CPU ``torch.nn.Module``, or why not.

Every process builds the module the same way: ``torch.manual_seed(seed)`` (in a forked RNG, so the
caller's torch RNG is untouched), then ``factory(spec, **options)``. With the job's seed that is the
module's own initialisation -- the run's version 0.

Refused at start, with the reason (they would train wrongly or not at all): lazy modules (no shapes
before a forward pass), parameters that are not real floating point (complex, integer), parameters
off the CPU, parameters shared between two names (tied weights: a state_dict would need one entry per
name), sparse gradients, SyncBatchNorm (needs a torch process group), extra state that is not a tensor.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from memtrain.errors import InputError
from memtrain.models.protocol import DataSpec
from memtrain.models.registry import import_object, user_code
from memtrain.models.torch_bind import Slots

TORCH_VERSION = "2.13.0"
INSTALL_HINT = f'pip install "memtrain[torch]"   (the CPU build: torch=={TORCH_VERSION})'


def require_torch() -> Any:
    """The torch package, or an InputError saying how to install it (exit 2, before anything starts)."""
    try:
        import torch
    except ImportError as exc:
        raise InputError("model kind 'torch' needs PyTorch, which is not installed",
                         hint=f"install it with: {INSTALL_HINT}") from exc
    return torch


def check_torch_installed() -> None:
    """``require_torch``'s InputError when torch cannot be imported, found without importing it (a server that
    only outlines the model, train/server/outline.py, never imports torch)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken entry in sys.modules
        found = False
    if not found:
        raise InputError("model kind 'torch' needs PyTorch, which is not installed",
                         hint=f"install it with: {INSTALL_HINT}")


def seed_of(rng: np.random.Generator) -> int:
    """The integer a generator was seeded with (``default_rng(train.seed)``), so that version 0 is
    ``torch.manual_seed(train.seed)`` + the factory, as a user would write it; else one draw from it."""
    entropy = getattr(rng.bit_generator.seed_seq, "entropy", None)
    if isinstance(entropy, int) and 0 <= entropy < 2**64:
        return entropy
    return int(rng.integers(2**63))


def task_seed(seed: tuple[int, int, int]) -> int:
    """(train.seed, version, task) -> the torch seed of one gradient task."""
    return int(np.random.SeedSequence([int(part) for part in seed]).generate_state(1, np.uint64)[0])


def build_module(factory: str, spec: DataSpec, options: dict[str, Any], seed: int) -> Any:
    torch = require_torch()
    make = import_object(factory, "model factory")
    if not callable(make):
        raise InputError(f"model factory {factory!r} is not callable", expected="a function (spec, **options)",
                         found=type(make).__name__)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)  # = torch.manual_seed on the CPU (see TorchModel.loss_and_grad)
        with user_code(f"model factory {factory!r}",  # anything it raises is a configuration error
                       hint=f"it was called with options {options or '{}'} and a DataSpec of feature "
                            f"shape {list(spec.feature_shape)}, task {spec.task}"):
            module = make(spec, **options)
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"model factory {factory!r} did not return a torch.nn.Module",
                         expected="a torch.nn.Module", found=type(module).__name__)
    check_module(module, factory)
    return module.float()


def refuse(factory: str, reason: str, expected: str, found: str) -> InputError:
    return InputError(f"model factory {factory!r}: memtrain cannot train this module: {reason}", expected=expected,
                      found=found, hint="see 'Modules memtrain refuses' in docs/torch.md")


def check_module(module: Any, factory: str) -> None:
    """Raise an InputError for a module memtrain cannot train correctly (see the module docstring)."""
    import torch

    named = list(module.named_parameters(remove_duplicate=False))
    unique = dict(module.named_parameters())
    for name, param in named:
        if isinstance(param, torch.nn.parameter.UninitializedParameter):
            raise refuse(factory, "lazy modules have no shapes before their first forward pass",
                         "layers with sizes (nn.Linear, not nn.LazyLinear)", f"{name} uninitialized")
        if not param.is_floating_point():
            raise refuse(factory, "parameters must be real floating point (trained as float32)",
                         "float16, bfloat16, float32 or float64", f"{name} of dtype {param.dtype}")
        if param.device.type != "cpu":
            raise refuse(factory, "memtrain trains on the CPU", "parameters on cpu", f"{name} on {param.device}")
    if len(named) != len(unique):
        tied = sorted({n for n, p in named} - set(unique))
        raise refuse(factory, "parameters shared between names (tied weights) are not supported",
                     "one tensor per parameter name", f"{', '.join(tied)} shared with another parameter")
    if not any(param.requires_grad for param in unique.values()):
        raise refuse(factory, "it has no trainable parameter", "a parameter with requires_grad=True",
                     f"{len(unique)} parameters, none requires grad")
    for name, sub in module.named_modules():
        if isinstance(sub, torch.nn.SyncBatchNorm):
            raise refuse(factory, "SyncBatchNorm needs a torch process group; use BatchNorm (memtrain averages "
                                  "the running statistics, see docs/torch.md)", "nn.BatchNorm*",
                         f"SyncBatchNorm at {name or 'the top'}")
        if getattr(sub, "sparse", False) is True:
            raise refuse(factory, "sparse gradients are not supported", "sparse=False", f"{name} has sparse=True")
    for name, value in module.state_dict(keep_vars=True).items():
        if not isinstance(value, torch.Tensor):
            raise refuse(factory, "state that is not a tensor cannot live in a weight file", "tensors only",
                         f"{name} of type {type(value).__name__}")
        if value.is_complex():
            raise refuse(factory, "complex buffers are not supported", "real buffers", f"{name} of dtype {value.dtype}")


def module_slots(module: Any) -> Slots:
    """Trained parameters in ``named_parameters()`` order, then frozen parameters and persistent buffers in
    ``state_dict()`` order: the layout of the flat vector, named by state_dict keys."""
    trained = tuple((name, param) for name, param in module.named_parameters() if param.requires_grad)
    names = {name for name, _ in trained}
    state = tuple((name, tensor) for name, tensor in module.state_dict(keep_vars=True).items() if name not in names)
    return Slots(module, trained, state)


def runtime_note(threads: int) -> str:
    import torch

    return (f"torch {torch.__version__}: {threads} intra-op thread(s) per worker (torch.set_num_threads), "
            f"1 inter-op thread, deterministic algorithms on")


def pin_process(threads: int) -> None:
    """One worker's torch: ``threads`` intra-op threads, one inter-op thread, deterministic algorithms.

    CPU results change bitwise with the intra-op thread count, so it is pinned (train.blas_threads).
    """
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # already set, or parallel work already ran here: keep it
        torch.set_num_interop_threads(1)
    # What torch.use_deterministic_algorithms(True) does, minus its import of torch._inductor (1-5 s per
    # process, measured) to set a torch.compile option; torch.are_deterministic_algorithms_enabled() reads it.
    set_deterministic = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_deterministic is None:
        torch.use_deterministic_algorithms(True)
    else:
        set_deterministic(True)
