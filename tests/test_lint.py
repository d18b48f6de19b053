"""The style bar is part of the test suite: `ruff check` must pass on the package, the tests and benchmarks/."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean() -> None:
    if shutil.which("ruff") is None and subprocess.run([sys.executable, "-m", "ruff", "--version"],
                                                        capture_output=True).returncode != 0:
        pytest.fail("ruff is not installed: it is part of the test extra (pip install -e '.[test]')")
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "memtrain", "tests", "benchmarks"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
