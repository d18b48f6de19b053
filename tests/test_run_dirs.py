"""Run directories are what their own records say (issue 14, items 1-5 and 7), end to end through the CLI:
created complete or not at all, resumed only as the job they record (changes asked for and kept in the
history), movable, never deleting or writing through anything memtrain did not make, and never trusting a
damaged record or a manifest path that leaves its dataset."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_data import blobs, sealed, write_dataset

from memtrain import faults
from memtrain.cli import main
from memtrain.layout import checkpoint_path, checkpoint_updates, weight_versions, weights_path

pytestmark = pytest.mark.timeout(120)

TESTS = Path(__file__).parent
JOB = """
[data]
path = "{data}"

[model]
kind = "mlp"
hidden = [{hidden}]

[train]
epochs = {epochs}
batch_size = 100
tasks_per_update = 2
optimizer = "adam"
lr = {lr}
seed = {seed}
workers = 1

[run]
dir = "run"
keep_checkpoints = 5
"""


def write_job(folder: Path, data: Path, *, epochs: int = 2, lr: float = 0.01, seed: int = 3, hidden: int = 8,
              extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "job.toml"
    job.write_text(JOB.format(data=data, epochs=epochs, lr=lr, seed=seed, hidden=hidden) + extra)
    return job


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=500, features=5, classes=3, seed=2)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=150)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, data: Path) -> Path:
    """A run trained for 2 epochs (copy it before changing it)."""
    job = write_job(tmp_path_factory.mktemp("finished"), data)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["train", str(job)]) == 0  # in this process: nothing kills it
    return job.parent / "run"


@pytest.fixture
def run_copy(tmp_path: Path, finished: Path) -> Path:
    shutil.copytree(finished, tmp_path / "run")
    return tmp_path / "run"


@pytest.fixture(autouse=True)
def fresh_fault_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "_hits", faults.Counter())


def subprocess_cli(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memtrain", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(TESTS), **(env or {})}, timeout=120)


def snapshot(folder: Path) -> dict[str, tuple[bytes | str, int]]:
    """Every entry under ``folder`` (links not followed): its bytes (or link target) and mtime."""
    found = {}
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        content = os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else "dir"
        found[str(path.relative_to(folder))] = (content, info.st_mtime_ns)
    return found


def digest(run: Path) -> str:
    return hashlib.sha256(np.load(weights_path(run, weight_versions(run)[-1])).tobytes()).hexdigest()


def progress(cli, run: Path) -> dict:
    result = cli("inspect", run, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)["progress"]


def backticked(text: str) -> list[str]:
    return re.findall(r"`(memtrain [^`]+)`", text)


def run_named(cli, command: str):
    """Run a ``memtrain ...`` command quoted in an error message (it must work)."""
    return cli(*command.split()[1:])


# --- 1. a run directory is created complete, or not at all ---

@pytest.mark.parametrize("hit", [1, 2, 3, 6])
def test_a_start_killed_at_any_write_leaves_no_run_or_a_resumable_one(tmp_path: Path, data: Path, hit: int,
                                                                      cli) -> None:
    job = write_job(tmp_path, data)
    run = tmp_path / "elsewhere" / "R"
    killed = subprocess_cli("train", job, "--run-dir", run, env={"MEMTRAIN_FAULT": f"write:{hit}"})
    assert killed.returncode == -9
    if run.exists():  # complete: its record is there, and every way back in names a command that works
        assert (run / "job.json").is_file() and (run / "params.json").is_file()
        again = cli("train", job, "--run-dir", run)
        assert again.code == 2 and "already exists" in again.err
        commands = backticked(again.err)
        assert commands[0] == f"memtrain train --resume {run}"
        assert run_named(cli, commands[1]).code == 0  # --overwrite
        assert run_named(cli, commands[0]).code == 0  # --resume
    else:  # not at all: nothing at R; resuming says how to start, and that command works
        resumed = cli("train", "--resume", run)
        assert resumed.code == 2 and "Traceback" not in resumed.err
        assert f"--run-dir {run}" in resumed.err
        assert cli("train", job, "--run-dir", run).code == 0
    assert [p.name for p in run.parent.iterdir()] == ["R"]  # an interrupted creation left nothing beside it
    assert cli("train", "--resume", run, "--set", "train.epochs=3").code == 0


def test_a_start_refused_after_the_directory_was_made_leaves_nothing(tmp_path: Path, data: Path, cli) -> None:
    job = write_job(tmp_path, data)
    # 10^4 checkpoints (the most a job may keep) of 12e6 parameters and two Adam slots: 1.4 TB, refused by the
    # room check once the directory is made
    too_many = ("--set", "run.keep_checkpoints=10000", "--set", "model.hidden=[2000000]")
    refused = cli("train", job, *too_many)
    assert refused.code == 1 and "Traceback" not in refused.err
    assert "not enough free space for the run's weight versions and checkpoints" in refused.err
    assert not (tmp_path / "run").exists()
    (tmp_path / "empty").mkdir()
    refused = cli("train", job, "--run-dir", tmp_path / "empty", *too_many)
    assert refused.code == 1 and list((tmp_path / "empty").iterdir()) == []  # put back as it was
    assert cli("train", job).code == 0  # the same command, without the bad setting, just works


# --- 2. resume compares first, refuses changes to what is computed, writes nothing before deciding ---

@pytest.mark.parametrize(("edit", "named"), [
    ({"lr": 0.05, "seed": 9}, ["train.seed", "train.lr"]),
    ({"hidden": 12}, ["model.hidden", "parameter layout"]),
])
def test_resuming_with_another_job_is_refused_before_anything_is_written(tmp_path: Path, data: Path, run_copy: Path,
                                                                         edit: dict, named: list[str], cli) -> None:
    other = write_job(tmp_path / "other", data, **edit)
    before = snapshot(run_copy)
    refused = cli("train", other, "--run-dir", run_copy, "--resume")
    assert refused.code == 2 and "Traceback" not in refused.err
    for key in named:
        assert key in refused.err
    assert snapshot(run_copy) == before
    assert cli("inspect", run_copy).code == 0


@pytest.mark.parametrize("setting", ["train.seed=4", "model.hidden=[4]", "train.batch_size=50",
                                     'train.optimizer="sgd"', "data.normalize=false"])
def test_resume_never_changes_the_model_data_or_batches_even_when_asked(run_copy: Path, setting: str, cli) -> None:
    before = snapshot(run_copy)
    refused = cli("train", "--resume", run_copy, "--set", setting)
    assert refused.code == 2 and setting.split("=")[0] in refused.err and "Traceback" not in refused.err
    assert snapshot(run_copy) == before


def test_a_resumed_jobs_errors_name_the_runs_job_json(run_copy: Path, cli) -> None:
    """A resumed job comes from the run's job.json: its errors name that file, not `job:` (issue 41)."""
    result = cli("train", "--resume", run_copy, "--set", "train.epochs=0")
    assert result.code == 2
    assert f"{run_copy / 'job.json'}: train.epochs out of range" in result.err
    job = run_copy / "job.json"
    record = json.loads(job.read_text())
    record["train"]["epocs"] = 3  # sealed again: a consistent record holding a key no version knew
    job.write_text(json.dumps(sealed(record)))
    result = cli("train", "--resume", run_copy)
    assert result.code == 2
    assert f"{job}: unknown key train.epocs" in result.err and not result.err.count(" job: ")


