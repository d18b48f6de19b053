"""train/server/monitor.py through memtrain.fit and the CLI on real files: the best epoch by any metric and its
direction, early stopping that a resume continues exactly, the best checkpoint kept through rotation and
resume, metrics.csv and TensorBoard event files (read back with TensorBoard's own reader), callbacks."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from tiny_data import write_dataset

import memtrain
from memtrain.errors import InputError, MemtrainError
from memtrain.layout import checkpoint_updates

pytestmark = pytest.mark.timeout(120)
VOLATILE = ("time", "samples_per_s")  # the only fields of an epoch record that depend on the clock


@pytest.fixture(scope="module")
def noise(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Labels that do not depend on the features: a model can only overfit, so validation gets worse."""
    rng = np.random.default_rng(11)
    x, y = rng.normal(size=(600, 10)).astype(np.float32), rng.integers(0, 3, 600)
    return write_dataset(tmp_path_factory.mktemp("data") / "noise", x, y, val_rows=200, shard_rows=300)


@pytest.fixture(scope="module")
def regression(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    y = (x @ rng.normal(size=4) + rng.normal(size=300)).astype(np.float32)
    return write_dataset(tmp_path_factory.mktemp("data") / "reg", x, y, task="regression", val_rows=60)


def settings(data: Path, **train: object) -> dict:
    return {"data": {"path": str(data)}, "model": {"kind": "mlp", "hidden": [32]},
            "train": {"epochs": 30, "batch_size": 50, "workers": 0, "optimizer": "adam", "lr": 0.01, **train}}


def epochs_of(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "epoch"]


def steady(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in records]


def test_early_stopping_on_a_metric_to_maximise_keeps_its_best_checkpoint(tmp_path: Path, noise: Path) -> None:
    run = tmp_path / "run"
    summary = memtrain.fit(settings(noise, monitor="val_accuracy", patience=3), run={"keep_checkpoints": 1},
                           run_dir=run, quiet=True)
    records = epochs_of(run)
    best = max(records, key=lambda r: (r["val_accuracy"], -r["epoch"]))  # the first epoch of the highest
    assert summary.stopped_early and summary.epochs == len(records) == best["epoch"] + 3 < 30
    assert summary.best["epoch"] == best["epoch"] and summary.monitor == "val_accuracy"
    lowest_loss = min(records, key=lambda r: r["val_loss"])
    assert lowest_loss["epoch"] != best["epoch"], "the test needs the two metrics to disagree"
    assert checkpoint_updates(run) == sorted({best["update"], records[-1]["update"]})  # rotation spared the best
    model = memtrain.load_model(run)
    assert model.meta["epoch"] == best["epoch"]  # what users expect after an early stop
    assert memtrain.load_model(run, which="last").meta["epoch"] == records[-1]["epoch"]
    assert "stopping early: no better val_accuracy for 3 epochs" in (run / "events.log").read_text()


def test_a_resumed_run_continues_early_stopping_exactly(tmp_path: Path, noise: Path) -> None:
    whole = memtrain.fit(settings(noise, patience=3), run={"keep_checkpoints": 1}, run_dir=tmp_path / "whole",
                         quiet=True)
    assert whole.stopped_early
    # stop between the best epoch and the early stop: the count of epochs without improvement must carry over
    cut = whole.best["epoch"] + 1
    memtrain.fit(settings(noise, patience=3, epochs=cut), run={"keep_checkpoints": 1}, run_dir=tmp_path / "cut",
                 quiet=True)
    resumed = memtrain.fit(resume=tmp_path / "cut", train={"epochs": 30}, quiet=True)
    assert resumed.stopped_early and resumed.epochs == whole.epochs
    assert steady(epochs_of(tmp_path / "cut")) == steady(epochs_of(tmp_path / "whole"))
    assert resumed.best == whole.best or steady([resumed.best]) == steady([whole.best])
    assert checkpoint_updates(tmp_path / "cut") == checkpoint_updates(tmp_path / "whole")  # the best survived
    assert memtrain.load_model(tmp_path / "cut").meta["epoch"] == whole.best["epoch"]


def test_monitor_settings_are_checked_before_anything_is_written(tmp_path: Path, noise: Path,
                                                                 regression: Path, cli) -> None:
    job = tmp_path / "job.toml"
    job.write_text(f'[data]\npath = "{noise}"\n[model]\nkind = "softmax"\n[train]\nmonitor = "val_acuracy"\n')
    done = cli("train", job)
    assert done.code == 2 and "bad value for train.monitor" in done.err and "did you mean `val_accuracy`" in done.err
    done = cli("train", job, "--set", "train.monitor=val_loss", "--set", "train.monitor_mode=up")
    assert done.code == 2 and "bad value for train.monitor_mode (expected 'auto' or 'min' or 'max', found 'up')" \
        in done.err
    with pytest.raises(InputError, match="train.monitor = 'val_accuracy' is not reported for regression"):
        memtrain.fit(data={"path": str(regression)}, model={"kind": "linear"}, train={"monitor": "val_accuracy"},
                     run_dir=tmp_path / "reg")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "reg").exists()


