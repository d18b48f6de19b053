"""Rows, features, worker counts -> the loader table: rows/s and GB/s delivered to a consumer that touches every
byte, for memtrain's ``batches`` and ``BatchDataset`` against the usual alternatives, side by side.

Methods (one epoch of batches of ``--batch`` rows in a new random order each, run in a fresh process), each
baseline the best a competent user writes with that tool (issue 32's rule):

- ``memtrain_batches``: ``ds.batches(batch, shuffle="rows")`` in the training process (no workers).
- ``memtrain_fixed``: the same with ``shuffle="batches"`` (contiguous batches, views of the mapped file):
  what the row-level shuffle costs is the ratio of the two.
- ``memtrain_torch``: ``DataLoader(BatchDataset(ds, batch), batch_size=None, num_workers=W)``.
- ``memmap_dataloader``: a map-style dataset over one ``x.npy`` / ``y.npy`` mapped with
  ``np.load(mmap_mode="r")`` lazily in each process (never pickled), a whole batch per ``__getitem__``
  (one gather per array, the row numbers sorted so that it reads in file order),
  ``DataLoader(data, batch_size=None, sampler=BatchSampler(RandomSampler(data), batch))``. torch already
  runs its workers on one thread; ``pin_memory`` only speeds copies to a GPU and ``persistent_workers``
  only the start of a later epoch (each run is one epoch, its start left out): both stay off.
- ``gather_floor``: the floor of a row-level shuffle on this machine, not a loader: the same epoch's batches
  (the order of ``memtrain_batches``, computed before the clock starts) taken with one ``np.take`` per array
  from the one x.npy / y.npy pair into two reused buffers. What ``memtrain_batches`` adds to it is the cost
  of the loader itself (the order, the joined shards, the buffers that are never overwritten while held).
- ``hf_datasets``: Hugging Face ``datasets`` on the same rows: an Arrow file memory-mapped by
  ``Dataset.from_file``, ``.shuffle(seed)`` (an indices mapping), numpy format, one ``hf[list]`` per batch.
- ``hf_flat``: the same, then ``.flatten_indices()`` (what HF's docs advise after a shuffle: the rows are
  rewritten in the shuffled order, so each batch is one contiguous slice ``hf[a:b]``). The shuffle and the
  rewrite are work every epoch needs, so their seconds count in both HF methods' time.

The data is read once before the timed runs (page cache). ``--larger-than-ram`` instead sizes the data
``--data-factor`` times ``--limit-mib`` and runs every method under ``RLIMIT_DATA``: its data segment once
torch (and datasets) are imported plus ``--limit-mib`` (torch alone reserves a few hundred MiB of address
space), inherited by the loader workers. RLIMIT_DATA caps private anonymous memory, not mapped files,
so a method that copies the dataset into its own memory fails while the file pages stay shared and reclaimable. (Not
``RLIMIT_AS``, which counts mapped files and torch's address-space reservations, and not a cgroup: a
cgroup would bound the page cache too, but creating one needs privileges this tool does not assume.)

The runs go through ``benchmarks/compare.py``: interleaved (every method and worker count once, then again,
``--repeats`` times), each rate the median with its range, each ratio per repeat between runs made side
by side (to the np.memmap DataLoader, and to the faster HF method, at the same worker count), the
issue's targets judged on those ratios, the machine and its load named under the table. Each process's
peak anonymous memory (the main process, and the largest loader worker) is sampled from outside.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.benchmarks.compare import Spread, Target, interleaved, pairwise
from memtrain.benchmarks.memory import run_sampled
from memtrain.errors import InputError

METHODS = ("memtrain_batches", "memtrain_fixed", "gather_floor", "memtrain_torch", "memmap_dataloader", "hf_datasets",
           "hf_flat")
IN_PROCESS = ("memtrain_batches", "memtrain_fixed", "gather_floor")  # numpy in the training process: no workers
LABELS = {"memtrain_batches": "memtrain ds.batches", "memtrain_fixed": "ds.batches, fixed batches",
          "gather_floor": "floor: np.take, same rows",
          "memtrain_torch": "memtrain BatchDataset",
          "memmap_dataloader": "np.memmap + DataLoader", "hf_datasets": "HF datasets + DataLoader",
          "hf_flat": "HF flattened + DataLoader"}
HF = ("hf_datasets", "hf_flat")
BASE = "memmap_dataloader"
WARMUP = 8  # batches per run left out of the rate: worker start-up and first imports, paid once per job
RUN_TIMEOUT = 1800.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``bench loader``'s own options (with bench.py's --dir, --repeats, --json)."""
    from memtrain.benchmarks import larger_than_ram

    parser.add_argument("--rows", type=float, default=1e6, help="rows of the dataset (default 1e6)")
    parser.add_argument("--features", type=int, default=64, help="float32 features per row (default 64)")
    parser.add_argument("--batch", type=int, default=512, help="rows per batch (default 512)")
    parser.add_argument("--loader-workers", default="0,2,4", help="DataLoader worker counts (default %(default)s)")
    parser.add_argument("--methods", help=f"comma-separated subset of {','.join(METHODS)} (default: every one "
                                          "whose libraries are installed)")
    larger_than_ram.add_arguments(parser, params=False)


