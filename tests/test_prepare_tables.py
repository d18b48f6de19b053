"""Tables (issue 31): text columns, missing values and column choice in prepare, the encoding in the manifest,
and predict on raw rows -- the raw penguins CSV from palmerpenguins end to end through the CLI."""

from __future__ import annotations

import csv
import importlib.resources
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memtrain
import memtrain.prepare.table
import memtrain.prepare.table_notes
from memtrain.dataset import open_dataset
from memtrain.errors import InputError
from memtrain.files import unseal, write_sealed_json
from memtrain.prepare import PrepareOptions, prepare
from memtrain.prepare.table import Encoding
from tests.dataset_files import dataset_bytes
from tests.test_prepare_errors import assert_clean_failure

PENGUINS = importlib.resources.files("palmerpenguins") / "data" / "penguins.csv"  # the raw CSV, as shipped
# The study's own export: 17 columns, among them an identifier (Individual ID) and a date (Date Egg).
PENGUINS_RAW = importlib.resources.files("palmerpenguins") / "data" / "penguins-raw.csv"


def quiet(options: PrepareOptions) -> None:
    prepare(options, say=lambda _: None, force_plain=True, quiet=True)


def rows_of(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def train_rows(path: Path) -> np.ndarray:
    x, _ = open_dataset(path).split("train")[:]
    return x


# --- the raw penguins CSV, end to end ---------------------------------------------------------------------

def test_raw_penguins_csv_from_prepare_through_train_to_predict_on_raw_rows(cli, tmp_path):
    source = tmp_path / "penguins.csv"
    source.write_bytes(PENGUINS.read_bytes())
    assert b",NA," in source.read_bytes() and b"Torgersen" in source.read_bytes()  # what stopped the user
    result = cli("prepare", source, tmp_path / "penguins", "--label", "species", "--seed", "3")
    assert result.code == 0, result.err
    assert "19 values imputed: bill_length_mm 2, bill_depth_mm 2, flipper_length_mm 2, body_mass_g 2, sex 11" \
        in result.out
    assert "island: 3 levels (one-hot); sex: 2 levels (one-hot)" in result.out
    assert "warning" not in result.err  # the tidy table has no identifier, date or crowded text column
    manifest = open_dataset(tmp_path / "penguins").manifest
    assert manifest["version"] == 3 and manifest["x"]["shape"] == [13]
    assert manifest["feature_names"][:4] == ["island=Biscoe", "island=Dream", "island=Torgersen", "island=<rare>"]
    sex = next(c for c in manifest["encoding"]["columns"] if c["name"] == "sex")
    assert sex == {"name": "sex", "kind": "category", "levels": ["female", "male"], "missing_level": True,
                   "missing": 11}
    (tmp_path / "job.toml").write_text('[data]\npath = "penguins"\n[model]\nkind = "softmax"\n'
                                       '[train]\nepochs = 15\nbatch_size = 32\nlr = 0.1\nworkers = 1\n')
    result = cli("train", tmp_path / "job.toml")
    assert result.code == 0, result.err
    model = memtrain.load_model(tmp_path / "runs" / "job")
    rows = rows_of(source)
    predicted = [model.classes[i] for i in model.predict(rows)]
    accuracy = np.mean([p == r["species"] for p, r in zip(predicted, rows, strict=True)])
    assert accuracy > 0.95, accuracy
    # the same rows as a dict of columns, and the arrays prepare wrote give the same answers
    columns = {name: [r[name] for r in rows] for name in rows[0]}
    np.testing.assert_array_equal(model.predict(columns), model.predict(rows))
    np.testing.assert_array_equal(model.encode(rows[:1]), model.encode({k: v for k, v in rows[0].items()}))
    # an unseen island goes to <rare>, a missing value gets the recorded fill
    odd = dict(rows[0], island="Atlantis", bill_length_mm="NA", sex="")
    encoded = model.encode([odd])[0]
    names = manifest["feature_names"]
    assert encoded[names.index("island=<rare>")] == 1 and encoded[:3].sum() == 0
    fill = next(c["fill"] for c in manifest["encoding"]["columns"] if c["name"] == "bill_length_mm")
    assert encoded[names.index("bill_length_mm")] == np.float32(fill)
    assert encoded[names.index("sex=<missing>")] == 1
    assert model.predict_proba([odd]).shape == (1, 3)
    # the export carries the encoding
    result = cli("inspect", tmp_path / "runs" / "job", "--export", tmp_path / "m.npz")
    assert result.code == 0, result.err
    assert "table encoding: written" in result.out
    with np.load(tmp_path / "m.npz", allow_pickle=False) as exported:
        assert json.loads(str(exported["memtrain.encoding"])) == manifest["encoding"]
    assert cli("inspect", tmp_path / "runs" / "job", "--export", tmp_path / "m.h5").code == 0
    import h5py

    with h5py.File(tmp_path / "m.h5", "r") as exported:
        assert json.loads(exported.attrs["memtrain.encoding"]) == manifest["encoding"]


def test_pandas_dataframe_rows(tmp_path):
    pd = pytest.importorskip("pandas")
    source = tmp_path / "t.csv"
    source.write_text("colour,size,label\nred,1.5,0\nblue,NA,1\nred,3,0\ngreen,2,1\n")
    quiet(PrepareOptions(source, tmp_path / "ds", val_fraction=0.0, shuffle=False))
    encoding = Encoding.from_dict(open_dataset(tmp_path / "ds").manifest["encoding"])
    frame = pd.read_csv(source)  # pandas reads NA as NaN, and the label column comes along
    np.testing.assert_array_equal(encoding.rows(frame), train_rows(tmp_path / "ds"))
    nullable = frame.convert_dtypes()  # pandas.NA in a nullable float column, strings as "string" dtype
    assert nullable["size"].isna().sum() == 1
    np.testing.assert_array_equal(encoding.rows(nullable), train_rows(tmp_path / "ds"))


# --- the encoding: properties and round trips -------------------------------------------------------------

LEVELS = ["a", "b", "c", "d", " e ", "NA", ""]
NUMBERS = ["1", "2.5", "-3", "1e2", "NA", "", "null"]


def expected_rows(rows: list[tuple[str, str, str]], encoding: str) -> np.ndarray:
    """The encoding written out by hand: levels sorted, then <missing>, then <rare>; the mean as the fill."""
    na = {"", "NA", "N/A", "NaN", "nan", "null", "NULL"}
    levels = sorted({c.strip() for c, _, _ in rows if c.strip() not in na})
    has_missing = any(c.strip() in na for c, _, _ in rows)
    buckets = [*levels, *(["<missing>"] if has_missing else []), "<rare>"]
    numbers = [float(n) for _, n, _ in rows if n.strip() not in na]
    fill = sum(numbers) / len(numbers) if numbers else 0.0
    out = []
    for c, n, _ in rows:
        code = buckets.index("<missing>") if c.strip() in na else levels.index(c.strip())
        value = fill if n.strip() in na else float(n)
        if encoding == "one-hot":
            out.append([*(float(code == k) for k in range(len(buckets))), value])
        else:
            out.append([float(code), value])
    return np.asarray(out, dtype=np.float32)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.sampled_from(LEVELS), st.sampled_from(NUMBERS), st.sampled_from(["0", "1"])),
                     min_size=1, max_size=12),
       encoding=st.sampled_from(["one-hot", "ordinal"]))
