"""`memtrain inspect` through the CLI: numbers vs numpy, the --json schema, --verify, --diff, --export, --plot."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import CliResult
from tiny_data import sealed

import memtrain
from memtrain.cli import main
from memtrain.files import publish_array, read_jsonl
from memtrain.inspection import build_view, detect
from memtrain.inspection.render import size
from memtrain.inspection.stats import Summary, difference, summarise
from memtrain.layout import (
    CHECKPOINT_META,
    CHECKPOINT_WEIGHTS,
    MANIFEST,
    RUN_LINEAGE,
    RUN_METRICS,
    RUN_PARAMS,
    checkpoint_path,
    checkpoint_updates,
    exchange_dir_name,
    gradient_name,
    optimizer_state_name,
    weight_versions,
    weights_path,
)
from memtrain.models.params import ParamLayout
from memtrain.train.records.checkpoint import write_checkpoint

pytestmark = pytest.mark.timeout(120)

JOB = """
[data]
path = "{data}"
[model]
kind = "mlp"
hidden = [12]
[train]
epochs = {epochs}
batch_size = {batch}
tasks_per_update = 2
lr = 0.01
workers = 2
[run]
dir = "{run}"
keep_versions = {keep}
keep_checkpoints = {keep}
exchange = "run"
"""

STAT_KEYS = ["name", "shape", "dtype", "size", "min", "max", "mean", "std", "l2", "nan", "inf"]
TENSOR_KEYS = {"schema", "kind", "path", "run", "file", "bytes", "named_by", "params", "total", "verified"}
RUN_ENTRY_KEYS = ["type", "name", "path", "version", "update", "epoch", "train_loss", "metrics_from", "val_loss",
                  "val_accuracy", "written", "bytes", "complete", "newest_complete", "verified", "problem"]


def memtrain_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memtrain", *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False)


def inspect(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["inspect", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def inspect_json(capsys: pytest.CaptureFixture[str], *args: str | Path) -> dict:
    code, out, err = inspect(capsys, *args, "--json")
    assert code == 0, err
    return strict_json(out)


def strict_json(text: str) -> dict:
    """Parse as a strict JSON reader would: NaN/Infinity are not JSON."""
    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def prepare(out: Path, *extra: str) -> Path:
    done = memtrain_cli("prepare", "--synthetic", *extra, out, "--plain")
    assert done.returncode == 0, done.stderr
    return out


def train(folder: Path, data: Path, *, epochs: int = 3, batch: int = 300, keep: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "job.toml"
    job.write_text(JOB.format(data=data, run=folder / "run", epochs=epochs, batch=batch, keep=keep))
    done = memtrain_cli("train", job)
    assert done.returncode == 0, done.stderr
    return folder / "run"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare(tmp_path_factory.mktemp("data") / "ds", "1500x14", "--classes", "3", "--shard-mb", "0.03")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, dataset: Path) -> Path:
    return train(tmp_path_factory.mktemp("train"), dataset)


@pytest.fixture
def copied(tmp_path: Path, run: Path, dataset: Path) -> tuple[Path, Path]:
    """A private copy of the run and its dataset, for tests that damage files."""
    shutil.copytree(dataset, tmp_path / "ds")
    shutil.copytree(run, tmp_path / "run", ignore=shutil.ignore_patterns("memtrain-x-*"))
    job = json.loads((tmp_path / "run" / "job.json").read_text())
    job["data"]["path"] = str(tmp_path / "ds")
    (tmp_path / "run" / "job.json").write_text(json.dumps(sealed(job)))  # a real edit: sealed again
    return tmp_path / "run", tmp_path / "ds"


def newest_checkpoint_dir(run: Path) -> Path:
    return checkpoint_path(run, checkpoint_updates(run)[-1])


def layout_of(run: Path) -> ParamLayout:
    return ParamLayout.from_json(json.loads((run / RUN_PARAMS).read_text()))


def expected_stats(array: np.ndarray) -> dict[str, float | int]:
    """Independent numpy reference: statistics over the finite values, NaN/Inf counted."""
    values = np.asarray(array, dtype=np.float64).ravel()
    finite = values[np.isfinite(values)]
    return {"min": finite.min(), "max": finite.max(), "mean": finite.mean(), "std": finite.std(),
            "l2": np.linalg.norm(finite), "nan": int(np.isnan(values).sum()), "inf": int(np.isinf(values).sum())}


def assert_stats(row: dict, array: np.ndarray) -> None:
    for key, value in expected_stats(array).items():
        assert row[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def shard_arrays(root: Path, split: str, part: str) -> list[np.ndarray]:
    manifest = json.loads((root / MANIFEST).read_text())
    return [np.load(root / shard[part], allow_pickle=False) for shard in manifest["splits"][split]["shards"]]


# --- dataset ---


def test_dataset_view_matches_numpy(capsys: pytest.CaptureFixture[str], dataset: Path) -> None:
    view = inspect_json(capsys, dataset)
    manifest = json.loads((dataset / MANIFEST).read_text())
    assert set(view) == {"schema", "kind", "path", "format_version", "task", "rows", "x", "y", "splits", "classes",
                         "targets", "features", "source", "created"}
    assert (view["kind"], view["task"], view["rows"]) == ("dataset", "classification", 1500)
    for split in ("train", "val"):
        ys = shard_arrays(dataset, split, "y")
        assert view["splits"][split]["rows"] == sum(len(y) for y in ys)
        shards = view["splits"][split]["shards"]
        assert [s["rows"] for s in shards] == [len(y) for y in ys]
        assert all(s["verified"] is None for s in shards)
        assert [s["x_bytes"] for s in shards] == [(dataset / s["x"]).stat().st_size for s in shards]
        counts = np.bincount(np.concatenate(ys), minlength=3)
        assert [c[split] for c in view["classes"]] == counts.tolist()
    assert len(view["splits"]["train"]["shards"]) > 1
    assert [c["name"] for c in view["classes"]] == manifest["classes"]
    features = view["features"]
    assert (features["count"], features["shown"], len(features["stats"])) == (14, 10, 10)
    assert [f["mean"] for f in features["stats"]] == manifest["stats"]["mean"][:10]
    assert set(features["stats"][0]) == {"index", "name", "mean", "std", "min", "max"}
    assert len(inspect_json(capsys, dataset, "--all")["features"]["stats"]) == 14


def test_dataset_tables(capsys: pytest.CaptureFixture[str], dataset: Path) -> None:
    code, out, _ = inspect(capsys, dataset)
    assert code == 0
    ys = np.concatenate(shard_arrays(dataset, "train", "y") + shard_arrays(dataset, "val", "y"))
    assert f"{int((ys == 0).sum()):,}" in out
    assert "showing 10 of 14 features; --all shows every one" in out
    assert "not checked" in out


def test_regression_targets_match_numpy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = prepare(tmp_path / "reg", "400x3", "--task", "regression")
    view = inspect_json(capsys, data, "--chunk", "7")
    assert view["classes"] is None
    for split in ("train", "val"):
        assert_stats(view["targets"][split], np.concatenate(shard_arrays(data, split, "y")))


# --- run ---


def test_run_view_lists_checkpoints_and_versions(capsys: pytest.CaptureFixture[str], run: Path) -> None:
    view = inspect_json(capsys, run)
    assert set(view) == {"schema", "kind", "path", "job", "history", "record_problems", "params", "progress",
                         "schedule", "entries", "newest_complete"}
    assert view["schedule"]["mode"] == "sync" and view["schedule"]["max"] == 0  # every gradient at its parent
    assert view["job"]["model"]["kind"] == "mlp"
    assert view["params"]["count"] == layout_of(run).size
    checkpoints = [e for e in view["entries"] if e["type"] == "checkpoint"]
    versions = [e for e in view["entries"] if e["type"] == "weights"]
    assert [e["path"] for e in checkpoints] == [str(checkpoint_path(run, u)) for u in checkpoint_updates(run)]
    assert [e["version"] for e in versions] == weight_versions(run)
    assert all(list(e) == RUN_ENTRY_KEYS for e in view["entries"])
    assert all(e["verified"] is None and e["complete"] for e in view["entries"])
    assert [e["newest_complete"] for e in checkpoints] == [False] * (len(checkpoints) - 1) + [True]
    assert view["newest_complete"] == newest_checkpoint_dir(run).name
    epochs = {r["version"]: r for r in read_jsonl(run / RUN_METRICS) if r["kind"] == "epoch"}
    for entry in checkpoints:
        record = epochs[entry["version"]]
        assert (entry["train_loss"], entry["val_loss"], entry["val_accuracy"]) == (
            record["loss"], record["val_loss"], record["val_accuracy"])
    assert view["progress"]["epochs_done"] == view["progress"]["epochs"] == 3


def test_run_table_marks_newest_and_unverified(capsys: pytest.CaptureFixture[str], run: Path) -> None:
    code, out, _ = inspect(capsys, run)
    assert code == 0
    newest = [line for line in out.splitlines() if line.startswith("* │ c")]
    assert len(newest) == 1 and newest_checkpoint_dir(run).name in newest[0]
    assert "checksums not checked; --verify re-hashes every file" in out


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.split("│")]


@pytest.mark.parametrize("verify", [False, True])
def test_run_tables_fit_80_columns_with_every_value(capsys: pytest.CaptureFixture[str], run: Path,
                                                    monkeypatch: pytest.MonkeyPatch, verify: bool) -> None:
    """At COLUMNS=80 every cell that has a value shows it whole (rich used to squeeze the version, update and
    epoch columns to nothing and cut the others to "…")."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = inspect(capsys, run, *(["--verify"] if verify else []))
    assert code == 0
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out
    entries = inspect_json(capsys, run)["entries"]
    rows = {cells(line)[1]: cells(line) for line in out.splitlines() if line[:4] in ("  │ ", "* │ ")}
    files = {cells(line)[0]: cells(line) for line in out.splitlines() if line.count("│") == 4}
    assert set(rows) == set(files) == {e["name"] for e in entries}
    for e in entries:
        assert rows[e["name"]][2:5] == [f"{e['version']:,}", f"{e['update']:,}", str(e["epoch"])]
        assert rows[e["name"]][5] == f"{e['train_loss']:.4g}"
        if e["val_loss"] is not None:
            assert rows[e["name"]][6:8] == [f"{e['val_loss']:.4g}", f"{e['val_accuracy']:.4g}"]
        assert files[e["name"]][1:] == [e["type"], e["written"], size(e["bytes"]), "ok" if verify else "not checked"]