def test_regression_monitor_mode_min_and_max(tmp_path: Path, regression: Path) -> None:
    base = {"data": {"path": str(regression)}, "model": {"kind": "linear"},
            "train": {"epochs": 6, "batch_size": 30, "workers": 0, "lr": 0.05}}
    for mode, pick in (("max", max), ("min", min)):
        run = tmp_path / mode
        summary = memtrain.fit(base | {"train": base["train"] | {"monitor": "val_r2", "monitor_mode": mode}},
                               run_dir=run, quiet=True)
        best = pick(epochs_of(run), key=lambda r: (r["val_r2"], -r["epoch"] if mode == "max" else r["epoch"]))
        assert summary.best["epoch"] == best["epoch"], mode


def test_csv_and_tensorboard_logs_follow_the_run_through_a_resume(tmp_path: Path, noise: Path, cli) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    memtrain.fit(settings(noise, epochs=3), run={"log_to": ["csv", "tensorboard"]}, run_dir=run, quiet=True)
    # the newest checkpoint goes, as if the run had died before it: the resume repeats epoch 3
    (run / "checkpoints" / "c00000024").rename(tmp_path / "gone")
    memtrain.fit(resume=run, train={"epochs": 4}, quiet=True)
    records = epochs_of(run)
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    with open(run / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4]
    for row, record in zip(rows, records, strict=True):
        assert float(row["val_loss"]) == record["val_loss"] and float(row["loss"]) == record["loss"]
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert {"loss", "val_loss", "val_accuracy", "val_macro_f1"} <= set(events.Tags()["scalars"])
    scalars = events.Scalars("val_loss")
    assert [s.step for s in scalars] == [1, 2, 3, 4]  # epoch 3 of the first session purged, written again
    assert [s.value for s in scalars] == pytest.approx([r["val_loss"] for r in records], rel=1e-6)
    assert cli("train", "--resume", run, "--set", "run.log_to=[]", "--quiet").code == 0  # adjustable on resume
    done = cli("train", "--resume", run, "--set", 'run.log_to=["csv", "tensorbord"]')
    assert done.code == 2 and "bad value in run.log_to (expected a list of csv and tensorboard, found " \
                              "'tensorbord')" in done.err
    done = cli("train", "--resume", run, "--set", "run.log_to=csv")
    assert done.code == 2 and "wrong type for run.log_to (expected a list of str values, found 'csv')" in done.err
    overwritten = memtrain.fit(settings(noise, epochs=1), run_dir=run, overwrite=True, quiet=True)
    assert overwritten.epochs == 1 and not (run / "metrics.csv").exists() and not (run / "tensorboard").exists()


