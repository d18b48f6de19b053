"""CI runs exactly the README's test command (.ci/run), so a newcomer's run and CI's are the same suite."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = "# install the test dependencies and run the test suite (what CI runs: .ci/run)"


def readme_command() -> str:
    readme = (ROOT / "README.md").read_text().splitlines()
    return readme[readme.index(MARK) + 1]


def test_ci_runs_the_readme_s_test_command() -> None:
    command = readme_command()
    assert "python -m pytest" in command
    script = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert script[-1] == command, f".ci/run ends with {script[-1]!r}, the README says {command!r}"
    assert "set -euo pipefail" in script  # pytest's exit 5 (no test collected) fails CI too


def test_the_command_s_parallel_run_is_installed_by_the_test_extra() -> None:
    """The command runs the suite on 2 processes a file each, the longest files first (tests/conftest.py): its
    options are pytest-xdist's, which the test extra it installs must hold, at a version that has them all."""
    command = readme_command()
    assert re.search(r"python -m pytest -n 2 --dist loadfile --no-loadscope-reorder$", command), command
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert "pytest-xdist>=3.8,<4" in extra  # --no-loadscope-reorder came with 3.8.0
