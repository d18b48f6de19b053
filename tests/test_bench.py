"""`memtrain bench train` at a tiny size: it runs every method and prints a well-formed table or JSON.

No timing assertions: the figures depend on the machine; only the shape of the report is checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memtrain.benchmarks.runner import METHODS, TORCH_METHODS
from memtrain.benchmarks.synthetic import mlp_shape

pytestmark = pytest.mark.timeout(240)


def bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memtrain", "bench", "train", "--sizes", "1e4", "--updates", "4",
                           "--warmup", "1", "--repeats", "1", "--dir", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=230, env=dict(os.environ))


def test_json_report_has_every_method_with_sane_fields(tmp_path: Path) -> None:
    result = bench(tmp_path, "--json", "--methods", ",".join(METHODS))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    rows = report["results"]
    assert [row["method"] for row in rows] == list(METHODS)
    for row in rows:
        assert row["params"] == mlp_shape(10_000).params
        assert row["samples_per_s"] > 0 and row["update_ms"] > 0 and row["peak_mib"] > 0
        assert 0 < row["pss_mib"] <= row["peak_mib"]
        assert row["updates_measured"] == 3
        assert row["compute_ms"] is not None and row["compute_ms"] > 0
    memtrain = rows[0]
    assert memtrain["memtrain_ratio"] == pytest.approx(1.0)
    assert any("exchange area" in line for line in memtrain["exchange"])
    assert os.listdir(tmp_path) == []  # datasets and runs are removed
    assert report["machine"]["cpus"] >= 1 and report["machine"]["cpu"] and report["machine"]["blas"] != "unknown"


def test_torch_comparison_runs_ddp_and_takes_ratios_against_memtrain_with_the_torch_module(tmp_path: Path) -> None:
    result = bench(tmp_path, "--json", "--methods", ",".join(TORCH_METHODS))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    rows = {row["method"]: row for row in report["results"]}
    assert list(rows) == list(TORCH_METHODS)
    base = rows["torch_memtrain"]["samples_per_s"]
    for row in rows.values():
        assert row["params"] == mlp_shape(10_000).params and row["updates_measured"] == 3
        assert row["samples_per_s"] > 0 and 0 < row["pss_mib"] <= row["peak_mib"]
        assert row["memtrain_ratio"] == pytest.approx(base / row["samples_per_s"])
        assert 0 < row["compute_ms"] <= row["update_ms"] * 1.5
    assert report["machine"]["torch"].startswith("2.13.0")
    assert os.listdir(tmp_path) == []


def test_table_lists_every_method(tmp_path: Path) -> None:
    result = bench(tmp_path, "--methods", "memtrain,one_process")
    assert result.returncode == 0, result.stderr
    for header in ("samples/s", "overhead ms", "peak MiB", "peak PSS MiB", "memtrain ÷ method"):
        assert header in result.stdout
    assert "memtrain" in result.stdout and "one process, 1 thread" in result.stdout
    assert "numpy " in result.stdout and " CPUs (" in result.stdout  # the caption names the machine


def test_unknown_method_is_a_usage_error(tmp_path: Path) -> None:
    result = bench(tmp_path, "--methods", "memtrain,mpi")
    assert result.returncode == 2
    assert "unknown --methods" in result.stderr