def test_callbacks_see_each_epoch_and_a_failing_one_stops_with_a_checkpoint(tmp_path: Path, noise: Path) -> None:
    seen: list[dict] = []

    class Plotter:
        def on_epoch_end(self, metrics: dict) -> None:
            seen.append(metrics)

    memtrain.fit(settings(noise, epochs=2), run_dir=tmp_path / "ok", callbacks=[Plotter()], quiet=True)
    assert steady(seen) == steady(epochs_of(tmp_path / "ok"))

    def fails(metrics: dict) -> None:
        if metrics["epoch"] == 2:
            raise ValueError("the plot broke")

    run = tmp_path / "run"
    with pytest.raises(MemtrainError, match=r"the on_epoch_end callback .*fails raised ValueError: the plot broke "
                                            r"\(after epoch 2\)") as caught:
        memtrain.fit(settings(noise, epochs=5), run={"checkpoint_every": 4, "keep_best": False}, run_dir=run,
                     callbacks=[fails], quiet=True)
    assert isinstance(caught.value.__cause__, ValueError) and caught.value.exit_code == 1
    assert f"memtrain.fit(resume={str(run)!r})" in str(caught.value)
    assert checkpoint_updates(run)[-1] == 2 * 8  # checkpointed where it stopped, between checkpoint_every epochs
    resumed = memtrain.fit(resume=run, quiet=True)
    assert resumed.epochs == 5 and [r["epoch"] for r in epochs_of(run)] == [1, 2, 3, 4, 5]
    with pytest.raises(InputError, match="a callback is neither a function nor an object with on_epoch_end"):
        memtrain.fit(settings(noise), run_dir=tmp_path / "bad", callbacks=[42])


def test_a_best_checkpoint_off_the_schedule_never_takes_a_scheduled_ones_place(tmp_path: Path, noise: Path,
                                                                              regression: Path) -> None:
    run = tmp_path / "run"
    memtrain.fit(settings(noise, epochs=7, lr=0.002), run={"checkpoint_every": 3, "keep_checkpoints": 2},
                 run_dir=run, quiet=True)
    records = epochs_of(run)
    best = min(records, key=lambda r: r["val_loss"])
    improved = [r["epoch"] for i, r in enumerate(records) if all(r["val_loss"] < b["val_loss"] for b in records[:i])]
    assert len([e for e in improved if e % 3]) >= 2, "the test needs several best epochs off the schedule"
    assert best["epoch"] % 3, "the test needs the best epoch off the schedule"
    # the two newest scheduled (or final) checkpoints, and the best epoch's; earlier bests' are gone
    assert checkpoint_updates(run) == sorted({6 * 8, 7 * 8, best["update"]})
    assert memtrain.load_model(run).meta["epoch"] == best["epoch"]
    # a run that improves every epoch (the README's digits run does): the scheduled checkpoints stay
    steady_run = tmp_path / "steady"
    memtrain.fit(data={"path": str(regression)}, model={"kind": "linear"},
                 train={"epochs": 8, "batch_size": 30, "workers": 0, "lr": 0.01},
                 run={"checkpoint_every": 3, "keep_checkpoints": 2}, run_dir=steady_run, quiet=True)
    losses = [r["val_loss"] for r in epochs_of(steady_run)]
    assert losses == sorted(losses, reverse=True), "the test needs a run that improves every epoch"
    assert checkpoint_updates(steady_run) == [6 * 8, 8 * 8]  # not epoch 7's, written as the best then


