"""prepare --stratify and --test-fraction, through the CLI on real files: exact per-class counts in every
split, every row exactly once, statistics from the train split only, and the plain split unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memtrain import load_model, open_dataset
from memtrain.prepare import PrepareOptions, prepare
from memtrain.prepare.shuffle import TEST, TRAIN, VAL, RowSplit, ValSplit
from tests.conftest import table_csv

pytestmark = pytest.mark.timeout(120)
COUNTS = {"common": 500, "middle": 180, "rare": 46, "rarest": 4}  # 46 rows: 41 train and 0 val, unstratified


def imbalanced_csv(folder: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    y = np.repeat(list(COUNTS), list(COUNTS.values()))
    centers = {name: rng.normal(size=3) * 3 for name in COUNTS}
    x = np.round(np.stack([centers[c] for c in y]) + rng.normal(size=(len(y), 3)), 3)
    order = rng.permutation(len(y))
    path = folder / "imbalanced.csv"
    path.write_text(table_csv(x[order], y[order], label="kind"))
    return path, x[order].astype(np.float32), y[order]


def per_split_counts(path: Path) -> dict[str, dict[str, int]]:
    ds = open_dataset(path, verify=True)
    result = {}
    for name, split in ds.splits.items():
        labels = split[:][1]
        result[name] = {c: int(np.sum(labels == i)) for i, c in enumerate(ds.classes)}
    return result


def rows_multiset(path: Path) -> list[tuple]:
    ds = open_dataset(path)
    rows = []
    for split in ds.splits.values():
        x, y = split[:]
        rows += [(*r, ds.classes[label]) for r, label in zip(x.tolist(), y.tolist(), strict=True)]
    return sorted(rows)


def test_stratified_split_with_a_test_split(tmp_path: Path, cli) -> None:
    source, x, y = imbalanced_csv(tmp_path)
    done = cli("prepare", source, tmp_path / "ds", "--label", "kind", "--stratify", "--val-fraction", "0.1",
               "--test-fraction", "0.2", "--chunk-mb", "0.01")  # small chunks: many pieces and buckets
    assert done.code == 0, done.err
    counts = per_split_counts(tmp_path / "ds")
    for name, n in COUNTS.items():
        val, test = round(n * 0.1), round(n * 0.2)
        assert (counts["train"][name], counts["val"][name], counts["test"][name]) == (n - val - test, val, test)
    assert f"train {sum(counts['train'].values()):,}, val 73, test 146)" in done.out
    assert rows_multiset(tmp_path / "ds") == sorted((*r, c) for r, c in zip(x.tolist(), y.tolist(), strict=True))
    ds = open_dataset(tmp_path / "ds")
    train_x = ds.split("train")[:][0].astype(np.float64)
    np.testing.assert_allclose(ds.manifest["stats"]["mean"], train_x.mean(axis=0), rtol=1e-9)
    assert ds.manifest["options"]["stratify"] is True and ds.manifest["options"]["test_fraction"] == 0.2
    shown = " ".join(cli("inspect", tmp_path / "ds").out.split())  # rich wraps lines to COLUMNS (80 is common)
    assert "test 146 rows in 1 shard" in shown and "rarest" in shown


def test_without_stratify_a_rare_class_can_miss_the_validation_split(tmp_path: Path, cli) -> None:
    source, _, _ = imbalanced_csv(tmp_path)
    assert cli("prepare", source, tmp_path / "plain", "--label", "kind", "--seed", "1").code == 0
    plain = per_split_counts(tmp_path / "plain")
    assert sum(plain["val"].values()) == round(730 * 0.1) and "test" not in plain
    assert plain["val"]["rarest"] == 0  # what --stratify is for (this seed shows it)
    assert cli("prepare", source, tmp_path / "strat", "--label", "kind", "--seed", "1", "--stratify").code == 0
    strat = per_split_counts(tmp_path / "strat")
    assert all(strat["val"][name] == round(n * 0.1) for name, n in COUNTS.items())


def test_training_reads_no_test_rows_and_the_model_evaluates_them(tmp_path: Path, cli) -> None:
    source, _, _ = imbalanced_csv(tmp_path)
    assert cli("prepare", source, tmp_path / "ds", "--label", "kind", "--test-fraction", "0.25", "-q").code == 0
    job = tmp_path / "job.toml"
    job.write_text('[data]\npath = "ds"\n[model]\nkind = "softmax"\n[train]\nepochs = 3\nbatch_size = 64\n'
                   'workers = 2\nlr = 0.05\n[run]\ndir = "run"\n')
    done = cli("train", job, "--quiet")
    assert done.code == 0, done.err
    ds = open_dataset(tmp_path / "ds")
    train_rows = ds.split("train").rows
    lineage = [json.loads(line) for line in (tmp_path / "run" / "lineage.jsonl").read_text().splitlines()]
    ranges = [tuple(task) for record in lineage for task in record.get("tasks", [])]
    assert len(lineage) == 1 + 3 * -(-train_rows // 64)  # version 0, then one per batch of the train split
    assert sorted(set(ranges))[-1][1] == train_rows  # every row read is a train row (test rows come after none)
    metrics = load_model(tmp_path / "run").evaluate(*ds.split("test")[:])
    assert set(metrics) == {"accuracy", "macro_f1", "log_loss"} and metrics["accuracy"] > 0.9


@pytest.mark.parametrize(("args", "message"), [
    (["--stratify", "--task", "regression"], "--stratify needs classification labels"),
    (["--test-fraction", "0.95"], "--test-fraction must be in [0, 1) and leave rows for training"),
    (["--test-fraction", "-0.1"], "--test-fraction must be in [0, 1)"),
])
def test_split_options_that_cannot_work_are_refused(tmp_path: Path, cli, args: list[str], message: str) -> None:
    source, _, _ = imbalanced_csv(tmp_path)
    source.write_text(source.read_text().replace("rarest", "4").replace("rare", "3").replace("middle", "2")
                      .replace("common", "1"))
    done = cli("prepare", source, tmp_path / "ds", "--label", "kind", *args)
    assert done.code == 2 and message in done.err
    assert not (tmp_path / "ds").exists()


@settings(max_examples=20, deadline=None)
@given(sizes=st.lists(st.integers(0, 60), min_size=1, max_size=4), val=st.sampled_from([0.0, 0.1, 0.3]),
       test=st.sampled_from([0.0, 0.2]), piece=st.integers(1, 50), seed=st.integers(0, 5))
def test_row_split_gives_exact_counts_per_group(sizes, val, test, piece, seed) -> None:
    groups = [(n, round(n * val), round(n * test)) for n in sizes]
    labels = np.random.default_rng(seed).permutation(np.repeat(np.arange(len(sizes)), sizes))
    split = RowSplit(groups, seed)
    codes = np.concatenate([split.take(labels[lo:lo + piece]) for lo in range(0, len(labels), piece)] or [[]])
    for g, (n, v, t) in enumerate(groups):
        mine = codes[labels == g]
        assert (np.sum(mine == TRAIN), np.sum(mine == VAL), np.sum(mine == TEST)) == (n - v - t, v, t)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 300), val=st.integers(0, 100), piece=st.integers(1, 70), seed=st.integers(0, 9))
def test_one_group_without_test_rows_is_the_plain_validation_split(rows, val, piece, seed) -> None:
    """So datasets prepared without the new options keep their exact bytes."""
    val = min(val, rows)
    plain, split = ValSplit(rows, val, seed), RowSplit([(rows, val, 0)], seed)
    for lo in range(0, rows, piece):
        n = min(piece, rows - lo)
        np.testing.assert_array_equal(split.take(np.zeros(n, dtype=np.int64)) == VAL, plain.take(n))


def test_a_dataset_prepared_with_the_python_api_has_a_test_split(tmp_path: Path) -> None:
    source, _, _ = imbalanced_csv(tmp_path)
    prepare(PrepareOptions(source, tmp_path / "ds", label="kind", test_fraction=0.1, stratify=True),
            say=lambda _: None, quiet=True)
    assert list(open_dataset(tmp_path / "ds").splits) == ["train", "val", "test"]
