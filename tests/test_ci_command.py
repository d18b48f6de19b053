"""CI runs exactly the README's test command (.ci/run), so a newcomer's run and CI's are the same suite."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = "# install the test dependencies and run the test suite (what CI runs: .ci/run)"


def test_ci_runs_the_readme_s_test_command() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    command = readme[readme.index(MARK) + 1]
    assert "python -m pytest" in command
    script = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert script[-1] == command, f".ci/run ends with {script[-1]!r}, the README says {command!r}"
    assert "set -euo pipefail" in script  # pytest's exit 5 (no test collected) fails CI too
