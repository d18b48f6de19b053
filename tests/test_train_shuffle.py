"""train.shuffle: each epoch's row order in `memtrain train` (issue 27). The plan decides every task's rows
(``Plan.rows``); one reader reads them (``TaskRows``); a run recorded before the key resumes with "batches".

The bitwise guarantees with shuffled rows (1/2/4 workers, the server, the cluster, async and replay) are
pinned by the ``rows-*`` goldens in tests/test_goldens.py.
"""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from tiny_data import blobs, sealed, write_dataset

from benchmarks.sorted_classes import prepare, val_accuracy, write_sorted_source
from memtrain.dataset import open_dataset
from memtrain.layout import weight_versions, weights_path
from memtrain.mixing import mixing
from memtrain.order import WINDOW, epoch_order, rank_part
from memtrain.train.loops.mapped import TaskRows
from memtrain.train.normalize import Normalizer
from memtrain.train.plan import Plan, epoch_updates

JOB = """
[data]
path = "{data}"

[model]
kind = "mlp"
hidden = [8]

[train]
epochs = {epochs}
batch_size = 50
tasks_per_update = 3
optimizer = "adam"
lr = 0.01
seed = 4
workers = {workers}
{train}

[run]
dir = "run"
checkpoint_every = 1
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=500, features=5, classes=3, seed=2)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=120)


# the [train] and [run] keys of a job.json written by 30339bc, before train.shuffle (and train.monitor,
# run.log_to, train.chunk_rows, train.backup_*) existed
OLD_KEYS = {
    "data": {"path", "normalize", "verify"},
    "train": {"async_group", "batch_size", "beta1", "beta2", "blas_threads", "epochs", "eps", "eval_rows", "lr",
              "max_attempts", "max_staleness", "min_lr", "mode", "momentum", "nesterov", "on_nonfinite", "optimizer",
              "patience", "schedule", "seed", "staleness", "staleness_in", "step_every", "step_gamma", "task_timeout",
              "tasks_per_update", "warmup_updates", "weight_decay", "workers"},
    "run": {"checkpoint_every", "cluster", "exchange", "keep_best", "keep_checkpoints", "keep_versions"},
}


def write_job(folder: Path, data: Path, *, epochs: int = 2, workers: int = 0, train: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.toml").write_text(JOB.format(data=data, epochs=epochs, workers=workers, train=train))
    return folder / "job.toml"


def digest(run: Path) -> str:
    return hashlib.sha256(np.load(weights_path(run, weight_versions(run)[-1])).tobytes()).hexdigest()


# --- the job keys ---

def test_the_default_is_rows_and_the_run_records_the_order(tmp_path: Path, data: Path, cli) -> None:
    assert cli("train", write_job(tmp_path, data), "--quiet").code == 0
    recorded = json.loads((tmp_path / "run" / "job.json").read_text())["train"]
    assert (recorded["shuffle"], recorded["shuffle_window"]) == ("rows", WINDOW)


@pytest.mark.parametrize(("setting", "message"), [
    ('train.shuffle="rowz"', "bad value for train.shuffle"),
    ("train.shuffle=true", "train.shuffle"),
    ("train.shuffle_window=0", "train.shuffle_window out of range"),
])
def test_a_bad_shuffle_is_a_usage_error_naming_the_key(tmp_path: Path, data: Path, setting: str, message: str,
                                                       cli) -> None:
    result = cli("train", write_job(tmp_path, data), "--set", setting)
    assert result.code == 2 and message in result.err and "Traceback" not in result.err
    assert not (tmp_path / "run").exists()


def test_the_three_orders_train_differently_and_inspect_says_what_a_task_names(tmp_path: Path, data: Path,
                                                                              cli) -> None:
    digests = set()
    for shuffle in ("rows", "batches", "none"):
        assert cli("train", write_job(tmp_path / shuffle, data, train=f'shuffle = "{shuffle}"'), "--quiet").code == 0
        digests.add(digest(tmp_path / shuffle / "run"))
        shown = cli("inspect", tmp_path / shuffle / "run", "--lineage", "3")
        assert shown.code == 0 and ("positions in the epoch's row order" in shown.out) == (shuffle == "rows")
    assert len(digests) == 3


# --- resume ---

def test_a_run_recorded_before_train_shuffle_resumes_with_batches(tmp_path: Path, data: Path, cli) -> None:
    """A run directory as memtrain wrote it before train.shuffle: its job.json has only the keys of a record
    written by 30339bc (OLD_KEYS, read from such a run, which also resumes bitwise by hand). It continues in
    the order it started with, and that order cannot be changed on resume."""
    old = write_job(tmp_path / "old", data, train='shuffle = "batches"')
    assert cli("train", old, "--quiet").code == 0
    record = json.loads((tmp_path / "old" / "run" / "job.json").read_text())
    for section, keys in OLD_KEYS.items():
        record[section] = {key: value for key, value in record[section].items() if key in keys}
    (tmp_path / "old" / "run" / "job.json").write_text(json.dumps(sealed(record)))
    refused = cli("train", "--resume", tmp_path / "old" / "run", "--set", "train.epochs=3",
                  "--set", 'train.shuffle="rows"')
    assert refused.code == 2 and "train.shuffle" in refused.err and "Traceback" not in refused.err
    resumed = cli("train", "--resume", tmp_path / "old" / "run", "--set", "train.epochs=3", "--quiet")
    assert resumed.code == 0, resumed.err
    for shuffle in ("batches", "rows"):
        job = write_job(tmp_path / shuffle, data, epochs=3, train=f'shuffle = "{shuffle}"')
        assert cli("train", job, "--quiet").code == 0
    assert digest(tmp_path / "old" / "run") == digest(tmp_path / "batches" / "run")
    assert digest(tmp_path / "old" / "run") != digest(tmp_path / "rows" / "run")


@pytest.mark.parametrize("keys", [("shuffle",), ("shuffle", "shuffle_window")])
def test_a_later_record_lacking_the_shuffle_is_refused_not_resumed_as_batches(tmp_path: Path, data: Path, keys,
                                                                             cli) -> None:
    """A job.json of a "rows" run, resealed without train.shuffle: it holds the keys added with it (monitor,
    log_to, ...), so it is no record of 30339bc's time, and the missing key is damage (issue 41), not "batches"."""
    assert cli("train", write_job(tmp_path, data), "--quiet").code == 0
    path = tmp_path / "run" / "job.json"
    record = json.loads(path.read_text())
    for key in keys:
        del record["train"][key]
    path.write_text(json.dumps(sealed(record)))
    versions = weight_versions(tmp_path / "run")
    resumed = cli("train", "--resume", tmp_path / "run", "--set", "train.epochs=3", "--quiet")
    assert resumed.code == 1, resumed.err
    assert f"{path}:train.shuffle" in resumed.err and "the job record lacks a setting" in resumed.err
    assert "Traceback" not in resumed.err
    assert weight_versions(tmp_path / "run") == versions


