"""--no-shuffle on an array source: the rows are read again from the source in pass 2 instead of being copied
into the spool; the dataset is byte for byte the one a spooled source gives, and a changed source is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import memtrain.prepare.pipeline
from memtrain.errors import InputError
from memtrain.prepare import PrepareOptions, prepare
from tests import dataset_files
from tests.conftest import table_csv

ROOT = Path(__file__).parents[1]


def quiet(options: PrepareOptions) -> None:
    prepare(options, say=lambda _: None, force_plain=True)


def dataset_bytes(path: Path) -> dict[str, bytes]:
    # what names the source, and how a CSV's text became numbers (array sources have no encoding)
    return dataset_files.dataset_bytes(path, ignore=("source", "options", "feature_names", "encoding"))


@pytest.fixture
def table() -> tuple[np.ndarray, np.ndarray]:
    """3,000 rows of values exact in float32 (so CSV text gives the same numbers), a few of them NaN."""
    rng = np.random.default_rng(5)
    x = np.round(rng.normal(size=(3000, 6)) * 8) / 8
    x[[17, 1234, 2999], [0, 3, 5]] = np.nan
    return x, rng.integers(0, 4, size=3000)


@pytest.mark.parametrize("drop", [False, True])
def test_reread_array_sources_match_a_spooled_csv(tmp_path, table, drop):
    x, y = table
    if not drop:
        x = np.nan_to_num(x)
    csv = tmp_path / "t.csv"
    csv.write_text(table_csv(x, y))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    np.savez_compressed(tmp_path / "a.npz", x=x, y=y)
    with h5py.File(tmp_path / "a.h5", "w") as handle:
        handle.create_dataset("x", data=x, chunks=(100, 6), compression="gzip")
        handle["y"] = y
    # --missing error: a CSV's "nan" is a non-finite number, as in the arrays (not a missing value to impute)
    common = {"shuffle": False, "drop_nonfinite": drop, "chunk_mb": 0.02, "shard_mb": 0.02, "seed": 3,
              "missing": "error"}
    runs = {"csv": PrepareOptions(csv, tmp_path / "csv", **common),
            "npy": PrepareOptions(tmp_path / "x.npy", tmp_path / "npy", y=str(tmp_path / "y.npy"), **common),
            "npz": PrepareOptions(tmp_path / "a.npz", tmp_path / "npz", **common),
            "h5": PrepareOptions(tmp_path / "a.h5", tmp_path / "h5", **common)}
    for options in runs.values():
        quiet(options)
    reference = dataset_bytes(tmp_path / "csv")
    assert len(reference) > 10
    for name in ("npy", "npz", "h5"):
        assert dataset_bytes(tmp_path / name) == reference, name
    manifest = json.loads((tmp_path / "npy" / "manifest.json").read_text())
    assert manifest["dropped_rows"] == (3 if drop else 0)


def test_the_spool_holds_only_label_codes_and_a_rerun_resumes(tmp_path, table):
    x, y = np.nan_to_num(table[0]), table[1]
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    args = [sys.executable, "-m", "memtrain", "prepare", str(tmp_path / "x.npy"), str(tmp_path / "ds"), "--y",
            str(tmp_path / "y.npy"), "--no-shuffle", "--shard-mb", "0.02", "--chunk-mb", "0.05"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMTRAIN_FAULT")}
    killed = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=ROOT,
                            env=env | {"MEMTRAIN_FAULT": "prepare_after_shard:3"})
    assert killed.returncode == -9, killed.stderr
    (work,) = [p for p in tmp_path.iterdir() if p.name.startswith(".ds.prepare-")]
    assert sorted(p.name for p in (work / "spool").iterdir()) == ["y-00000.bin"]
    again = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert again.returncode == 0 and "3 shards already complete" in again.stderr, again.stderr
    quiet(PrepareOptions(tmp_path / "x.npy", tmp_path / "ref", y=str(tmp_path / "y.npy"), shuffle=False,
                         shard_mb=0.02, chunk_mb=0.05))
    assert dataset_bytes(tmp_path / "ds") == dataset_bytes(tmp_path / "ref")


def test_a_source_changed_between_the_passes_is_refused(tmp_path, table, monkeypatch):
    x, y = np.nan_to_num(table[0]), table[1]
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    scatter = memtrain.prepare.pipeline._scatter

    def scatter_then_edit(*args, **kwargs):
        info = scatter(*args, **kwargs)
        np.save(tmp_path / "x.npy", x[:-1])  # someone rewrites the source meanwhile
        return info

    monkeypatch.setattr(memtrain.prepare.pipeline, "_scatter", scatter_then_edit)
    with pytest.raises(InputError, match="the source changed while it was being prepared"):
        quiet(PrepareOptions(tmp_path / "x.npy", tmp_path / "ds", y=str(tmp_path / "y.npy"), shuffle=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy", "y.npy"]
