"""``data.scale_target`` (models/target_scale.py): a regression target of natural scale, end to end through the CLI.

The table is a diamonds-like synthetic one (ggplot2's diamonds is not installed, and tests download nothing):
carat, cut, color and clarity as text columns, and a price of about 3,900 on average that grows as carat^1.75
times a factor per level, with noise -- the shape of the real table.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from tiny_data import sealed

import memtrain
from memtrain.layout import weight_versions, weights_path

pytestmark = pytest.mark.timeout(300)

CUTS = {"Fair": -0.12, "Good": -0.05, "Very Good": 0.0, "Premium": 0.03, "Ideal": 0.06}
COLORS = dict(zip("DEFGHIJ", (0.22, 0.18, 0.14, 0.10, 0.0, -0.12, -0.25), strict=True))
CLARITIES = dict(zip(("I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"),
                     (-0.45, -0.05, 0.05, 0.12, 0.18, 0.26, 0.32, 0.40), strict=True))


def diamonds(path: Path, rows: int = 8000, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    carat = np.clip(rng.lognormal(np.log(0.7), 0.55, rows), 0.2, 5.0)
    cut = rng.choice(list(CUTS), rows, p=[0.03, 0.09, 0.22, 0.26, 0.40])
    color = rng.choice(list(COLORS), rows, p=[0.12, 0.18, 0.18, 0.21, 0.15, 0.10, 0.06])
    clarity = rng.choice(list(CLARITIES), rows, p=[0.014, 0.17, 0.24, 0.23, 0.15, 0.094, 0.068, 0.034])
    effect = np.array([CUTS[c] + COLORS[o] + CLARITIES[k] for c, o, k in zip(cut, color, clarity, strict=True)])
    price = np.round(np.exp(8.18 + 1.75 * np.log(carat) + effect + rng.normal(0, 0.15, rows)))
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["carat", "cut", "color", "clarity", "price"])
        writer.writerows(zip(np.round(carat, 2), cut, color, clarity, price.astype(int), strict=True))
    return path


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("diamonds")
    source = diamonds(folder / "diamonds.csv")
    from memtrain.cli import main

    assert main(["prepare", str(source), str(folder / "diamonds"), "--label", "price", "--task", "regression"]) == 0
    return folder / "diamonds"


def job(folder: Path, data: Path, kind: str, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    train = 'epochs = 20\nbatch_size = 64\noptimizer = "adam"\nlr = 0.003\n' if kind != "ridge" else ""
    (folder / "job.toml").write_text(f'[data]\npath = "{data}"\n{extra}\n[model]\nkind = "{kind}"\n\n'
                                     f'[train]\n{train}workers = 0\n\n[run]\ndir = "run"\n')
    return folder / "job.toml"


def best(run: Path) -> dict:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return max((r for r in records if r["kind"] == "epoch"), key=lambda r: r["val_r2"])


def test_a_linear_model_on_a_price_fits_as_well_as_ridge(tmp_path: Path, table: Path, cli) -> None:
    """linear, Adam, lr 0.003, 20 epochs on a price of mean ~3,900: within 0.02 R² of ridge, with every metric,
    prediction and export in dollars; trained on the raw price (``scale_target = false``) it does not fit."""
    y = memtrain.open_dataset(table).split("train")[:][1].astype(np.float64)
    assert 3000 < y.mean() < 5000, "the test needs a target of natural scale"
    for kind, extra in (("ridge", ""), ("linear", ""), ("raw", "scale_target = false")):
        done = cli("train", job(tmp_path / kind, table, "linear" if kind == "raw" else kind, extra), "--quiet")
        assert done.code == 0, done.err
    r2 = {kind: best(tmp_path / kind / "run")["val_r2"] for kind in ("ridge", "linear", "raw")}
    assert r2["ridge"] > 0.8 and abs(r2["linear"] - r2["ridge"]) <= 0.02, r2
    assert r2["raw"] < 0.5, r2  # what scaling fixes: without it, Adam's steps of ~lr never reach a price

    run = tmp_path / "linear" / "run"
    model = memtrain.load_model(run)
    scale = model.meta["data"]["target_scale"]
    assert scale["mean"] == [pytest.approx(float(y.mean()), rel=1e-9)]
    assert scale["std"] == [pytest.approx(float(y.std()), rel=1e-6)]
    x_val, y_val = memtrain.open_dataset(table).split("val")[:]
    record = best(run)
    assert model.meta["epoch"] == record["epoch"]
    assert model.evaluate(x_val, y_val)["r2"] == pytest.approx(record["val_r2"], abs=1e-6)  # in dollars
    rows = [{"carat": 1.0, "cut": "Ideal", "color": "G", "clarity": "VS1"},
            {"carat": 0.3, "cut": "Fair", "color": "J", "clarity": "I1"}]
    big, small = model.predict(rows)
    assert 3000 < big < 9000 and small < 1500, (big, small)  # a one-carat stone costs thousands, in dollars
    # val_loss is half the squared error in dollars², as for a model trained on the raw price
    assert record["val_loss"] == pytest.approx(record["val_rmse"] ** 2 / 2, rel=1e-6)

    out = tmp_path / "linear.npz"
    exported = cli("inspect", run, "--export", out, "--json")
    assert exported.code == 0, exported.err
    assert json.loads(exported.out)["target_scale"] == "folded into the output layer"
    with np.load(out) as arrays:  # the exported weights predict dollars with no scale to apply
        mean, std = arrays["memtrain.normalize.mean"], arrays["memtrain.normalize.std"]
        features = (x_val.reshape(len(x_val), -1) - mean) / std
        np.testing.assert_allclose((features @ arrays["W"] + arrays["b"])[:, 0], model.predict(x_val), rtol=1e-4,
                                   atol=0.05)


def test_ridge_is_unchanged_and_a_run_recorded_before_the_key_resumes_on_the_raw_target(
        tmp_path: Path, table: Path, cli) -> None:
    """ridge solves exactly: its weights are the same bits with the key on or off. A run whose job.json has no
    scale_target (recorded before the key) trained on the raw target and resumes so, bit for bit."""
    for name, extra in (("on", ""), ("off", "scale_target = false")):
        assert cli("train", job(tmp_path / f"ridge-{name}", table, "ridge", extra), "--quiet").code == 0
    on, off = (weights_path(tmp_path / f"ridge-{n}" / "run", 1).read_bytes() for n in ("on", "off"))
    assert on == off

    whole = job(tmp_path / "whole", table, "linear", "scale_target = false")
    whole.write_text(whole.read_text().replace("epochs = 20", "epochs = 3"))
    assert cli("train", whole, "--quiet").code == 0
    old = job(tmp_path / "old", table, "linear", "scale_target = false")
    old.write_text(old.read_text().replace("epochs = 20", "epochs = 2"))
    assert cli("train", old, "--quiet").code == 0
    record_path = tmp_path / "old" / "run" / "job.json"
    record = json.loads(record_path.read_text())
    del record["data"]["scale_target"]  # as written before the key existed
    record_path.write_text(json.dumps(sealed(record)))
    resumed = cli("train", "--resume", tmp_path / "old" / "run", "--set", "train.epochs=3", "--quiet")
    assert resumed.code == 0, resumed.err
    last = {run: weights_path(run, weight_versions(run)[-1]).read_bytes()
            for run in (tmp_path / "whole" / "run", tmp_path / "old" / "run")}
    assert len(set(last.values())) == 1  # the raw target, as the run started


def test_worker_processes_train_on_the_same_scale_as_the_server(tmp_path: Path, table: Path, cli) -> None:
    """The scale reaches the workers with their setup: 2 worker processes give the server's bits."""
    last = []
    for workers in (0, 2):
        path = job(tmp_path / f"w{workers}", table, "mlp")
        path.write_text(path.read_text().replace("epochs = 20", "epochs = 2").replace("workers = 0",
                                                                                      f"workers = {workers}"))
        assert cli("train", path, "--quiet").code == 0
        run = tmp_path / f"w{workers}" / "run"
        last.append(weights_path(run, weight_versions(run)[-1]).read_bytes())
    assert last[0] == last[1] and best(tmp_path / "w2" / "run")["val_r2"] > 0.7