TORCH_MODEL = """kind = "torch"
factory = "torch_nets:bn_dropout"
code_dir = "{tests}"
hidden = 24"""
NUMBER = re.compile(r"-?[\d,]*\.?\d+(?:e[-+]?\d+)?%?")


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory: pytest.TempPathFactory, dataset: Path) -> Path:
    """A torch module's run (BatchNorm: buffers, so more and longer parameter names than the MLP's)."""
    folder = tmp_path_factory.mktemp("torch")
    job = folder / "job.toml"
    text = JOB.format(data=dataset, run=folder / "run", epochs=3, batch=300, keep=3)
    job.write_text(text.replace('kind = "mlp"\nhidden = [12]', TORCH_MODEL.format(tests=Path(__file__).parent))
                   .replace("lr = 0.01", 'lr = 0.01\noptimizer = "adam"')
                   .replace("workers = 2", "workers = 1"))  # the views read its files: one torch import will do
    done = memtrain_cli("train", job)
    assert done.returncode == 0, done.stderr
    return folder / "run"


def every_view(run: Path, dataset: Path, scratch: Path) -> list[list[str | Path]]:
    """The arguments of every `memtrain inspect` view of a run, its dataset and its files."""
    copy = scratch / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("memtrain-x-*"))
    exchange = copy / exchange_dir_name("test", 1)
    exchange.mkdir()
    gradient = exchange / gradient_name(5, 2, 1)
    publish_array(gradient, np.random.default_rng(1).normal(size=layout_of(run).size).astype(np.float32),
                  durable=False)
    plain = scratch / "plain.npy"
    np.save(plain, np.random.default_rng(2).normal(size=(40, 25)))
    first, newest = checkpoint_path(run, checkpoint_updates(run)[0]), newest_checkpoint_dir(run)
    version = weights_path(run, weight_versions(run)[-1])
    return [[dataset, "--all", "--verify"], [run], [run, "--verify"], [newest], [newest, "--verify"],
            [version, "--verify"], [gradient], [plain], [run, "--lineage", weight_versions(run)[-1]],
            [first, "--diff", newest], [newest, "--export", scratch / "params.npz"]]


