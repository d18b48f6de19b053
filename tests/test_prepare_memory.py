"""Peak anonymous memory of memtrain prepare is bounded by the chunk size, not by the source size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memtrain.prepare.synthetic import write_synthetic_source

PROBE = Path(__file__).with_name("prepare_memory_probe.py")
# The documented bound (docs/prepare.md, "Memory"): growth of RssAnon <= 4.5 x --chunk-mb + 16 MiB of fixed costs.
SLOPE, FIXED_MIB = 4.5, 16


def peak_growth(tmp_path: Path, *args: object) -> dict:
    result = subprocess.run([sys.executable, str(PROBE), *map(str, args)], capture_output=True, text=True,
                            timeout=120, cwd=Path(__file__).parents[1])
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["code"] == 0, result.stderr
    return report


@pytest.mark.timeout(120)
def test_npy_source_20x_the_chunk(tmp_path):
    x, y = write_synthetic_source(tmp_path / "s.npy", 1_200_000, 64, seed=1)  # 307 MB of features
    report = peak_growth(tmp_path, x, tmp_path / "out", "--y", y, "--chunk-mb", 16, "--shard-mb", 16)
    assert x.stat().st_size > 18 * 16 * 2**20
    assert report["growth_mib"] < SLOPE * 16 + FIXED_MIB, report


@pytest.mark.timeout(120)
def test_csv_source_30x_the_chunk(tmp_path):
    (path,) = write_synthetic_source(tmp_path / "s.csv", 150_000, 64, seed=1)  # 67 MB of text
    report = peak_growth(tmp_path, path, tmp_path / "out", "--chunk-mb", 2, "--shard-mb", 8)
    assert path.stat().st_size > 30 * 2 * 2**20
    assert report["growth_mib"] < SLOPE * 2 + FIXED_MIB, report
