"""The stream (train/loops/stream.py) on its own, without Dask: gradient tasks sent to local worker processes
through the Transport interface, the step in the server -- the path a cluster run takes.

Bitwise the weights, versions and records of the fused round; non-finite updates skipped where the
round skips them; a worker SIGKILLed after writing its gradient file and before answering changes
nothing (its task re-runs under a new attempt number, into a new file).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest
from crash_models import POISON
from tiny_data import blobs, write_dataset

from memtrain.cli import main
from memtrain.layout import weight_versions, weights_path
from memtrain.train.server import server
from memtrain.train.server.exchange import WorkerPool

pytestmark = pytest.mark.timeout(180)

JOB = """
[data]
path = "{data}"

[model]
kind = "{kind}"
hidden = [16]

[train]
epochs = 2
batch_size = 200
tasks_per_update = 3
optimizer = "adam"
lr = 0.01
seed = 7
workers = 2
on_nonfinite = "skip"

[run]
dir = "run"
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1000, features=6, classes=3, seed=1)
    return write_dataset(tmp_path_factory.mktemp("stream") / "blobs", x, y, shard_rows=300)


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """``--cluster`` runs get 2 local worker processes instead of Dask workers; returns what was sent them."""
    sent: list[object] = []
    send = WorkerPool.send
    monkeypatch.setattr(WorkerPool, "send", lambda pool, slot, message: (sent.append(message),
                                                                         send(pool, slot, message))[1])
    monkeypatch.setattr(server, "open_cluster", lambda job, setup, run, log, **_: WorkerPool(setup, 2))
    return sent


def train(folder: Path, data: Path, *args: str, kind: str = "mlp") -> Path:
    folder.mkdir(parents=True)
    (folder / "job.toml").write_text(JOB.format(data=data, kind=kind))
    assert main(["train", str(folder / "job.toml"), *args]) == 0
    return folder / "run"


def digest(run: Path) -> str:
    return hashlib.sha256(np.load(weights_path(run, weight_versions(run)[-1])).tobytes()).hexdigest()


def records(run: Path, name: str) -> str:
    return re.sub(r'"(time|compute_s|samples_per_s)": [0-9.e+-]+', "", (run / name).read_text())


def test_the_stream_gives_the_bits_and_records_of_the_fused_round(tmp_path: Path, dataset: Path,
                                                                   streamed: list[object]) -> None:
    fused = train(tmp_path / "fused", dataset)
    assert {type(m).__name__ for m in streamed} == {"Stretch", "EvalTask"}  # a local run: the fused round
    streamed.clear()
    stream = train(tmp_path / "stream", dataset, "--cluster", "local:2")
    # never a Stretch: nobody meets; the step is sliced into tasks (train/loops/sliced.py)
    assert {type(m).__name__ for m in streamed} == {"GradTask", "StepTask", "EvalTask"}
    grads = [m for m in streamed if type(m).__name__ == "GradTask"]
    spares = [m.spare for m in grads if m.spare]
    assert len(spares) > len(grads) / 2 and len(set(spares)) == len(spares)  # stepped files, rewritten
    assert "rounds: in the server (the gradients streamed to 2 Dask workers" in (stream / "events.log").read_text()
    assert digest(stream) == digest(fused)
    for name in ("lineage.jsonl", "metrics.jsonl"):
        assert records(stream, name) == records(fused, name)
    assert not [p for p in stream.rglob("*") if ".tmp-" in p.name or p.name.startswith(("memtrain-x-", "g-"))]


def poisoned(folder: Path) -> Path:
    x, y = blobs(n=1000, features=6, classes=3, seed=1)
    x[500:700, 0] = POISON  # train rows 400-599: wherever the plan puts them, some updates are skipped
    return write_dataset(folder / "poison", x, y, shard_rows=300)


