"""memtrain prepare under faults: SIGKILL at each stage then rerun, disk full (injected and real tmpfs), atomicity."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from in_process import here

from memtrain.prepare.synthetic import write_synthetic_source
from tests.dataset_files import dataset_bytes

ROOT = Path(__file__).parents[1]
OPTIONS = ["--shard-mb", "0.1", "--chunk-mb", "0.5", "--seed", "4"]


def run_prepare(source: Path, out: Path, *extra: str, fault: str | None = None,
                action: str | None = None) -> subprocess.CompletedProcess:
    """``memtrain prepare SOURCE OUT``: a process of its own when ``fault`` kills it (SIGKILL, the default action),
    else in this process (tests/in_process.py: an interpreter's start saved)."""
    args = ["prepare", str(source), str(out), *OPTIONS, *extra]
    if fault and action is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMTRAIN_FAULT")}
        return subprocess.run([sys.executable, "-m", "memtrain", *args], capture_output=True, text=True, timeout=60,
                              env={**env, "MEMTRAIN_FAULT": fault}, cwd=ROOT)
    return here(*args, env={"MEMTRAIN_FAULT": fault, "MEMTRAIN_FAULT_ACTION": action} if fault and action else None)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    (path,) = write_synthetic_source(tmp_path_factory.mktemp("src") / "s.csv", 12_000, 16, seed=3)
    return path


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("ref") / "ds"
    result = run_prepare(source, out)
    assert result.returncode == 0, result.stderr
    return dataset_bytes(out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault, resumed", [
    ("prepare_mid_spool:3", None),
    ("prepare_mid_shard:1", "0 shards already complete"),
    ("prepare_mid_shard:9", "already complete (verified by checksum)"),
    ("prepare_after_shard:4", "4 shards already complete"),
    ("prepare_before_publish:1", "already complete (verified by checksum)"),
])
def test_sigkill_then_rerun_gives_identical_bytes(source, reference, tmp_path, fault, resumed):
    out = tmp_path / "ds"
    killed = run_prepare(source, out, fault=fault)
    assert killed.returncode == -9, killed.stderr
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ds.prepare-")]
    again = run_prepare(source, out)
    assert again.returncode == 0, again.stderr
    if resumed:
        assert "resuming:" in again.stderr and resumed in again.stderr, again.stderr
    else:
        assert "resuming:" not in again.stderr
    assert dataset_bytes(out) == reference
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


@pytest.mark.timeout(120)
def test_damaged_finished_shard_is_rewritten(source, reference, tmp_path):
    out = tmp_path / "ds"
    assert run_prepare(source, out, fault="prepare_after_shard:3").returncode == -9
    (work,) = [p for p in tmp_path.iterdir() if p.name.startswith(".ds.prepare-")]
    shard = work / "dataset" / "train" / "x-00001.npy"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    again = run_prepare(source, out)
    assert "2 shards already complete" in again.stderr, again.stderr
    assert dataset_bytes(out) == reference


@pytest.mark.timeout(120)
def test_injected_disk_full_then_rerun(source, reference, tmp_path):
    out = tmp_path / "ds"
    full = run_prepare(source, out, fault="prepare_mid_shard:5", action="raise")
    assert full.returncode == 1 and "no space left" in full.stderr, full.stderr
    assert "Traceback" not in full.stderr and not out.exists()
    assert not list(tmp_path.rglob("*.tmp-*"))  # the half-written shard was not kept
    again = run_prepare(source, out)
    assert again.returncode == 0 and "resuming:" in again.stderr
    assert dataset_bytes(out) == reference


@pytest.mark.timeout(120)
def test_overwrite_keeps_the_old_dataset_until_the_new_one_is_complete(source, reference, tmp_path):
    out = tmp_path / "ds"
    assert run_prepare(source, out, "--seed", "1").returncode == 0
    old = dataset_bytes(out)
    assert run_prepare(source, out, "--overwrite", fault="prepare_before_publish:1").returncode == -9
    assert dataset_bytes(out) == old  # killed before the rename: the old dataset is intact
    assert run_prepare(source, out, "--overwrite").returncode == 0
    assert dataset_bytes(out) == reference


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True,
                            text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {result.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.timeout(120)
def test_real_disk_full_on_a_small_tmpfs(source, tiny_tmpfs):
    out = tiny_tmpfs / "ds"
    result = run_prepare(source, out)
    assert result.returncode == 1, result.stderr
    assert "no space left" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()
    assert not list(tiny_tmpfs.rglob("*.tmp-*"))


def test_a_kill_at_the_nth_logged_shard_leaves_exactly_n_lines_whatever_the_splits_threads(tmp_path, monkeypatch):
    """Each split's writer publishes from its own thread (train, val, test at once). The fault point
    ``prepare_after_shard`` is hit under the log's lock, so when it is hit for the n-th time done.jsonl holds
    exactly n whole lines: a kill there leaves what the test that armed it expects (CI once saw 3 for 2)."""
    import threading

    from memtrain.layout import PREPARE_DONE_LOG
    from memtrain.prepare import workdir

    work = workdir.WorkArea(tmp_path / "out", "k")
    work.root.mkdir(parents=True)
    seen: list[tuple[int, int]] = []

    def count_lines(name: str) -> None:
        if name == "prepare_after_shard":
            seen.append((len(seen) + 1, len((work.root / PREPARE_DONE_LOG).read_text().splitlines())))

    monkeypatch.setattr(workdir, "fault_point", count_lines)
    start = threading.Barrier(3)

    def publish(split: str) -> None:
        start.wait()
        for index in range(60):
            work.record_shard(split, index, {"rows": index, "x": f"{split}-{index}"})

    threads = [threading.Thread(target=publish, args=(split,)) for split in ("train", "val", "test")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(seen) == 180
    assert [lines for _, lines in seen] == [hit for hit, _ in seen]