def numbers(text: str) -> list[str]:
    return list(word for word in re.split(r"[\s│┃]+", text) if NUMBER.fullmatch(word))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("model", ["mlp", "torch"])
def test_every_view_fits_80_columns_and_wide_terminals_keep_full_tables(
        request: pytest.FixtureRequest, dataset: Path, tmp_path: Path, model: str, cli: Callable[..., CliResult],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 44: at COLUMNS=80 every view is at most 80 columns and shows every number it shows on a wide
    terminal, whole (a table too wide is cut into parts of whole columns, never a number across two lines);
    at COLUMNS=250 each table is one table, as before. In this process (its stdout a pipe, as in a
    subprocess): the views read COLUMNS at each command (inspection/render.py make_console)."""
    run = request.getfixturevalue("run" if model == "mlp" else "torch_run")
    for args in every_view(run, dataset, tmp_path):
        outputs = {}
        for columns in (80, 250):
            (tmp_path / "params.npz").unlink(missing_ok=True)
            monkeypatch.setenv("COLUMNS", str(columns))
            done = cli("inspect", *args)
            assert done.code == 0, done.err
            outputs[columns] = done.out
        narrow, wide = outputs[80], outputs[250]
        width = max(map(len, narrow.splitlines()))
        assert width <= 80, f"inspect {' '.join(map(str, args))}: {width} columns at COLUMNS=80:\n{narrow}"
        assert not Counter(numbers(wide)) - Counter(numbers(narrow)), args  # every number, whole
        headers = [line for line in wide.splitlines() if "┃" in line]
        if "parameters (" in wide:  # the statistics table: every column in one header line
            assert any(all(f" {k} " in f" {line} " for k in ("name", "shape", "dtype", "min", "max", "mean", "std",
                                                              "l2", "nan", "inf")) for line in headers), wide
        assert len(headers) == wide.count("\n\n"), wide  # one header per table: none was split
        assert not any(line.startswith("row ") for line in wide.splitlines())


def test_incomplete_checkpoint_is_not_newest(capsys: pytest.CaptureFixture[str], copied: tuple[Path, Path]) -> None:
    run, _ = copied
    newest = newest_checkpoint_dir(run)
    (newest / optimizer_state_name("m")).unlink()
    view = inspect_json(capsys, run)
    rows = {e["name"]: e for e in view["entries"]}
    assert rows[newest.name]["complete"] is False and "opt-m.npy is missing" in rows[newest.name]["problem"]
    assert view["newest_complete"] == checkpoint_path(run, checkpoint_updates(run)[-2]).name
    out = inspect(capsys, run)[1]  # the table says INCOMPLETE; the reason is a line of its own below it
    reason = next(line for line in out.splitlines() if line.startswith(f"{newest.name} INCOMPLETE: "))
    assert "opt-m.npy is missing" in reason


# --- checkpoint, weight version, gradient, plain .npy ---


def test_checkpoint_stats_match_numpy(capsys: pytest.CaptureFixture[str], run: Path) -> None:
    checkpoint = newest_checkpoint_dir(run)
    view = inspect_json(capsys, checkpoint)
    layout = layout_of(run)
    flat = np.load(checkpoint / CHECKPOINT_WEIGHTS, allow_pickle=False)
    assert set(view) >= TENSOR_KEYS
    assert [p["name"] for p in view["params"]] == [e.name for e in layout.entries]
    for row, entry in zip(view["params"], layout.entries, strict=True):
        assert list(row) == STAT_KEYS
        assert (row["shape"], row["dtype"], row["size"]) == (list(entry.shape), "float32", entry.size)
        assert_stats(row, flat[entry.offset:entry.offset + entry.size])
    assert_stats(view["total"], flat)
    meta = json.loads((checkpoint / CHECKPOINT_META).read_text())
    assert (view["update"], view["epoch"], view["weights_version"]) == (
        meta["update"], meta["epoch"], meta["weights_version"])
    state = view["optimizer"]["state"]
    assert [s["slot"] for s in state] == ["m", "v"]
    assert list(state[0]) == ["slot", "file", "size", "min", "max", "mean", "std", "l2", "nan", "inf"]
    for slot in state:
        assert_stats(slot, np.load(checkpoint / optimizer_state_name(slot["slot"]), allow_pickle=False))
    assert [f["name"] for f in view["files"]] == list(meta["files"])


def test_checkpoint_table_shows_numpy_numbers(capsys: pytest.CaptureFixture[str], run: Path) -> None:
    checkpoint = newest_checkpoint_dir(run)
    code, out, _ = inspect(capsys, checkpoint)
    assert code == 0
    flat = np.load(checkpoint / CHECKPOINT_WEIGHTS, allow_pickle=False).astype(np.float64)
    entry = layout_of(run).entries[0]
    part = flat[entry.offset:entry.offset + entry.size]
    for value in (part.min(), part.max(), part.std(), np.linalg.norm(part)):
        assert f"{value:.6g}" in out
    assert "optimizer state: adam" in out


def test_weight_version_named_by_params_json(capsys: pytest.CaptureFixture[str], run: Path) -> None:
    version = weight_versions(run)[-1]
    view = inspect_json(capsys, weights_path(run, version))
    assert (view["kind"], view["version"], view["named_by"]) == ("weights", version, str(run / RUN_PARAMS))
    flat = np.load(weights_path(run, version), allow_pickle=False)
    layout = layout_of(run)
    for row, entry in zip(view["params"], layout.entries, strict=True):
        assert_stats(row, flat[entry.offset:entry.offset + entry.size])
    lineage = [r for r in read_jsonl(run / RUN_LINEAGE) if r["version"] == version][-1]
    assert lineage.pop("record_checksum")  # the view shows a lineage record once its seal is checked
    assert view["checksum"] == lineage["checksum"] and view["lineage"] == lineage


def test_gradient_file_and_foreign_npy(capsys: pytest.CaptureFixture[str], copied: tuple[Path, Path]) -> None:
    run, _ = copied
    exchange = run / exchange_dir_name("test", 1)
    exchange.mkdir()
    gradient = exchange / gradient_name(5, 2, 1)
    values = np.random.default_rng(1).normal(size=layout_of(run).size).astype(np.float32)
    publish_array(gradient, values, durable=False)
    view = inspect_json(capsys, gradient)
    assert (view["kind"], view["version"], view["task"], view["attempt"]) == ("gradient", 5, 2, 1)
    assert [p["name"] for p in view["params"]] == [e.name for e in layout_of(run).entries]
    assert_stats(view["total"], values)
    stats_file = exchange / gradient_name(0, 0, 0)
    publish_array(stats_file, np.arange(7.0), durable=False)  # an additive model's statistics: another size
    view = inspect_json(capsys, stats_file)
    assert [p["name"] for p in view["params"]] == [stats_file.stem] and view["named_by"] is None


def test_plain_npy_nan_inf_and_markup(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    array = np.random.default_rng(2).normal(size=(40, 25))
    array[3, 4], array[7, 1], array[9, 9] = np.nan, np.inf, -np.inf
    path = tmp_path / "[bold]odd[red].npy"
    np.save(path, array)
    view = inspect_json(capsys, path, "--chunk", "64")
    (row,) = view["params"]
    assert (row["name"], row["shape"], row["nan"], row["inf"]) == ("[bold]odd[red]", [40, 25], 1, 2)
    assert_stats(row, array)
    everything_nan = tmp_path / "nan.npy"
    np.save(everything_nan, np.full(5, np.nan, dtype=np.float32))
    row = inspect_json(capsys, everything_nan)["params"][0]
    assert (row["min"], row["mean"], row["std"], row["nan"]) == (None, None, None, 5)
    code, out, _ = inspect(capsys, path)
    assert code == 0 and "[bold]odd[red]" in out


def test_refuses_pickled_npy_without_running_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    sentinel = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self) -> tuple:
            return (open, (str(sentinel), "w"))

    path = tmp_path / "evil.npy"
    np.save(path, np.array([Payload()], dtype=object), allow_pickle=True)
    for args in ([path], [path, "--json"], [path, "--export", tmp_path / "out.npz"]):
        code, out, err = inspect(capsys, *args)
        assert code == 1 and "refusing" in err and str(path) in err and "Traceback" not in err
        assert not sentinel.exists()
    assert not (tmp_path / "out.npz").exists()
    np.load(path, allow_pickle=True)  # the payload is live: loading it the unsafe way does run it
    assert sentinel.exists()


def test_truncated_checkpoint_file_is_an_error_naming_it(capsys: pytest.CaptureFixture[str],
                                                         copied: tuple[Path, Path]) -> None:
    run, _ = copied
    weights = newest_checkpoint_dir(run) / CHECKPOINT_WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-8])
    code, _, err = inspect(capsys, weights.parent)
    assert code == 1 and str(weights) in err and "truncated" in err and "Traceback" not in err


def test_unrecognised_paths_are_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "notes.txt", tmp_path / "empty", tmp_path / "missing"):
        code, _, err = inspect(capsys, path)
        assert code == 2 and "recognised: a dataset directory" in err and str(path) in err


# --- streaming: a checkpoint larger than the chunk ---


def big_checkpoint(root: Path, shapes: dict[str, tuple[int, ...]], seed: int) -> tuple[Path, np.ndarray]:
    """A checkpoint written with the engine's own writer, from made-up weights (no training needed)."""
    layout = ParamLayout.from_shapes(shapes)
    flat = np.random.default_rng(seed).normal(size=layout.size).astype(np.float32)
    flat[::100_003] = np.nan
    flat[17] = np.inf
    root.mkdir(parents=True, exist_ok=True)
    source, moment = root / "source.npy", root / "moment.npy"
    publish_array(source, flat, durable=False)
    publish_array(moment, np.abs(flat), durable=False)
    meta = {"epoch": 1, "update": 10, "weights_version": 10, "optimizer": {"name": "sgd", "slots": ["momentum"]},
            "model": {"kind": "made-up", "options": {}}, "layout": layout.to_json(), "metrics": {}}
    return write_checkpoint(root, 10, meta, source, {"momentum": moment}, keep=3), flat


def test_large_checkpoint_streamed_matches_numpy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    checkpoint, flat = big_checkpoint(tmp_path, {"big": (500, 1000), "b": (1000,)}, seed=3)
    chunk = 4096  # far smaller than either parameter
    view = inspect_json(capsys, checkpoint, "--chunk", str(chunk))
    assert_stats(view["params"][0], flat[:500_000])
    assert_stats(view["params"][1], flat[500_000:])
    assert_stats(view["total"], flat)
    assert_stats(view["optimizer"]["state"][0], np.abs(flat))
    assert view["params"][0]["nan"] == len(range(0, 500_000, 100_003))


def test_streamed_summary_uses_bounded_memory(tmp_path: Path) -> None:
    checkpoint, flat = big_checkpoint(tmp_path, {"big": (1000, 1000)}, seed=4)
    target = detect(checkpoint)
    tracemalloc.start()
    try:
        view = build_view(target, chunk=1 << 14)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_stats(view["params"][0], flat)
    # Loading the weights whole as float64 would take 8 MB; streaming 16K-element chunks takes a few hundred KB.
    assert peak < flat.nbytes // 4, peak


def test_chan_merge_matches_numpy_on_uneven_chunks() -> None:
    values = np.random.default_rng(5).normal(loc=1e4, scale=3.0, size=10_001)
    for chunk in (1, 3, 1000, 10_001, 50_000):
        summary = summarise(values, chunk).to_dict()
        assert summary["std"] == pytest.approx(values.std(), rel=1e-10)
        assert summary["mean"] == pytest.approx(values.mean(), rel=1e-12)
    empty = Summary().to_dict()
    assert empty["mean"] is None and empty["nan"] == 0
    diff = difference(values, values * 2, chunk=333).to_dict()
    assert diff["l2_distance"] == pytest.approx(np.linalg.norm(values), rel=1e-10)


# --- --verify ---


@pytest.mark.parametrize("which", ["run", "checkpoint", "weights", "dataset"])
def test_verify_passes_on_clean_files(capsys: pytest.CaptureFixture[str], run: Path, dataset: Path,
                                      which: str) -> None:
    path = {"run": run, "checkpoint": newest_checkpoint_dir(run), "dataset": dataset,
            "weights": weights_path(run, weight_versions(run)[-1])}[which]
    code, out, err = inspect(capsys, path, "--verify", "--json")
    assert code == 0, err
    result = strict_json(out)["verify"]
    assert set(result) == {"checked", "ok", "failures", "unrecorded"}
    assert result["ok"] and result["checked"] > 0 and result["failures"] == []


def test_verify_names_every_damaged_file(capsys: pytest.CaptureFixture[str], copied: tuple[Path, Path]) -> None:
    run, data = copied
    checkpoint_file = newest_checkpoint_dir(run) / optimizer_state_name("v")
    version_file = weights_path(run, weight_versions(run)[0])
    shard = data / json.loads((data / MANIFEST).read_text())["splits"]["train"]["shards"][1]["x"]
    missing = checkpoint_path(run, checkpoint_updates(run)[0]) / CHECKPOINT_WEIGHTS
    for path in (checkpoint_file, version_file, shard):
        flip_last_byte(path)
    missing.unlink()

    code, out, err = inspect(capsys, run, "--verify", "--with-dataset", "--json")
    assert code == 1
    failures = {f["path"]: f["status"] for f in strict_json(out)["verify"]["failures"]}
    assert failures == {str(checkpoint_file): "mismatch", str(version_file): "mismatch", str(shard): "mismatch",
                        str(missing): "missing"}
    for path in failures:
        assert path in err
    for path, target in ((checkpoint_file, checkpoint_file.parent), (version_file, version_file), (shard, data)):
        code, out, err = inspect(capsys, target, "--verify")
        assert code == 1 and f"{path}: checksum mismatch" in err and "FAILED" in out


def test_verify_marks_rows(capsys: pytest.CaptureFixture[str], copied: tuple[Path, Path]) -> None:
    run, _ = copied
    damaged = newest_checkpoint_dir(run)
    flip_last_byte(damaged / CHECKPOINT_WEIGHTS)
    code, out, _ = inspect(capsys, run, "--verify", "--json")
    rows = {e["name"]: e["verified"] for e in strict_json(out)["entries"]}
    assert code == 1 and rows.pop(damaged.name) is False and all(rows.values())


# --- --diff ---


def test_diff_matches_numpy(capsys: pytest.CaptureFixture[str], run: Path) -> None:
    first, last = (checkpoint_path(run, u) for u in checkpoint_updates(run)[::len(checkpoint_updates(run)) - 1])
    view = inspect_json(capsys, first, "--diff", last)
    assert set(view) == {"schema", "kind", "path", "other", "params", "total"}
    a = np.load(first / CHECKPOINT_WEIGHTS).astype(np.float64)
    b = np.load(last / CHECKPOINT_WEIGHTS).astype(np.float64)
    for row, entry in zip(view["params"], layout_of(run).entries, strict=True):
        x, y = a[entry.offset:entry.offset + entry.size], b[entry.offset:entry.offset + entry.size]
        assert list(row) == ["name", "shape", "l2_distance", "max_abs_diff", "relative_change", "norm", "other_norm"]
        assert row["l2_distance"] == pytest.approx(np.linalg.norm(y - x), rel=1e-9)
        assert row["max_abs_diff"] == pytest.approx(np.abs(y - x).max(), rel=1e-12)
        assert row["relative_change"] == pytest.approx(np.linalg.norm(y - x) / np.linalg.norm(x), rel=1e-9)
    assert view["total"]["l2_distance"] == pytest.approx(np.linalg.norm(b - a), rel=1e-9)
    same = inspect_json(capsys, run, "--diff", weights_path(run, weight_versions(run)[-1]))
    assert same["total"]["l2_distance"] == 0.0 and same["total"]["relative_change"] == 0.0


def test_diff_refuses_mismatched_layouts(capsys: pytest.CaptureFixture[str], run: Path, tmp_path: Path) -> None:
    wider, _ = big_checkpoint(tmp_path / "wider", {"W1": (14, 99), "b1": (12,), "extra": (3,)}, seed=6)
    code, out, err = inspect(capsys, newest_checkpoint_dir(run), "--diff", wider)
    assert code == 2 and out == ""
    assert "parameter layouts differ" in err and "shapes differ: W1 (14, 12) vs (14, 99)" in err
    assert "only in" in err and "extra" in err and "W2" in err


# --- --export ---


@pytest.mark.parametrize("suffix", [".npz", ".h5", ".safetensors"])
def test_export_round_trip(capsys: pytest.CaptureFixture[str], run: Path, tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"params{suffix}"
    code, text, err = inspect(capsys, run, "--export", out, "--json", "--chunk", "5")
    assert code == 0, err
    assert strict_json(text)["out"] == str(out) and strict_json(text)["normalization"] == "written"
    params, meta = memtrain.load_checkpoint(run)
    # Read back with numpy, h5py or safetensors alone, in a process where memtrain cannot be imported.
    reader = ("import sys, json, numpy as np, h5py; sys.modules['memtrain'] = None\n"
              f"p = {str(out)!r}\n"
              "if p.endswith('.npz'):\n"
              "    with np.load(p, allow_pickle=False) as f: d = {k: f[k].tolist() for k in f.files}\n"
              "elif p.endswith('.h5'):\n"
              "    with h5py.File(p, 'r') as f:\n"
              "        d = {k: f[k][()].tolist() for k in f}; d['@'] = f.attrs['memtrain_meta']\n"
              "else:\n"
              "    from safetensors import safe_open\n"
              "    with safe_open(p, 'numpy') as f:\n"
              "        d = {k: f.get_tensor(k).tolist() for k in f.keys()}; m = f.metadata()\n"
              "    d['@'] = m.pop('memtrain_meta'); d.update({k: json.loads(v) for k, v in m.items()})\n"
              "print(json.dumps(d))")
    done = subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True, timeout=60, check=True)
    loaded = json.loads(done.stdout)
    if suffix != ".npz":
        assert json.loads(loaded.pop("@"))["update"] == meta["update"]
    normalization = [loaded.pop("memtrain.normalize.mean"), loaded.pop("memtrain.normalize.std")]
    np.testing.assert_array_equal(normalization, np.asarray([meta["data"]["stats"]["mean"],
                                                             meta["data"]["stats"]["std"]], dtype=np.float32))
    assert sorted(loaded) == sorted(params)
    for name, array in params.items():
        np.testing.assert_array_equal(np.asarray(loaded[name], dtype=np.float32), array)


def test_exported_weights_predict_on_raw_rows_as_load_model_does(capsys: pytest.CaptureFixture[str], run: Path,
                                                                 dataset: Path, tmp_path: Path) -> None:
    """The MLP's forward pass by hand from the .npz alone: (x - mean) / std, then the layers."""
    out = tmp_path / "mlp.npz"
    assert inspect(capsys, run, "--export", out)[0] == 0
    with np.load(out, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    val = memtrain.open_dataset(dataset).split("val")
    raw = np.asarray(val.read(0, val.rows)[0], dtype=np.float32)
    x = (raw - arrays["memtrain.normalize.mean"]) / arrays["memtrain.normalize.std"]
    scores = np.maximum(x @ arrays["W1"] + arrays["b1"], 0) @ arrays["W2"] + arrays["b2"]
    np.testing.assert_array_equal(scores.argmax(1), memtrain.load_model(run).predict(raw))


def test_export_never_replaces_a_file_unless_asked(capsys: pytest.CaptureFixture[str], run: Path,
                                                   tmp_path: Path) -> None:
    out = tmp_path / "keep.safetensors"
    out.write_bytes(b"precious")
    code, _, err = inspect(capsys, run, "--export", out)
    assert code == 2 and f"{out}: the export file exists" in err and "--overwrite" in err
    assert out.read_bytes() == b"precious"
    code, _, err = inspect(capsys, run, "--export", out, "--overwrite")
    assert code == 0, err
    assert out.read_bytes()[8:9] == b"{"
    code, _, err = inspect(capsys, run, "--overwrite")
    assert code == 2 and "--overwrite only makes sense with --export" in err


def test_export_onto_a_directory_never_advises_the_overwrite_it_was_given(capsys: pytest.CaptureFixture[str],
                                                                          run: Path, tmp_path: Path) -> None:
    """--overwrite replaces a file, never a directory: the error said "pass --overwrite" when it was passed."""
    out = tmp_path / "weights.npz"
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    for extra in ((), ("--overwrite",)):
        code, _, err = inspect(capsys, run, "--export", out, *extra)
        assert code == 2 and f"{out}: the export path is a directory" in err, err
        assert "--overwrite" not in err and "give a file name" in err
    assert (out / "mine.txt").read_text() == "kept"


def test_export_refuses_unknown_format_and_datasets(capsys: pytest.CaptureFixture[str], run: Path,
                                                   dataset: Path, tmp_path: Path) -> None:
    code, _, err = inspect(capsys, run, "--export", tmp_path / "p.pt")
    assert code == 2 and "unknown export format" in err
    code, _, err = inspect(capsys, dataset, "--export", tmp_path / "p.npz")
    assert code == 2 and "a dataset has no parameters" in err


def test_load_checkpoint_gives_read_only_maps(run: Path) -> None:
    params, meta = memtrain.load_checkpoint(run)
    flat = np.load(newest_checkpoint_dir(run) / CHECKPOINT_WEIGHTS, allow_pickle=False)
    assert meta["update"] == checkpoint_updates(run)[-1]
    for name, view in layout_of(run).views(flat).items():
        assert isinstance(params[name], np.memmap) and not params[name].flags.writeable
        np.testing.assert_array_equal(params[name], view)


# --- --plot ---


def test_plot_writes_png(capsys: pytest.CaptureFixture[str], run: Path, tmp_path: Path) -> None:
    out = tmp_path / "loss.png"
    code, text, err = inspect(capsys, run, "--plot", out)
    assert code == 0, err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {out}" in text


def test_plot_without_matplotlib_says_how_to_get_it(capsys: pytest.CaptureFixture[str], run: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # `import matplotlib` now raises ImportError
    out = tmp_path / "loss.png"
    code, _, err = inspect(capsys, run, "--plot", out)
    assert code == 1 and "needs matplotlib" in err and "pip install 'memtrain[plot]'" in err
    assert "Traceback" not in err and not out.exists()


# --- a run that is still training ---


def test_inspect_while_training(capsys: pytest.CaptureFixture[str], dataset: Path, tmp_path: Path) -> None:
    """Views and --verify on a live run: versions are retired and checkpoints pruned under our feet."""
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(data=dataset, run=tmp_path / "run", epochs=12, batch=100, keep=1))
    trainer = subprocess.Popen([sys.executable, "-m", "memtrain", "train", str(job)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        rounds, deadline = 0, time.monotonic() + 90
        while trainer.poll() is None and time.monotonic() < deadline:
            if (tmp_path / "run" / RUN_PARAMS).exists():
                code, out, err = inspect(capsys, tmp_path / "run", "--verify", "--json")
                assert code == 0, err
                assert strict_json(out)["kind"] == "run"
                rounds += 1
        assert trainer.wait(timeout=60) == 0, trainer.stderr.read() if trainer.stderr else ""
    finally:
        trainer.kill()
        trainer.wait()
    assert rounds > 0
