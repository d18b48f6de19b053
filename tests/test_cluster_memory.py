"""A Dask worker that maps and touches a file larger than its memory limit is neither paused nor restarted.

Real processes: a ``dask scheduler`` and a ``dask worker`` under its nanny, with a 400 MB memory limit,
scanning an 800 MB ``.npy`` through a read-only map as memtrain's workers scan shards.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("distributed")

from distributed import Client  # noqa: E402

from memtrain.cluster.memory import register  # noqa: E402
from memtrain.files import allocate_npy  # noqa: E402
from tests.cluster_tasks import scan  # noqa: E402
from tests.dask_processes import DaskProcesses  # noqa: E402

LIMIT = 400 << 20
FILE_BYTES = 800 << 20


@pytest.fixture
def limited_worker(tmp_path: Path):
    dask = DaskProcesses(tmp_path / "dask")
    try:
        address = dask.start_scheduler()
        dask.start_worker("limited", memory_limit=str(LIMIT))
        with Client(address, timeout=30) as client:
            workers = dask.wait_for_workers(client, {"limited"})
            yield client, workers["limited"], dask.started[-1].log
    finally:
        dask.close()


@pytest.mark.timeout(120)
def test_mapped_pages_neither_pause_nor_restart_a_worker(limited_worker, tmp_path: Path) -> None:
    client, worker, log = limited_worker
    path = tmp_path / "big.npy"
    allocate_npy(path, (FILE_BYTES,), np.uint8)
    register(client)
    report = client.submit(scan, str(path), FILE_BYTES, pure=False).result(timeout=60)
    assert report["file_bytes"] > LIMIT  # the mapped pages alone were over the limit
    assert report["anonymous"] < 0.8 * LIMIT  # while the worker's own memory was not
    assert report["statuses"] == ["running"]  # never paused
    assert report["pid"] == worker["pid"]  # never restarted
    assert client.run(os.getpid, workers=[worker["address"]]) == {worker["address"]: worker["pid"]}
    assert "Pausing worker" not in log.read_text()
    assert "exceeded" not in log.read_text()
