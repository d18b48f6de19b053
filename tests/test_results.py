"""Results a user can trust, through the CLI on real files: validation metrics against an independent
computation, the best checkpoint kept and loaded, early stopping, the few-updates note, and errors that
list the checkpoints a run has."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tiny_data import blobs, write_dataset

from memtrain import load_model, open_dataset
from memtrain.config import load_job
from memtrain.errors import InputError
from memtrain.layout import checkpoint_updates
from memtrain.train.server.advice import few_updates_note

pytestmark = pytest.mark.timeout(120)

JOB = """
[data]
path = "{data}"

[model]
kind = "{kind}"

[train]
epochs = {epochs}
batch_size = {batch}
workers = 2
eval_rows = 7   # many evaluation tasks: their statistics are combined
{extra}
[run]
dir = "run"
keep_checkpoints = {keep}
"""


def job_file(folder: Path, data: Path, *, kind: str = "softmax", epochs: int = 3, batch: int = 100, keep: int = 3,
             extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.toml"
    path.write_text(JOB.format(data=data, kind=kind, epochs=epochs, batch=batch, keep=keep, extra=extra))
    return path


def epoch_records(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "epoch"]


@pytest.fixture(scope="module")
def classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1000, features=6, classes=4, seed=3)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, val_rows=150, shard_rows=300)


@pytest.fixture(scope="module")
def noise(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Labels that do not depend on the features: a model can only overfit, so val_loss rises after a while."""
    rng = np.random.default_rng(11)
    x, y = rng.normal(size=(600, 10)).astype(np.float32), rng.integers(0, 3, 600)
    return write_dataset(tmp_path_factory.mktemp("data") / "noise", x, y, val_rows=200, shard_rows=300)


@pytest.fixture(scope="module")
def regression(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(900, 5)).astype(np.float32) * 4 + 2
    y = (x @ rng.normal(size=(5, 2)) + rng.normal(size=(900, 2)) + [30, -7]).astype(np.float32)  # two outputs
    return write_dataset(tmp_path_factory.mktemp("data") / "reg", x, y, task="regression", val_rows=120,
                         shard_rows=250)


def reference_classification(proba: np.ndarray, predicted: np.ndarray, y: np.ndarray) -> dict[str, float]:
    f1 = []
    for c in np.union1d(np.unique(y), np.unique(predicted)):
        tp = np.sum((predicted == c) & (y == c))
        f1.append(2 * tp / (np.sum(predicted == c) + np.sum(y == c)))
    return {"val_accuracy": np.mean(predicted == y), "val_macro_f1": np.mean(f1),
            "val_log_loss": -np.mean(np.log(np.clip(proba[np.arange(len(y)), y], 1e-15, 1)))}


def reference_regression(predicted: np.ndarray, y: np.ndarray) -> dict[str, float]:
    y, predicted = y.astype(np.float64), predicted.astype(np.float64).reshape(y.shape)
    r2 = [1 - np.sum((y[:, t] - predicted[:, t]) ** 2) / np.sum((y[:, t] - y[:, t].mean()) ** 2)
          for t in range(y.shape[1])]
    return {"val_r2": np.mean(r2), "val_mae": np.mean(np.abs(y - predicted)),
            "val_rmse": np.sqrt(np.mean((y - predicted) ** 2))}


def test_classification_metrics_match_an_independent_computation(tmp_path: Path, classes: Path, cli) -> None:
    done = cli("train", job_file(tmp_path, classes, epochs=2))
    assert done.code == 0, done.err
    for line in (done.err.splitlines()[-1], done.out.splitlines()[1]):  # the last epoch line, the summary
        assert "val_accuracy" in line and "val_macro_f1" in line
    last = epoch_records(tmp_path / "run")[-1]
    model = load_model(tmp_path / "run")
    x, y = open_dataset(classes).split("val")[:]
    expected = reference_classification(model.predict_proba(x), model.predict(x), y)
    for key, value in expected.items():
        # the log-loss: float32 logs summed per evaluation task here, at once there; the same to float32 rounding
        assert last[key] == pytest.approx(value, rel=1e-6 if key == "val_log_loss" else 1e-9, abs=1e-12), key
    assert last["val_log_loss"] == pytest.approx(last["val_loss"], rel=1e-5)  # softmax's loss is the log-loss
    assert model.evaluate(x, y) == pytest.approx({k.removeprefix("val_"): v for k, v in expected.items()})
    shown = cli("inspect", tmp_path / "run").out
    assert f"val_macro_f1 {last['val_macro_f1']:.6g}" in shown and "val_log_loss" in shown


