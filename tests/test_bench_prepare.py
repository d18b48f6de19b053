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
from table_widths import assert_fits_or_whole

from memtrain.prepare import bench

pytestmark = pytest.mark.timeout(240)


def run_bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memtrain", "bench", "prepare", *args], capture_output=True,
                          text=True, timeout=230, env={**os.environ, **(env or {})})


def test_table_names_each_baseline_and_the_machine(tmp_path: Path) -> None:
    """On an 80-column terminal (issue 44): the table is cut into parts, each naming its rows by source and
    options; the lines under it wrap."""
    pytest.importorskip("pyarrow")
    result = run_bench("--gb", "0.003", "--repeats", "2", "--sources", "npy,h5,csv", "--dir", str(tmp_path),
                       env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 80, result.stdout
    text = " ".join(result.stdout.split())
    assert "2 alternating runs" in text
    rows: dict[tuple[str, ...], str] = {}
    for line in lines:
        if "│" in line:
            cells = [cell.strip() for cell in line.split("│")]
            rows[tuple(cells[:2])] = rows.get(tuple(cells[:2]), "") + " " + " ".join(cells[2:])
    assert set(rows) == {("npy", "shuffle"), ("npy", "no-shuffle"), ("h5", "shuffle"), ("h5", "no-shuffle"),
                         ("csv", "shuffle")}
    assert "np.load + np.save + fsync" in rows["npy", "shuffle"]
    assert "h5py read + np.save + fsync" in rows["h5", "no-shuffle"]
    assert "pyarrow.csv.read_csv + np.save + fsync" in rows["csv", "shuffle"]
    stages = text.split("median seconds by stage", 1)[1]
    for source, options in rows:  # where each side's time went, per row
        assert f" {source} {options}: baseline read " in stages
    assert stages.count(", fsync ") == stages.count("memtrain scatter ") == stages.count(", publish ") == len(rows)
    assert "machine: " in stages and " CPUs (" in stages and "GiB RAM" in stages
    assert "memtrain's CSV parser: pyarrow" in stages and "files on " in stages
    assert lines[-1].startswith("load average") or "load average (1, 5, 15 min) before" in stages
    assert os.listdir(tmp_path) == []  # sources and datasets are removed
    # progress on stderr, not in the table: stderr is not a terminal here, so a line every 10 s at most
    assert result.stderr.startswith("bench prepare:   0.0% writing the 0.003 GB npy source (1 of 23)\n")
    assert not any(line.startswith("bench prepare:") for line in lines)


def test_json_report_keeps_every_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_bench("--gb", "0.002", "--repeats", "2", "--sources", "npz", "--dir", str(tmp_path), "--json",
                       "--settle", "0.01")  # its 8 timed runs wait 0.01 s each, not 0.1
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["settle"] == 0.01
    assert_fits_or_whole(bench.print_table, report, bench.COLUMNS, capsys, monkeypatch)
    bench.print_table(report)
    assert "each run after a sync and 0.01 s of quiet" in " ".join(capsys.readouterr().out.split())
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
