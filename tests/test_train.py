"""End-to-end training through the CLI on real files: run layout, determinism, reference, resume, errors."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_data import blobs, write_dataset

from memtrain import load_model
from memtrain.cli import main
from memtrain.config import load_job
from memtrain.dataset import open_dataset
from memtrain.files import BLOCK_CHECKSUM_ALGO, checksum_file
from memtrain.layout import ROUND_BOARD, checkpoint_updates, weight_versions, weights_path
from memtrain.train.context import model_context
from memtrain.train.exchange.marks import Board, Cancelled, Ledger, UpdateRecord, read_records, records_dtype
from memtrain.train.exchange.weights import BLOCK
from memtrain.train.messages import (
    EvalTask,
    GradTask,
    Loop,
    Outcome,
    Ready,
    Result,
    RoundSetup,
    StatsTask,
    Stop,
    Stretch,
    StretchEnd,
    WorkerSetup,
)
from memtrain.train.optim import OptimizerConfig, apply_update, learning_rate, state_names
from memtrain.train.plan import step_slices, updates_per_epoch
from memtrain.train.server.server import job_plan

pytestmark = pytest.mark.timeout(120)

JOB = """
[data]
path = "{data}"

[model]
kind = "{kind}"
{model_extra}

[train]
epochs = {epochs}
batch_size = {batch_size}
tasks_per_update = 3
optimizer = "adam"
lr = 0.01
seed = 7
workers = 2

[run]
dir = "run"
keep_versions = 2
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1500, features=8, classes=3)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=300)


def write_job(folder: Path, data: Path, *, kind: str = "mlp", model_extra: str = "hidden = [16]", epochs: int = 3,
              batch_size: int = 200) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "job.toml"
    job.write_text(JOB.format(data=data, kind=kind, model_extra=model_extra, epochs=epochs, batch_size=batch_size))
    return job


def final_weights(run: Path) -> np.ndarray:
    return np.load(weights_path(run, weight_versions(run)[-1]), allow_pickle=False)


def digest(run: Path) -> str:
    return hashlib.sha256(final_weights(run).tobytes()).hexdigest()


def train_cli(*args: str) -> int:
    return main(["train", *map(str, args)])


def test_train_writes_the_documented_run_directory(tmp_path: Path, dataset: Path, capsys) -> None:
    job = write_job(tmp_path, dataset)
    assert train_cli(job) == 0
    run = tmp_path / "run"
    out = capsys.readouterr().out
    assert "val_accuracy" in out and f"memtrain inspect {run}" in out
    names = set(p.name for p in run.iterdir())
    assert {"job.json", "params.json", "metrics.jsonl", "lineage.jsonl", "events.log", "weights",
            "checkpoints"} <= names
    assert not [n for n in names if n.startswith("memtrain-x-")], "exchange area left behind"
    per_epoch = updates_per_epoch(1350, 200)
    assert weight_versions(run) == [3 * per_epoch - 1, 3 * per_epoch]  # keep_versions = 2
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2, 3]
    assert all({"loss", "val_loss", "val_accuracy", "update"} <= r.keys() for r in epochs)
    assert len([r for r in records if r["kind"] == "update"]) == 3 * per_epoch
    assert epochs[-1]["val_accuracy"] > 0.9
    lineage = [json.loads(line) for line in (run / "lineage.jsonl").read_text().splitlines()]
    assert [r["version"] for r in lineage] == list(range(3 * per_epoch + 1))
    assert all(r["parent"] == r["version"] - 1 for r in lineage[1:])
    resolved = json.loads((run / "job.json").read_text())
    assert resolved["train"]["tasks_per_update"] == 3 and resolved["train"]["blas_threads"] == 1
    assert checkpoint_updates(run)[-1] == 3 * per_epoch


