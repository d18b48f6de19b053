"""User code may raise anything (issue 30, defect 5): a factory, a model class, a module's import or a loss that
raises SystemExit(0), KeyboardInterrupt or a BaseException of its own is reported (exit 2 at start, exit 1 when a
run fails); a run that did not finish never exits 0 (docs/faults.md)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tiny_data import blobs, write_dataset

pytestmark = pytest.mark.timeout(60)

# Two modules, so that the runs of plain models never import torch (seconds per process).
TORCH_CODE = '''
from torch import nn


class Own(BaseException):
    pass


def factory_exit(spec):
    raise SystemExit(0)


def factory_interrupt(spec):
    raise KeyboardInterrupt


def factory_own(spec):
    raise Own("a BaseException of its own")


def linear(spec):
    return nn.Linear(spec.n_features, spec.n_classes)


def loss_exit(output, target):
    raise SystemExit(0)
'''
CODE = '''
from memtrain.models.softmax import SoftmaxRegression


class Own(BaseException):
    pass


class Quitting(SoftmaxRegression):
    def __init__(self, spec, **options):
        raise SystemExit(0)


class InitQuits(SoftmaxRegression):
    def init(self, rng):
        raise SystemExit(0)


class InitOwn(SoftmaxRegression):
    def init(self, rng):
        raise Own("from init")


class Exploding(SoftmaxRegression):
    def loss_and_grad(self, *args, **kwargs):
        raise SystemExit(0)
'''


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("user")
    x, y = blobs(n=300, features=4, classes=3)
    write_dataset(folder / "data", x, y)
    (folder / "usercode.py").write_text(CODE)
    (folder / "torchcode.py").write_text(TORCH_CODE)
    (folder / "quits_on_import.py").write_text("raise SystemExit(0)\n")
    (folder / "hard_exit_on_import.py").write_text("import os\n\nos._exit(0)\n")
    return folder


def job(folder: Path, name: str, model: str, workers: int = 0) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(f'[data]\npath = "data"\n[model]\n{model}\n[train]\nepochs = 1\nbatch_size = 100\n'
                    f'workers = {workers}\n[run]\ndir = "runs/{name}"\n')
    return path


@pytest.mark.parametrize(("name", "model", "message"), [
    ("exit", 'kind = "torch"\nfactory = "torchcode:factory_exit"',
     "model factory 'torchcode:factory_exit' raised SystemExit: 0"),
    ("interrupt", 'kind = "torch"\nfactory = "torchcode:factory_interrupt"',
     "model factory 'torchcode:factory_interrupt' raised KeyboardInterrupt"),
    ("own", 'kind = "torch"\nfactory = "torchcode:factory_own"',
     "model factory 'torchcode:factory_own' raised Own: a BaseException of its own"),
    ("loss", 'kind = "torch"\nfactory = "torchcode:linear"\nloss = "torchcode:loss_exit"',
     "loss 'torchcode:loss_exit' of model factory 'torchcode:linear' raised SystemExit: 0"),
    ("class", 'kind = "usercode:Quitting"', "model 'usercode:Quitting' raised SystemExit: 0"),
    ("import", 'kind = "quits_on_import:Model"',
     "importing module 'quits_on_import' of model 'quits_on_import:Model' raised SystemExit: 0"),
], ids=["factory-exit", "factory-interrupt", "factory-own", "loss-exit", "class-exit", "import-exit"])
def test_user_code_raising_anything_at_start_is_a_usage_error(cli: Callable[..., Any], folder: Path, name: str,
                                                              model: str, message: str) -> None:
    result = cli("train", job(folder, name, model))
    assert result.code == 2, result.err
    assert message in result.err and "Traceback" not in result.err
    assert not (folder / "runs" / name).exists()


@pytest.mark.parametrize("workers", [0, 1])
def test_a_model_raising_systemexit_0_in_training_fails_the_run(folder: Path, workers: int) -> None:
    """Through the real command line: `python -m memtrain` exited 0 with no output (SystemExit(0) passed through)."""
    name = f"exploding{workers}"
    result = subprocess.run([sys.executable, "-m", "memtrain", "train",
                             job(folder, name, 'kind = "usercode:Exploding"', workers)],
                            capture_output=True, text=True, timeout=50, cwd=folder)
    assert result.returncode == 1, result.stderr
    assert "SystemExit" in result.stderr and "Traceback" not in result.stderr.split("error:")[0]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_module_calling_os_exit_0_at_import_never_exits_0(folder: Path, workers: int) -> None:
    """os._exit(0) skips every handler: `memtrain train` ended with exit 0 and nothing trained (issue 41)."""
    name = f"hard{workers}"
    result = subprocess.run([sys.executable, "-m", "memtrain", "train",
                             job(folder, name, 'kind = "hard_exit_on_import:Model"', workers)],
                            capture_output=True, text=True, timeout=50, cwd=folder)
    assert result.returncode == 2, result.stderr
    assert ("importing module 'hard_exit_on_import' of model 'hard_exit_on_import:Model' called os._exit(0)"
            in result.stderr)
    assert "Traceback" not in result.stderr
    assert not (folder / "runs" / name).exists()


def test_a_factory_raising_systemexit_0_exits_2_through_the_real_command_line(folder: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "memtrain", "train",
                             job(folder, "cmdline", 'kind = "torch"\nfactory = "torchcode:factory_exit"')],
                            capture_output=True, text=True, timeout=50, cwd=folder)
    assert result.returncode == 2, result.stderr
    assert "model factory 'torchcode:factory_exit' raised SystemExit: 0" in result.stderr


@pytest.mark.parametrize(("kind", "message"), [
    ("usercode:InitQuits", "stopped by SystemExit(0) raised inside the command"),
    ("usercode:InitOwn", "stopped by Own: from init"),
], ids=["systemexit-0", "own-baseexception"])
def test_the_command_lines_last_net_never_exits_0(cli: Callable[..., Any], folder: Path, kind: str,
                                                  message: str) -> None:
    """Raised where no narrower rule catches it (a model's init, in the server): still an error, exit 1."""
    result = cli("train", job(folder, kind.partition(":")[2], f'kind = "{kind}"'))
    assert result.code == 1, result.err
    assert message in result.err and "Traceback" not in result.err