def test_regression_metrics_match_an_independent_computation(tmp_path: Path, regression: Path, cli) -> None:
    done = cli("train", job_file(tmp_path, regression, kind="linear", epochs=4, batch=20,
                                 extra='optimizer = "adam"\nlr = 0.5\n'))
    assert done.code == 0, done.err
    last = epoch_records(tmp_path / "run")[-1]
    model = load_model(tmp_path / "run", which="last")  # the last epoch's weights, as its record
    x, y = open_dataset(regression).split("val")[:]
    expected = reference_regression(model.predict(x), y)
    for key, value in expected.items():
        assert last[key] == pytest.approx(value, rel=1e-9), key
    assert 0.5 < last["val_r2"] < 1.0
    assert all(key in done.err.splitlines()[-1] for key in ("val_r2", "val_rmse", "val_mae"))


def overfitting_job(folder: Path, data: Path, *, epochs: int, keep: int = 3, extra: str = "") -> Path:
    job = job_file(folder, data, kind="mlp", epochs=epochs, batch=50, keep=keep,
                   extra='optimizer = "adam"\nlr = 0.01\n' + extra)
    job.write_text(job.read_text().replace('kind = "mlp"', 'kind = "mlp"\nhidden = [64]'))
    return job


def test_keep_best_keeps_the_best_checkpoint_and_load_model_finds_it(tmp_path: Path, noise: Path, cli) -> None:
    plain = overfitting_job(tmp_path / "plain", noise, epochs=6, keep=1)
    plain.write_text(plain.read_text() + "keep_best = false\n")
    assert cli("train", plain).code == 0
    best = min(epoch_records(tmp_path / "plain" / "run"), key=lambda r: r["val_loss"])
    assert best["epoch"] < 6, "the test needs a run whose best epoch is not the last"
    with pytest.raises(InputError, match=r"the checkpoint of the best epoch .* was pruned") as gone:
        load_model(tmp_path / "plain" / "run", which="best")
    assert "has checkpoints c00000048" in str(gone.value) and "run.keep_best = true" in str(gone.value)
    with pytest.warns(UserWarning, match=r"the checkpoint of the best epoch .* was pruned .*using the newest"):
        assert load_model(tmp_path / "plain" / "run").meta["epoch"] == 6  # the newest, when best is gone: said
    exported = cli("inspect", tmp_path / "plain" / "run", "--export", tmp_path / "plain.npz", "--json")
    assert exported.code == 0 and "note: the checkpoint of the best epoch" in exported.err, exported.err

    # with train.patience as without (the default run.keep_best = true), the best epoch's checkpoint is kept
    kept = overfitting_job(tmp_path / "kept", noise, epochs=6, keep=1, extra="patience = 10\n")
    assert cli("train", kept).code == 0
    run = tmp_path / "kept" / "run"
    assert checkpoint_updates(run) == [best["update"], 6 * 8]  # the best one and the newest one
    model = load_model(run, which="best")
    assert model.meta["epoch"] == best["epoch"] and model.meta["metrics"]["val_loss"] == best["val_loss"]
    assert load_model(run).meta["epoch"] == best["epoch"]  # the default is the best epoch's checkpoint
    assert load_model(run, which="last").meta["epoch"] == 6
    x, y = open_dataset(noise).split("val")[:]
    assert model.evaluate(x, y)["accuracy"] == pytest.approx(best["val_accuracy"])
    with pytest.raises(InputError, match="bad value for which"):
        load_model(run, which="newest")
    for which, epoch in ((None, best["epoch"]), ("last", 6), ("best", best["epoch"])):  # inspect --export too
        out = tmp_path / f"export-{which}.npz"
        done = cli("inspect", run, "--export", out, *(["--which", which] if which else []), "--json")
        assert done.code == 0, done.err
        chosen = load_model(run, which=which or "best")
        with np.load(out) as exported:
            for name, value in chosen.params.items():
                np.testing.assert_array_equal(exported[name], value)
        assert chosen.meta["epoch"] == epoch


def test_patience_stops_early_and_resume_does_not_train_on(tmp_path: Path, noise: Path, cli) -> None:
    job = overfitting_job(tmp_path, noise, epochs=30, extra="patience = 2\n")
    done = cli("train", job)
    assert done.code == 0, done.err
    records = epoch_records(tmp_path / "run")
    best = min(records, key=lambda r: r["val_loss"])
    assert len(records) == best["epoch"] + 2 < 30  # exactly `patience` epochs after the best one
    assert f"stopped early: no better val_loss for 2 epochs after epoch {best['epoch']}" in done.out
    assert checkpoint_updates(tmp_path / "run")[-1] == records[-1]["update"]  # the stop left a checkpoint
    again = cli("train", "--resume", tmp_path / "run")
    assert again.code == 0 and len(epoch_records(tmp_path / "run")) == len(records)
    bad = cli("train", job, "--set", "train.patience=0", "--overwrite")
    assert bad.code == 2 and "train.patience out of range (expected an integer from 1 to 1000000" in bad.err