def test_a_data_change_is_refused(tmp_path: Path, run_copy: Path, cli) -> None:
    x, y = blobs(n=300, features=5, classes=3, seed=9)
    other = write_dataset(tmp_path / "other-data", x, y)
    before = snapshot(run_copy)
    refused = cli("train", "--resume", run_copy, "--set", f'data.path="{other}"')
    assert refused.code == 2 and "data.path" in refused.err
    assert snapshot(run_copy) == before


def test_changes_asked_for_are_history_entries_and_inspect_shows_them(run_copy: Path, cli) -> None:
    record = (run_copy / "job.json").read_bytes()
    fewer = cli("train", "--resume", run_copy, "--set", "train.epochs=1")
    assert fewer.code == 2 and "already trained 2 epochs" in fewer.err
    assert progress(cli, run_copy)["epochs"] == 2
    done = cli("train", "--resume", run_copy, "--set", "train.epochs=4", "--set", "train.lr=0.02", "--workers", "2")
    assert done.code == 0, done.err
    assert (run_copy / "job.json").read_bytes() == record  # the original record is never rewritten
    history = [json.loads(line) for line in (run_copy / "history.jsonl").read_text().splitlines()]
    assert [e["event"] for e in history] == ["start", "resume"]
    assert history[1]["changes"] == {"train.epochs": {"from": 2, "to": 4}, "train.lr": {"from": 0.01, "to": 0.02}}
    assert history[1]["from_checkpoint"] == checkpoint_path(run_copy, checkpoint_updates(run_copy)[1]).name
    shown = progress(cli, run_copy)
    assert (shown["epochs_done"], shown["epochs"]) == (4, 4)
    again = cli("train", "--resume", run_copy, "--set", "train.epochs=3")  # fewer than done: refused
    assert again.code == 2 and progress(cli, run_copy)["epochs"] == 4
    view = json.loads(cli("inspect", run_copy, "--json").out)
    assert view["job"]["train"]["lr"] == 0.02 and view["job"]["train"]["workers"] == 1  # --workers: not recorded