def test_prepare_and_predict_encode_rows_alike(tmp_path_factory, rows, encoding):
    """What prepare writes equals the hand-written encoding, and equals what predict's encoding makes of the
    same raw rows (read back from the CSV with csv.DictReader)."""
    tmp = tmp_path_factory.mktemp("t")
    source = tmp / "t.csv"
    with open(source, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["colour", "size", "label"])
        writer.writerows([("x", "1", "0"), *rows])  # a first row that makes 'colour' a text column
    quiet(PrepareOptions(source, tmp / "ds", val_fraction=0.0, shuffle=False, categorical_encoding=encoding))
    written = train_rows(tmp / "ds")
    np.testing.assert_array_equal(written, expected_rows([("x", "1", "0"), *rows], encoding))
    recorded = Encoding.from_dict(open_dataset(tmp / "ds").manifest["encoding"])
    np.testing.assert_array_equal(recorded.rows(rows_of(source)), written)


def test_encoding_record_round_trips_and_damage_is_refused():
    record = {"columns": [{"name": "c", "kind": "category", "levels": ["a", "b"], "missing_level": True,
                           "missing": 2}, {"name": "n", "kind": "number", "fill": 1.5, "missing": 0}],
              "categorical": "one-hot", "na_values": ["", "NA"], "missing": "impute", "label": "y",
              "source_columns": ["c", "n", "y"]}
    encoding = Encoding.from_dict(record)
    assert encoding.as_dict() == record
    assert encoding.feature_names == ["c=a", "c=b", "c=<missing>", "c=<rare>", "n"]
    np.testing.assert_array_equal(encoding.rows({"c": ["b", "zz", None], "n": [2, None, "3"], "y": [0, 1, 0]}),
                                  [[0, 1, 0, 0, 2], [0, 0, 0, 1, 1.5], [0, 0, 1, 0, 3]])
    with pytest.raises(memtrain.errors.CorruptFileError, match="encoding"):
        Encoding.from_dict({**record, "categorical": "binary"})