@pytest.mark.parametrize("workers", [1, 4])
def test_any_worker_count_gives_bitwise_identical_weights(tmp_path: Path, dataset: Path, workers: int) -> None:
    reference = write_job(tmp_path / "two", dataset)
    assert train_cli(reference) == 0
    other = write_job(tmp_path / "other", dataset)
    assert train_cli(other, "--workers", workers) == 0
    assert digest(tmp_path / "two" / "run") == digest(tmp_path / "other" / "run")


def test_evaluation_is_split_over_the_update_tasks_and_its_figures_do_not_depend_on_the_workers(
        tmp_path: Path, dataset: Path, monkeypatch) -> None:
    """150 validation rows, train.eval_rows 8192, tasks_per_update 3: each evaluation is 3 tasks (so that 2 or 3
    workers evaluate side by side), the same for any worker count, and so are its figures, bit for bit."""
    from memtrain.train.server.scheduler import Scheduler

    evaluations: list[list[tuple[int, int]]] = []
    run = Scheduler.run

    def spy(scheduler, transport, tasks, *args, **options):  # noqa: ANN001, ANN202 - a pass-through spy
        if tasks and isinstance(tasks[0], EvalTask):
            evaluations.append([(task.lo, task.hi) for task in tasks])
        return run(scheduler, transport, tasks, *args, **options)

    monkeypatch.setattr(Scheduler, "run", spy)
    figures = []
    for workers in (1, 2):
        job = write_job(tmp_path / str(workers), dataset)
        assert train_cli(job, "--workers", workers) == 0
        records = [json.loads(line) for line in (tmp_path / str(workers) / "run" / "metrics.jsonl").read_text()
                   .splitlines()]
        figures.append([{k: v for k, v in r.items() if k.startswith("val_")} for r in records if r["kind"] == "epoch"])
    assert evaluations == [[(0, 50), (50, 100), (100, 150)]] * 6  # 3 epochs, twice
    assert figures[0] == figures[1] and len(figures[0]) == 3


def test_sliced_steps_give_identical_weights_and_checksums_for_any_worker_count(tmp_path: Path,
                                                                              dataset: Path) -> None:
    """A model of 13 checksum blocks: 1, 2 and 3 workers cut every step into 1, 2 and 3 slices.

    The weights are bitwise identical, and the checksum the server assembled from the slice owners'
    block digests is, for every version, the one a reader computes from the file alone.
    """
    lineages = {}
    for workers in (1, 2, 3):
        job = write_job(tmp_path / str(workers), dataset, model_extra="hidden = [70000]", epochs=1)
        assert train_cli(job, "--workers", workers) == 0
        run = tmp_path / str(workers) / "run"
        lineage = {r["version"]: r["checksum"] for r in map(json.loads, (run / "lineage.jsonl").open())}
        assert all(value.startswith("xxh3-128-blocks:") for value in lineage.values())
        for version in weight_versions(run):
            path = weights_path(run, version)
            assert checksum_file(path, algo=BLOCK_CHECKSUM_ALGO) == lineage[version]
        lineages[workers] = lineage
    assert len(step_slices(final_weights(tmp_path / "1" / "run").size, 3, BLOCK)) == 3
    assert lineages[1] == lineages[2] == lineages[3]
    assert digest(tmp_path / "1" / "run") == digest(tmp_path / "3" / "run")


def test_full_batch_rounds_reduce_once_per_epoch(tmp_path: Path, dataset: Path) -> None:
    job = write_job(tmp_path, dataset, kind="softmax", model_extra="", epochs=4, batch_size=0)
    job.write_text(job.read_text().replace("batch_size = 0\n", ""))
    assert train_cli(job) == 0
    assert weight_versions(tmp_path / "run")[-1] == 4