def run(args: argparse.Namespace) -> int:
    """``memtrain bench loader``: the table (or JSON)."""
    methods = parse_methods(args.methods)
    workers = parse_workers(args.loader_workers)
    if args.batch < 1 or args.features < 1 or args.repeats < 1:
        raise InputError("--batch, --features and --repeats must be positive",
                         found=f"{args.batch}, {args.features}, {args.repeats}")
    limit = args.limit_mib if args.larger_than_ram else None
    rows = int(args.rows) if limit is None else int((limit << 20) * args.data_factor // (args.features * 4 + 8))
    if rows < args.batch * (WARMUP + 2):
        raise InputError(f"--rows must give at least {WARMUP + 2} batches", found=rows)
    from memtrain.benchmarks.train_bench import machine

    cases = [f"{method}@{count}" for count in workers for method in methods if not (method in IN_PROCESS and count)]
    scratch = Path(tempfile.mkdtemp(prefix="memtrain-bench-loader-", dir=getattr(args, "dir", None)))
    try:
        paths = write_sources(scratch, rows, args.features, methods)
        load_before = os.getloadavg()

        def one(case: str, repeat: int) -> dict[str, Any]:
            method, count = case.split("@")
            return run_once({"method": method, "workers": int(count), "paths": paths, "batch": args.batch,
                             "epoch": repeat, "limit_mib": limit})

        runs = interleaved(cases, args.repeats, one)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results = summarize(runs)
    report = {"machine": machine() | {"loadavg_before": load_before, "loadavg_after": os.getloadavg()},
              "settings": {"rows": rows, "features": args.features, "batch": args.batch, "workers": workers,
                           "repeats": args.repeats, "rlimit_data_mib": limit, "methods": methods},
              "results": results, "targets": verdicts(results)}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def default_methods() -> str:
    """Every method whose libraries are installed (a note on stderr for the others)."""
    from importlib.util import find_spec

    needs = {"memtrain_torch": "torch", "memmap_dataloader": "torch", "hf_datasets": "datasets", "hf_flat": "datasets"}
    missing = sorted({needs[m] for m in METHODS if m in needs and find_spec(needs[m]) is None})
    if missing:
        print(f"bench loader: {' and '.join(missing)} not installed; the methods that need them are left out "
              '(pip install "memtrain[bench]")', file=sys.stderr)
    return ",".join(m for m in METHODS if needs.get(m) not in missing)


def parse_methods(text: str | None) -> list[str]:
    methods = [m.strip() for m in (text or default_methods()).split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise InputError("unknown --methods for bench loader", expected=", ".join(METHODS),
                         found=", ".join(unknown) or text)
    return methods


def parse_workers(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError("--loader-workers takes worker counts such as 0,2,4", found=text) from None
    if not counts or min(counts) < 0:
        raise InputError("--loader-workers takes worker counts of 0 or more", found=text)
    return counts


def write_sources(scratch: Path, rows: int, features: int, methods: list[str]) -> dict[str, str]:
    """The same rows three ways: a memtrain dataset, one x.npy/y.npy pair, an Arrow file; then read once."""
    from memtrain.benchmarks.synthetic import write_dataset
    from memtrain.dataset import open_dataset

    data = write_dataset(scratch / "memtrain", rows, 1024, features=features)
    split = open_dataset(data).split("train")
    x = np.lib.format.open_memmap(scratch / "x.npy", mode="w+", dtype=split.x_dtype, shape=(rows, *split.x_shape))
    y = np.lib.format.open_memmap(scratch / "y.npy", mode="w+", dtype=split.y_dtype, shape=(rows, *split.y_shape))
    paths = {"memtrain": str(data), "x": str(scratch / "x.npy"), "y": str(scratch / "y.npy")}
    writer = _arrow_writer(scratch / "rows.arrow", features) if set(HF) & set(methods) else None
    for lo in range(0, rows, 65536):
        xs, ys = split.read(lo, min(lo + 65536, rows))
        x[lo:lo + len(xs)], y[lo:lo + len(ys)] = xs, ys
        if writer is not None:
            writer.write_table(_arrow_table(xs, ys))
    x.flush()
    y.flush()
    del x, y
    if writer is not None:
        writer.close()
        paths["arrow"] = str(scratch / "rows.arrow")
    for path in scratch.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:  # into the page cache: every method starts from warm data
                while handle.read(16 << 20):
                    pass
    return paths


def _arrow_table(x: np.ndarray, y: np.ndarray) -> Any:
    import pyarrow as pa

    return pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1]), "y": pa.array(y)})