def test_chunk_boundaries_cutting_levels_change_nothing(tmp_path):
    """Levels first seen in late blocks, missing cells on both sides of block edges: a small --chunk-mb (several
    blocks of the CSV) writes the same rows as one block (in source order: the shuffle depends on --chunk-mb)."""
    rng = np.random.default_rng(5)
    lines = ["city,temp,kind,label"]
    for i in range(12_000):
        city = f"c{rng.integers(0, 5 + i // 2000)}" if rng.random() > 0.02 else "NA"
        temp = f"{rng.normal(20, 5):.2f}" if rng.random() > 0.03 else ""
        kind = ["x", "y", "z"][i % 3] if i < 11_000 else "late"
        lines.append(f"{city},{temp},{kind},{i % 2}")
    source = tmp_path / "t.csv"
    source.write_text("\n".join(lines) + "\n")
    common = {"shard_mb": 0.05, "shuffle": False, "val_fraction": 0.0}
    quiet(PrepareOptions(source, tmp_path / "small", chunk_mb=0.5, **common))
    quiet(PrepareOptions(source, tmp_path / "big", chunk_mb=64, **common))
    small = open_dataset(tmp_path / "small").manifest
    levels = next(c["levels"] for c in small["encoding"]["columns"] if c["name"] == "city")
    assert levels == [f"c{k}" for k in range(10)]  # c6..c9 appear only in later blocks
    assert "kind=late" in small["feature_names"]
    # the statistics are summed piece by piece, and a piece's size follows --chunk-mb: equal to rounding
    assert dataset_bytes(tmp_path / "small", ignore=("options", "stats")) == \
        dataset_bytes(tmp_path / "big", ignore=("options", "stats"))
    big = open_dataset(tmp_path / "big").manifest
    for key in ("mean", "std", "min", "max"):
        np.testing.assert_allclose(small["stats"][key], big["stats"][key], rtol=1e-12, atol=1e-12)


def test_level_cap_min_count_and_rare_bucket(tmp_path):
    source = tmp_path / "t.csv"
    source.write_text("c,label\n" + "".join(f"{name},0\n" for name in "aaaabbbccd"))
    quiet(PrepareOptions(source, tmp_path / "cap", val_fraction=0.0, shuffle=False, max_levels=2))
    manifest = open_dataset(tmp_path / "cap").manifest
    assert manifest["feature_names"] == ["c=a", "c=b", "c=<rare>"]
    np.testing.assert_array_equal(train_rows(tmp_path / "cap")[-3:], [[0, 0, 1]] * 3)  # c, c, d: rare
    quiet(PrepareOptions(source, tmp_path / "count", val_fraction=0.0, shuffle=False, min_level_count=2,
                         categorical_encoding="ordinal"))
    manifest = open_dataset(tmp_path / "count").manifest
    assert manifest["feature_names"] == ["c"] and manifest["encoding"]["columns"][0]["levels"] == ["a", "b", "c"]
    np.testing.assert_array_equal(train_rows(tmp_path / "count")[:, 0], [0, 0, 0, 0, 1, 1, 1, 2, 2, 3])


# --- missing values, column choice ------------------------------------------------------------------------

TABLE = "id,colour,size,note,label\n1,red,1.5,x,a\n2,blue,NA,y,b\n3,N/A,3,z,\n4,red,,w,b\n5,green,2,v,NA\n"


def test_missing_modes_and_rows_without_a_label(cli, write_file, tmp_path):
    source = write_file("t.csv", TABLE)
    result = cli("prepare", source, tmp_path / "impute", "--drop-columns", "id,note", "--val-fraction", "0")
    assert result.code == 0, result.err
    assert "rows     3 (train 3, val 0), 2 rows without a label dropped" in result.out
    assert "missing  2 values imputed: size 2" in result.out
    manifest = open_dataset(tmp_path / "impute").manifest
    assert manifest["label_missing_rows"] == 2
    assert manifest["encoding"]["columns"][1] == {"name": "size", "kind": "number", "fill": 1.5, "missing": 2}
    result = cli("prepare", source, tmp_path / "drop", "--columns", "colour,size", "--missing", "drop",
                 "--val-fraction", "0")
    assert result.code == 0, result.err
    assert "rows     1 (train 1, val 0), 2 rows without a label dropped, 2 rows with a missing value dropped" \
        in result.out
    assert open_dataset(tmp_path / "drop").manifest["feature_names"] == \
        ["colour=red", "colour=<rare>", "size"]


