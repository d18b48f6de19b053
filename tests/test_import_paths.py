"""Import paths in a job are a module's dotted name and a name, never a file path (issue 30, defect 7):
`model.factory = "../../x:f"` or `"..evil:f"` gave a traceback (exit 1); now a usage error naming the key
(exit 2), at `memtrain train` and at `memtrain serve`'s admission (docs/faults.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tiny_data import blobs, write_dataset

from memtrain.errors import InputError
from memtrain.serve.admit import admit

BAD = ["../../x:f", "..evil:f", "a/b:f", "nets:../f", "nets.:f", "nets:f.g", " nets:f"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=200, features=4, classes=3)
    return write_dataset(tmp_path_factory.mktemp("data") / "ds", x, y)


@pytest.mark.parametrize("key", ["factory", "loss", "kind"])
@pytest.mark.parametrize("text", BAD)
def test_a_path_where_a_module_name_belongs_is_a_usage_error(cli: Callable[..., Any], tmp_path: Path, data: Path,
                                                              key: str, text: str) -> None:
    model = {"factory": f'kind = "torch"\nfactory = "{text}"', "kind": f'kind = "{text}"',
             "loss": f'kind = "torch"\nfactory = "nets:mlp"\nloss = "{text}"'}[key]
    (tmp_path / "job.toml").write_text(f'[data]\npath = "{data}"\n[model]\n{model}\n[train]\nepochs = 1\n')
    result = cli("train", tmp_path / "job.toml")
    assert result.code == 2, result.err
    assert f"bad model.{key} {text!r}" in result.err and "Traceback" not in result.err
    assert "job.toml" in result.err
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_serve_refuses_it_at_admission(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"bad model.factory '\.\./\.\./x:f'"):
        admit(b'[model]\nkind = "torch"\nfactory = "../../x:f"\n', tmp_path / "a.toml", base=tmp_path, root=None,
              spool=tmp_path)