def skipped(run: Path) -> list[tuple[int, int]]:
    return [(r["epoch"], r["batch"]) for r in map(json.loads, (run / "metrics.jsonl").open())
            if r["kind"] == "update" and r["skipped"]]


@pytest.mark.parametrize("kind", ["NanLossOnPoison", "HugeGradientOnPoison"])
def test_a_nonfinite_update_is_skipped_where_the_round_skips_it(tmp_path: Path, streamed: list[object],
                                                                 kind: str) -> None:
    """A NaN loss (skipped at its gradients) and a sum that overflows (skipped at the server's step)."""
    data = poisoned(tmp_path)
    with_normalize = {"kind": f"crash_models:{kind}"}
    fused = train(tmp_path / "fused", data, "--set", "data.normalize=false", **with_normalize)
    stream = train(tmp_path / "stream", data, "--cluster", "local:2", "--set", "data.normalize=false",
                   **with_normalize)
    assert skipped(stream) and skipped(stream) == skipped(fused)
    if kind == "HugeGradientOnPoison":  # every task's gradient finite, their mean not: found by the step
        assert "the mean gradient or the new weights" in (stream / "events.log").read_text()
    assert digest(stream) == digest(fused)
    assert records(stream, "metrics.jsonl") == records(fused, "metrics.jsonl")


def test_a_worker_killed_after_writing_its_gradient_changes_nothing(tmp_path: Path, dataset: Path,
                                                                    streamed: list[object],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    fused = train(tmp_path / "fused", dataset)
    monkeypatch.setenv("MEMTRAIN_FAULT", "after_grad_write:4")  # the workers inherit it; the server never
    monkeypatch.setenv("MEMTRAIN_FAULT_ONCE", str(tmp_path / "fired"))  # passes that point in a stream
    # no backup copies (tests/test_backups.py): a busy machine's slow task would add attempts of its own
    stream = train(tmp_path / "stream", dataset, "--cluster", "local:2", "--set", "train.backup_ratio=0")
    assert (tmp_path / "fired").exists()
    retried = [m for m in streamed if type(m).__name__ == "GradTask" and m.attempt == 1]
    assert len(retried) == 1
    assert "died with exit code -9 during gradient task" in (stream / "events.log").read_text()
    assert digest(stream) == digest(fused)
    assert not [p for p in stream.rglob("g-*")]  # the dead attempt's file was discarded


def test_the_exchange_never_holds_more_than_the_room_check_reserved(tmp_path: Path, dataset: Path,
                                                                     streamed: list[object]) -> None:
    """The stream's gradient files (those of the update just stepped and the next one's) are counted."""
    from test_resources import exchange_usage

    from memtrain.config import load_job
    from memtrain.dataset import open_dataset
    from memtrain.train.context import model_context
    from memtrain.train.plan import Plan
    from memtrain.train.server.room import room_needed

    folder = tmp_path / "stream"
    folder.mkdir()
    job = folder / "job.toml"
    job.write_text(JOB.format(data=dataset, kind="mlp").replace("hidden = [16]", "hidden = [2000]")
                   .replace('dir = "run"', 'dir = "run"\nexchange = "run"\ncluster = "local:2"'))
    resolved = load_job(job)
    data = open_dataset(resolved.data.path)
    plan = Plan(data.split("train").rows, 200, 3, 7, 2, shuffle="rows")
    reserved = room_needed(resolved, model_context(data, "mlp", {"hidden": (2000,)}, True),
                           per_epoch=plan.per_epoch, slots=2).exchange
    peak = {"bytes": 0, "gradients": 0}
    stop = threading.Event()
    sampler = threading.Thread(target=exchange_usage, args=(folder / "run", stop, peak))
    sampler.start()
    try:
        assert main(["train", str(job)]) == 0
    finally:
        stop.set()
        sampler.join()
    assert peak["gradients"] > 3, peak  # the per-task buffers, and some of the stream's files were seen
    assert 0 < peak["bytes"] <= reserved, (peak, reserved)