@pytest.mark.parametrize("first", ["", "NA", " null "])
def test_text_labels_whose_first_label_is_missing(cli, write_file, tmp_path, first):
    source = write_file("t.csv", f"x,species\n1,{first}\n" + "".join(f"{i},{'AG'[i % 2]}\n" for i in range(2, 8)))
    result = cli("prepare", source, tmp_path / "ds", "--label", "species", "--val-fraction", "0")
    assert result.code == 0, result.err
    assert "rows     6 (train 6, val 0), 1 row without a label dropped" in result.out
    manifest = open_dataset(tmp_path / "ds").manifest
    assert manifest["classes"] == ["A", "G"] and manifest["label_missing_rows"] == 1


def test_configured_missing_spellings(cli, write_file, tmp_path):
    source = write_file("t.csv", "a,label\n1,0\n-999,1\n3,0\n")
    result = cli("prepare", source, tmp_path / "ds", "--na-values", "-999", "--val-fraction", "0", "--no-shuffle")
    assert result.code == 0, result.err
    np.testing.assert_array_equal(train_rows(tmp_path / "ds")[:, 0], [1, 2, 3])


def test_parquet_string_and_dictionary_columns_encode_as_the_csv_does(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    colour = ["red", "blue", None, "red", "NA", "green"]
    table = pa.table({"colour": pa.array(colour, pa.string()),
                      "shape": pa.array(["o", "x", "o", None, "x", "o"]).dictionary_encode(),
                      "size": pa.array([1.5, None, 3.0, 2.0, float("nan"), 4.0]),
                      "label": pa.array(["a", "b", "a", None, "b", "a"]).dictionary_encode()})
    pq.write_table(table, tmp_path / "t.parquet")
    text = "colour,shape,size,label\nred,o,1.5,a\nblue,x,,b\n,o,3,a\nred,,2,\nNA,x,NaN,b\ngreen,o,4,a\n"
    (tmp_path / "t.csv").write_text(text)
    for name in ("t.parquet", "t.csv"):
        quiet(PrepareOptions(tmp_path / name, tmp_path / f"ds-{name}", val_fraction=0.0, shuffle=False))
    parquet, csv_ = (open_dataset(tmp_path / f"ds-{n}") for n in ("t.parquet", "t.csv"))
    assert parquet.manifest["encoding"]["columns"] == csv_.manifest["encoding"]["columns"]
    assert parquet.manifest["label_missing_rows"] == 1 and parquet.manifest["feature_names"][:3] == \
        ["colour=blue", "colour=green", "colour=red"]
    np.testing.assert_array_equal(train_rows(tmp_path / "ds-t.parquet"), train_rows(tmp_path / "ds-t.csv"))


def test_a_count_like_integer_label_is_not_taken_as_classes_silently(cli, write_file, tmp_path):
    source = write_file("t.csv", "a,visits\n" + "".join(f"{i % 7},{i % 59}\n" for i in range(300)))
    result = cli("prepare", source, tmp_path / "ds", "--label", "visits")
    assert result.code == 0, result.err
    assert "warning: the label column 'visits' holds 59 distinct whole numbers from 0 to 58" in result.err
    assert "--task regression" in result.err and "59 classes look like counts" in result.out
    result = cli("prepare", write_file("s.csv", "a,y\n1,0\n2,1\n3,2\n"), tmp_path / "ds2")
    assert result.code == 0 and "warning" not in result.err


# --- columns that are probably no categories: said before the shards are written -------------------------

def test_identifier_and_date_columns_of_the_raw_penguins_csv_are_named(cli, tmp_path):
    source = tmp_path / "penguins-raw.csv"
    source.write_bytes(PENGUINS_RAW.read_bytes())
    result = cli("prepare", source, tmp_path / "ds", "--label", "Species", "--plain")
    assert result.code == 0, result.err
    warnings = [line for line in result.err.splitlines() if line.startswith("memtrain prepare: warning: ")]
    assert any("column 'Individual ID' looks like an identifier (190 distinct values in 344 rows)" in w and
               "--drop-columns 'Individual ID'" in w for w in warnings), result.err
    assert any("column 'Date Egg' looks like dates or times (50 distinct values" in w and
               "--drop-columns 'Date Egg'" in w for w in warnings), result.err
    assert any("levels went to <rare>: Individual ID 90 levels" in w and "--max-levels" in w for w in warnings)
    assert result.err.index("warning: column 'Individual ID'") < result.err.index("writing shards")
    assert "Individual ID: 100 levels, 90 more in <rare> (one-hot)" in result.out
    assert "Region: 1 level (one-hot)" in result.out and "Island: 3 levels (one-hot)" in result.out
    result = cli("prepare", source, tmp_path / "ds2", "--label", "Species", "--drop-columns", "Individual ID,Date Egg")
    assert result.code == 0 and "warning" not in result.err, result.err


def flights_like(path: Path, rows: int = 3000) -> Path:
    """A table shaped like nycflights13's flights: tailnum (an identifier, ~one level per row), time_hour (a
    timestamp as text), dest (105 levels, more than --max-levels keeps), a delay and a label."""
    rng = np.random.default_rng(5)
    with open(path, "w") as handle:
        handle.write("tailnum,time_hour,dest,dep_delay,late\n")
        for i in range(rows):
            tail = f"N{rng.integers(0, 2 * rows):05d}"
            hour = f"2013-{1 + i // 2000 % 12:02d}-{1 + i // 80 % 25:02d} {5 + i % 18:02d}:00:00"
            dest = f"D{min(int(rng.geometric(0.03)), 105) - 1:03d}" if i >= 105 else f"D{i:03d}"
            handle.write(f"{tail},{hour},{dest},{rng.normal(10, 30):.0f},{i % 2}\n")
    return path


def test_a_flights_like_table_warns_before_writing(cli, tmp_path, monkeypatch):
    source = flights_like(tmp_path / "flights.csv")
    result = cli("prepare", source, tmp_path / "ds", "--label", "late", "--plain")
    assert result.code == 0, result.err
    assert "warning: column 'tailnum' looks like an identifier" in result.err
    assert "warning: column 'time_hour' looks like dates or times" in result.err and "'2013-01-01 05:00:00'" \
        in result.err
    assert "dest 5 levels" in result.err and "dest: 100 levels, 5 more in <rare> (one-hot)" in result.out
    assert "will take about" not in result.err  # small enough
    monkeypatch.setattr(memtrain.prepare.table_notes, "ENCODED_WARN_BYTES", 1 << 20)
    result = cli("prepare", source, tmp_path / "wide", "--label", "late", "--max-levels", "65536", "--plain")
    assert result.code == 0, result.err
    size = next(line for line in result.err.splitlines() if "will take about" in line)
    manifest = open_dataset(tmp_path / "wide").manifest
    width = manifest["x"]["shape"][0]
    tailnum = len(manifest["encoding"]["columns"][0]["levels"]) + 1  # its levels and <rare>
    assert f"{width:,} features a row" in size and f"widest: tailnum {tailnum:,} features" in size
    assert "--drop-columns tailnum,time_hour,dest" in size and "--categorical-encoding ordinal" in size
    assert result.err.index("will take about") < result.err.index("writing shards")


# --- errors --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, fragments", [
    (["--columns", "colour,nope"], ["--columns names a column the source does not have", "nope", "'colour'"]),
    (["--drop-columns", "id,colour,size,note"], ["no feature columns left"]),
    (["--categorical", "shade"], ["--categorical names a column", "shade"]),
    (["--max-levels", "0"], ["--max-levels out of range", "found 0"]),
    (["--min-level-count", "0"], ["--min-level-count out of range"]),
])
def test_bad_table_options(cli, write_file, tmp_path, args, fragments):
    source = write_file("t.csv", TABLE)
    assert_clean_failure(cli("prepare", source, tmp_path / "out", *args), tmp_path, *fragments)


