"""Model kind + options + DataSpec -> a model object (built-in kinds, or a user class by import path)."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any, NoReturn

from memtrain.errors import InputError, MemtrainError, did_you_mean
from memtrain.models.protocol import DataSpec, Model, build_options_error

# Built-in kinds name import paths, so a built-in model is found exactly the way a user model is.
BUILTIN = MappingProxyType({
    "linear": "memtrain.models.linear:LinearRegression",
    "logistic": "memtrain.models.logistic:LogisticRegression",
    "softmax": "memtrain.models.softmax:SoftmaxRegression",
    "mlp": "memtrain.models.mlp:MLP",
    "ridge": "memtrain.models.ridge:Ridge",
    "naive_bayes": "memtrain.models.naive_bayes:GaussianNaiveBayes",
    "torch": "memtrain.models.torch_model:TorchModel",
})
MODEL_KINDS = tuple(BUILTIN)
BASE_METHODS = ("parameter_shapes", "init", "loss", "predict")
GRADIENT_METHODS = ("loss_and_grad",)
ADDITIVE_METHODS = ("statistic_shapes", "solve")
# An additive model's statistics: one of these (protocol.py; the adding contract, or the whole-rows one).
STATISTICS_METHODS = ("add_statistics", "statistics")
# The [model] key that says where a model's own code is imported from first (config.py fills it in with
# the job file's directory); it is consumed here, never passed to the model.
CODE_DIR = "code_dir"


def build_model(kind: str, options: dict[str, Any], spec: DataSpec) -> Model:
    """Build a model. ``kind`` is a built-in name or ``"package.module:ClassName"``.

    >>> build_model("mlp", {"hidden": [32]}, DataSpec(n_features=4, task="classification", n_classes=3)).hidden
    (32,)
    """
    options = {key: _tuples(value) for key, value in options.items()}
    with code_on_path(options.pop(CODE_DIR, None)):
        cls = model_class(kind)
        check_protocol(kind, cls)
        check_options(kind, cls, options)
        with user_code(f"model {kind!r}"):
            return cls(spec, **options)


@contextlib.contextmanager
def user_code(what: str, **details: Any) -> Iterator[None]:
    """Run the user's code (an import, a constructor, a factory, a loss): whatever it raises -- any exception,
    ``SystemExit`` (even ``SystemExit(0)``), ``KeyboardInterrupt``, a ``BaseException`` of its own -- is an
    InputError saying ``what`` raised it (exit 2), never a silent exit or exit 0. memtrain's own errors (a stop
    request's ``Interrupted``) pass through. ``details``: the InputError's other fields (``expected``, ...).

    >>> with user_code("model factory 'nets:make'"):       # doctest: +SKIP
    ...     raise SystemExit(0)
    InputError: model factory 'nets:make' raised SystemExit: 0
    """
    try:
        with _no_hard_exit():
            yield
    except MemtrainError:
        raise
    except HardExit as exc:
        raise InputError(f"{what} called os._exit({exc.code}): a model's code must not end the process",
                         **details) from exc
    except BaseException as exc:  # noqa: BLE001 - the user's code may raise anything
        raise InputError(f"{what} raised {type(exc).__name__}: {exc}", **details) from exc


class HardExit(BaseException):
    """The user's code called ``os._exit(code)`` while ``user_code`` ran it."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def _no_hard_exit() -> Iterator[None]:
    """``os._exit`` raises ``HardExit`` while the user's code runs: called at import (say), it would end memtrain
    at once with the code it gives, 0 too, skipping every ``finally`` -- a run that never started, reported
    as a success. Restored after, whatever happens (memtrain's own exits keep the real one)."""
    real = os._exit

    def refuse(code: int) -> NoReturn:
        raise HardExit(code)

    os._exit = refuse
    try:
        yield
    finally:
        os._exit = real


def _import(module_name: str, what: str, hint: str) -> Any:
    """Import the user's module; an ImportError says it cannot be found, anything else that importing it
    raised (``user_code``)."""
    try:
        with user_code(f"importing module {module_name!r} of {what}"):
            return importlib.import_module(module_name)
    except InputError as exc:
        if isinstance(exc.__cause__, ImportError):
            raise InputError(f"cannot import module {module_name!r} of {what} ({exc.__cause__})",
                             hint=hint) from exc.__cause__
        raise


@contextlib.contextmanager
def code_on_path(folder: str | None) -> Iterator[None]:
    """``folder`` first on ``sys.path`` while a model (and what it imports by name) is built."""
    if folder is None or folder in sys.path:
        yield
        return
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