def test_a_job_built_in_python_resolves_keep_best_and_writes_no_checkpoint_per_improving_epoch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``run.keep_best`` (default true; ``"auto"``, the older default, is true) is a bool also for a ``Job(...)``
    built in Python (a script, the benches), not only for a job file; a job checkpointing at the end only writes
    one scheduled checkpoint, not one per improving epoch, and the best epoch's is committed once at the end."""
    from memtrain.config import DataConfig, Job, ModelConfig, RunConfig, TrainConfig
    from memtrain.train.records.state import save_checkpoint
    from memtrain.train.server import server

    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 4)).astype(np.float32)
    data = write_dataset(tmp_path / "data", x, (x[:, 0] > 0).astype(np.int64))
    job = Job(DataConfig(path=data), ModelConfig("softmax", {}),
              TrainConfig(epochs=4, batch_size=60, workers=0),
              RunConfig(dir=tmp_path / "run", checkpoint_every=100))
    assert job.run.keep_best is True
    assert Job(job.data, job.model, job.train, RunConfig(keep_best="auto")).run.keep_best is True
    assert Job(job.data, job.model, job.train, RunConfig(keep_best=False)).run.keep_best is False
    saved: list[int] = []

    def counted(*args: object, **kwargs: object) -> object:
        saved.append(args[3].epoch)  # type: ignore[attr-defined]  # (run, job, context, position, ...)
        return save_checkpoint(*args, **kwargs)

    monkeypatch.setattr(server, "save_checkpoint", counted)
    server.train(job, quiet=True)
    assert saved == [4]  # the last epoch's only: none per improving epoch
    best = min(epochs_of(tmp_path / "run"), key=lambda r: r["val_loss"])
    assert checkpoint_updates(tmp_path / "run") == sorted({best["update"], 4 * 9})
    assert memtrain.load_model(tmp_path / "run").meta["epoch"] == best["epoch"]


def test_plot_draws_the_monitored_metric(tmp_path: Path, regression: Path, noise: Path, capsys) -> None:
    """``inspect --plot`` draws the metric the run is monitored on beside the loss: ``val_r2`` for a regression
    monitored on it (which has no accuracy), the validation accuracy for a classifier monitored on its loss."""
    from memtrain.cli import main

    drawn = {}
    for name, data, monitor in (("r2", regression, "val_r2"), ("loss", noise, "val_loss")):
        run = tmp_path / name
        memtrain.fit(settings(data, epochs=2, monitor=monitor), run_dir=run, quiet=True)
        assert main(["inspect", str(run), "--plot", str(tmp_path / f"{name}.png"), "--json"]) == 0
        drawn[name] = json.loads(capsys.readouterr().out)["metric"]
    assert drawn == {"r2": "val_r2", "loss": "val_accuracy"}


KILLER = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import memtrain

def kill_at_the_end(metrics):
    if metrics["epoch"] == {epochs}:
        os.kill(os.getpid(), signal.SIGKILL)  # after the best epoch's copy was staged, before it is committed

memtrain.fit({job!r}, run={{"checkpoint_every": 3, "keep_checkpoints": 1}}, run_dir={run!r}, quiet=True,
             callbacks=[kill_at_the_end])