def test_table_options_are_checked_once_at_the_edge(tmp_path):
    for bad, message in (({"missing": "guess"}, "unknown --missing"),
                         ({"categorical_encoding": "binary"}, "unknown --categorical-encoding")):
        with pytest.raises(InputError, match=message):
            PrepareOptions(tmp_path / "t.csv", tmp_path / "out", **bad)


@pytest.mark.parametrize("value", ["<rare>", "<missing>", " <rare> "])
def test_a_value_spelled_like_a_bucket_is_refused(cli, write_file, tmp_path, value):
    source = write_file("t.csv", "c,label\na,0\nb,1\n" + f"{value},0\n" * 3)
    assert_clean_failure(cli("prepare", source, tmp_path / "out"), tmp_path, "t.csv:column 'c'",
                         f"spelled like memtrain's {value.strip()} bucket", "--drop-columns c")
    parquet = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    parquet.write_table(pa.table({"c": ["a", "b", value, None], "label": [0, 1, 0, 1]}), tmp_path / "t.parquet")
    assert_clean_failure(cli("prepare", tmp_path / "t.parquet", tmp_path / "out", "--categorical-encoding", "ordinal"),
                         tmp_path, "t.parquet:column 'c'", f"{value.strip()} bucket")


def test_too_many_distinct_values_is_an_identifier(cli, write_file, tmp_path, monkeypatch):
    monkeypatch.setattr(memtrain.prepare.table, "MAX_DISTINCT", 50)
    source = write_file("t.csv", "name,label\n" + "".join(f"n{i},{i % 2}\n" for i in range(60)))
    assert_clean_failure(cli("prepare", source, tmp_path / "out", "--max-levels", "10"), tmp_path,
                         "t.csv:column 'name'", "too many distinct values", "--drop-columns")


