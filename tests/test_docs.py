"""The documentation site builds with ``mkdocs build --strict``: every page in the nav, every link and anchor
resolves, every API reference names a real object."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_the_site_builds_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner about its successor
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "formats" / "index.html").exists()
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "open_dataset" in api and "load_model" in api  # the reference was generated from the docstrings
    home = (tmp_path / "site" / "index.html").read_text()
    assert "penguins.csv" in home  # the README's tour, included by pymdownx.snippets