"""


@pytest.mark.timeout(180)
def test_a_crash_loses_the_staged_best_and_loading_the_run_says_so(tmp_path: Path, noise: Path) -> None:
    """The best epoch between two scheduled checkpoints is only copied until the run stops: a SIGKILL loses the
    copy. The resume removes it, finishes the run, and ``load_model`` then warns that the best epoch's checkpoint
    was lost and which one it gives instead (never another epoch in silence)."""
    import subprocess
    import sys

    job = settings(noise, epochs=7, lr=0.01) | {"model": {"kind": "mlp", "hidden": [128]}}  # overfits after epoch 4
    reference = memtrain.fit(job, run={"checkpoint_every": 3, "keep_checkpoints": 1}, run_dir=tmp_path / "whole",
                             quiet=True)
    assert reference.best["epoch"] % 3 and reference.best["epoch"] < 6, "the test needs a best epoch off the schedule"
    run = tmp_path / "killed"
    script = KILLER.format(tests=str(Path(__file__).parent), epochs=7, job=job, run=str(run))
    assert subprocess.run([sys.executable, "-c", script], cwd=tmp_path, timeout=120).returncode == -9
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")], "the staged copy"
    assert checkpoint_updates(run) == [6 * 8]
    resumed = memtrain.fit(resume=run, quiet=True)
    assert resumed.best == {k: v for k, v in reference.best.items() if k not in VOLATILE} | {
        k: resumed.best[k] for k in VOLATILE}
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    with pytest.warns(UserWarning, match=r"best epoch \(\d\) was pruned \(run.keep_best = false\) or lost in a "
                                         r"crash: using the newest checkpoint, c00000056 \(epoch 7\), instead"):
        assert memtrain.load_model(run).meta["epoch"] == 7
    assert memtrain.load_model(tmp_path / "whole").meta["epoch"] == reference.best["epoch"]


def test_an_improving_epoch_copies_its_files_without_a_python_buffer_into_one_staging_directory(
        tmp_path: Path, noise: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-epoch cost of ``run.keep_best`` (docs/performance.md): an improving epoch off the schedule copies
    its checkpoint's files by ``sendfile`` (none through a Python buffer), each copy holding the bytes its source
    had then; an improving epoch on the schedule forgets the copy but keeps its directory for the next one, so a
    run makes and removes one staging directory, not one per best epoch; the best epoch's checkpoint is kept."""
    import shutil

    from memtrain.train.records import checkpoint

    staged: list[int] = []
    folders: set[str] = set()  # the staging directories' names
    removed: list[str] = []
    original_stage, original_rmtree = checkpoint.StagedBest.stage, shutil.rmtree

    def stage(self: checkpoint.StagedBest, update: int, meta: dict, sources: dict) -> None:
        original_stage(self, update, meta, sources)
        assert self.folder is not None
        for name, src in sources.items():
            assert (self.folder / name).read_bytes() == src.read_bytes(), name
        staged.append(update)
        folders.add(self.folder.name)

    def buffered(*args: object, **kwargs: object) -> None:
        raise AssertionError("a staged copy went through a Python buffer")

    def rmtree(path: object, *args: object, **kwargs: object) -> None:
        removed.append(Path(str(path)).name)
        original_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.StagedBest, "stage", stage)
    monkeypatch.setattr(checkpoint.shutil, "copyfileobj", buffered)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", rmtree)
    run = tmp_path / "run"
    memtrain.fit(settings(noise, epochs=7, lr=0.002), run={"checkpoint_every": 3, "keep_checkpoints": 2},
                 run_dir=run, quiet=True)
    records = epochs_of(run)
    improved = [r["epoch"] for i, r in enumerate(records) if all(r["val_loss"] < b["val_loss"] for b in records[:i])]
    assert [e for e in improved if e % 3] and [e for e in improved if e % 3 == 0 and e > min(improved)], \
        "the test needs improving epochs off the schedule and on it after one"
    assert staged == [r["update"] for r in records if r["epoch"] in improved and r["epoch"] % 3 and r["epoch"] < 7]
    assert len(folders) == 1 and [n for n in removed if n in folders] == list(folders)  # made once, removed at the end
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    best = min(records, key=lambda r: r["val_loss"])
    model = memtrain.load_model(run, which="best")
    assert model.meta["epoch"] == best["epoch"]
    assert checkpoint_updates(run) == sorted({6 * 8, 7 * 8, best["update"]})


@pytest.mark.parametrize("sendfile", [True, False], ids=["sendfile", "no-sendfile"])
def test_a_checkpoint_copy_holds_its_sources_bytes_with_or_without_sendfile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sendfile: bool) -> None:
    """``checkpoint._send``, every checkpoint file's copy: ``sendfile`` where the system writes files with it,
    ``pread``/``pwrite`` where it refuses (not Linux); a longer old staged copy is cut to the new size."""
    import errno
    import os

    from memtrain.train.records import checkpoint

    if not sendfile:
        def refused(*args: object) -> int:
            raise OSError(errno.ENOTSOCK, "not a socket")
        monkeypatch.setattr(checkpoint.os, "sendfile", refused)
    data = np.random.default_rng(3).bytes(3 * (1 << 20) + 17)
    (tmp_path / "src").write_bytes(data)
    (tmp_path / "staged").write_bytes(b"x" * (len(data) + 4096))  # an earlier, longer copy is rewritten in place
    checkpoint._rewrite(tmp_path / "src", tmp_path / "staged")
    checkpoint._copy(tmp_path / "src", tmp_path / "new")
    assert (tmp_path / "staged").read_bytes() == data and (tmp_path / "new").read_bytes() == data
    assert os.stat(tmp_path / "staged").st_ino != os.stat(tmp_path / "src").st_ino