def test_a_classifier_recorded_before_the_key_resumes_from_its_job_file(tmp_path: Path, cli) -> None:
    """For a classifier the key changes nothing: its job file (the key at its default, true) still resumes a run
    recorded before the key (false), as it did before the key existed. A regression that it would change is
    refused, naming the key."""
    from tiny_data import blobs, write_dataset

    x, y = blobs(n=300, features=4, classes=3)
    data = write_dataset(tmp_path / "blobs", x, y, val_rows=60)
    for name, source in (("classes", data), ("prices", None)):
        folder = tmp_path / name
        path = job(folder, source or diamonds_dataset(tmp_path, cli), "mlp")
        path.write_text(path.read_text().replace("epochs = 20", "epochs = 1"))
        assert cli("train", path, "--quiet").code == 0
        record_path = folder / "run" / "job.json"
        record = json.loads(record_path.read_text())
        del record["data"]["scale_target"]  # as written before the key existed
        record_path.write_text(json.dumps(sealed(record)))
        resumed = cli("train", path, "--resume", "--set", "train.epochs=2", "--quiet")
        if name == "classes":
            assert resumed.code == 0 and "done: 2 epochs" in resumed.out, resumed.err
        else:
            assert resumed.code == 2 and "data.scale_target: the run has false, the new job says true" in resumed.err


def diamonds_dataset(folder: Path, cli) -> Path:
    assert cli("prepare", diamonds(folder / "small.csv", rows=600), folder / "small", "--label", "price",
               "--task", "regression").code == 0
    return folder / "small"
