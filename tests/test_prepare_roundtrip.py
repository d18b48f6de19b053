"""memtrain prepare round trips: every source format -> dataset -> open_dataset gives the same rows back."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memtrain.dataset import open_dataset
from memtrain.prepare import PrepareOptions, prepare
from tests.conftest import table_csv


def all_rows(path: Path) -> tuple[np.ndarray, np.ndarray]:
    ds = open_dataset(path, verify=True)
    parts = [ds.split(name).read(0, ds.split(name).rows) for name in ("train", "val")]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def as_multiset(x: np.ndarray, y: np.ndarray) -> list[tuple]:
    return sorted(tuple(row) + (label,) for row, label in zip(x.reshape(len(x), -1).tolist(), y.tolist(),
                                                              strict=True))


def quiet(options: PrepareOptions) -> None:
    prepare(options, say=lambda _: None, force_plain=True)


def test_csv_round_trip_through_the_cli(cli, write_file, small_table, tmp_path):
    x, y = small_table
    source = write_file("t.csv", table_csv(x, y))
    result = cli("prepare", source, tmp_path / "ds", "--seed", "3")
    assert result.code == 0, result.err
    assert "rows     40 (train 36, val 4)" in result.out
    gx, gy = all_rows(tmp_path / "ds")
    assert as_multiset(gx, gy) == as_multiset(x.astype(np.float32), y)
    ds = open_dataset(tmp_path / "ds")
    assert ds.manifest["classes"] == ["0", "1", "2", "3"] and ds.task == "classification"
    assert ds.manifest["x"] == {"shape": [3], "dtype": "float32"}
    assert ds.manifest["y"] == {"shape": [], "dtype": "int64"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "t.csv"]  # no work dir left


def test_no_shuffle_keeps_source_order_and_val_is_a_subset(write_file, small_table, tmp_path):
    x, y = small_table
    quiet(PrepareOptions(write_file("t.csv", table_csv(x, y)), tmp_path / "ds", shuffle=False, val_fraction=0.25))
    ds = open_dataset(tmp_path / "ds")
    tx, ty = ds.split("train").read(0, 30)
    vx, _ = ds.split("val").read(0, 10)
    val_rows = [int(np.flatnonzero((x.astype(np.float32) == r).all(axis=1))[0]) for r in vx]
    train_rows = [int(np.flatnonzero((x.astype(np.float32) == r).all(axis=1))[0]) for r in tx]
    assert val_rows == sorted(val_rows) and train_rows == sorted(train_rows)
    assert sorted(val_rows + train_rows) == list(range(40)) and val_rows != list(range(10))
    np.testing.assert_array_equal(ty, y[train_rows])


def test_text_labels_quoted_fields_bom_crlf_and_spaced_header(write_file, tmp_path):
    text = '\ufeff"pixel one","pixel, two",species\r\n1,"2",cat\r\n3,4, dog\r\n\r\n5,6,"cat"\r\n7,8,ant\r\n'
    quiet(PrepareOptions(write_file("t.csv", text), tmp_path / "ds", label="species", val_fraction=0.0,
                         shuffle=False))
    ds = open_dataset(tmp_path / "ds")
    assert ds.classes == ["ant", "cat", "dog"]
    assert ds.manifest["feature_names"] == ["pixel one", "pixel, two"]
    x, y = ds.split("train").read(0, 4)
    np.testing.assert_array_equal(x, [[1, 2], [3, 4], [5, 6], [7, 8]])
    np.testing.assert_array_equal(y, [1, 2, 1, 0])


def test_numeric_classes_sort_numerically_and_regression_is_inferred(write_file, tmp_path):
    quiet(PrepareOptions(write_file("c.csv", "a,y\n1,10\n2,9\n3,-1\n4,10\n"), tmp_path / "c", val_fraction=0,
                         shuffle=False))
    ds = open_dataset(tmp_path / "c")
    assert ds.classes == ["-1", "9", "10"]
    np.testing.assert_array_equal(ds.split("train").read(0, 4)[1], [2, 1, 0, 2])
    quiet(PrepareOptions(write_file("r.csv", "a,target\n1,0.5\n2,1.25\n3,2\n"), tmp_path / "r", val_fraction=0,
                         shuffle=False))
    ds = open_dataset(tmp_path / "r")
    assert ds.task == "regression" and ds.classes is None and ds.manifest["y"]["dtype"] == "float32"
    np.testing.assert_array_equal(ds.split("train").read(0, 3)[1], np.float32([0.5, 1.25, 2]))


def test_npy_npz_hdf5_and_parquet_sources_agree(small_table, tmp_path):
    x, y = small_table
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    np.savez_compressed(tmp_path / "a.npz", feats=x, labs=y)
    with h5py.File(tmp_path / "a.h5", "w") as handle:
        handle.create_dataset("/g/x", data=x, chunks=(7, 3), compression="gzip")
        handle.create_dataset("/g/y", data=y, chunks=(7,), compression="gzip")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    columns = {f"c{i}": x[:, i] for i in range(3)} | {"label": y}
    pq.write_table(pa.table(columns), tmp_path / "a.parquet", row_group_size=9)
    runs = {
        "npy": PrepareOptions(tmp_path / "x.npy", tmp_path / "npy", y=str(tmp_path / "y.npy"), chunk_mb=0.0001),
        "npz": PrepareOptions(tmp_path / "a.npz", tmp_path / "npz", x="feats", y="labs", chunk_mb=0.0001),
        "h5": PrepareOptions(tmp_path / "a.h5", tmp_path / "h5", x="/g/x", y="/g/y", chunk_mb=0.0001),
        "parquet": PrepareOptions(tmp_path / "a.parquet", tmp_path / "pq", chunk_mb=0.0001),
    }
    results = {}
    for name, options in runs.items():
        quiet(options)
        results[name] = all_rows(options.out)
        assert as_multiset(*results[name]) == as_multiset(x.astype(np.float32), y), name
    # same seed, same rows: the shuffle depends on the data and options, not on the format
    np.testing.assert_array_equal(results["npy"][0], results["h5"][0])


def test_text_labels_from_hdf5_and_multidimensional_features(tmp_path):
    x = np.arange(24, dtype=np.float64).reshape(6, 2, 2)
    with h5py.File(tmp_path / "a.h5", "w") as handle:
        handle["x"] = x
        handle["y"] = np.array([b"b", b"a", b"b", b"c", b"a", b"a"])
    quiet(PrepareOptions(tmp_path / "a.h5", tmp_path / "ds", shuffle=False, val_fraction=0))
    ds = open_dataset(tmp_path / "ds")
    assert ds.manifest["x"]["shape"] == [2, 2] and ds.classes == ["a", "b", "c"]
    got_x, got_y = ds.split("train").read(0, 6)
    np.testing.assert_array_equal(got_x, x.astype(np.float32))
    np.testing.assert_array_equal(got_y, [1, 0, 1, 2, 0, 0])


def test_synthetic_is_deterministic_and_independent_of_chunking(cli, tmp_path):
    a = cli("prepare", "--synthetic", "5000x8", tmp_path / "a", "--seed", "5", "--shard-mb", "0.05")
    b = cli("prepare", "--synthetic", "5000x8", tmp_path / "b", "--seed", "5", "--shard-mb", "0.05")
    assert a.code == b.code == 0, a.err + b.err
    for name in sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.npy")):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    ds = open_dataset(tmp_path / "a")
    assert len(ds.split("train").shards) == 4 and ds.classes == [str(i) for i in range(10)]
    from memtrain.prepare.synthetic import SyntheticSource
    source = SyntheticSource(5000, 8, seed=5)
    coarse = np.concatenate([c.x for c in source.chunks(100_000)])
    fine = np.concatenate([c.x for c in source.chunks(10)])
    np.testing.assert_array_equal(coarse, fine)


def test_synthetic_csv_and_npy_writers_prepare(tmp_path):
    from memtrain.prepare.synthetic import write_synthetic_source
    csv_path, = write_synthetic_source(tmp_path / "s.csv", 3000, 5, classes=12, seed=2)
    x_path, y_path = write_synthetic_source(tmp_path / "s.npy", 3000, 5, classes=12, seed=2)
    quiet(PrepareOptions(csv_path, tmp_path / "c"))
    quiet(PrepareOptions(x_path, tmp_path / "n", y=str(y_path)))
    cx, cy = all_rows(tmp_path / "c")
    nx, ny = all_rows(tmp_path / "n")
    np.testing.assert_allclose(cx, nx, atol=1e-4)  # CSV keeps 4 decimals
    np.testing.assert_array_equal(cy, ny)
    reg, = write_synthetic_source(tmp_path / "r.csv", 100, 3, regression=True)
    quiet(PrepareOptions(reg, tmp_path / "r"))
    assert open_dataset(tmp_path / "r").task == "regression"


features = st.integers(1, 4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), n_features=features, rows=st.integers(1, 120), shuffle=st.booleans(),
       val=st.sampled_from([0.0, 0.1, 0.5]), seed=st.integers(0, 3), shard_kb=st.sampled_from([0.2, 1, 64]))
def test_property_rows_stats_and_split(tmp_path_factory, data, n_features, rows, shuffle, val, seed, shard_kb):
    x = data.draw(st.lists(st.lists(st.integers(-1000, 1000), min_size=n_features, max_size=n_features),
                           min_size=rows, max_size=rows))
    x = np.array(x, dtype=np.float64) / 4
    y = np.array(data.draw(st.lists(st.sampled_from(["a", "b", "zz"]), min_size=rows, max_size=rows)))
    folder = tmp_path_factory.mktemp("p")
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    quiet(PrepareOptions(folder / "x.npy", folder / "ds", y=str(folder / "y.npy"), shuffle=shuffle,
                         val_fraction=val, seed=seed, shard_mb=shard_kb / 1024, chunk_mb=0.001))
    ds = open_dataset(folder / "ds", verify=True)
    classes = sorted(set(y.tolist()))
    assert ds.classes == classes
    gx, gy = all_rows(folder / "ds")
    names = np.array(classes)[gy]
    assert as_multiset(gx, names) == as_multiset(x.astype(np.float32), y)
    n_val = min(round(rows * val), rows - 1)
    assert ds.split("val").rows == n_val and ds.split("train").rows == rows - n_val
    train_x = ds.split("train").read(0, rows - n_val)[0].astype(np.float64)
    stats = {key: np.asarray(value) for key, value in ds.manifest["stats"].items()}  # as recorded: float64
    np.testing.assert_allclose(stats["mean"], train_x.mean(axis=0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(stats["std"], train_x.std(axis=0), rtol=1e-7, atol=1e-9)
    np.testing.assert_array_equal(stats["min"], train_x.min(axis=0))
    np.testing.assert_array_equal(stats["max"], train_x.max(axis=0))
    if not shuffle:
        order = gx if n_val == 0 else ds.split("train").read(0, rows - n_val)[0]
        keys = [tuple(r) for r in x.astype(np.float32).tolist()]
        positions = [keys.index(tuple(r)) for r in order.tolist()]
        assert positions == sorted(positions) or len(set(keys)) < len(keys)
