"""Size in GB -> a table of prepare throughput: memtrain prepare against a plain read-and-save baseline.

Sources, synthetic (64 float features + an integer label), written once into a temporary directory:
  npy   features .npy + labels .npy    baseline: np.load + np.save + fsync of both (a durable copy)
  npz   one uncompressed .npz          baseline: the same, loading from the archive
  h5    one HDF5 file, x and y         baseline: the same, reading with h5py
  csv   one CSV file                   baseline: pyarrow.csv.read_csv + np.save + fsync (np.loadtxt when
                                       pyarrow is missing; the table names the one it used)
memtrain runs ``prepare`` with its default options (global shuffle, split, statistics, checksums, fsync)
and, for array sources, with ``--no-shuffle`` as well. Every measurement runs in a fresh process (its peak
anonymous memory sampled from /proc), baseline and memtrain alternating, ``repeats`` times; the table
gives the median and the spread (min-max) of each figure, and the ratio of each back-to-back pair, so a
burst of load from another process moves one pair, not the comparison. MB/s is source bytes per second
of wall time; the source is in the page cache for both (it was just written, or read by the previous run),
and every run starts with no dirty pages to write back (``os.sync()`` before the clock): without it, the
first run after the source was written paid for writing the source back (measured: a 304 MB npy copy at
157 MB/s right after writing, 1145 MB/s after a sync), a cost that fell on whichever side ran first and
on some sources more than others (the h5 source's npy scratch files are deleted before they reach the disk).
With ``settle`` (``--settle``), each run also waits that many seconds after the sync: on a guest that hands
its free memory back to the host, memory freed by the previous run is cheap to touch only for a moment, so
without a wait each run's speed depends on what ran just before it (see docs/prepare-performance.md).
Each run's seconds by stage are kept (baseline: read, write, fsync; memtrain: scatter, shards, publish).
Every baseline ends as memtrain does, its files on disk (fsync): until issue 32 the CSV baseline skipped
the fsync that memtrain and the array baselines pay. Medians, ranges and pairwise ratios: benchmarks/compare.py.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.benchmarks.compare import Spread, median, pairwise
from memtrain.benchmarks.memory import run_sampled
from memtrain.errors import InputError
from memtrain.progress import BENCH_EVERY, Reporter, reporting

FEATURES = 64
NPY_ROW_BYTES = FEATURES * 4 + 8
CSV_ROW_BYTES = FEATURES * 7 + 2
SOURCES = ("npy", "npz", "h5", "csv")
DEFAULT_SOURCES = ("npy", "csv")
RUN_TIMEOUT = 3600.0  # seconds for one measurement; a hung run fails the benchmark, not the machine


def parse_sources(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in SOURCES]
    if unknown or not names:
        raise InputError("unknown --sources", expected=", ".join(SOURCES), found=", ".join(unknown) or text)
    return names


def bench_prepare(gb: float, folder: Path | None = None, *, sources: list[str] | None = None,
                  repeats: int = 3, settle: float = 0.0) -> dict[str, Any]:
    """The report: machine, settings and one row per (source, options) with every run's figures."""
    if repeats < 1:
        raise InputError("--repeats must be at least 1", found=repeats)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="memtrain-bench-", dir=folder) as tmp:
        root = Path(tmp)
        machine = describe_machine(root)
        rows = []
        sources = sources or list(DEFAULT_SOURCES)
        # per source: writing it, then the baseline and memtrain, `repeats` times per option
        steps = sum(1 + len(shuffles(source)) * repeats * 2 for source in sources)
        with reporting("bench prepare", steps, plain_every=BENCH_EVERY) as progress:
            for source in sources:
                progress.begin(f"writing the {gb:g} GB {source} source")
                files = write_source(source, root, gb)
                size = sum(f.stat().st_size for f in files)
                for shuffle in shuffles(source):
                    rows.append(_compare(source, files, size, shuffle, root, repeats, settle, progress))
                for path in files:
                    path.unlink()
    machine["loadavg"] = [round(v, 2) for v in (*load_before, *os.getloadavg())]
    return {"machine": machine, "settings": {"gb": gb, "repeats": repeats, "features": FEATURES, "settle": settle},
            "results": rows}


