"""Additive models at scale, in small (train/loops/additive.py): a statistics task streams its rows in the job's chunks
(which cut shards), the same bits for any worker count, under a memory limit a whole task would break; a
killed worker or server resumes to the same bits, never reading a half-written partial; no gradient buffers
or optimizer state; a worker the kernel kills is said to be killed for memory."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from in_process import here
from tiny_data import write_dataset

from memtrain.layout import STATISTICS_DIR, parse_partial_name, weight_versions, weights_path
from memtrain.train.memory import OOM_EVENTS_ENV, WORKER_DATA_LIMIT_ENV

pytestmark = pytest.mark.timeout(120)
TESTS = Path(__file__).parent  # and its parent, for benchmarks/ngram.py
PYTHONPATH = os.pathsep.join(filter(None, [str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH")]))
TRAIN_ROWS, SHARD_ROWS, CHUNK_ROWS, TASKS = 360, 100, 37, 3


def memtrain(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``memtrain ARGS``: with ``env`` (a fault point, a memory limit) in a child process, which such a run may
    kill; without, in this process (the CLI's entry point, its workers spawned as always), sparing an
    interpreter's start-up per run."""
    if env is None:
        return here(*args)
    return subprocess.run([sys.executable, "-m", "memtrain", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": PYTHONPATH, **env}, timeout=100)


def regression(folder: Path, rows: int, features: int, shard_rows: int = SHARD_ROWS) -> Path:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(rows, features)).astype(np.float32)
    y = (x @ rng.normal(size=features) + 0.1 * rng.normal(size=rows)).astype(np.float32)
    return write_dataset(folder / "data", x, y, task="regression", val_rows=rows // 10, shard_rows=shard_rows)


def write_job(folder: Path, data: Path, *, kind: str = "additive_models:CountsChunks", workers: int = 2,
              tasks: int = TASKS, chunk_rows: int = CHUNK_ROWS, extra: str = "", name: str = "job") -> Path:
    path = folder / f"{name}.toml"
    path.write_text(f'[data]\npath = "{data}"\n[model]\nkind = "{kind}"\ncode_dir = "{TESTS}"\n'
                    f"[train]\ntasks_per_update = {tasks}\nworkers = {workers}\nchunk_rows = {chunk_rows}\n"
                    f'task_timeout = 60\n{extra}\n[run]\ndir = "{folder / name}"\nexchange = "run"\n')
    return path


def final(run: Path) -> np.ndarray:
    return np.load(weights_path(run, weight_versions(run)[-1]), allow_pickle=False)


def digest(run: Path) -> str:
    return hashlib.sha256(final(run).tobytes()).hexdigest()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return regression(tmp_path_factory.mktemp("additive"), TRAIN_ROWS + TRAIN_ROWS // 9, 5)


@pytest.fixture(scope="module")
def straight(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the pass on 2 workers, uninterrupted."""
    folder = tmp_path_factory.mktemp("straight")
    result = memtrain("train", write_job(folder, data, workers=2))
    assert result.returncode == 0, result.stderr
    return folder / "job"


@pytest.fixture(scope="module")
def four_tasks(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference of the resumed 4-task runs: the pass in 4 tasks on 2 workers, uninterrupted."""
    folder = tmp_path_factory.mktemp("four-tasks")
    result = memtrain("train", write_job(folder, data, workers=2, tasks=4, name="ref"))
    assert result.returncode == 0, result.stderr
    return folder / "ref"


def test_chunks_are_the_jobs_and_cut_shards_and_the_bits_never_depend_on_the_workers(
        data: Path, straight: Path, tmp_path: Path) -> None:
    tasks = [(t * TRAIN_ROWS // TASKS, (t + 1) * TRAIN_ROWS // TASKS) for t in range(TASKS)]
    calls = sum(-(-(hi - lo) // CHUNK_ROWS) for lo, hi in tasks)  # every task from its own first row
    assert calls > TRAIN_ROWS // SHARD_ROWS + TASKS  # chunks cut the shards (100 rows) and the tasks (120)
    weights = final(straight)
    assert weights[-2:].tolist() == [calls, TRAIN_ROWS]  # CountsChunks: statistics calls, rows
    for workers in (1, 4):
        result = memtrain("train", write_job(tmp_path, data, workers=workers, name=f"w{workers}"))
        assert result.returncode == 0, result.stderr
        assert digest(tmp_path / f"w{workers}") == digest(straight), f"{workers} workers"
    assert not (straight / STATISTICS_DIR).exists()  # the pass's files go once the solve is checkpointed


def test_an_additive_run_says_what_does_not_apply_and_makes_no_gradient_or_optimizer_files(
        data: Path, four_tasks: Path, tmp_path: Path) -> None:
    """The server is killed after the second statistics result: its exchange area is left as it was."""
    job = write_job(tmp_path, data, workers=1, tasks=4, extra='epochs = 7\noptimizer = "sgd"\nlr = 0.5')
    killed = memtrain("train", job, env={"MEMTRAIN_FAULT": "after_result:2"})
    assert killed.returncode == -9, killed.stderr
    assert ("model 'additive_models:CountsChunks' is additive, solved in one pass of statistics (no epochs, "
            "batches or optimizer): train.epochs = 7, train.optimizer = 'sgd', train.lr = 0.5 do not apply and are "
            "ignored") in killed.stderr
    run = tmp_path / "job"
    exchanges = [p for p in run.iterdir() if p.name.startswith("memtrain-x-")]
    assert len(exchanges) == 1
    names = sorted(p.name for p in exchanges[0].iterdir())
    assert names and not [n for n in names if n.startswith(("g-", "opt-"))], names
    partials = [n for n in os.listdir(run / STATISTICS_DIR) if parse_partial_name(n)]
    assert len(partials) >= 2, partials
    resumed = memtrain("train", "--resume", run)
    assert resumed.returncode == 0, resumed.stderr
    assert "statistics: 2 of 4 partials kept from an earlier start" in (run / "events.log").read_text() or \
        "statistics: 3 of 4 partials kept from an earlier start" in (run / "events.log").read_text()
    metrics = (run / "metrics.jsonl").read_text()
    assert '"epoch": 1,' in metrics and '"epoch": 7' not in metrics  # one pass, not seven epochs
    assert sorted(os.listdir(run / "checkpoints")) == ["c00000001"]
    assert digest(run) == digest(four_tasks)


def test_a_worker_killed_mid_pass_leaves_nothing_half_written_that_is_read(data: Path, straight: Path,
                                                                         tmp_path: Path) -> None:
    env = {"MEMTRAIN_FAULT": "statistics_chunk:2", "MEMTRAIN_FAULT_ONCE": str(tmp_path / "once")}
    result = memtrain("train", write_job(tmp_path, data, workers=2), env=env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "once").exists()  # a worker did die mid-task, its partial half-written
    assert "died with exit code -9 during statistics task" in (tmp_path / "job" / "events.log").read_text()
    assert digest(tmp_path / "job") == digest(straight)


def test_a_statistics_task_streams_under_a_memory_limit_a_whole_task_exceeds(tmp_path: Path) -> None:
    """Each worker may allocate 40 MiB more than it holds at start (RLIMIT_DATA); a task's 237,600 rows of 32
    float32 features are 31 MB as stored, and its whole-task ridge statistics would need ~110 MB."""
    data = regression(tmp_path, 264_000, 32, shard_rows=50_000)
    env = {WORKER_DATA_LIMIT_ENV: "40"}
    streamed = memtrain("train", write_job(tmp_path, data, kind="ridge", workers=1, tasks=1, chunk_rows=4096,
                                           name="streamed"), env=env)
    assert streamed.returncode == 0, streamed.stderr
    whole = memtrain("train", write_job(tmp_path, data, kind="ridge", workers=1, tasks=1, chunk_rows=240_000,
                                        name="whole"), env=env)
    assert whole.returncode == 1, whole.stderr
    assert "MemoryError" in whole.stderr and "the memory limit that applies is" in whole.stderr
    assert "the task held 237,600 rows at once" in whole.stderr
    assert "Lower train.chunk_rows" in " ".join(whole.stderr.split())  # the OOM killer's remedy too (one hint)
    assert f"RLIMIT_DATA of each worker above what it held at start ({WORKER_DATA_LIMIT_ENV})" in whole.stderr


def test_a_worker_the_kernel_kills_is_said_to_be_killed_for_memory(data: Path, tmp_path: Path) -> None:
    """The cgroup's OOM kill counter (a file standing for it) rises: the death is put down to memory, with the
    limit and what the task held. A SIGKILL the counter did not see keeps the crash hint."""
    counter = tmp_path / "memory.events"
    counter.write_text("oom_kill 0\n")
    job = write_job(tmp_path, data, kind="additive_models:KilledByTheKernel", workers=1, extra="max_attempts = 2")
    result = memtrain("train", job, env={OOM_EVENTS_ENV: str(counter)})
    assert result.returncode == 1, result.stderr
    err = " ".join(result.stderr.split())
    assert "killed its worker 2 times (last exit code -9: SIGKILL from the kernel's out-of-memory killer)" in err
    assert "the memory limit that applies is" in err and "the task held 37 rows at once" in err
    assert "Lower train.chunk_rows" in err and "the data or the model may crash" not in err
    assert "Traceback" not in err
    assert "(killed by the kernel's out-of-memory killer: the run's memory cgroup counted an OOM kill; " in \
        (tmp_path / "job" / "events.log").read_text()
    counter.write_text("oom_kill 0\n")
    job = write_job(tmp_path, data, kind="additive_models:KilledByTheKernel", workers=1, extra="max_attempts = 1",
                    name="uncounted")
    job.write_text(job.read_text().replace("[train]", "counted = false\n[train]"))
    result = memtrain("train", job, env={OOM_EVENTS_ENV: str(counter)})
    assert result.returncode == 1, result.stderr
    err = " ".join(result.stderr.split())
    assert "killed its worker 1 time (last exit code -9)" in err and "the data or the model may crash" in err
    assert "out-of-memory" not in err


def test_the_ngram_user_model_gives_exact_probabilities(tmp_path: Path) -> None:
    """benchmarks/ngram.py at a small scale: chunks of 97 rows cut its shards, two workers add into
    their partials with np.add.at; every seen context's probabilities equal a direct count, bit for bit."""
    result = subprocess.run([sys.executable, "-m", "benchmarks.ngram", tmp_path / "ngram", "--rows", "3000",
                             "--order", "2", "--symbols", "6", "--classes", "3", "--chunk-rows", "97"],
                            capture_output=True, text=True, timeout=100,
                            env={**os.environ, "PYTHONPATH": PYTHONPATH})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["wrong"] == 0 and report["contexts_checked"] == 36  # every context of 6 x 6 is seen


def test_a_start_keeps_whole_partials_only_and_sums_them_in_task_order(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """StatisticsPass on its own: a truncated partial or a temporary one is never read; the sum, in pieces
    smaller than a partial, has the bits of adding whole partials in task order."""
    from memtrain.files import publish_array
    from memtrain.layout import tmp_sibling
    from memtrain.train.loops import additive

    monkeypatch.setattr(additive, "SUM_CHUNK", 7)  # pieces that cut the partials unevenly
    plan = additive.PassPlan(tasks=((0, 10), (10, 20), (20, 30)), chunk_rows=4, size=50, source="s")
    logged: list[str] = []
    first = additive.StatisticsPass(tmp_path, plan, logged.append)
    assert first.start() == {}
    parts = [np.random.default_rng(t).normal(size=50) * 10.0 ** (3 * t) for t in range(3)]

    def publish(path: Path, values: np.ndarray) -> None:  # as a statistics task does: the file, then its checksum
        with additive.publishing_statistics(path, len(values)) as flat:
            flat[:] = values

    publish(first.partial_path(0, 1), parts[0])
    publish_array(first.partial_path(1, 0), parts[1][:40], durable=False)  # the wrong size: never trusted
    publish_array(tmp_sibling(first.partial_path(2, 0)), parts[2], durable=False)  # not renamed: never read
    again = additive.StatisticsPass(tmp_path, plan, logged.append)
    assert again.start() == {0: again.partial_path(0, 1)}
    assert sorted(os.listdir(tmp_path / STATISTICS_DIR)) == ["plan.json", "t00000-a001.json", "t00000-a001.npy"]
    publish(again.partial_path(1, 0), parts[1])
    publish(again.partial_path(2, 2), parts[2])
    total = again.summed({0: again.partial_path(0, 1), 1: again.partial_path(1, 0), 2: again.partial_path(2, 2)})
    expected = np.zeros(50)
    for part in parts:
        expected += part
    assert total.tobytes() == expected.tobytes()
    assert sorted(os.listdir(tmp_path / STATISTICS_DIR)) == ["plan.json", "sum.json", "sum.npy"]
    other = additive.PassPlan(tasks=plan.tasks, chunk_rows=5, size=50, source="s")
    assert additive.StatisticsPass(tmp_path, other, logged.append).start() == {}  # another pass: all gone
    assert sorted(os.listdir(tmp_path / STATISTICS_DIR)) == ["plan.json"]


def test_a_nonfinite_training_row_or_solve_stops_the_run_and_publishes_nothing(tmp_path: Path) -> None:
    """The gradient path's finiteness check (weights.finite) on the solve path (issue 41, #4): a NaN in a training
    row makes the summed statistics non-finite, and ridge with alpha > 0 solved them into NaN weights, published
    with exit 0; a solve that makes Inf of finite statistics published them too. Now: exit 1 naming the task or
    the parameter, and no version 1."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    y = x.sum(axis=1).astype(np.float32)
    x[200, 2] = np.nan  # train row 170 (the first 30 rows are the validation split)
    data = write_dataset(tmp_path / "nan", x, y, task="regression", val_rows=30, shard_rows=100)
    for alpha in (0.0, 1.0):  # alpha 0: lstsq raised LinAlgError (a traceback); alpha 1: NaN weights published
        name = f"alpha{int(alpha)}"
        job = write_job(tmp_path, data, kind="ridge", name=name)
        job.write_text(job.read_text().replace('kind = "ridge"', f'kind = "ridge"\nalpha = {alpha}')
                       .replace("[data]\n", "[data]\nnormalize = false\n"))  # the NaN row stays as it is
        result = memtrain("train", job)
        assert result.returncode == 1, result.stderr
        err = " ".join(result.stderr.split())
        assert "non-finite statistics (NaN or Inf) in the pass: task 1 (rows 90-180 of the train split" in err
        assert "Traceback" not in err
        assert weight_versions(tmp_path / name) == [0], "nothing non-finite is published"
    clean = regression(tmp_path / "clean", 200, 3)
    result = memtrain("train", write_job(tmp_path, clean, kind="additive_models:SolvesNonFinite", name="inf"))
    assert result.returncode == 1, result.stderr
    err = " ".join(result.stderr.split())
    assert ("the solve of model 'additive_models:SolvesNonFinite' gave non-finite parameters: 'b' holds 1 NaN or "
            "Inf of 1 values; weight version 1 was not published") in err
    assert weight_versions(tmp_path / "inf") == [0]


def flip_last_float(path: Path) -> None:
    """One bit of the file's last float64 flipped: header and size stay right, the value is wrong."""
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x10
    path.write_bytes(bytes(data))


def test_kept_statistics_are_verified_against_their_checksums_on_resume(data: Path, four_tasks: Path,
                                                                       tmp_path: Path) -> None:
    """Issue 41, #3: a flipped float in a kept partial, a partial replaced by a link to a user's .npy, a damaged
    sum.npy were trusted on resume (header and size only): exit 0 with wrong weights. Each is now absent, logged,
    computed again: the resumed run has the bits of an uninterrupted one, and the user's file is untouched."""
    job = write_job(tmp_path, data, workers=1, tasks=4)
    run = tmp_path / "job"
    assert memtrain("train", job, env={"MEMTRAIN_FAULT": "after_result:3"}).returncode == -9
    partials = sorted(n for n in os.listdir(run / STATISTICS_DIR) if parse_partial_name(n))
    assert len(partials) >= 2, partials
    flipped, linked = run / STATISTICS_DIR / partials[0], run / STATISTICS_DIR / partials[1]
    flip_last_float(flipped)
    users = tmp_path / "users.npy"
    np.save(users, np.zeros_like(np.load(linked)))  # the right shape and dtype: only a checksum tells it apart
    before = users.read_bytes()
    linked.unlink()
    linked.symlink_to(users)
    resumed = memtrain("train", "--resume", run)
    assert resumed.returncode == 0, resumed.stderr
    events = (run / "events.log").read_text()
    assert f"statistics: {flipped}: checksum mismatch: the file changed since it was written" in events
    assert f"statistics: {linked}: a symbolic link, not a file memtrain published; computing it again" in events
    assert users.read_bytes() == before
    assert digest(run) == digest(four_tasks)

    again = write_job(tmp_path, data, workers=1, tasks=4, name="summed")
    run = tmp_path / "summed"
    assert memtrain("train", again, env={"MEMTRAIN_FAULT": "statistics_summed:1"}).returncode == -9
    assert sorted(os.listdir(run / STATISTICS_DIR)) == ["plan.json", "sum.json", "sum.npy"]
    flip_last_float(run / STATISTICS_DIR / "sum.npy")
    resumed = memtrain("train", "--resume", run)
    assert resumed.returncode == 0, resumed.stderr
    events = (run / "events.log").read_text()
    assert f"statistics: {run / STATISTICS_DIR / 'sum.npy'}: checksum mismatch" in events
    assert "partials kept from an earlier start" not in events.split("checksum mismatch")[1]  # all computed again
    assert digest(run) == digest(four_tasks)


def test_a_model_of_the_whole_rows_contract_gets_each_tasks_rows_at_once_and_exact_counts(tmp_path: Path) -> None:
    """Issue 41 (the silent contract change): a user's bigram model written when memtrain called ``statistics``
    once per task overwrites ``out`` (zeroes it, then np.add.at). Called per chunk it kept only each task's last
    chunk (log-probabilities off, exit 0). A model that defines ``statistics`` only is called once per task with
    the task's whole rows: on a dataset of many chunks (chunk_rows 37) its table equals a direct count, bit for
    bit; the event log says its rows are read at once."""
    symbols, rows = 5, 900
    rng = np.random.default_rng(3)
    sequence = rng.integers(0, symbols, rows + 1)
    x, y = sequence[:-1, None].astype(np.float32), sequence[1:].astype(np.int64)
    data = write_dataset(tmp_path / "bigrams", x, y, val_rows=90, shard_rows=100)
    job = write_job(tmp_path, data, kind="additive_models:BigramCounts", workers=2, tasks=3, chunk_rows=37)
    job.write_text(job.read_text().replace("[data]\n", "[data]\nnormalize = false\n"))
    result = memtrain("train", job)
    assert result.returncode == 0, result.stderr
    counts = np.zeros((symbols, symbols))
    np.add.at(counts, (sequence[90:-1], sequence[91:]), 1.0)  # the train split: rows 90 on
    expected = np.log((counts + 1.0) / (counts.sum(axis=1, keepdims=True) + symbols)).astype(np.float32)
    assert final(tmp_path / "job").tobytes() == expected.tobytes()
    assert ("statistics: model 'additive_models:BigramCounts' defines statistics() but not add_statistics(): each "
            "task's rows are read and passed at once (up to 270 rows)") in (tmp_path / "job" / "events.log").read_text()


def test_the_statistics_method_is_the_one_defined_lowest_in_the_class_hierarchy() -> None:
    from additive_models import BigramCounts, CountsChunks, RidgeWholeRows

    from memtrain.models.naive_bayes import GaussianNaiveBayes
    from memtrain.models.protocol import DataSpec
    from memtrain.models.ridge import Ridge
    from memtrain.train.loops.additive import StatisticsContract, statistics_contract

    spec = DataSpec(n_features=2, task="classification", n_classes=3)
    adding, whole = StatisticsContract("add_statistics", True), StatisticsContract("statistics", False)
    for model in (Ridge(spec), GaussianNaiveBayes(spec), CountsChunks(spec)):
        assert statistics_contract(model) == adding
    for model in (BigramCounts(spec), RidgeWholeRows(spec)):  # statistics only; or overridden below a built-in
        assert statistics_contract(model) == whole
