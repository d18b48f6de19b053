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


def _cost_row(params: int, workers: int) -> dict:
    worker = {"read": 3 * 4 * params, "written": 4 * params, "read_bytes": 0, "write_bytes": 8 * params}
    return {"params": params, "workers": workers, "vector_bytes": 4 * params, "server_cpu_ms": 12.345,
            "server_loop_cpu_ms": 3.21, "scheduler_cpu_ms": 4.56, "updates_per_s": 17.5,
            "server": {"records": 2048, "rchar": 10240, "wchar": 4096, "read_bytes": 0, "write_bytes": 65536},
            "each_worker": [worker] * workers}


def test_the_cluster_costs_table_fits_an_80_column_terminal_and_stays_markdown_in_a_pipe(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``bench train --cluster --costs``: Markdown (about 200 columns, pasted into docs/cluster.md) in a pipe; at
    COLUMNS=80 the same cells in parts that fit, every number whole (issue 44: every view fits its terminal)."""
    from memtrain.benchmarks.cluster_costs import print_costs

    report = {"cluster": "local:2", "updates": 12, "warmup": 2, "loadavg_before": (0.5, 0.4, 0.3),
              "loadavg_after": (1.5, 1.4, 1.3), "rows": [_cost_row(1_000_000, 2), _cost_row(10_000_000, 8)]}
    monkeypatch.delenv("COLUMNS", raising=False)
    print_costs(report)
    pipe = capsys.readouterr().out.splitlines()
    assert pipe[1].startswith("| params | workers |") and max(map(len, pipe)) > 80
    monkeypatch.setenv("COLUMNS", "80")
    print_costs(report)
    narrow = capsys.readouterr().out
    assert max(len(line) for line in narrow.splitlines()) <= 80
    for number in ("1,000,000", "10,000,000", "12.3", "3.2", "4.6", "17.50", "11.4 MiB (3.00)", "38.1 MiB (1.00)"):
        assert number in narrow, number


def test_startup_without_a_cluster_is_a_usage_error(tmp_path: Path) -> None:
    result = bench(tmp_path, "--startup")
    assert result.returncode == 2, result.stderr
    assert "--startup measures a cluster's start-up" in result.stderr and "--cluster" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # two runs of the first job, one of them starting a Dask cluster: about 15 s on a busy machine
def test_startup_times_the_first_job_to_its_workers_listed_and_its_first_task(tmp_path: Path) -> None:
    """``--startup``: a real ``memtrain train --cluster local:2`` of the README's first job, timed to its
    workers listed and its rounds line, beside the same job without a cluster; the runs stopped at once."""
    result = bench(tmp_path, "--cluster", "local:2", "--startup", "--repeats", "1", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["cluster"] == "local:2" and report["job"] == "jobs/examples/digits-mlp.toml"
    listed, rounds, local = (report[key]["median"] for key in ("listed_s", "cluster_rounds_s", "local_rounds_s"))
    assert 0 < listed <= rounds < 280 and 0 < local < 280
    assert len(report["loadavg_before"]) == 3
    assert not list(tmp_path.iterdir())  # the scratch directory (dataset, runs) is removed


def test_the_startup_table_says_the_target_and_the_load(capsys: pytest.CaptureFixture[str]) -> None:
    from memtrain.benchmarks.cluster_start import print_startup

    spread = {"median": 1.2, "low": 1.1, "high": 1.7, "runs": [1.1, 1.2, 1.7]}
    print_startup({"cluster": "local:2", "repeats": 3, "job": "jobs/examples/digits-mlp.toml",
                   "loadavg_before": [0.5, 0.4, 0.3], "loadavg_after": [0.6, 0.4, 0.3], "listed_s": spread,
                   "cluster_rounds_s": spread, "local_rounds_s": spread})
    printed = capsys.readouterr().out
    assert "| --cluster local:2 | 1.20 (1.10-1.70) | 1.20 (1.10-1.70) |" in printed
    assert "load average before 0.50 0.40 0.30" in printed and "<= 5 s by median: met" in printed


def test_a_window_leaves_out_the_snapshots_own_messages() -> None:
    """``per_update``: the CPU and wall clocks run from after the first snapshot's messages (``Client.run`` to
    every worker, ``run_on_scheduler``: a few ms of the scheduler's and the server's CPU each, more with more
    workers) to before the last one's; the scheduler's CPU from ``/proc`` when it is on this machine."""
    from memtrain.benchmarks.cluster_costs import per_update, threads_cpu

    def clocks(at: float) -> dict:
        return {"wall": at, "cpu": at / 2, "loop_cpu": 0.0, "scheduler_local": at / 4}

    counts = {"server": {}, "workers": {}, "scheduler": (-1, 100.0)}
    first = clocks(0.0) | counts | {"after": clocks(1.0)}  # its messages took 1 s
    last = clocks(5.0) | counts | {"after": clocks(6.0)}
    row = per_update([first, last], 2, 10, 1)
    assert row["updates_per_s"] == pytest.approx(0.5)  # 2 updates in 4 s, not 5
    assert row["server_cpu_ms"] == pytest.approx(1000.0) and row["scheduler_cpu_ms"] == pytest.approx(500.0)
    spent = threads_cpu(os.getpid())
    sum(i * i for i in range(200_000))
    assert threads_cpu(os.getpid()) > spent and threads_cpu(2**22 + 7) is None