def test_a_job_file_that_differs_in_a_changeable_setting_names_the_command_that_changes_it(
        tmp_path: Path, data: Path, run_copy: Path, cli) -> None:
    edited = write_job(tmp_path / "edited", data, epochs=3, lr=0.03)
    before = snapshot(run_copy)
    refused = cli("train", edited, "--run-dir", run_copy, "--resume")
    assert refused.code == 2 and "train.lr" in refused.err and "train.epochs" in refused.err
    assert snapshot(run_copy) == before
    command = backticked(refused.err)[0]
    assert "--set train.lr=0.03" in command and "--set train.epochs=3" in command
    assert run_named(cli, command).code == 0
    assert progress(cli, run_copy)["epochs"] == 3
    same = cli("train", edited, "--run-dir", run_copy, "--resume")  # the record now says what the file says
    assert same.code == 0, same.err


def test_a_resume_changes_train_blas_threads_only_when_asked_it_changes_the_bits(
        tmp_path: Path, data: Path, run_copy: Path, cli) -> None:
    """The BLAS may add in another order with another thread count (1e6 parameters in the server: 1 and 2
    threads end in different weights): a job file's other train.blas_threads is refused, named with the
    command that changes it, and a change asked for with --set is recorded in the history."""
    edited = write_job(tmp_path / "edited", data)
    edited.write_text(edited.read_text().replace("workers = 1\n", "workers = 1\nblas_threads = 2\n"))
    before = snapshot(run_copy)
    refused = cli("train", edited, "--run-dir", run_copy, "--resume")
    assert refused.code == 2 and "train.blas_threads" in refused.err, refused.err
    assert snapshot(run_copy) == before
    assert "--set train.blas_threads=2" in backticked(refused.err)[0]
    done = cli("train", "--resume", run_copy, "--set", "train.blas_threads=2", "--set", "train.epochs=3")
    assert done.code == 0, done.err
    history = [json.loads(line) for line in (run_copy / "history.jsonl").read_text().splitlines()]
    assert history[-1]["changes"]["train.blas_threads"] == {"from": 1, "to": 2}


