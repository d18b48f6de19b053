"""A ``torch.nn.Module`` behind the model protocol: ``[model] kind = "torch"``, ``factory = "module:callable"``.

The factory is called as ``factory(spec, **options)`` with every other key of ``[model]`` and returns
the module; ``loss`` picks the per-row loss (models/torch_losses.py). To the engine this is a model
like any other: a flat float32 vector (the trained parameters in ``named_parameters()`` order, then
buffers and frozen parameters, all named by their state_dict keys) and a summed loss and gradient
(models/torch_bind.py computes them zero-copy on the mapped files).

Rules that keep memtrain's guarantees (docs/torch.md):
- version 0 is the module's own initialisation under ``torch.manual_seed(train.seed)``;
- buffers (BatchNorm running statistics) become the row-weighted mean of what each task's forward pass
  made of them, added in task order (models/protocol.py, train/loops/reduce.py);
- every random draw of a gradient task (dropout) comes from the CPU generator seeded with a seed
  derived from (train.seed, version, task): the same whichever worker runs it, so never dependent on the
  worker count; evaluation and prediction run in eval mode;
- each worker runs torch on ``train.blas_threads`` threads with deterministic algorithms on.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from memtrain.errors import InputError, MemtrainError
from memtrain.models.checks import CLASSIFICATION
from memtrain.models.layers import regression_output
from memtrain.models.protocol import DataSpec, Evaluation
from memtrain.models.torch_bind import BINDINGS, CHOSEN, Slots, as_tensor, as_tensors, private_state
from memtrain.models.torch_losses import check_output, resolve_loss, targets
from memtrain.models.torch_module import (
    build_module,
    check_torch_installed,
    module_slots,
    pin_process,
    require_torch,
    runtime_note,
    seed_of,
    task_seed,
)

Params = dict[str, np.ndarray]


class TorchModel:
    additive: ClassVar[bool] = False
    seeded: ClassVar[bool] = True
    outlined: ClassVar[bool] = True  # a server whose workers compute never imports torch (train/server/outline.py)

    def __init__(self, spec: DataSpec, factory: str, loss: str | None = None, **options: Any):
        require_torch()
        if not isinstance(factory, str):
            raise InputError("wrong type for model.factory", expected="'module:callable', e.g. 'nets:make_cnn'",
                             found=repr(factory))
        self.spec, self.factory, self.options = spec, factory, options
        self.criterion = resolve_loss(loss, spec)
        self.module = build_module(factory, spec, options, seed=0)
        self.slots: Slots = module_slots(self.module)
        self.binding = BINDINGS[CHOSEN]

    @classmethod
    def check_installed(cls) -> None:
        """In a server that only outlines the module: the install hint, without importing torch."""
        check_torch_installed()

    # --- shapes and initial weights ---

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(param.shape) for name, param in self.slots.trained}

    def buffer_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(tensor.shape) for name, tensor in self.slots.state}

    def init(self, rng: np.random.Generator) -> Params:
        """The module's own initialisation under ``torch.manual_seed(train.seed)``, as float32 arrays."""
        fresh = module_slots(build_module(self.factory, self.spec, self.options, seed=seed_of(rng)))
        return {name: tensor.detach().to(dtype=_float32()).numpy().copy()
                for name, tensor in (*fresh.trained, *fresh.state)}

    # --- per-process set-up and the server's dry run ---

    def in_worker(self, threads: int) -> None:
        pin_process(threads)

    def startup(self, x: np.ndarray, y: np.ndarray, threads: int) -> str:
        """Run the module, the loss and the gradient on a few training rows; InputError naming the factory
        and the shapes when the output does not fit the loss or the targets."""
        import torch

        inputs, target = self._inputs(x), targets(y, self.spec)
        self.module.train()
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            try:
                output = self.module(inputs)
            except MemtrainError:
                raise
            except BaseException as exc:  # noqa: BLE001 - the user's forward pass on real rows: may raise anything
                raise InputError(f"model factory {self.factory!r}: the module fails on {len(x)} rows of the "
                                 f"training data: {type(exc).__name__}: {exc}",
                                 expected=f"a module taking float32 rows of shape [n, "
                                          f"{', '.join(map(str, self.spec.feature_shape))}]",
                                 found=f"input shape {list(inputs.shape)}") from exc
            check_output(self.factory, self.criterion, self.spec, len(x), output, target)
        current = {name: tensor.detach().to(dtype=_float32()).numpy().copy()
                   for name, tensor in (*self.slots.trained, *self.slots.state)}
        grads = {name: np.zeros_like(array) for name, array in current.items()}
        try:
            self.loss_and_grad(current, x, y, grads)
        except MemtrainError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the user's module and loss: may raise anything
            raise InputError(f"model factory {self.factory!r}: the gradient of loss {self.criterion.name!r} fails on "
                             f"{len(x)} rows: {type(exc).__name__}: {exc}",
                             expected="a loss autograd can differentiate with respect to the parameters",
                             found=f"input shape {list(inputs.shape)}, output shape {list(output.shape)}") from exc
        return runtime_note(threads)

    # --- the protocol ---

    def loss_and_grad(self, params: Params, x: np.ndarray, y: np.ndarray, grads: Params, *,
                      seed: tuple[int, int, int] = (0, 0, 0)) -> float:
        import torch

        if len(x) == 0:
            for array in grads.values():
                array[...] = 0
            return 0.0
        inputs, target = self._inputs(x), targets(y, self.spec)
        self.module.train()
        with torch.random.fork_rng(devices=[]):
            # The CPU generator only: torch.manual_seed also queues lazy seeds for CUDA, XPU and MTIA, each
            # with a captured Python stack (measured: 0.5-2 ms per task, most of a small model's compute).
            torch.default_generator.manual_seed(task_seed(seed))
            return self.binding.gradient(self.slots, params, grads,
                                         lambda forward: self.criterion.total(forward(inputs), target), len(x))

    def loss(self, params: Params, x: np.ndarray, y: np.ndarray) -> float:
        if len(x) == 0:
            return 0.0
        return float(self.criterion.total(self._evaluate(params, x), targets(y, self.spec)))

    def predict(self, params: Params, x: np.ndarray) -> np.ndarray:
        return self._predicted(self._evaluate(params, x))

    def predict_proba(self, params: Params, x: np.ndarray) -> np.ndarray:
        self._check_classifier()
        return self._proba(self._evaluate(params, x))

    def evaluate(self, params: Params, x: np.ndarray, y: np.ndarray) -> Evaluation:
        """``loss``, ``predict`` and ``predict_proba`` (classification) of the same rows from one forward pass:
        an evaluation task asks for all three, and a forward pass is most of what each costs (models/protocol.py)."""
        if len(x) == 0:
            return Evaluation(loss=0.0, predicted=self.predict(params, x),
                              proba=self.predict_proba(params, x) if self.spec.task == CLASSIFICATION else None)
        scores = self._evaluate(params, x)
        return Evaluation(loss=float(self.criterion.total(scores, targets(y, self.spec))),
                          predicted=self._predicted(scores),
                          proba=self._proba(scores) if self.spec.task == CLASSIFICATION else None)

    def _predicted(self, scores: Any) -> np.ndarray:
        values = scores.numpy()
        if self.spec.task == CLASSIFICATION:
            return np.argmax(values, axis=1)
        return regression_output(values.reshape(len(values), -1), self.spec)

    def _proba(self, scores: Any) -> np.ndarray:
        import torch

        return torch.softmax(scores, dim=1).numpy()

    def _check_classifier(self) -> None:
        if self.spec.task != CLASSIFICATION:
            raise InputError("model 'torch' gives probabilities only for classification data",
                             found=f"task {self.spec.task!r}")

    # --- using the result ---

    def to_module(self, params: Params) -> Any:
        """The module with ``params`` loaded (``load_state_dict(strict=True)``), in eval mode."""
        import torch

        module = build_module(self.factory, self.spec, self.options, seed=0)  # self.module may be unbound
        state = {name: torch.from_numpy(np.array(params[name], dtype=np.float32)) for name in params}
        module.load_state_dict(state, strict=True)
        return module.eval()

    def _evaluate(self, params: Params, x: np.ndarray) -> Any:
        """Scores in eval mode with ``params`` bound as views (buffers as copies), no autograd."""
        import torch
        from torch.func import functional_call

        names = self.slots.trained_names
        tensors = dict(zip(names, as_tensors(params[name] for name in names), strict=True))
        tensors |= private_state(self.slots, params)
        self.module.eval()
        with torch.no_grad():
            return functional_call(self.module, tensors, (self._inputs(x),))

    def _inputs(self, x: np.ndarray) -> Any:
        """Normalized rows -> a float32 tensor of shape [n, *feature shape]; never a view of a read-only map
        (a module may work in place on its input, e.g. ReLU(inplace=True) first)."""
        rows = np.asarray(x, dtype=np.float32).reshape((len(x), *(self.spec.feature_shape or (-1,))))
        if not rows.flags.writeable or not rows.flags.c_contiguous:
            rows = np.array(rows)
        return as_tensor(rows)


def _float32() -> Any:
    import torch

    return torch.float32