def reference_weights(job_path: Path) -> np.ndarray:
    """The same job in one process, no queues, no files: the plan, the model and the optimizer only."""
    job = load_job(job_path)
    data = open_dataset(job.data.path)
    context = model_context(data, job.model.kind, job.model.options, job.data.normalize)
    layout, model, train = context.layout, context.model, data.split("train")
    weights = layout.flatten(model.init(np.random.default_rng(job.train.seed)))
    state = {name: np.zeros_like(weights) for name in state_names(job.train.optimizer)}
    total = updates_per_epoch(train.rows, job.train.batch_size) * job.train.epochs
    index = 0
    plan = job_plan(job, train.rows)  # the job's order (train.shuffle): each task's rows from Plan.rows
    for epoch in range(job.train.epochs):
        for update in plan.updates(epoch):
            grad = np.zeros_like(weights)
            for task in update.tasks:
                x, y = train[plan.rows(epoch, task.lo, task.hi)]
                part = np.zeros_like(weights)
                model.loss_and_grad(layout.views(weights), context.normalize(x), np.asarray(y), layout.views(part))
                grad += part
            grad /= np.float32(update.rows)
            new_weights, new_state = np.empty_like(weights), {k: np.empty_like(v) for k, v in state.items()}
            lr = learning_rate(job.train.optimizer, index, total)
            apply_update(job.train.optimizer, index + 1, lr, weights, grad, state, new_weights, new_state)
            weights, state, index = new_weights, new_state, index + 1
    return weights


def test_agrees_with_a_single_process_reference(tmp_path: Path, dataset: Path) -> None:
    job = write_job(tmp_path, dataset)
    assert train_cli(job) == 0
    np.testing.assert_allclose(final_weights(tmp_path / "run"), reference_weights(job), rtol=1e-4, atol=1e-5)


def test_resume_after_more_epochs_is_bitwise_identical(tmp_path: Path, dataset: Path) -> None:
    straight = write_job(tmp_path / "straight", dataset, epochs=4)
    assert train_cli(straight) == 0
    split = write_job(tmp_path / "split", dataset, epochs=2)
    assert train_cli(split) == 0
    assert train_cli("--resume", tmp_path / "split" / "run", "--set", "train.epochs=4") == 0
    assert digest(tmp_path / "straight" / "run") == digest(tmp_path / "split" / "run")
    lines = (tmp_path / "split" / "run" / "metrics.jsonl").read_text().splitlines()
    epochs = [json.loads(line)["epoch"] for line in lines if json.loads(line)["kind"] == "epoch"]
    assert epochs == [1, 2, 3, 4]


def test_load_model_predicts_raw_features_like_training(tmp_path: Path, dataset: Path) -> None:
    job = write_job(tmp_path, dataset)
    assert train_cli(job) == 0
    model = load_model(tmp_path / "run")
    x, y = open_dataset(dataset).split("val").read(0, 150)
    accuracy = float(np.mean(model.predict(np.asarray(x)) == y))
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert accuracy == pytest.approx(metrics[-1]["val_accuracy"])
    proba = model.predict_proba(np.asarray(x))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)
    assert model.classes == ["0", "1", "2"]


def test_ridge_through_the_engine_matches_a_direct_solve(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(900, 5)).astype(np.float32)
    y = (x @ np.array([1.5, -2.0, 0.5, 0.0, 3.0]) + 0.7 + 0.1 * rng.normal(size=900)).astype(np.float32)
    data = write_dataset(tmp_path / "reg", x, y, task="regression", shard_rows=250)
    job = write_job(tmp_path, data, kind="ridge", model_extra="alpha = 0.0", epochs=1, batch_size=100)
    job.write_text(job.read_text().replace('[data]\npath', '[data]\nnormalize = false\npath'))
    assert train_cli(job) == 0
    model = load_model(tmp_path / "run")
    xt, yt = x[90:].astype(np.float64), y[90:].astype(np.float64)
    design = np.hstack([xt, np.ones((len(xt), 1))])
    coef = np.linalg.lstsq(design, yt, rcond=None)[0]
    np.testing.assert_allclose(model.predict(x[:90]).ravel(), np.hstack([x[:90], np.ones((90, 1))]) @ coef,
                               rtol=1e-4, atol=1e-4)