def test_shuffled_rows_resume_on_another_worker_count_bitwise(tmp_path: Path, data: Path, cli) -> None:
    rows = 'shuffle = "rows"\nshuffle_window = 64'  # windows of 64 rows: the block strata matter
    assert cli("train", write_job(tmp_path / "a", data, epochs=1, workers=2, train=rows), "--quiet").code == 0
    resumed = cli("train", "--resume", tmp_path / "a" / "run", "--set", "train.epochs=2", "--workers", "0", "--quiet")
    assert resumed.code == 0, resumed.err
    assert cli("train", write_job(tmp_path / "b", data, epochs=2, workers=0, train=rows), "--quiet").code == 0
    assert digest(tmp_path / "a" / "run") == digest(tmp_path / "b" / "run")


# --- the plan decides the rows ---

@pytest.mark.parametrize(("rows", "batch", "tasks", "window"), [(1000, 128, 3, 256), (999, 100, 4, 64),
                                                                 (50, 64, 2, WINDOW), (300, 7, 3, 16)])
def test_a_shuffled_plan_s_tasks_are_the_loader_s_batches_cut_per_task(rows: int, batch: int, tasks: int,
                                                                       window: int) -> None:
    plan = Plan(rows, batch, tasks, 9, 3, shuffle="rows", window=window)
    compositions = []
    for epoch in range(3):
        order = epoch_order("rows", rows=rows, batch_size=batch, seed=9, epoch=epoch, window=window)
        seen = []
        for k, update in enumerate(plan.updates(epoch)):
            parts = [np.asarray(plan.rows(epoch, t.lo, t.hi)) for t in update.tasks]
            expected = order.batch(k)
            np.testing.assert_array_equal(np.concatenate(parts), expected)  # the loader's global batch k
            for i, part in enumerate(parts):  # task i: the i-th contiguous part, as rank_part cuts a batch
                np.testing.assert_array_equal(part, rank_part(expected, i, len(parts)))
            seen.append(np.concatenate(parts))
        every = np.concatenate(seen)
        np.testing.assert_array_equal(np.sort(every), np.arange(rows))  # each epoch: a permutation of the split
        compositions.append({frozenset(b.tolist()) for b in seen})
    if rows > batch:
        assert compositions[0] != compositions[1]  # new batches every epoch


def test_batches_and_none_keep_contiguous_ranges() -> None:
    for shuffle in ("batches", "none"):
        plan = Plan(1000, 128, 3, 5, 2, shuffle=shuffle)
        for update in plan.updates(1):
            for task in update.tasks:
                assert plan.rows(1, task.lo, task.hi) == range(task.lo, task.hi)
    old = [(u.tasks[0].lo, u.tasks[-1].hi) for u in epoch_updates(1000, 128, 3, 5, 1, shuffle="batches")]
    assert old == [(r.start, r.stop) for r in map(epoch_order("batches", rows=1000, batch_size=128, seed=5,
                                                              epoch=1).batch, range(8))]
    full = Plan(1000, None, 3, 5, 2, shuffle="rows")  # a full batch is every row, whatever the order
    assert [full.rows(0, t.lo, t.hi) for t in full.updates(0)[0].tasks] == [range(0, 333), range(333, 666),
                                                                            range(666, 1000)]