def test_an_additive_model_has_no_epochs_to_add(tmp_path: Path, data: Path, cli) -> None:
    job = tmp_path / "nb.toml"
    job.write_text(f'[data]\npath = "{data}"\nnormalize = false\n[model]\nkind = "naive_bayes"\n'
                   '[train]\nepochs = 1\nworkers = 1\n[run]\ndir = "run"\n')
    assert cli("train", job).code == 0
    before = snapshot(tmp_path / "run")
    refused = cli("train", "--resume", tmp_path / "run", "--set", "train.epochs=3")
    assert refused.code == 2 and "train.epochs" in refused.err and "Traceback" not in refused.err
    assert snapshot(tmp_path / "run") == before


# --- 3. a run directory can be moved ---

def test_a_moved_run_directory_trains_where_it_is_now(tmp_path: Path, data: Path, finished: Path, cli) -> None:
    straight = write_job(tmp_path / "straight", data, epochs=3)
    assert cli("train", straight).code == 0
    origin = tmp_path / "A"
    shutil.copytree(finished, origin)
    moved = tmp_path / "moved" / "B"
    moved.parent.mkdir()
    origin.rename(moved)
    assert cli("train", "--resume", moved, "--set", f'run.dir="{origin}"').code == 2  # it resumes where it is
    resumed = cli("train", "--resume", moved, "--set", "train.epochs=3")
    assert resumed.code == 0, resumed.err
    assert not origin.exists()
    assert digest(moved) == digest(straight.parent / "run")
    for name in ("job.json", "history.jsonl", "params.json", "lineage.jsonl"):
        assert str(origin) not in (moved / name).read_text() and str(finished) not in (moved / name).read_text()
    job = moved.parent / "job.toml"
    job.write_text(straight.read_text().replace("epochs = 3", "epochs = 4"))
    assert cli("train", job, "--run-dir", moved, "--resume", "--set", "train.epochs=4").code == 0
    assert not origin.exists() and progress(cli, moved)["epochs_done"] == 4


# --- 4. memtrain deletes or replaces only what it can prove it wrote ---

def plant_user_files(run: Path) -> dict[str, bytes]:
    files = {"notes.tmp-123-abc": b"notes", ".notes.txt.tmp-1-abcdef12": b"an editor's backup",
             "checkpoints/.hidden/mine.txt": b"hidden", "weights/mine.npy": b"not a version",
             f"memtrain-x-0123abcd-{dead_pid()}/g-v00000001-t00000-a000.npy": b"looks like an exchange area"}
    for name, content in files.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(content)
    return files


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_user_files_in_a_run_survive_resume_and_overwrite(tmp_path: Path, data: Path, run_copy: Path, cli) -> None:
    files = plant_user_files(run_copy)
    assert cli("train", "--resume", run_copy, "--set", "train.epochs=3").code == 0
    assert {name: (run_copy / name).read_bytes() for name in files} == files
    job = write_job(tmp_path / "job", data)
    replaced = cli("train", job, "--run-dir", run_copy, "--overwrite")
    assert replaced.code == 0, replaced.err
    assert {name: (run_copy / name).read_bytes() for name in files} == files
    assert progress(cli, run_copy)["epochs_done"] == 2
    assert "left in place (not written by memtrain)" in (run_copy / "events.log").read_text()


def test_a_directory_memtrain_did_not_make_is_never_written(tmp_path: Path, data: Path, cli) -> None:
    mine = tmp_path / "mine"
    (mine / "checkpoints" / ".hidden").mkdir(parents=True)
    (mine / "metrics.jsonl").write_text('{"my": "metrics"}\n')
    (mine / "notes.tmp-123-abc").write_text("notes")
    (mine / "checkpoints" / ".hidden" / "x").write_text("x")
    before = snapshot(mine)
    job = write_job(tmp_path, data)
    for args in (["--resume"], ["--overwrite"], []):
        refused = cli("train", job, "--run-dir", mine, *args)
        assert refused.code == 2 and "not a memtrain run" in refused.err, args
        assert "--run-dir NEW_DIR" in refused.err
    refused = cli("train", "--resume", mine)
    assert refused.code == 2 and "no job.json" in refused.err
    assert snapshot(mine) == before