# Options of [model] that name the user's code as "module:name" (besides kind), checked by ``import_path``
# when the job is loaded (config.py).
IMPORT_OPTIONS = ("factory", "loss")


def import_path(path: str, what: str, *, example: str = "'nets:make_cnn'") -> tuple[str, str]:
    """``"package.module:name"`` -> ``("package.module", "name")``: a module's dotted name (each part a Python
    identifier, so never a file path, ``..`` or a relative import) and an identifier; InputError if not.

    >>> import_path("nets.cnn:make", "model factory")
    ('nets.cnn', 'make')
    """
    module_name, _, name = path.partition(":")
    if not (module_name and name and all(part.isidentifier() for part in module_name.split("."))
            and name.isidentifier()):
        raise InputError(f"bad {what} {path!r}: a module's dotted name, a colon and a name are expected",
                         expected=f"'module:name' of Python identifiers, e.g. {example}", found=repr(path),
                         hint="put the module beside the job file (or in model.code_dir) and name it, not its path")
    return module_name, name


def import_object(path: str, what: str) -> object:
    """``"package.module:name"`` -> the object; InputError naming ``what`` when it cannot be found."""
    module_name, name = import_path(path, what)
    module = _import(module_name, f"{what} {path!r}",
                     hint="put it beside the job file (or in model.code_dir), or on PYTHONPATH")
    if not hasattr(module, name):
        raise InputError(f"module {module_name!r} has no {name!r} (the {what})", expected=f"a name {name}",
                         found="nothing", path=getattr(module, "__file__", None))
    return getattr(module, name)


def check_kind(kind: str) -> None:
    """A built-in kind, or an import path of the form ``package.module:ClassName`` (dotted identifiers; nothing
    is imported).

    >>> check_kind("mlp"); check_kind("nets:Model")   # both pass; "sofmax" raises: "... did you mean `softmax`?"
    """
    path = BUILTIN.get(kind, kind)
    if ":" not in path:
        raise InputError(f"unknown model kind {kind!r}",
                         expected=f"one of {', '.join(MODEL_KINDS)}, or 'package.module:ClassName'", found=repr(kind),
                         hint=did_you_mean(kind, MODEL_KINDS))
    import_path(path, "model kind", example="'mymodels:Huber'")


def model_class(kind: str) -> type:
    check_kind(kind)
    module_name, class_name = import_path(BUILTIN.get(kind, kind), "model kind", example="'mymodels:Huber'")
    module = _import(module_name, f"model {kind!r}", hint="check the name and that the module is on PYTHONPATH")
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise InputError(f"module {module_name!r} has no class {class_name!r}", expected=f"a class {class_name}",
                         found="nothing" if cls is None else type(cls).__name__)
    return cls


def check_protocol(kind: str, cls: type) -> None:
    """A model class must say whether it is additive and have the methods of its kind of model."""
    additive = getattr(cls, "additive", None)
    if not isinstance(additive, bool):
        raise InputError(f"model {kind!r} does not implement the model protocol",
                         expected="a class attribute additive = True or False", found=repr(additive))
    needed = BASE_METHODS + (ADDITIVE_METHODS if additive else GRADIENT_METHODS)
    missing = [name for name in needed if not callable(getattr(cls, name, None))]
    if additive and not any(callable(getattr(cls, name, None)) for name in STATISTICS_METHODS):
        missing.append(" or ".join(STATISTICS_METHODS))
        needed += (" or ".join(STATISTICS_METHODS),)
    if missing:
        raise InputError(f"model {kind!r} does not implement the model protocol",
                         expected=f"methods {', '.join(needed)}", found=f"missing {', '.join(missing)}")


def check_options(kind: str, cls: type, options: dict[str, Any]) -> None:
    """Unknown and missing options, read from the constructor's signature after its first (spec) parameter."""
    parameters = list(inspect.signature(cls).parameters.values())[1:]
    named = {p.name: p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if not any(p.kind is p.VAR_KEYWORD for p in parameters):
        for key in options:
            if key not in named:
                raise InputError(build_options_error(kind, key, named))
    missing = [name for name, p in named.items() if p.default is p.empty and name not in options]
    if missing:
        raise InputError(f"model {kind!r} needs option {missing[0]!r}", expected=f"a value for {missing[0]}",
                         found="nothing")


def _tuples(value: Any) -> Any:
    """TOML lists -> tuples, so options are hashable and fit tuple-typed dataclass fields."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
