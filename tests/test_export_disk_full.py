"""A full disk during `inspect --export OUT.h5` names OUT and the room on OUT's filesystem, not the working
directory's (issue 30, defect 8; docs/faults.md). A real size-limited tmpfs (root is needed to mount it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tiny_data import blobs, write_dataset

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def small_disk(tmp_path: Path):
    point = tmp_path / "small"
    point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(point)], capture_output=True,
                            text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()})")
    yield point
    subprocess.run(["umount", "-l", str(point)], check=False)


def test_h5_export_on_a_full_disk_names_the_target(tmp_path: Path, small_disk: Path) -> None:
    x, y = blobs(n=300, features=4, classes=3)
    data = write_dataset(tmp_path / "data", x, y)
    (tmp_path / "job.toml").write_text(f'[data]\npath = "{data}"\n[model]\nkind = "mlp"\nhidden = [4096]\n'
                                       '[train]\nepochs = 1\nworkers = 0\n[run]\ndir = "run"\n')
    memtrain = [sys.executable, "-m", "memtrain"]
    assert subprocess.run([*memtrain, "train", "job.toml"], cwd=tmp_path, capture_output=True).returncode == 0
    out = small_disk / "params.h5"
    result = subprocess.run([*memtrain, "inspect", "run", "--export", out], cwd=tmp_path, capture_output=True,
                            text=True, timeout=50)
    assert result.returncode == 1, result.stderr
    assert f"{out}: no space left on the device while writing" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert list(small_disk.iterdir()) == []  # nothing partial left