def test_exchange_areas_are_removed_only_with_memtrain_s_mark(tmp_path: Path, data: Path, cli) -> None:
    scratch = tmp_path / "scratch"
    users = scratch / f"memtrain-x-0badcafe-{dead_pid()}"
    users.mkdir(parents=True)
    (users / "results.csv").write_text("precious")
    stale = scratch / f"memtrain-x-0dead0ff-{dead_pid()}"
    stale.mkdir()
    (stale / ".memtrain-exchange.json").write_text("1")
    job = write_job(tmp_path, data, extra=f'exchange = "{scratch}"\n')
    assert cli("train", job).code == 0
    assert (users / "results.csv").read_text() == "precious"
    assert not stale.exists()
    assert sorted(p.name for p in scratch.iterdir()) == [users.name]


def test_prepare_overwrite_refuses_a_dataset_holding_user_files(tmp_path: Path, cli) -> None:
    source = tmp_path / "s.csv"
    source.write_text("a,b,label\n" + "".join(f"{i},{i % 7},{i % 2}\n" for i in range(60)))
    out = tmp_path / "ds"
    assert cli("prepare", source, out, "--plain").code == 0
    (out / "README.txt").write_text("what this dataset is")
    (out / "train" / "notes.tmp-1-abc").write_text("mine")
    stray = tmp_path / f".ds.prepare-{'0' * 16}"  # a work area's name, but no lock: not made by memtrain
    stray.mkdir()
    (stray / "keep.txt").write_text("keep")
    refused = cli("prepare", source, out, "--overwrite", "--plain", "--seed", "5")
    assert refused.code == 2 and "README.txt" in refused.err and "train/notes.tmp-1-abc" in refused.err
    assert (out / "README.txt").exists() and (stray / "keep.txt").exists()
    (out / "README.txt").unlink()
    (out / "train" / "notes.tmp-1-abc").unlink()
    assert cli("prepare", source, out, "--overwrite", "--plain", "--seed", "5").code == 0
    assert (stray / "keep.txt").exists()


# --- 5. every record that decides what happens next is checksummed; damage is skipped or reported ---

def edit_json(path: Path, change) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record, indent=2))


def flip_digit(path: Path, pattern: str) -> None:
    """Change one digit inside the first match of ``pattern`` (a raw edit: the JSON stays valid)."""
    text = path.read_text()
    match = re.search(pattern, text)
    assert match, pattern
    at = match.end() - 1
    path.write_text(text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1:])


@pytest.mark.parametrize("damage", [
    lambda meta: flip_digit(meta, r'"position": \{\s*"epoch": \d'),
    lambda meta: flip_digit(meta, r'"version": \d'),
    lambda meta: edit_json(meta, lambda m: m["position"].pop("version")),
    lambda meta: edit_json(meta, lambda m: m.pop("layout")),
    lambda meta: meta.write_text(json.dumps(sealed({k: v for k, v in json.loads(meta.read_text()).items()
                                                    if k != "position"}))),
], ids=["epoch", "format-version", "missing-key", "missing-layout", "sealed-without-position"])
def test_a_damaged_checkpoint_meta_is_skipped_for_the_previous_one(tmp_path: Path, data: Path, run_copy: Path,
                                                                   damage, cli) -> None:
    straight = write_job(tmp_path / "straight", data, epochs=3)
    assert cli("train", straight).code == 0
    newest = checkpoint_path(run_copy, checkpoint_updates(run_copy)[-1])
    damage(newest / "meta.json")
    resumed = cli("train", "--resume", run_copy, "--set", "train.epochs=3")
    assert resumed.code == 0, resumed.err
    assert f"skipping checkpoint {newest.name}" in resumed.out + resumed.err
    assert "Traceback" not in resumed.err and "done: 3 epochs" in resumed.out
    assert digest(run_copy) == digest(straight.parent / "run")


