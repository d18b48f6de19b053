"""Model kind + options + DataSpec -> a model object (built-in kinds, or a user class by import path)."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

from memtrain.errors import InputError, did_you_mean
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
ADDITIVE_METHODS = ("statistic_shapes", "statistics", "solve")
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
        return cls(spec, **options)


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


def import_object(path: str, what: str) -> object:
    """``"package.module:name"`` -> the object; InputError naming ``what`` when it cannot be found."""
    module_name, _, name = path.partition(":")
    if not module_name or not name:
        raise InputError(f"bad {what} {path!r}", expected="'module:name', e.g. 'nets:make_cnn'", found=repr(path))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"cannot import module {module_name!r} of {what} {path!r} ({exc})",
                         hint="put it beside the job file (or in model.code_dir), or on PYTHONPATH") from exc
    if not hasattr(module, name):
        raise InputError(f"module {module_name!r} has no {name!r} (the {what})", expected=f"a name {name}",
                         found="nothing", path=getattr(module, "__file__", None))
    return getattr(module, name)


def check_kind(kind: str) -> None:
    """A built-in kind, or the form of an import path (``package.module:ClassName``; nothing is imported).

    >>> check_kind("mlp"); check_kind("nets:Model")   # both pass; "sofmax" raises: "... did you mean `softmax`?"
    """
    module_name, _, class_name = BUILTIN.get(kind, kind).partition(":")
    if not class_name or not module_name:
        raise InputError(f"unknown model kind {kind!r}",
                         expected=f"one of {', '.join(MODEL_KINDS)}, or 'package.module:ClassName'", found=repr(kind),
                         hint=did_you_mean(kind, MODEL_KINDS))


def model_class(kind: str) -> type:
    check_kind(kind)
    module_name, _, class_name = BUILTIN.get(kind, kind).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"cannot import module {module_name!r} of model {kind!r} ({exc})",
                         hint="check the name and that the module is on PYTHONPATH") from exc
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