def write_source(source: str, root: Path, gb: float) -> list[Path]:
    """A synthetic source of about ``gb`` GB on disk, streamed (never all in memory)."""
    from memtrain.prepare.synthetic import write_synthetic_source

    if source == "csv":
        return write_synthetic_source(root / "src.csv", max(10, int(gb * 1e9 / CSV_ROW_BYTES)), FEATURES, seed=1)
    x, y = write_synthetic_source(root / "src.npy", max(10, int(gb * 1e9 / NPY_ROW_BYTES)), FEATURES, seed=1)
    if source == "npy":
        return [x, y]
    if source == "npz":
        np.savez(root / "src.npz", x=np.load(x, mmap_mode="r"), y=np.load(y, mmap_mode="r"))
        out = [root / "src.npz"]
    else:
        import h5py

        xs, ys = np.load(x, mmap_mode="r"), np.load(y, mmap_mode="r")
        with h5py.File(root / "src.h5", "w") as handle:
            rows = len(xs)
            hx = handle.create_dataset("x", shape=xs.shape, dtype=xs.dtype, chunks=(min(rows, 4096), FEATURES))
            hy = handle.create_dataset("y", shape=ys.shape, dtype=ys.dtype, chunks=(min(rows, 65536),))
            for lo in range(0, len(xs), 262144):
                hx[lo:lo + 262144] = xs[lo:lo + 262144]
                hy[lo:lo + 262144] = ys[lo:lo + 262144]
        out = [root / "src.h5"]
    x.unlink()
    y.unlink()
    return out


def shuffles(source: str) -> tuple[bool, ...]:
    """The options each source is measured with: shuffled and not (a CSV: shuffled only)."""
    return (True, False) if source != "csv" else (True,)


def _compare(source: str, files: list[Path], size: int, shuffle: bool, root: Path, repeats: int,
             settle: float, progress: Reporter) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "memtrain": []}
    for _ in range(repeats):
        for what in ("baseline", "memtrain"):
            progress.begin(f"{source}{'' if shuffle else ', no shuffle'}: {what}")
            spec = {"what": what, "source": source, "files": [str(f) for f in files], "shuffle": shuffle,
                    "out": str(root / "out"), "settle": settle}
            runs[what].append(run_once(spec))
            shutil.rmtree(root / "out", ignore_errors=True)
    base = [size / 1e6 / r["seconds"] for r in runs["baseline"]]
    ours = [size / 1e6 / r["seconds"] for r in runs["memtrain"]]
    return {"source": source, "options": "shuffle" if shuffle else "no-shuffle", "size_mb": size / 1e6,
            "baseline": runs["baseline"][0]["name"], "parser": runs["memtrain"][0].get("parser"),
            "baseline_mbps": base, "memtrain_mbps": ours, "ratios": list(pairwise(ours, base).runs),
            "baseline_stages": [r["stages"] for r in runs["baseline"]],
            "memtrain_stages": [r["stages"] for r in runs["memtrain"]],
            "baseline_peak_mib": [r["peak_anon_mib"] for r in runs["baseline"]],
            "memtrain_peak_mib": [r["peak_anon_mib"] for r in runs["memtrain"]]}