def test_user_model_by_import_path_trains(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(600, 4)).astype(np.float32)
    y = (x @ np.array([2.0, -1.0, 0.5, 1.0]) + 1.0).astype(np.float32)
    data = write_dataset(tmp_path / "reg", x, y, task="regression", shard_rows=200)
    job = write_job(tmp_path, data, kind="user_model_example:HuberRegression", model_extra="", epochs=15)
    assert train_cli(job, "--set", "train.lr=0.2") == 0
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in metrics if r["kind"] == "epoch"]
    assert epochs[-1]["val_loss"] < epochs[0]["val_loss"] / 2


def test_messages_stay_small_whatever_the_sizes() -> None:
    huge = 10**12
    messages = [
        Stretch(generation=huge, epoch=huge, first=huge, stop=huge, version=huge, slot=huge, participants=huge,
                slices=huge),
        StatsTask(task=huge, attempt=99, lo=huge, hi=huge, chunk_rows=huge),
        EvalTask(task=huge, attempt=99, version=huge, lo=huge, hi=huge),
        Result(task=huge, attempt=99, outcome=Outcome.DONE, loss=1e300, rows=huge, correct=huge),
        StretchEnd(generation=huge, slot=huge, outcome=Outcome.CANCELLED),
        Stretch(generation=huge, epoch=huge, first=huge, stop=huge, version=huge, slot=huge, participants=huge,
                slices=0, loop=Loop.DESK, group=huge, max_staleness=huge),
        GradTask(task=huge, attempt=99, ticket=huge, version=huge, epoch=huge, lo=huge, hi=huge,
                 spare="g-s00000001-t00001-a001.npy", in_place=True),
        Stop(), Ready(pid=huge),
    ]
    for message in messages:
        assert len(pickle.dumps(message)) < 400, message
    rounds = RoundSetup(batch_size=huge, tasks_per_update=huge, seed=huge, epochs=huge, shuffle="batches",
                        shuffle_window=huge, keep_versions=huge,
                        on_nonfinite="skip", slots=huge)
    setup = WorkerSetup(server_pid=1, run_dir="/r", exchange_dir="/x", dataset="/d", normalize=True, model_kind="mlp",
                        model_options=(("hidden", (1024, 1024)),), blas_threads=1, optimizer=OptimizerConfig(),
                        rounds=rounds)
    assert len(pickle.dumps(setup)) < 900


def test_second_train_on_the_same_run_dir_is_refused(tmp_path: Path, dataset: Path) -> None:
    job = write_job(tmp_path, dataset, epochs=40, batch_size=50)
    first = subprocess.Popen([sys.executable, "-m", "memtrain", "train", str(job)], stderr=subprocess.PIPE)
    try:
        run = tmp_path / "run"
        for _ in range(200):
            if any((run / "weights").glob("v*.npy")):  # versions are recycled fast: v1 may be gone already
                break
            subprocess.run(["sleep", "0.05"])
        for how in (["--resume", str(run)], [str(job)], [str(job), "--overwrite"]):
            second = subprocess.run([sys.executable, "-m", "memtrain", "train", *how], capture_output=True, text=True)
            assert second.returncode == 2, second.stderr
            assert "another memtrain train is using this run directory" in second.stderr
            assert f"pid {first.pid}" in second.stderr
            # the advice is what works once the first one is done, not --resume/--overwrite now
            assert "wait for it to finish" in second.stderr and "--overwrite" not in second.stderr
        assert first.poll() is None  # the running train was left alone
    finally:
        first.kill()
        first.wait()


@pytest.mark.parametrize(("edit", "message"), [
    ("[train]\nepohcs = 3\n", "unknown key train.epohcs"),
    ("[train]\nlr = \"fast\"\n", "wrong type for train.lr"),
    ("[trian]\n", "unknown section [trian]"),
    ("[train\n", "not valid TOML"),
    ("[model]\nkind = \"mlp\"\nhiden = [3]\n", "model 'mlp' has no option 'hiden'"),
])
def test_bad_job_files_are_usage_errors_naming_the_key(tmp_path: Path, dataset: Path, edit: str, message: str,
                                                        capsys) -> None:
    job = tmp_path / "bad.toml"
    job.write_text(f'[data]\npath = "{dataset}"\n' + edit)
    assert train_cli(job) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(("configured", "expected", "code"), [(1, 1, 0), (2, 2, 0), (1, 2, 1)])
