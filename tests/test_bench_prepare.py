"""`memtrain bench prepare` at a tiny size: it names its baselines and the machine, and checks --dir.

No timing assertions: the figures depend on the machine; only the shape of the report is checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memtrain.prepare import bench

pytestmark = pytest.mark.timeout(240)


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memtrain", "bench", "prepare", *args], capture_output=True,
                          text=True, timeout=230, env=dict(os.environ))


def test_table_names_each_baseline_and_the_machine(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    result = run_bench("--gb", "0.003", "--repeats", "2", "--sources", "npy,h5,csv", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "2 alternating runs" in lines[0]
    stages_at = next(i for i, line in enumerate(lines) if line.startswith("median seconds by stage"))
    rows = {tuple(line.split()[:2]): line for line in lines[2:stages_at]}
    stages = {tuple(line.split()[:2]): line for line in lines[stages_at + 1:-2]}
    assert set(rows) == {("npy", "shuffle"), ("npy", "no-shuffle"), ("h5", "shuffle"), ("h5", "no-shuffle"),
                         ("csv", "shuffle")}
    assert "np.load + np.save + fsync" in rows["npy", "shuffle"]
    assert "h5py read + np.save + fsync" in rows["h5", "no-shuffle"]
    assert "pyarrow.csv.read_csv + np.save + fsync" in rows["csv", "shuffle"]
    assert set(stages) == set(rows)  # where each side's time went, per row
    for key in [("npy", "shuffle"), ("h5", "no-shuffle")]:
        assert "baseline read " in stages[key] and ", fsync " in stages[key] and "memtrain scatter " in stages[key]
        assert ", shards " in stages[key] and ", publish " in stages[key]
    assert lines[-2].startswith("machine: ") and " CPUs (" in lines[-2] and "GiB RAM" in lines[-2]
    assert "memtrain's CSV parser: pyarrow" in lines[-2] and "files on " in lines[-2]
    assert lines[-1].startswith("load average")
    assert os.listdir(tmp_path) == []  # sources and datasets are removed
    # progress on stderr, not in the table: stderr is not a terminal here, so a line every 10 s at most
    assert result.stderr.startswith("bench prepare:   0.0% writing the 0.003 GB npy source (1 of 23)\n")
    assert not any(line.startswith("bench prepare:") for line in lines)


def test_json_report_keeps_every_run(tmp_path: Path) -> None:
    result = run_bench("--gb", "0.002", "--repeats", "2", "--sources", "npz", "--dir", str(tmp_path), "--json",
                       "--settle", "0.1")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["settle"] == 0.1
    assert "each run after a sync and 0.1 s of quiet" in bench.format_table(report).splitlines()[0]
    assert [(r["source"], r["options"]) for r in report["results"]] == [("npz", "shuffle"), ("npz", "no-shuffle")]
    for row in report["results"]:
        assert row["baseline"] == "np.load(.npz) + np.save + fsync"
        assert len(row["baseline_mbps"]) == len(row["memtrain_mbps"]) == len(row["ratios"]) == 2
        assert all(v > 0 for v in row["baseline_mbps"] + row["memtrain_mbps"] + row["memtrain_peak_mib"])
        assert [sorted(stages) for stages in row["baseline_stages"]] == [["fsync", "read", "write"]] * 2
        assert [sorted(stages) for stages in row["memtrain_stages"]] == [["publish", "scatter", "shards"]] * 2
    assert report["machine"]["cpus"] >= 1 and report["machine"]["memory_gib"] > 0


def test_csv_baseline_without_pyarrow_is_named_for_what_it_runs(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.csv", None)
    _, name = bench._baseline("csv", [tmp_path / "s.csv"], tmp_path / "out")
    assert name == "np.loadtxt + np.save + fsync"


@pytest.mark.parametrize("make", ["missing", "file"])
def test_dir_must_be_an_existing_directory(tmp_path: Path, make: str) -> None:
    target = tmp_path / "scratch"
    if make == "file":
        target.write_text("")
    result = run_bench("--gb", "0.001", "--dir", str(target))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{target}: --dir must be an existing directory" in result.stderr
    assert ("found a file" if make == "file" else "found nothing there") in result.stderr


def test_unknown_source_is_a_usage_error() -> None:
    result = run_bench("--sources", "npy,xlsx")
    assert result.returncode == 2 and "unknown --sources" in result.stderr and "xlsx" in result.stderr


def test_negative_settle_is_a_usage_error() -> None:
    result = run_bench("--settle", "-1")
    assert result.returncode == 2 and "--settle must be zero or more seconds" in result.stderr
    assert "Traceback" not in result.stderr