def test_few_updates_are_noted_with_a_batch_size_to_try(tmp_path: Path, classes: Path, cli) -> None:
    job = tmp_path / "minimal.toml"
    job.write_text(f'[data]\npath = "{classes}"\n[model]\nkind = "mlp"\n[train]\nworkers = 2\n')
    done = cli("train", job, "--run-dir", tmp_path / "a")
    assert done.code == 0
    note = ("this job makes only 10 updates in all (one full-batch update per epoch, as train.batch_size is not set, "
            "10 epochs); a gradient model usually needs hundreds. Set train.batch_size (e.g. --set "
            "train.batch_size=64: 140 updates) or raise train.epochs")
    assert done.err.startswith(f"memtrain train: note: {note}\nepoch 1/10"), done.err
    quiet = cli("train", job, "--run-dir", tmp_path / "b", "--quiet")
    assert quiet.code == 0 and quiet.err == ""  # quiet means quiet: the note is in the run's event log
    assert f"note: {note}" in (tmp_path / "b" / "events.log").read_text()
    refused = cli("train", job, "--run-dir", tmp_path / "b")
    assert refused.code == 2 and "the run directory already exists" in refused.err
    assert "note:" not in refused.err  # a refusal comes before any note (a note above an error reads as its cause)

    minimal = load_job(job)
    assert few_updates_note(minimal, 850, additive=False) is not None
    assert few_updates_note(minimal, 850, additive=True) is None  # one closed-form solve: updates do not apply
    batched = load_job(job, values={"train.batch_size": 64})
    assert few_updates_note(batched, 850, additive=False) is None  # 14 x 10 updates
    assert few_updates_note(load_job(job, values={"train.batch_size": 128}), 850, additive=False).startswith(
        "this job makes only 70 updates in all (7 updates per epoch at train.batch_size = 128, 10 epochs)")
    assert few_updates_note(minimal, 10, additive=False) is None  # too few rows for any batch size to help


def test_missing_checkpoints_and_versions_list_what_the_run_has(tmp_path: Path, classes: Path, cli) -> None:
    assert cli("train", job_file(tmp_path, classes, epochs=2)).code == 0
    run = tmp_path / "run"
    shown = cli("inspect", run / "checkpoints" / "c00000024")
    assert shown.code == 2
    assert shown.err.rstrip().endswith(f"{run} has checkpoints c00000009, c00000018")
    shown = cli("inspect", run / "weights" / "v00000024.npy")
    assert shown.code == 2 and f"{run} has weight versions v00000016.npy, v00000017.npy, v00000018.npy" in shown.err
    with pytest.raises(InputError, match=r"no such checkpoint or run directory. .* has checkpoints c00000009"):
        load_model(run / "checkpoints" / "c00000024")


def test_the_best_epoch_off_the_checkpoint_schedule_is_kept_by_default_with_its_own_bits(
        tmp_path: Path, noise: Path, cli) -> None:
    """No train.patience, a checkpoint every 4 epochs: the best epoch (between two) is still what ``load_model``
    and ``--export`` give, bit for bit the weights that epoch had (a run checkpointing every epoch keeps them
    too), committed once at the end: no checkpoint per improving epoch."""
    sparse = overfitting_job(tmp_path / "sparse", noise, epochs=6, keep=1)
    sparse.write_text(sparse.read_text().replace("keep_checkpoints = 1", "keep_checkpoints = 1\ncheckpoint_every = 4"))
    done = cli("train", sparse)
    assert done.code == 0, done.err
    run = tmp_path / "sparse" / "run"
    best = min(epoch_records(run), key=lambda r: r["val_loss"])
    assert best["epoch"] not in (4, 6), "the test needs a best epoch off the schedule"
    assert checkpoint_updates(run) == [best["update"], 6 * 8]
    events = (run / "events.log").read_text()
    assert events.count("checkpoint c") == 3  # epoch 4's, the final one, and the best epoch's, written at the end
    every = overfitting_job(tmp_path / "every", noise, epochs=best["epoch"], keep=1)
    assert cli("train", every).code == 0
    reference = load_model(tmp_path / "every" / "run", which="last")
    model = load_model(run)
    assert model.meta["epoch"] == best["epoch"] and model.meta["best_only"] is True
    for name, value in reference.params.items():
        np.testing.assert_array_equal(model.params[name], value)
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]  # no copy left behind