def test_each_worker_uses_the_configured_blas_threads(tmp_path: Path, dataset: Path, configured: int, expected: int,
                                                      code: int, capsys) -> None:
    job = write_job(tmp_path, dataset, kind="probe_models:ExpectsBlasThreads",
                    model_extra=f"expect_threads = {expected}", epochs=1)
    assert train_cli(job, "--set", f"train.blas_threads={configured}") == code
    if code:
        assert f"BLAS threads in this worker: [{configured}], expected {expected}" in capsys.readouterr().err


def test_marks_wait_for_every_participant_of_this_update_and_report_a_void_one(tmp_path: Path) -> None:
    board = Board.create(tmp_path / ROUND_BOARD, 3)
    peer = Board(3, tmp_path / ROUND_BOARD)  # another process's handle on the same file
    alive = lambda: None  # noqa: E731
    for slot in (0, 1):
        board.mark_step(1, 5, slot, finite=True)
    board.cancel(1)
    with pytest.raises(Cancelled):  # slot 2 has not marked: only the server's cancel ends the wait
        peer.wait_step(1, 5, 3, alive)
    board.mark_step(2, 5, 2, finite=True)
    board.cancel(2)
    with pytest.raises(Cancelled):  # generation 1's marks of slots 0 and 1 never stand for generation 2
        peer.wait_step(2, 5, 3, alive)
    board.mark_step(2, 5, 0, finite=True)
    board.mark_step(2, 5, 1, finite=False)
    assert peer.wait_step(2, 5, 3, alive) is False  # all marked, one slice void: the step is void
    assert peer.wait_step(2, 5, 1, alive) is True  # a stretch of one participant reads only slot 0
    for slot in range(3):
        board.mark_gradients(2, 6, slot, finite=slot != 1)
    with pytest.raises(Cancelled):  # no ready mark yet
        peer.wait_gradients(2, 6, 3, alive)
    board.mark_ready(2, 7)  # a later ready mark stands for this one too
    assert peer.wait_gradients(2, 6, 3, alive) is False
    board.mark_gradients(2, 7, 1, finite=True)  # update 7 is in the other bank: update 6's marks stay
    assert peer.wait_gradients(2, 6, 3, alive) is False
    board.set_ledger(Ledger(2, 6, 4))
    assert peer.ledger() == Ledger(2, 6, 4)
    board.close()
    peer.close()


def test_an_updates_record_is_read_by_its_fields_names_in_one_conversion(tmp_path: Path) -> None:
    """read_records' fields are records_dtype's, in its order, as Python values: the logbook reads each by name."""
    records = np.zeros(3, records_dtype(2))
    assert UpdateRecord._fields == records.dtype.names
    row = records[1]
    row["loss"], row["seconds"], row["bad"] = (1.5, -2.25), (0.5, 0.25), (0, 1)
    row["status"], row["participants"], row["version"], row["at"], row["time"] = 2, 3, 7, 6, 12.5
    row["checksum"] = np.arange(16, dtype=np.uint8)
    records[2]["checksum"] = np.arange(16, 32, dtype=np.uint8)
    first, record, last = read_records(records)
    assert (record.loss, record.seconds, record.bad) == ([1.5, -2.25], [0.5, 0.25], [0, 1])
    assert (record.status, record.participants, record.version, record.at, record.time) == (2, 3, 7, 6, 12.5)
    assert all(type(value) is kind for value, kind in zip(record[3:8], (int, int, int, int, float), strict=True))
    assert (first.checksum, record.checksum, last.checksum) == (bytes(16), bytes(range(16)), bytes(range(16, 32)))
    assert read_records(records[1:2]) == [record]
