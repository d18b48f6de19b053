"""Where `memtrain serve` imports a job's code from (issue 30, defect 2): the folder it checked is the folder
imported from and the folder recorded, and every folder code can be imported from follows the jobs folder's
rule (no group/other write). docs/serve.md "Security", docs/faults.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memtrain.layout import RUN_JOB
from memtrain.predict import load_model

pytestmark = pytest.mark.timeout(60)

JOB = """
[data]
path = "../data"

[model]
kind = "{kind}"
code_dir = "{code_dir}"

[train]
epochs = 1
batch_size = 100
tasks_per_update = 1
workers = 0

[run]
dir = "../runs/{name}"
"""
# A model module that leaves a mark beside itself when imported, so the test sees which file was imported.
MODEL = """from pathlib import Path
from memtrain.models.softmax import SoftmaxRegression as Model
Path(__file__).with_suffix(".imported").touch()
"""


@pytest.fixture
def root(tmp_path: Path, cli: Callable[..., Any]) -> Path:
    root = tmp_path / "root"
    for folder in ("jobs", "code", "jobs/code", "jobs/pkg"):
        (root / folder).mkdir(parents=True)
        (root / folder).chmod(0o755)
    assert cli("prepare", "--synthetic", "300x4", "--classes", "3", "--plain", root / "data").code == 0
    (root / "code" / "pwn.py").write_text(MODEL)
    (root / "jobs" / "code" / "pwn.py").write_text(MODEL)
    (root / "jobs" / "pkg" / "pwn.py").write_text(MODEL)
    return root


def serve_once(jobs: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memtrain", "serve", "--jobs", str(jobs), "--settle", "0.3",
                           "--grace", "1", "--once"], capture_output=True, text=True, timeout=50)


def drop(jobs: Path, name: str, kind: str, code_dir: str) -> None:
    (jobs / f"{name}.toml.tmp").write_text(JOB.format(kind=kind, code_dir=code_dir, name=name))
    os.rename(jobs / f"{name}.toml.tmp", jobs / f"{name}.toml")


def test_code_is_imported_from_the_folder_that_was_checked_and_recorded(root: Path) -> None:
    drop(root / "jobs", "a", "pwn:Model", "../code")
    done = serve_once(root / "jobs")
    assert done.returncode == 0, done.stderr
    assert (root / "jobs" / "done" / "a.result.json").exists(), os.listdir(root / "jobs" / "failed")
    assert (root / "code" / "pwn.imported").exists(), "the admitted root/code was not imported from"
    assert not (root / "jobs" / "code" / "pwn.imported").exists(), "imported from a folder it did not check"
    recorded = json.loads((root / "runs" / "a" / RUN_JOB).read_text())["model"]["code_dir"]
    assert recorded == str(root / "code")
    assert load_model(root / "runs" / "a").predict(np.zeros((2, 4), dtype=np.float32)).shape == (2,)


@pytest.mark.parametrize("writable, kind, code_dir", [
    ("code", "pwn:Model", "../code"),  # a world-writable model.code_dir
    ("jobs/pkg", "pkg.pwn:Model", "."),  # a world-writable package folder inside the jobs folder
    ("code/pwn.py", "pwn:Model", "../code"),  # a module file others can write to
], ids=["code_dir", "package-in-jobs-folder", "module-file"])
def test_code_others_can_write_to_is_refused(root: Path, writable: str, kind: str, code_dir: str) -> None:
    (root / writable).chmod(0o777 if (root / writable).is_dir() else 0o666)
    drop(root / "jobs", "w", kind, code_dir)
    done = serve_once(root / "jobs")
    assert done.returncode == 0, done.stderr
    error = json.loads((root / "jobs" / "failed" / "w.result.json").read_text())["error"]
    assert "that other users can write to" in error and str(root / writable) in error
    assert not list(root.rglob("*.imported")), "code was imported from a folder others can write to"