def run_once(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement in a fresh process; its peak anonymous memory sampled from here."""
    result, pid, peaks = run_sampled("memtrain.prepare.bench", spec, what=f"bench prepare: {spec['what']} on "
                                     f"{spec['source']}", timeout=RUN_TIMEOUT)
    result["peak_anon_mib"] = max(peaks.anon_kib.get(pid, 0) / 1024, result["anon_mib"])
    return result


def _measure(spec: dict[str, Any]) -> dict[str, Any]:
    """In the child: run one baseline or one prepare and time it (imports are done before the clock)."""
    files = [Path(f) for f in spec["files"]]
    out = Path(spec["out"])
    if spec["what"] == "baseline":
        action, name = _baseline(spec["source"], files, out)
        parser = None
    else:
        action, name, parser = _memtrain(spec["source"], files, out, spec["shuffle"])
    os.sync()  # no earlier write (the source, the last run) is written back on this run's clock
    time.sleep(spec.get("settle", 0.0))  # --settle: free memory in the same state for every run
    started = time.perf_counter()
    stages = action()
    seconds = time.perf_counter() - started
    return {"name": name, "seconds": seconds, "parser": parser, "anon_mib": _anon_mib(), "stages": stages}


def _baseline(source: str, files: list[Path], out: Path) -> tuple[Any, str]:
    if source == "csv":
        try:
            import pyarrow.csv
        except ImportError:
            return (lambda: _loadtxt_baseline(files[0], out)), "np.loadtxt + np.save + fsync"
        return (lambda: _pyarrow_baseline(pyarrow.csv, files[0], out)), "pyarrow.csv.read_csv + np.save + fsync"
    read = {"npy": "np.load", "npz": "np.load(.npz)", "h5": "h5py read"}[source]
    if source == "h5":
        import h5py  # noqa: F401
    return (lambda: _durable_copy(source, files, out)), f"{read} + np.save + fsync"


def _memtrain(source: str, files: list[Path], out: Path, shuffle: bool) -> tuple[Any, str, str | None]:
    from memtrain.prepare.options import PrepareOptions
    from memtrain.prepare.pipeline import prepare
    from memtrain.prepare.sources import open_source

    y = str(files[1]) if source == "npy" else None
    options = PrepareOptions(files[0], out, y=y, shuffle=shuffle)
    parser = getattr(open_source(options), "parser", None)  # imports the parser too, before the clock
    return (lambda: prepare(options, say=lambda _: None, force_plain=True).stage_seconds), "memtrain prepare", parser


def _save_durably(path: Path, array: np.ndarray, stages: dict[str, float]) -> None:
    started = time.perf_counter()
    with open(path, "wb") as handle:
        np.save(handle, array)
        handle.flush()
        saved = time.perf_counter()
        os.fsync(handle.fileno())
    stages["write"] = stages.get("write", 0.0) + saved - started
    stages["fsync"] = stages.get("fsync", 0.0) + time.perf_counter() - saved


def _durable_copy(source: str, files: list[Path], out: Path) -> dict[str, float]:
    """The copy; its wall seconds by stage: read (into a new array), write (np.save), fsync."""
    out.mkdir()
    if source == "npy":
        arrays = {"x": lambda: np.load(files[0]), "y": lambda: np.load(files[1])}
    elif source == "npz":
        archive = np.load(files[0])
        arrays = {"x": lambda: archive["x"], "y": lambda: archive["y"]}
    else:
        import h5py

        handle = h5py.File(files[0], "r")
        arrays = {"x": lambda: handle["x"][()], "y": lambda: handle["y"][()]}
    stages: dict[str, float] = {}
    for name, load in arrays.items():
        started = time.perf_counter()
        array = load()
        stages["read"] = stages.get("read", 0.0) + time.perf_counter() - started
        _save_durably(out / f"{name}.npy", array, stages)
        del array
    return stages


def _pyarrow_baseline(pacsv: Any, path: Path, out: Path) -> dict[str, float]:
    """pyarrow's multithreaded reader (its default), the columns stacked into one float32 array, saved durably."""
    out.mkdir()
    started = time.perf_counter()
    table = pacsv.read_csv(path)
    x = np.column_stack([table.column(i).to_numpy() for i in range(FEATURES)]).astype(np.float32)
    y = table.column(FEATURES).to_numpy()
    stages = {"read": time.perf_counter() - started}
    _save_durably(out / "x.npy", x, stages)
    _save_durably(out / "y.npy", y, stages)
    return stages


def _loadtxt_baseline(path: Path, out: Path) -> dict[str, float]:
    out.mkdir()
    started = time.perf_counter()
    table = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float32)
    stages = {"read": time.perf_counter() - started}
    _save_durably(out / "x.npy", table[:, :-1], stages)
    _save_durably(out / "y.npy", table[:, -1].astype(np.int64), stages)
    return stages


def _anon_mib() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