def reseal_without(path: Path, section: str, key: str) -> None:
    """A consistent (sealed) record that lacks a field: what a buggy writer or a hand edit could leave."""
    record = json.loads(path.read_text())
    del record[section][key]
    path.write_text(json.dumps(sealed(record)))


@pytest.mark.parametrize(("record", "damage", "message"), [
    ("job.json", lambda p: edit_json(p, lambda job: job["train"].update(lr=0.5)), "damaged"),
    ("job.json", lambda p: reseal_without(p, "train", "epochs"), "lacks a setting"),
    ("history.jsonl", lambda p: p.write_text(p.read_text().replace(
        '"start"', '"resume", "changes": {"train.epochs": {"from": 2, "to": 9}}')), "damaged"),
    ("history.jsonl", lambda p: p.write_text(json.dumps(sealed({"event": "resume", "changes": {
        "train.seed": {"from": 3, "to": 4}}})) + "\n"), "malformed"),
    ("params.json", lambda p: flip_digit(p, r'"size": \d'), "damaged"),
], ids=["job-edited", "job-resealed-incomplete", "history-edited", "history-resealed-fixed-key", "params"])
def test_a_damaged_run_record_is_reported_and_never_trusted(run_copy: Path, record: str, damage, message: str,
                                                            cli) -> None:
    damage(run_copy / record)
    before = snapshot(run_copy)
    refused = cli("train", "--resume", run_copy, "--set", "train.epochs=3")
    assert refused.code == 1 and message in refused.err and record in refused.err
    assert "Traceback" not in refused.err and "--overwrite" in refused.err
    assert snapshot(run_copy) == before
    shown = cli("inspect", run_copy)
    assert shown.code == 0 and "DAMAGED" in shown.out
    assert cli("inspect", run_copy, "--verify").code == 1
    assert cli("train", write_job(run_copy.parent / "job", Path(json.loads(
        (run_copy / "job.json").read_text())["data"]["path"])), "--run-dir", run_copy, "--overwrite").code == 0


def test_a_damaged_lineage_line_is_reported_by_verify(run_copy: Path, cli) -> None:
    path = run_copy / "lineage.jsonl"
    flip_digit(path, r'"update": \d')
    result = cli("inspect", run_copy, "--verify", "--json")
    assert result.code == 1
    failures = json.loads(result.out)["verify"]["failures"]
    assert [f["path"] for f in failures] == [str(path)] and "line" in failures[0]["found"]


@pytest.mark.parametrize("damage", [
    lambda m: m["splits"]["train"]["shards"][0].update(rows=151),
    lambda m: m.update(version=1),
    lambda m: m["x"].update(dtype="float64"),
], ids=["rows", "version", "dtype"])
def test_a_damaged_manifest_is_refused_naming_it(tmp_path: Path, data: Path, damage, cli) -> None:
    copy = tmp_path / "ds"
    shutil.copytree(data, copy)
    edit_json(copy / "manifest.json", damage)
    result = cli("train", write_job(tmp_path, copy))
    assert result.code == 1 and "manifest.json" in result.err and "Traceback" not in result.err
    assert not (tmp_path / "run").exists()


# --- 7. manifest paths stay inside their dataset; nothing is written through a link memtrain did not make ---

@pytest.mark.parametrize("where", ["absolute", "dotdot", "symlink"])
def test_a_manifest_cannot_point_outside_its_dataset(tmp_path: Path, data: Path, where: str, cli) -> None:
    copy = tmp_path / "ds"
    shutil.copytree(data, copy)
    outside = tmp_path / "outside.npy"
    shutil.copy(copy / "train" / "x-00000.npy", outside)
    manifest = json.loads((copy / "manifest.json").read_text())
    shard = manifest["splits"]["train"]["shards"][0]
    if where == "absolute":
        shard["x"] = str(outside)
    elif where == "dotdot":
        shard["x"] = "train/../../outside.npy"
    else:
        (copy / "train" / "x-00000.npy").unlink()
        (copy / "train" / "x-00000.npy").symlink_to(outside)
    (copy / "manifest.json").write_text(json.dumps(sealed(manifest)))  # a consistent manifest, not a damaged one
    for args in (["train", write_job(tmp_path, copy)], ["inspect", copy, "--verify"]):
        result = cli(*args)
        assert result.code == 1 and "Traceback" not in result.err
        assert "splits.train.shards[0].x" in result.err and ("relative" in result.err or "leaves" in result.err)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["events.log", "run.lock"])