def _arrow_writer(path: Path, features: int) -> Any:
    import pyarrow as pa

    schema = pa.schema([("x", pa.list_(pa.float32(), features)), ("y", pa.int64())])
    return pa.ipc.new_stream(pa.OSFile(str(path), "wb"), schema)


def run_once(spec: dict[str, Any]) -> dict[str, Any]:
    """One method in a fresh process, the memory of it and of its loader workers sampled from here."""
    result, pid, peaks = run_sampled("memtrain.benchmarks.loader_bench", spec, timeout=RUN_TIMEOUT,
                                     what=f"bench loader {spec['method']} with {spec['workers']} workers")
    mib = {p["pid"]: p["peak_anon_mib"] for p in peaks.per_process()}
    result["main_anon_mib"] = mib.get(pid, 0.0)
    result["worker_anon_mib"] = max((v for p, v in mib.items() if p != pid), default=0.0)
    return result


def summarize(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per method and worker count: rows/s and GB/s (median, range), each repeat's rate as a ratio to the
    np.memmap DataLoader's and to the faster Hugging Face method's in the same repeat, the peak anonymous
    memory of the main process and of the largest loader worker."""
    rates = {case: [r["rows"] / r["seconds"] for r in results] for case, results in runs.items()}
    rows = []
    for case, results in runs.items():
        method, workers = case.split("@")
        base = rates.get(f"{BASE}@{workers}")
        hf = [max(pair) for pair in zip(*(rates[f"{m}@{workers}"] for m in HF if f"{m}@{workers}" in rates),
                                        strict=True)]
        spread = Spread.of(rates[case])
        rows.append({"method": method, "label": LABELS[method], "workers": int(workers),
                     "rows_per_s": spread.median, "runs_rows_per_s": rates[case], "rows_per_s_spread": spread.as_dict(),
                     "gb_per_s": spread.median * results[0]["row_bytes"] / 1e9,
                     "gb_per_s_spread": Spread.of([r * results[0]["row_bytes"] / 1e9 for r in rates[case]]).as_dict(),
                     "cpu_gb_per_s_spread": _cpu_rate(results, int(workers)),
                     "vs_memmap": _ratio(rates[case], base), "vs_hf": _ratio(rates[case], hf or None),
                     "main_anon_mib": max(r["main_anon_mib"] for r in results),
                     "worker_anon_mib": max(r["worker_anon_mib"] for r in results),
                     "setup_seconds": Spread.of([r["setup_seconds"] for r in results]).as_dict()})
    return sorted(rows, key=lambda r: (r["workers"], METHODS.index(r["method"])))


def _cpu_rate(results: list[dict[str, Any]], workers: int) -> dict[str, Any] | None:
    """GB/s per CPU second of the run's loading thread (median, range), for runs without loader workers: on a
    machine other work loads, a thread's CPU time is slowed far less than its wall time. None with loader
    workers, whose CPU time the main thread's does not count. The CPU seconds are those of the timed
    batches (``timed_cpu_seconds``), not ``run_sampled``'s ``cpu_seconds`` (the whole process, imports too)."""
    if workers:
        return None
    return Spread.of([r["rows"] * r["row_bytes"] / r["timed_cpu_seconds"] / 1e9 for r in results]).as_dict()


def _ratio(mine: list[float], other: list[float] | None) -> dict[str, Any] | None:
    spread = pairwise(mine, other) if other else None
    return None if spread is None else spread.as_dict()


def verdicts(results: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, by worker count: memtrain's BatchDataset >= 1.5x the np.memmap DataLoader and
    >= 2x the faster Hugging Face method, ratios of runs made side by side."""
    lines = []
    for r in (r for r in results if r["method"] == "memtrain_torch"):
        for key, name, target in (("vs_memmap", "np.memmap DataLoader", 1.5), ("vs_hf", "HF datasets", 2.0)):
            if r[key] is not None:
                ratio = _spread(r[key])
                lines.append(Target(name=f"BatchDataset / {name}, {r['workers']} workers", at_least=target)
                             .verdict(ratio))
    return lines + _row_shuffle_verdicts(results)


def _row_shuffle_verdicts(results: list[dict[str, Any]]) -> list[str]:
    """Issue 43's targets for ``ds.batches`` in rows order, 0 loader workers: >= 2x the np.memmap DataLoader
    (ratios side by side) and >= 3 GB/s to the consumer; and how close it comes to the gather floor."""
    by_method = {r["method"]: r for r in results if r["workers"] == 0}
    mine = by_method.get("memtrain_batches")
    if mine is None:
        return []
    lines = []
    if mine["vs_memmap"] is not None:
        lines.append(Target(name="ds.batches / np.memmap DataLoader, 0 workers", at_least=2.0)
                     .verdict(_spread(mine["vs_memmap"])))
    rate = _spread(mine["gb_per_s_spread"])
    lines.append(f"ds.batches: {rate.median:.2f} GB/s (runs {rate.low:.2f}-{rate.high:.2f}) to the consumer, "
                 f"target >= 3 GB/s by median: {'met' if rate.median >= 3 else 'NOT met'}")
    floor = by_method.get("gather_floor")
    if floor is not None:
        share = pairwise(mine["runs_rows_per_s"], floor["runs_rows_per_s"])
        floor_rate = _spread(floor["gb_per_s_spread"])
        lines.append(f"ds.batches / the gather floor (one np.take per array of the same rows, "
                     f"{floor_rate.median:.2f} GB/s): {share.text() if share else '-'}")
    lines.append(_by_cpu_time(mine, floor))
    return lines


def _by_cpu_time(mine: dict[str, Any], floor: dict[str, Any] | None) -> str:
    """ds.batches's rate per CPU second of its process, and the floor's: what a loaded machine leaves of the
    comparison (each process's CPU time is its own; its wall time is everyone's)."""
    rate = _spread(mine["cpu_gb_per_s_spread"])
    line = f"by CPU time: ds.batches {rate.median:.2f} GB/s (runs {rate.low:.2f}-{rate.high:.2f})"
    if floor is not None:
        floor_rate = _spread(floor["cpu_gb_per_s_spread"])
        share = pairwise(list(rate.runs), list(floor_rate.runs))
        line += (f", the gather floor {floor_rate.median:.2f} GB/s (runs {floor_rate.low:.2f}-{floor_rate.high:.2f}),"
                 f" ds.batches / floor {share.text() if share else '-'}")
    return line


def _spread(values: dict[str, Any]) -> Spread:
    """A Spread back from its ``as_dict`` form (the report's JSON)."""
    return Spread(median=values["median"], low=values["low"], high=values["high"], runs=tuple(values["runs"]))


def _times(ratio: dict[str, Any] | None) -> str:
    if ratio is None:
        return "-"
    return _spread(ratio).text()


COLUMNS = ("method", "workers", "Mrows/s", "GB/s", "vs np.memmap", "vs HF", "anon MiB main/worker")


def print_table(report: dict[str, Any]) -> None:
    """The report for people: the table (split to fit a narrow terminal: render.print_table), the targets, the
    machine."""
    from rich.text import Text

    from memtrain.benchmarks.train_bench import machine_caption
    from memtrain.inspection.render import make_console, table
    from memtrain.inspection.render import print_table as print_grid

    s = report["settings"]
    limit = (f", RLIMIT_DATA = data segment after imports + {s['rlimit_data_mib']} MiB per process"
             if s["rlimit_data_mib"] else ", in page cache")
    title = (f"bench loader: {s['rows']:,} rows of {s['features']} float32 features, batches of {s['batch']}, "
             f"one epoch per run, {s['repeats']} repeat{'s' if s['repeats'] > 1 else ''} interleaved{limit}; "
             "rates: median (range) over the repeats; ratios: per repeat, to the run made beside it")
    rows = []
    for r in report["results"]:
        rate = _spread(r["rows_per_s_spread"])
        mrows = Spread(median=rate.median / 1e6, low=rate.low / 1e6, high=rate.high / 1e6, runs=rate.runs).text()
        worker = f"{r['worker_anon_mib']:.0f}" if r["workers"] else "-"
        rows.append((r["label"], str(r["workers"]), mrows, f"{r['gb_per_s']:.2f}", _times(r["vs_memmap"]),
                     _times(r["vs_hf"]), f"{r['main_anon_mib']:.0f}/{worker}"))
    console = make_console()
    print_grid(console, table(title, COLUMNS, rows, right=COLUMNS[1:], keys=2))
    for line in [*report["targets"], machine_caption(report["machine"])]:
        console.print(Text(line))


# --- the child process: one method, one epoch ---


def consume(x: Any, y: Any) -> float:
    """Touch every byte of a batch, as a training step would (a sum reads all of it). Always numpy's sum
    (a tensor is viewed, not copied): torch's own spreads over its threads, and on a busy machine their
    wake-ups cost more than the loading measured here (6 ms against 0.03 for 2 MB on one thread)."""
    return float(np.asarray(x).sum()) + float(np.asarray(y).sum())


def batches(spec: dict[str, Any]) -> tuple[Any, float]:
    """The method's batches of one epoch, and the seconds it spent on the epoch before its first batch
    (Hugging Face's shuffle, and flatten: counted in its time, as they are work each epoch needs)."""
    method, workers, paths, batch, epoch = (spec[k] for k in ("method", "workers", "paths", "batch", "epoch"))
    if method == "gather_floor":
        return gather_floor(paths, batch, epoch), 0.0
    if method in IN_PROCESS:
        from memtrain.dataset import open_dataset

        shuffle = "rows" if method == "memtrain_batches" else "batches"
        return open_dataset(paths["memtrain"]).batches(batch, seed=0, epoch=epoch, shuffle=shuffle), 0.0
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

    if method == "memtrain_torch":
        from memtrain.dataset import open_dataset
        from memtrain.torch import BatchDataset

        data = BatchDataset(open_dataset(paths["memtrain"]), batch, seed=0, epoch=epoch)
        return DataLoader(data, batch_size=None, num_workers=workers), 0.0
    torch.manual_seed(epoch)
    if method == "memmap_dataloader":
        data = MemmapRows(paths["x"], paths["y"])
        sampler = BatchSampler(RandomSampler(data), batch, drop_last=False)
        return DataLoader(data, batch_size=None, sampler=sampler, num_workers=workers), 0.0
    import datasets

    datasets.disable_progress_bars()
    datasets.disable_caching()  # no run reuses another's shuffled indices or flattened file
    hf = datasets.Dataset.from_file(paths["arrow"])
    started = time.perf_counter()
    hf = hf.shuffle(seed=epoch)
    if method == "hf_flat":
        hf = hf.flatten_indices()  # rows rewritten in the shuffled order: each batch one contiguous slice
    setup = time.perf_counter() - started
    sampler = BatchSampler(SequentialSampler(range(len(hf))), batch, drop_last=False)
    rows = HFRows(hf.with_format("numpy"), contiguous=method == "hf_flat")
    return DataLoader(rows, batch_size=None, sampler=sampler, num_workers=workers), setup


def gather_floor(paths: dict[str, str], batch: int, epoch: int) -> Any:
    """The rows of ``memtrain_batches``'s epoch, batch by batch, with nothing but one take per array."""
    from memtrain.dataset import open_dataset

    order = open_dataset(paths["memtrain"]).split("train").order(batch, seed=0, epoch=epoch, shuffle="rows")
    index = [np.asarray(order.batch(k), dtype=np.intp) for k in range(order.batches)]  # before the clock starts
    x, y = (np.load(paths[name], mmap_mode="r").view(np.ndarray) for name in ("x", "y"))
    buffers = [(np.empty((batch, *x.shape[1:]), x.dtype), np.empty(batch, y.dtype)) for _ in range(2)]

    def run() -> Any:
        for k, rows in enumerate(index):
            bx, by = buffers[k % 2]
            yield (np.take(x, rows, axis=0, out=bx[:len(rows)], mode="clip"),
                   np.take(y, rows, axis=0, out=by[:len(rows)], mode="clip"))
    return run()


class MemmapRows:
    """The baseline: a map-style dataset over x.npy/y.npy, mapped lazily in each process (never pickled)."""

    def __init__(self, x: str, y: str):
        self.paths, self.arrays = (x, y), None
        self.rows = len(np.load(x, mmap_mode="r"))

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """One batch, one gather per array, its row numbers sorted (reads in file order; a batch's inner
        order means nothing to SGD)."""
        if self.arrays is None:
            self.arrays = tuple(np.load(p, mmap_mode="r").view(np.ndarray) for p in self.paths)
        index = np.sort(np.asarray(rows, dtype=np.intp))
        return self.arrays[0][index], self.arrays[1][index]

    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self.paths, "arrays": None, "rows": self.rows}


class HFRows:
    """A shuffled Hugging Face dataset read a batch at a time: ``hf[list]`` through its indices mapping, or
    ``hf[a:b]`` once flattened (the positions of a batch are then one contiguous run)."""

    def __init__(self, hf: Any, *, contiguous: bool):
        self.hf, self.contiguous = hf, contiguous

    def __len__(self) -> int:
        return len(self.hf)

    def __getitem__(self, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        batch = self.hf[rows[0]:rows[-1] + 1] if self.contiguous else self.hf[rows]
        return batch["x"], batch["y"]


def data_segment() -> int:
    """This process's private writable address space now (``VmData``, what RLIMIT_DATA counts), in bytes."""
    with open("/proc/self/status", encoding="utf-8") as status:
        return next(int(line.split()[1]) << 10 for line in status if line.startswith("VmData:"))


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["limit_mib"]:
        # set once torch and datasets are imported: their code and tables are not the data path under test
        if spec["method"] not in IN_PROCESS:
            import torch  # noqa: F401
        if spec["method"] in HF:
            import datasets  # noqa: F401
        limit = data_segment() + (spec["limit_mib"] << 20)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    total, start, cpu, rows, row_bytes = 0.0, 0.0, 0.0, 0, 0
    cpu_setup = time.thread_time()
    loader, setup = batches(spec)
    cpu_setup = time.thread_time() - cpu_setup if setup else 0.0  # counted where the wall setup is
    for seen, (x, y) in enumerate(loader, start=1):
        total += consume(x, y)
        if seen == WARMUP:
            start, cpu = time.perf_counter(), time.thread_time()
        elif seen > WARMUP:
            rows += len(x)
            row_bytes = x[0].nbytes + y[0].nbytes  # numpy arrays and torch tensors alike
    # the loading thread's CPU time, not the process's: numpy's OpenBLAS pool spins on the other cores for about
    # 0.1 s after import, and the kernel adds a spinning thread's time a tick (4 ms) at a time, so a timed window
    # of 0.2 ms could read 20x its wall time in CPU (every in-process method loads and consumes in this thread)
    return {"rows": rows, "seconds": time.perf_counter() - start + setup, "setup_seconds": setup,
            "timed_cpu_seconds": time.thread_time() - cpu + cpu_setup, "row_bytes": row_bytes, "checksum": total}


if __name__ == "__main__":
    print(json.dumps(run_child(json.loads(sys.argv[1]))))