@pytest.mark.parametrize("header, fragments", [
    ("a,b,a,label", ["t.csv:column names", "two columns have the same name", "'a' at positions 1, 3"]),
    ("label,x,label", ["'label' at positions 1, 3"]),  # the target would be among the features
    ("a, b ,b,label", ["'b' at positions 2, 3"]),  # names are compared as read: spaces trimmed
    (",x,,label", ["a column has no name", "position 1, 3 of 4", "to_csv(index=False)"]),
])
def test_duplicate_and_empty_column_names_are_refused(cli, write_file, tmp_path, header, fragments):
    width = header.count(",") + 1
    source = write_file("t.csv", header + "\n" + "".join(",".join(str(i + j) for j in range(width - 1)) +
                                                         f",{i % 2}\n" for i in range(4)))
    assert_clean_failure(cli("prepare", source, tmp_path / "out"), tmp_path, *fragments)


def test_duplicate_parquet_column_names_are_refused(cli, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.Table.from_arrays([pa.array([1, 2]), pa.array([3.0, 4.0]), pa.array([0, 1])], names=["a", "a", "label"])
    pq.write_table(table, tmp_path / "t.parquet")
    assert_clean_failure(cli("prepare", tmp_path / "t.parquet", tmp_path / "out"), tmp_path,
                         "t.parquet:column names", "two columns have the same name", "'a' at positions 1, 2")


def test_raw_rows_errors(tmp_path):
    source = tmp_path / "t.csv"
    source.write_text(TABLE)
    quiet(PrepareOptions(source, tmp_path / "ds", val_fraction=0.0, drop_columns=("note",)))
    encoding = Encoding.from_dict(open_dataset(tmp_path / "ds").manifest["encoding"])
    row = {"id": "1", "colour": "red", "size": "2"}
    assert encoding.rows([dict(row, note="ignored", label="a")]).shape == (1, encoding.width)  # source columns
    with pytest.raises(InputError, match="did not have.*'weight'"):
        encoding.rows([dict(row, weight="3")])
    with pytest.raises(InputError, match="the rows have no column 'size'"):
        encoding.rows([{"id": "1", "colour": "red"}])
    with pytest.raises(InputError, match="row 1, column 'size'.*'big'"):
        encoding.rows({"id": [1, 2], "colour": ["red", "red"], "size": [1, "big"]})
    with pytest.raises(InputError, match="same columns"):
        encoding.rows([row, {"id": "1"}])


@pytest.fixture
def table_model(cli, tmp_path):
    """A softmax model trained one epoch on a small table: colour (text), size (numbers), label a/b."""
    source = tmp_path / "t.csv"
    source.write_text("colour,size,label\n" + "".join(f"{'rgb'[i % 3]},{i % 7}.5,{'ab'[i % 2]}\n" for i in range(60)))
    assert cli("prepare", source, tmp_path / "ds").code == 0
    (tmp_path / "job.toml").write_text('[data]\npath = "ds"\n[model]\nkind = "softmax"\n[train]\nepochs = 1\n'
                                       'workers = 1\n')
    assert cli("train", tmp_path / "job.toml").code == 0
    return memtrain.load_model(tmp_path / "runs" / "job")


def test_predict_on_raw_rows_refuses_what_it_cannot_answer(table_model):
    model = table_model
    row = {"colour": "r", "size": "1.5"}
    assert model.predict([row]).shape == (1,)
    for size in ("inf", "-inf", 1e999, "1e999", float("-inf")):  # prepare refuses these: predict must too
        with pytest.raises(InputError, match=r"row 0, column 'size': not a finite number in a number column"):
            model.predict([dict(row, size=size)])
    with pytest.raises(InputError, match=r"row 1, column 'size': a value is not a finite float32"):
        model.predict({"colour": ["r", "g"], "size": [1.0, 1e39]})  # finite as float64, Inf as float32
    with pytest.raises(InputError, match="row 0, feature 3: a feature is not a finite number"):
        model.predict(np.array([[1, 0, 0, np.inf, 0]], dtype=np.float32)[:, :model.context.spec.n_features])
    with pytest.raises(InputError, match="column 'colour': a dict of columns needs a sequence.*str 'rgb'"):
        model.predict({"colour": "rgb", "size": [1, 2, 3]})  # not split into three rows of one letter
    with pytest.raises(InputError, match="row 0, column 'colour': a cell holds no single value.*list"):
        model.predict({"colour": [["r"]], "size": [1]})
    with pytest.raises(InputError, match="column 'colour'.*bytes b'r'.*decode"):
        model.predict({"colour": b"r", "size": 1.5})
    with pytest.raises(InputError, match="row 0, column 'size': a cell holds no single value.*list"):
        model.predict([{"colour": "r", "size": [1, 2]}])
    with pytest.raises(InputError, match="no rows"):
        model.predict({"colour": [], "size": []})
    with pytest.raises(InputError, match="no rows"):
        model.predict(np.empty((0, model.context.spec.n_features)))
    with pytest.raises(InputError, match=r"the rows have no column 'size', which the model needs.*expected "
                                         r"every feature column: colour, size.*found the rows' columns: colour"):
        model.predict([{"colour": "r"}])
    rows = [row, dict(row, colour="g")]
    np.testing.assert_array_equal(model.predict(r for r in rows), model.predict(rows))  # a generator is read once


def test_predict_on_a_dataframe_with_a_repeated_column_is_refused(table_model):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame([["r", "g", 1.5]], columns=["colour", "colour", "size"])
    with pytest.raises(InputError, match="two columns of the rows have the same name.*'colour' 2 times"):
        table_model.predict(frame)
    with pytest.raises(InputError, match="no rows"):
        table_model.predict(pd.DataFrame({"colour": [], "size": []}))


def test_evaluate_checks_the_labels(table_model):
    model = table_model
    rows = [{"colour": "r", "size": "1.5"}, {"colour": "g", "size": "2.5"}]
    assert set(model.evaluate(rows, [0, 1])) == {"accuracy", "macro_f1", "log_loss"}
    assert model.evaluate(rows, ["a", "b"]) == model.evaluate(rows, [0, 1])  # class names are taken too
    for labels, message in (([0.5, 1], r"row 0: a label in y is not a class index.*0 to 1.*found 0\.5\)"),
                            ([1, 1.5], r"row 1.*found 1\.5"), ([0, 2], r"row 1.*found 2\)"), ([-1, 0], "row 0"),
                            (["a", "c"], r"not one of the model's classes.*'c'"), ([0, np.nan], "not finite"),
                            ([0], "different numbers of rows"), (3, "a single value"),
                            ([[0, 1], [1, 0]], "one class per row"), ([None, {}], "not a number"),
                            ([[0], [1, 0]], "not one label per row")):
        with pytest.raises(InputError, match=message):
            model.evaluate(rows, labels)


def test_raw_rows_for_a_model_without_a_table_encoding_is_a_clear_error(cli, tmp_path, small_table):
    x, y = small_table
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    assert cli("prepare", tmp_path / "x.npy", tmp_path / "ds", "--y", tmp_path / "y.npy").code == 0
    (tmp_path / "job.toml").write_text('[data]\npath = "ds"\n[model]\nkind = "softmax"\n[train]\nepochs = 1\n'
                                       'workers = 1\n')
    assert cli("train", tmp_path / "job.toml").code == 0
    model = memtrain.load_model(tmp_path / "runs" / "job")
    assert model.encoding is None and model.predict(x[:2]).shape == (2,)
    with pytest.raises(InputError, match="records no table encoding"):
        model.predict([{"f0": 1.0}])
    pd = pytest.importorskip("pandas")  # a DataFrame of features is still an array for such a model
    np.testing.assert_array_equal(model.predict(pd.DataFrame(x[:3])), model.predict(x[:3]))


def test_a_version_2_dataset_is_still_read(tmp_path):
    source = tmp_path / "t.csv"
    source.write_text("a,b,label\n1,2,0\n3,4,1\n5,6,0\n")
    quiet(PrepareOptions(source, tmp_path / "ds"))
    path = tmp_path / "ds" / "manifest.json"
    manifest = unseal(json.loads(path.read_text()), path=path, what="manifest")
    assert manifest["version"] == 3 and manifest["encoding"]["columns"][0]["name"] == "a"
    old = {k: v for k, v in manifest.items() if k not in ("encoding", "label_missing_rows", "missing_dropped_rows")}
    write_sealed_json(path, {**old, "version": 2}, durable=False)
    dataset = open_dataset(tmp_path / "ds")
    assert dataset.manifest["version"] == 2 and len(dataset) + len(dataset.split("val")) == 3
    write_sealed_json(path, {**old, "version": 1}, durable=False)
    with pytest.raises(memtrain.errors.CorruptFileError, match="unsupported dataset format version"):
        open_dataset(tmp_path / "ds")
    assert math.isfinite(old["stats"]["mean"][0])


def test_categorical_reads_codes_and_stray_words_as_levels(cli, write_file, tmp_path):
    source = write_file("t.csv", "zip,f,label\n10115,2,0\n20095,abc,1\n10115,4,0\n")
    assert_clean_failure(cli("prepare", source, tmp_path / "out"), tmp_path, "t.csv:line 3, column 'f'",
                         "'abc'", "--categorical f")
    result = cli("prepare", source, tmp_path / "out", "--categorical", "zip,f", "--no-shuffle", "--val-fraction", "0")
    assert result.code == 0, result.err
    assert open_dataset(tmp_path / "out").manifest["feature_names"] == \
        ["zip=10115", "zip=20095", "zip=<rare>", "f=2", "f=4", "f=abc", "f=<rare>"]
    np.testing.assert_array_equal(train_rows(tmp_path / "out")[1], [0, 1, 0, 0, 0, 1, 0])


@pytest.mark.timeout(120)
def test_a_table_killed_while_writing_shards_resumes_to_the_same_bytes(tmp_path):
    """The encoding and the level ids live in the spool's record: a rerun after SIGKILL in pass 2 reuses
    the spool and the finished shards and writes what an uninterrupted prepare writes."""
    from tests.test_prepare_faults import run_prepare

    rng = np.random.default_rng(2)
    source = tmp_path / "t.csv"
    source.write_text("city,temp,label\n" + "".join(
        f"{'NA' if i % 37 == 0 else f'c{rng.integers(0, 6)}'},{'' if i % 41 == 0 else rng.integers(0, 99)},{i % 3}\n"
        for i in range(8000)))
    assert run_prepare(source, tmp_path / "ref").returncode == 0
    killed = run_prepare(source, tmp_path / "ds", fault="prepare_after_shard:2")
    assert killed.returncode == -9, killed.stderr
    again = run_prepare(source, tmp_path / "ds")
    assert again.returncode == 0, again.stderr
    assert "resuming:" in again.stderr and "2 shards already complete" in again.stderr, again.stderr
    assert open_dataset(tmp_path / "ds").manifest["x"]["shape"] == [9]  # c0..c5, <missing>, <rare>, temp
    assert dataset_bytes(tmp_path / "ds", ignore=("source",)) == dataset_bytes(tmp_path / "ref", ignore=("source",))


def test_a_table_gives_the_same_bytes_whichever_parser_reads_it(tmp_path, monkeypatch):
    """pyarrow's fast path and the reference parser (the csv module) agree on text, quotes and missing cells."""
    rng = np.random.default_rng(4)
    cells = ["red", " blue ", '"a, b"', "NA", "", "null", '"x\ny"']
    source = tmp_path / "t.csv"
    source.write_text("colour,n,label\n" + "".join(
        f"{cells[rng.integers(0, 7)]},{['1.5', 'NA', '', '2e3', '-7'][rng.integers(0, 5)]},{['p', 'q', 'NA'][i % 3]}\n"
        for i in range(3000)))
    from memtrain.prepare.csv_source import CsvSource

    calls = []
    real = CsvSource._parse
    monkeypatch.setattr(CsvSource, "_parse", lambda self, data, line: calls.append(line) or real(self, data, line))
    quiet(PrepareOptions(source, tmp_path / "fast", chunk_mb=0.5, shard_mb=0.01))
    assert calls == []  # pyarrow read every block
    import memtrain.prepare.csv_fast

    monkeypatch.setattr(memtrain.prepare.csv_fast, "available", lambda: False)
    quiet(PrepareOptions(source, tmp_path / "reference", chunk_mb=0.5, shard_mb=0.01))
    fast = open_dataset(tmp_path / "fast").manifest
    assert fast["label_missing_rows"] == 1000 and "colour=a, b" in fast["feature_names"]
    assert dataset_bytes(tmp_path / "fast") == dataset_bytes(tmp_path / "reference")
