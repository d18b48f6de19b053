"""Bad input to memtrain prepare: a one-paragraph error naming file/line/column, exit code 2, nothing left behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

GOOD = "f0,f 1,label\n1,2,0\n3,4,1\n"


def assert_clean_failure(result, tmp_path: Path, *fragments: str) -> None:
    assert result.code == 2, (result.code, result.err)
    assert result.err.splitlines()[-1].startswith("memtrain prepare: error: "), result.err
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in result.err, (fragment, result.err)
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")], list(tmp_path.iterdir())


@pytest.mark.parametrize("content, fragments", [
    ("", ["bad.csv", "the file is empty"]),
    ("\n\n", ["bad.csv", "the file is empty"]),
    ("f0,f1,label\n", ["bad.csv", "no data rows"]),
    ("f0,f1,label\n\n", ["bad.csv", "no data rows"]),
    ("f0,f1,label\n1,2,0\n3,4\n", ["bad.csv:line 3", "ragged row", "expected 3 fields", "found 2 fields"]),
    ("f0,f1,label\n1,2,0\n3,4,1,9\n", ["bad.csv:line 3", "ragged row", "found 4 fields"]),
    ("f0,f1,label\n1,2,0\n3,abc,1\n", ["bad.csv:line 3, column 'f1'", "not a number", "'abc'"]),
    ('f0,f1,label\n"1\n",2,0\n3,-inf,1\n', ["bad.csv:line 4, column 'f1'", "-inf"]),
    ("f0,f1,label\n1,2,inf\n", ["bad.csv:line 2, column 'label'", "inf"]),
    ("f0,f1,label\n1e39,2,0\n", ["bad.csv:line 2, column 'f0'", "out of range"]),
    ("f0,f1,cls\n1,2,0\n", ["bad.csv", "missing label column", "'cls'"]),
    ("f0,f1,label\n1,2,0\n3,4,cat\n", ["bad.csv:line 3, column 'label'", "the label is not a number"]),
    (b"f0,f1,label\n1,2,0\n\xff,4,1\n", ["bad.csv:line 3", "not UTF-8"]),
])
def test_bad_csv(cli, write_file, tmp_path, content, fragments):
    source = write_file("bad.csv", content)
    assert_clean_failure(cli("prepare", source, tmp_path / "out"), tmp_path, *fragments)


@pytest.mark.parametrize("content, fragments", [
    ("f0,f1,label\n1,,0\n", ["bad.csv:line 2, column 'f1'", "an empty field", "--missing impute"]),
    ("f0,f1,label\n1,NA,0\n", ["bad.csv:line 2, column 'f1'", "not a number", "'NA'", "--missing impute"]),
    ("f0,f1,label\n1,2,0\n\n3,nan,1\n", ["bad.csv:line 4, column 'f1'", "not a finite float32", "nan",
                                         "--drop-nonfinite"]),
    ("f0,f1,label\n1,2,0\n3,4,NA\n", ["bad.csv:line 3, column 'label'", "the label is not a number", "'NA'"]),
    ("f0,f1,label\n1,2,cat\n3,4,\n", ["bad.csv:line 3, column 'label'", "the label is missing"]),
    ("f0,c,label\n1,x,0\n3,,1\n", ["bad.csv:line 3, column 'c'", "a value is missing", "--missing impute"]),
])
def test_missing_values_under_missing_error_stop_as_before(cli, write_file, tmp_path, content, fragments):
    """``--missing error``: today's messages (numbers are read without missing spellings), with a hint."""
    source = write_file("bad.csv", content)
    assert_clean_failure(cli("prepare", source, tmp_path / "out", "--missing", "error"), tmp_path, *fragments)


def test_ragged_row_is_found_in_a_later_chunk(cli, write_file, tmp_path):
    rows = "".join(f"{i},{i},0\n" for i in range(20000))
    source = write_file("bad.csv", "a,b,label\n" + rows + "1,2\n" + rows)
    result = cli("prepare", source, tmp_path / "out", "--chunk-mb", "0.25")
    assert_clean_failure(result, tmp_path, "bad.csv:line 20002", "ragged row")


