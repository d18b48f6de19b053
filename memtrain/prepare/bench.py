"""Size in GB -> a table of prepare throughput: memtrain prepare vs the plain read-and-np.save baseline.

For an NPY and a CSV source of about ``gb`` GB each (synthetic, 64 features, written to a temporary
directory), it times the plain baseline (``np.load`` + ``np.save`` for NPY; ``pyarrow.csv.read_csv``
when installed, else ``np.loadtxt``, + ``np.save`` for CSV) and ``memtrain prepare`` with default options
(shuffle, split, statistics, checksums, fsync), each on a cold start of the same file. MB/s is source
bytes per second of wall time.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from memtrain.prepare.options import PrepareOptions
from memtrain.prepare.pipeline import prepare
from memtrain.prepare.synthetic import write_synthetic_source

FEATURES = 64
NPY_ROW_BYTES = FEATURES * 4 + 8
CSV_ROW_BYTES = FEATURES * 7 + 2


def bench_prepare(gb: float, folder: Path | None = None) -> list[tuple[str, float, float, float]]:
    """Rows of (source, size MB, baseline MB/s, memtrain MB/s)."""
    with tempfile.TemporaryDirectory(prefix="memtrain-bench-", dir=folder) as tmp:
        root = Path(tmp)
        rows = []
        x, y = write_synthetic_source(root / "src.npy", int(gb * 1e9 / NPY_ROW_BYTES), FEATURES, seed=1)
        rows.append(_measure("npy", x.stat().st_size + y.stat().st_size, lambda: _npy_baseline(x, y, root),
                             PrepareOptions(x, root / "ds-npy", y=str(y)), root))
        (csv_path,) = write_synthetic_source(root / "src.csv", int(gb * 1e9 / CSV_ROW_BYTES), FEATURES, seed=1)
        rows.append(_measure("csv", csv_path.stat().st_size, lambda: _csv_baseline(csv_path, root),
                             PrepareOptions(csv_path, root / "ds-csv"), root))
        return rows


def _measure(name: str, size: int, baseline: Callable[[], str], options: PrepareOptions,
             root: Path) -> tuple[str, float, float, float]:
    seconds = _timed(baseline)
    shutil.rmtree(root / "baseline", ignore_errors=True)
    ours = _timed(lambda: prepare(options, say=lambda _: None, force_plain=True))
    shutil.rmtree(options.out, ignore_errors=True)
    return name, size / 1e6, size / 1e6 / seconds, size / 1e6 / ours


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _npy_baseline(x: Path, y: Path, root: Path) -> str:
    (root / "baseline").mkdir(exist_ok=True)
    np.save(root / "baseline" / "x.npy", np.load(x))
    np.save(root / "baseline" / "y.npy", np.load(y))
    return "np.load + np.save"


def _csv_baseline(path: Path, root: Path) -> str:
    (root / "baseline").mkdir(exist_ok=True)
    try:
        import pyarrow.csv
    except ImportError:
        table = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float32)
        np.save(root / "baseline" / "x.npy", table[:, :-1])
        np.save(root / "baseline" / "y.npy", table[:, -1].astype(np.int64))
        return "np.loadtxt + np.save"
    table = pyarrow.csv.read_csv(path)
    x = np.column_stack([table.column(i).to_numpy() for i in range(FEATURES)]).astype(np.float32)
    np.save(root / "baseline" / "x.npy", x)
    np.save(root / "baseline" / "y.npy", table.column(FEATURES).to_numpy())
    return "pyarrow.csv.read_csv + np.save"


def format_table(rows: list[tuple[str, float, float, float]]) -> str:
    lines = [f"{'source':<8}{'size MB':>10}{'baseline MB/s':>15}{'memtrain MB/s':>15}{'ratio':>8}"]
    for name, size, base, ours in rows:
        lines.append(f"{name:<8}{size:>10.0f}{base:>15.1f}{ours:>15.1f}{ours / base:>8.2f}")
    return "\n".join(lines)
