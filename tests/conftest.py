"""Shared tiny fixtures: small files on disk and an in-process `memtrain` CLI runner."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from memtrain import faults
from memtrain.cli import main

# The suite starts thousands of interpreters (servers, spawned workers, Dask processes, `python -m memtrain`), each
# importing memtrain. Under PYTHONDONTWRITEBYTECODE (set in many containers and CI images) none of them finds a cached
# .pyc of this checkout, so each compiles memtrain's modules again, and each pytest process rewrites every test
# module's asserts anew: 20% of the suite's CPU (test_faults.py: 77 s of CPU with it, 61 s without). For the
# suite's own processes, from here on, bytecode is cached as Python does by default (__pycache__, in .gitignore).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# Every Dask process the tests start (theirs and memtrain's, which inherit this environment) checks its event
# loop's latency every 20 ms by default, only to warn when the loop was blocked: an idle scheduler and two
# workers (5 processes) then burn 8% of a core. Every 500 ms: half that, and nothing the tests look at changes.
os.environ.setdefault("DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL", "500ms")

# Property tests check results, never speed: a per-example deadline only measures how loaded the machine is.
settings.register_profile("memtrain", deadline=None)
settings.load_profile("memtrain")


@pytest.fixture(autouse=True)
def fault_spec_read_afresh() -> object:
    """Each test reads MEMTRAIN_FAULT as it sets it (memtrain reads it once per process: memtrain/faults.py),
    and leaves no armed fault point or hit count to the next test in this process."""
    faults.reread()
    yield
    faults.reread()


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run ``memtrain ARGS...`` in this process; returns exit code, stdout and stderr."""
    def run(*args: object) -> CliResult:
        capsys.readouterr()
        code = main([os.fspath(a) if isinstance(a, Path) else str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)
    return run


@pytest.fixture
def write_file(tmp_path: Path) -> Callable[[str, str | bytes], Path]:
    """Write text or bytes to ``tmp_path/name`` and return the path."""
    def write(name: str, content: str | bytes) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        return path
    return write


@pytest.fixture
def small_table() -> tuple[np.ndarray, np.ndarray]:
    """40 rows x 3 float features (exact in float32) and integer labels 0..3."""
    rng = np.random.default_rng(1234)
    x = np.round(rng.normal(size=(40, 3)) * 8) / 8
    y = rng.integers(0, 4, size=40)
    return x, y


def table_csv(x: np.ndarray, y: np.ndarray, names: list[str] | None = None, label: str = "label") -> str:
    """CSV text of a feature matrix and a label column (header included)."""
    names = names or [f"f{i}" for i in range(x.shape[1])]
    lines = [",".join([*names, label])]
    lines += [",".join([*(repr(float(v)) for v in row), str(t)]) for row, t in zip(x, y, strict=True)]
    return "\n".join(lines) + "\n"


# The files that take longest, longest first (`python -m pytest --durations=0`, summed per file; 2026-11-28). The
# README's command runs the suite on 2 processes, a file to a process (`-n 2 --dist loadfile`), handing out the files
# in collection order (`--no-loadscope-reorder`): started first, the long files end while the short ones fill the
# other process, where xdist's own order (most tests first) hands out a long file of few tests (test_bench_rl.py:
# 6 tests, 5% of the time) among the last, for one process to run while the other may have nothing left.
LONGEST_FILES = ("test_faults.py", "test_bench.py", "test_bench_rl.py", "test_async.py", "test_node_processes.py",
                 "test_torch.py", "test_cluster.py", "test_serve.py", "test_slurm.py", "test_rl_faults.py",
                 "test_additive.py", "test_goldens.py", "test_train.py", "test_inspect.py", "test_links.py",
                 "test_node_round.py", "test_rl_learner_workers.py", "test_bench_prepare.py", "test_format_spec.py",
                 "test_rounds.py", "test_pools.py", "test_rl_staleness.py", "test_rl_async.py", "test_nodes.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first, in LONGEST_FILES' order; every file's own tests keep their order."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FILES)))