def test_drop_nonfinite_drops_and_reports(cli, write_file, tmp_path):
    source = write_file("ok.csv", "f0,f1,label\n1,2,0\n3,nan,1\n5,6,1\ninf,1,0\n")
    result = cli("prepare", source, tmp_path / "out", "--drop-nonfinite", "--val-fraction", "0", "--missing", "error")
    assert result.code == 0, result.err
    assert "2 non-finite rows dropped" in result.out and "rows     2 " in result.out
    # by default "nan" is a spelling of a missing value: imputed; Inf is still non-finite
    result = cli("prepare", source, tmp_path / "out2", "--drop-nonfinite", "--val-fraction", "0")
    assert result.code == 0, result.err
    assert "1 non-finite rows dropped" in result.out and "rows     3 " in result.out
    assert "1 values imputed: f1 1" in result.out


def test_unknown_label_name(cli, write_file, tmp_path):
    source = write_file("t.csv", GOOD)
    assert_clean_failure(cli("prepare", source, tmp_path / "out", "--label", "nope"), tmp_path,
                         "t.csv: no label column named 'nope'", "'f 1'")


def test_output_exists_needs_overwrite_and_overwrite_replaces(cli, write_file, tmp_path):
    source = write_file("t.csv", GOOD)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("precious")
    result = cli("prepare", source, tmp_path / "out")
    assert result.code == 2 and "out: the output path exists" in result.err and "--overwrite" in result.err
    result = cli("prepare", source, tmp_path / "out", "--overwrite")
    assert result.code == 2 and "not a memtrain dataset" in result.err
    assert (tmp_path / "out" / "keep.txt").read_text() == "precious"
    (tmp_path / "out" / "keep.txt").unlink()
    assert cli("prepare", source, tmp_path / "out", "--overwrite").code == 0
    first = (tmp_path / "out" / "manifest.json").read_text()
    assert cli("prepare", source, tmp_path / "out", "--overwrite", "--seed", "9").code == 0
    assert (tmp_path / "out" / "manifest.json").read_text() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "t.csv"]


def test_npy_truncated_mismatched_and_missing_labels(cli, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((10, 3)))
    np.save(tmp_path / "y.npy", np.zeros(9))
    assert_clean_failure(cli("prepare", tmp_path / "x.npy", tmp_path / "out"), tmp_path, "x.npy", "--y")
    assert_clean_failure(cli("prepare", tmp_path / "x.npy", tmp_path / "out", "--y", tmp_path / "y.npy"), tmp_path,
                         "x.npy", "different lengths", "10 and 9 rows")
    np.save(tmp_path / "y.npy", np.zeros(10))
    data = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "x.npy").write_bytes(data[:-50])
    assert_clean_failure(cli("prepare", tmp_path / "x.npy", tmp_path / "out", "--y", tmp_path / "y.npy"), tmp_path,
                         "x.npy", "truncated")
    (tmp_path / "x.npy").write_bytes(data[:20])
    assert_clean_failure(cli("prepare", tmp_path / "x.npy", tmp_path / "out", "--y", tmp_path / "y.npy"), tmp_path,
                         "x.npy")