def describe_machine(folder: Path) -> dict[str, Any]:
    """What the figures were measured on: CPUs, memory, the filesystem of ``folder``, library versions."""
    from memtrain.benchmarks.train_bench import cpu_model

    try:
        import pyarrow
        arrow = pyarrow.__version__
    except ImportError:
        arrow = None
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpus": os.cpu_count(), "cpu": cpu_model(), "memory_gib": round(memory, 1),
            "filesystem": filesystem(folder), "python": platform.python_version(), "numpy": np.__version__,
            "pyarrow": arrow}


def filesystem(folder: Path) -> str:
    """``ext4 on /dev/vda``: the mount (from /proc/mounts) holding ``folder``."""
    best, found = "", "unknown filesystem"
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                device, point, kind = line.split()[:3]
                inside = str(folder.resolve()).startswith(point.rstrip("/") + "/") or point == "/"
                if inside and len(point) >= len(best):
                    best, found = point, f"{kind} on {device}"
    except OSError:
        pass
    return found


def _spread(values: list[float], digits: int = 0) -> str:
    return Spread.of(values).text(digits)


def _stages(runs: list[dict[str, float] | None] | None) -> str:
    """``read 0.12, write 0.90, fsync 0.20``: the median of each stage over the runs that timed it."""
    timed = [run for run in runs or [] if run]
    names = list(dict.fromkeys(name for run in timed for name in run))
    return ", ".join(f"{name} {median([run[name] for run in timed if name in run]):.2f}" for name in names) or "-"


COLUMNS = ("source", "options", "size MB", "baseline", "baseline MB/s", "memtrain MB/s", "ratio",
           "peak MiB base / memtrain")


def print_table(report: dict[str, Any]) -> None:
    """The report as printed by ``memtrain bench prepare``: a title, the table (split to fit a narrow terminal:
    render.print_table), the stages of each row, the machine."""
    from rich.text import Text

    from memtrain.inspection.render import make_console, table
    from memtrain.inspection.render import print_table as print_grid

    s, m = report["settings"], report["machine"]
    settle = f"; each run after a sync and {s['settle']:g} s of quiet" if s.get("settle") else ""
    title = (f"memtrain bench prepare: {s['gb']:g} GB sources, {s['features']} float features + a label; "
             f"median (min-max) of {s['repeats']} alternating runs{settle}")
    rows = [(row["source"], row["options"], f"{row['size_mb']:.0f}", row["baseline"], _spread(row["baseline_mbps"]),
             _spread(row["memtrain_mbps"]), _spread(row["ratios"], 2),
             f"{median(row['baseline_peak_mib']):,.0f} / {median(row['memtrain_peak_mib']):,.0f}")
            for row in report["results"]]
    console = make_console()
    print_grid(console, table(title, COLUMNS, rows, right=set(COLUMNS) - {"source", "options", "baseline"}, keys=2))
    lines = ["median seconds by stage (baseline: read into a new array, np.save, fsync; memtrain: scatter "
             "= pass 1, shards = pass 2, publish):"]
    lines += [f"  {row['source']} {row['options']}: baseline {_stages(row.get('baseline_stages'))}; "
              f"memtrain {_stages(row.get('memtrain_stages'))}" for row in report["results"]]
    parsers = sorted({row["parser"] for row in report["results"] if row.get("parser")})
    load = m["loadavg"]
    lines.append(f"machine: {m['cpus']} CPUs ({m['cpu']}), {m['memory_gib']:g} GiB RAM, files on {m['filesystem']}; "
                 f"Python {m['python']}, numpy {m['numpy']}, pyarrow {m['pyarrow'] or 'not installed'}"
                 + (f"; memtrain's CSV parser: {', '.join(parsers)}" if parsers else ""))
    lines.append(f"load average (1, 5, 15 min) before {load[0]:g} {load[1]:g} {load[2]:g}, "
                 f"after {load[3]:g} {load[4]:g} {load[5]:g}")
    for line in lines:
        console.print(Text(line))


if __name__ == "__main__":
    print(json.dumps(_measure(json.loads(sys.argv[1]))))