def test_links_planted_in_a_run_are_never_written_through(tmp_path: Path, run_copy: Path, name: str, cli) -> None:
    target = tmp_path / "outside.txt"
    target.write_text("must stay as it is\n")
    (run_copy / name).unlink()
    (run_copy / name).symlink_to(target)
    result = cli("train", "--resume", run_copy, "--set", "train.epochs=3")
    assert result.code == 1 and "symbolic link" in result.err and "Traceback" not in result.err
    assert target.read_text() == "must stay as it is\n"
    assert (run_copy / name).is_symlink()


def test_a_linked_log_file_is_replaced_by_rename_not_written_through(tmp_path: Path, run_copy: Path, cli) -> None:
    target = tmp_path / "outside.jsonl"
    target.write_text("outside\n")
    metrics = run_copy / "metrics.jsonl"
    metrics.unlink()
    metrics.symlink_to(target)
    assert cli("train", "--resume", run_copy, "--set", "train.epochs=3").code == 0
    assert target.read_text() == "outside\n"
    assert not metrics.is_symlink()


# --- a rerun of a job whose run directory memtrain named goes beside the earlier run ---


def test_a_rerun_goes_to_a_numbered_directory_beside_the_earlier_run(tmp_path: Path, data: Path, cli) -> None:
    """Edit and rerun: a job file without run.dir trains into runs/<name>; run again it trains into runs/<name>-2
    (the summary names it), leaving the earlier run untouched. --overwrite and --resume still act on runs/<name>,
    and a directory the job or the command names is still refused when taken (exit 2)."""
    job = write_job(tmp_path, data)
    job.write_text(job.read_text().replace('dir = "run"\n', ""))
    first = cli("train", job)
    runs = tmp_path / "runs"
    assert first.code == 0 and f"run directory: {runs / 'job'}\n" in first.out
    before = {p.name: p.stat().st_mtime_ns for p in (runs / "job").rglob("*")}
    job.write_text(job.read_text().replace("lr = 0.01", "lr = 0.02"))  # edit, and rerun
    second = cli("train", job)
    assert second.code == 0, second.err
    assert f"run directory: {runs / 'job-2'}\n" in second.out
    assert f"{runs / 'job'} holds an earlier run: this one is {runs / 'job-2'}" in second.err
    assert {p.name: p.stat().st_mtime_ns for p in (runs / "job").rglob("*")} == before
    assert json.loads((runs / "job-2" / "job.json").read_text())["train"]["lr"] == 0.02
    assert cli("train", job, "--quiet").code == 0 and sorted(os.listdir(runs)) == ["job", "job-2", "job-3"]
    overwritten = cli("train", job, "--overwrite", "--quiet")
    assert overwritten.code == 0 and sorted(os.listdir(runs)) == ["job", "job-2", "job-3"]
    assert json.loads((runs / "job" / "job.json").read_text())["train"]["lr"] == 0.02
    resumed = cli("train", job, "--resume", "--set", "train.epochs=3", "--quiet")
    assert resumed.code == 0 and "done: 3 epochs" in resumed.out and f"{runs / 'job'}\n" in resumed.out
    named = cli("train", job, "--run-dir", runs / "job")
    assert named.code == 2 and "the run directory already exists" in named.err
    assert sorted(os.listdir(runs)) == ["job", "job-2", "job-3"]