def test_npz_missing_array_and_truncated_archive(cli, tmp_path):
    np.savez(tmp_path / "a.npz", feats=np.zeros((4, 2)), y=np.zeros(4))
    assert_clean_failure(cli("prepare", tmp_path / "a.npz", tmp_path / "out"), tmp_path,
                         "a.npz", "no array named 'x'", "feats")
    data = (tmp_path / "a.npz").read_bytes()
    (tmp_path / "a.npz").write_bytes(data[: len(data) // 2])
    assert_clean_failure(cli("prepare", tmp_path / "a.npz", tmp_path / "out", "--x", "feats"), tmp_path, "a.npz")


def test_hdf5_missing_path_lists_datasets(cli, tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as handle:
        handle["/train/x"] = np.zeros((4, 2))
        handle["/train/y"] = np.zeros(4)
    result = cli("prepare", tmp_path / "a.h5", tmp_path / "out", "--x", "/train/nope", "--y", "/train/y")
    assert_clean_failure(result, tmp_path, "a.h5", "'/train/nope'", "/train/x, /train/y")
    result = cli("prepare", tmp_path / "a.h5", tmp_path / "out", "--x", "/train", "--y", "/train/y")
    assert_clean_failure(result, tmp_path, "a group, not a dataset")


def test_not_hdf5_and_truncated_hdf5(cli, write_file, tmp_path):
    assert_clean_failure(cli("prepare", write_file("fake.h5", "just text\n"), tmp_path / "out"), tmp_path,
                         "fake.h5", "not an HDF5 file")
    with h5py.File(tmp_path / "a.h5", "w") as handle:
        handle.create_dataset("x", data=np.random.default_rng(0).normal(size=(5000, 8)))
        handle["y"] = np.zeros(5000)
    data = (tmp_path / "a.h5").read_bytes()
    (tmp_path / "a.h5").write_bytes(data[: len(data) // 2])
    assert_clean_failure(cli("prepare", tmp_path / "a.h5", tmp_path / "out"), tmp_path, "a.h5")


@pytest.mark.timeout(60)
def test_hdf5_held_open_for_writing_gives_the_locking_hint(cli, tmp_path):
    path = tmp_path / "busy.h5"
    with h5py.File(path, "w") as handle:
        handle["x"] = np.zeros((4, 2))
        handle["y"] = np.zeros(4)
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import h5py, sys, time
        f = h5py.File({str(path)!r}, "a")
        print("open", flush=True)
        time.sleep(30)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "open"
        result = cli("prepare", path, tmp_path / "out")
    finally:
        writer.kill()
        writer.wait()
    assert_clean_failure(result, tmp_path, "busy.h5", "locked", "h5clear -s", "locking=False")


def test_parquet_without_pyarrow_names_the_extra(cli, write_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    result = cli("prepare", write_file("t.parquet", b"PAR1xxxxPAR1"), tmp_path / "out")
    assert_clean_failure(result, tmp_path, "pip install memtrain[parquet]")


def test_parquet_nulls_and_text_features(cli, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"a": [1.0, None, 3.0], "label": [0, 1, 0]}), tmp_path / "n.parquet")
    assert_clean_failure(cli("prepare", tmp_path / "n.parquet", tmp_path / "out", "--missing", "error"), tmp_path,
                         "n.parquet:row 1, column 'a'", "null", "--missing impute")
    pq.write_table(pa.table({"a": pa.array([1, 2], pa.timestamp("s")), "label": [0, 1]}), tmp_path / "s.parquet")
    assert_clean_failure(cli("prepare", tmp_path / "s.parquet", tmp_path / "out"), tmp_path,
                         "s.parquet:column 'a'", "neither numeric nor text", "--drop-columns a")
    (tmp_path / "junk.parquet").write_text("not parquet at all")
    assert_clean_failure(cli("prepare", tmp_path / "junk.parquet", tmp_path / "out"), tmp_path, "junk.parquet")


def test_usage_errors(cli, write_file, tmp_path):
    source = write_file("t.csv", GOOD)
    assert_clean_failure(cli("prepare", source, tmp_path / "out", "--val-fraction", "1.5"), tmp_path, "val-fraction")
    assert_clean_failure(cli("prepare", tmp_path / "missing.csv", tmp_path / "out"), tmp_path, "missing.csv",
                         "not found")
    assert_clean_failure(cli("prepare", write_file("t.xlsx", "x"), tmp_path / "out"), tmp_path, "unknown source format")
    assert_clean_failure(cli("prepare", "--synthetic", "10y3", tmp_path / "out"), tmp_path, "ROWSxFEATURES")
    assert_clean_failure(cli("prepare", write_file("s.csv", "a,label\n1,cat\n"), tmp_path / "out", "--task",
                             "regression"), tmp_path, "regression needs numeric targets")


def test_errors_are_fast(cli, write_file, tmp_path):
    started = time.monotonic()
    cli("prepare", write_file("bad.csv", "a,label\n1\n"), tmp_path / "out")
    assert time.monotonic() - started < 5