# --- one reader ---

def test_task_rows_gathers_the_same_bits_whether_the_split_is_kept_or_not(data: Path) -> None:
    dataset = open_dataset(data)
    train = dataset.split("train")
    normalize = Normalizer.from_stats(dataset.manifest["stats"], True)
    kept, gathered = TaskRows(train, normalize, 1 << 30), TaskRows(train, normalize, 0)
    plan = Plan(train.rows, 50, 3, 4, 1, shuffle="rows", window=64)
    for update in plan.updates(0):
        for task in update.tasks:
            rows = plan.rows(0, task.lo, task.hi)
            assert isinstance(rows, np.ndarray) and len(np.unique(np.searchsorted(train.starts, rows, "right"))) > 1
            (xk, yk), (xg, yg) = kept.get(rows), gathered.get(rows)
            x, y = train[rows]
            for got in (xk, xg):
                assert got.tobytes() == normalize(x).tobytes()
            for got in (yk, yg):
                np.testing.assert_array_equal(got, y)


def test_task_rows_reads_a_contiguous_range_without_a_copy(data: Path) -> None:
    train = open_dataset(data).split("train")
    x, _ = TaskRows(train, Normalizer(None, None), 0).get(range(10, 60))
    assert np.shares_memory(x, train.shard_arrays(0)[0])



@pytest.mark.parametrize("budget", [1 << 30, 0], ids=["split kept", "gathered from the map"])
def test_a_shuffled_task_allocates_no_array_of_its_size(tmp_path: Path, budget: int) -> None:
    """A task's rows go into reused buffers, copied once: no new array per task (np.take's default mode would
    take into a temporary first; normalizing would make a new array), whether the split is kept or not."""
    # a task's features are 50 x 2 KiB: more than the fixed buffer (<= 32 KiB) numpy's ufuncs use to broadcast
    x, y = blobs(n=500, features=512, classes=3, seed=2)
    dataset = open_dataset(write_dataset(tmp_path / "one-shard", x, y, shard_rows=1000))
    train = dataset.split("train")
    rows = TaskRows(train, Normalizer.from_stats(dataset.manifest["stats"], True), budget)
    plan = Plan(train.rows, 50, 1, 4, 1, shuffle="rows", window=64)
    one_shard = [plan.rows(0, t.lo, t.hi) for u in plan.updates(0) for t in u.tasks]
    assert all(isinstance(r, np.ndarray) and len(r) == 50 for r in one_shard[:-1])
    one_shard = one_shard[:-1]
    for task in one_shard[:2]:
        rows.get(task)  # the buffers made
    tracemalloc.start()
    try:
        for task in one_shard * 3:
            x, y = rows.get(task)
            del x, y
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 50 * 512 * 4 // 2, f"{peak} bytes traced while reading tasks of {50 * 512 * 4} bytes of features"

# --- the effect on a model (the full experiment: python -m benchmarks.sorted_classes) ---

def test_a_class_sorted_dataset_trains_with_rows_as_well_as_prepared_shuffled(tmp_path: Path) -> None:
    """Rows sorted by class, prepared with --no-shuffle: with "batches" every batch is one class and the model
    ends the epoch leaning towards the class of its last batches; "rows" (windows of 512 rows: 64 blocks of 8,
    one from each 64th of the split) trains as well as on the same rows prepared shuffled."""
    x, y = write_sorted_source(tmp_path / "source", 4000, noise=0.5)  # well separated: ~0.96 is reachable
    sorted_data = prepare(x, y, tmp_path / "sorted", shuffle=False)
    assert np.all(np.diff(np.asarray(open_dataset(sorted_data).split("train")[:][1])) >= 0)  # still sorted
    shuffled_data = prepare(x, y, tmp_path / "shuffled", shuffle=True)

    def accuracy(data: Path, shuffle: str) -> float:
        return val_accuracy(data, tmp_path / f"{data.name}-{shuffle}", model="mlp", shuffle=shuffle, epochs=1,
                            batch=100, lr=0.03, window=512)

    rows, batches, shuffled = accuracy(sorted_data, "rows"), accuracy(sorted_data, "batches"), \
        accuracy(shuffled_data, "rows")
    # recorded: rows 0.965, batches 0.825, prepared shuffled 0.958 (deterministic); the windows of 16 blocks
    # in a seeded order that order.py had before gave 0.917 here
    assert rows >= shuffled - 0.01 and rows > batches + 0.1, (rows, batches, shuffled)


def test_no_stretch_of_a_class_sorted_epoch_leans_to_a_few_classes() -> None:
    """The mixing a model sees along an epoch (memtrain/mixing.py): every stretch of 65,536 rows of the default
    window's order holds each class within 2 points of its share (fixed batches: 3.8; the seeded order of 16
    blocks per window that order.py had before: 10.5, worse than fixed batches)."""
    rows = mixing("rows", rows=216_000, batch_size=512, classes=10)
    batches = mixing("batches", rows=216_000, batch_size=512, classes=10)
    assert rows.share_drift < 0.02 < batches.share_drift and rows.classes_per_batch == 10
