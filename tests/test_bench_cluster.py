"""`memtrain bench train --cluster ADDRESS --costs` (memtrain/benchmarks/cluster_costs.py): a cluster run's cost per
update by who pays it. Counts, not timings: the server's records and writes stay small, the workers read and write
about three vectors per task whatever their number; ``--costs`` without ``--cluster`` is a usage error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed")

pytestmark = pytest.mark.timeout(300)


def bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memtrain", "bench", "train", "--dir", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=280, env=dict(os.environ))


def test_costs_without_a_cluster_is_a_usage_error(tmp_path: Path) -> None:
    result = bench(tmp_path, "--costs", "--sizes", "1e4")
    assert result.returncode == 2, result.stderr
    assert "--costs measures a cluster run" in result.stderr and "--cluster" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # a Dask cluster and a 1e5-parameter run: about 25 s on a busy machine
def test_costs_count_records_in_the_server_and_about_three_vectors_per_worker(tmp_path: Path) -> None:
    result = bench(tmp_path, "--cluster", "local:2", "--costs", "--sizes", "1e5", "--updates", "5", "--warmup", "1",
                   "--json")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["rows"]
    assert row["workers"] == 2 and row["vector_bytes"] == row["params"] * 4
    assert 0 < row["server"]["records"] < 64 * 1024  # task and result records only
    assert row["server"]["wchar"] < 64 * 1024  # the server writes no parameter
    assert len(row["each_worker"]) == 2
    # a worker per task: (2 + 1/N) vectors read, (1 + 1/N) written, plus headers; which worker takes which
    # task is not fixed (whoever is idle), so the sum over the N = 2 workers is what is pinned: 5 and 3
    read = sum(worker["read"] for worker in row["each_worker"]) / row["vector_bytes"]
    written = sum(worker["written"] for worker in row["each_worker"]) / row["vector_bytes"]
    assert 4.8 <= read <= 5.6 and 2.9 <= written <= 3.4, (read, written)
    assert row["updates_per_s"] > 0 and row["server_cpu_ms"] > 0
