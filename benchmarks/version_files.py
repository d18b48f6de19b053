"""A weight version as one file or as slice files: what a gradient task pays to read it (docs/cluster.md).

Run: ``python -m benchmarks.version_files [--params 1e7] [--repeats 15] [--dir DIR]``. A version
of ``--params`` float32 values is written once as one ``.npy`` and once as 4 and as 16 slice files; then,
per layout, the median (and the least) time of one read as a gradient task needs it, the layouts
interleaved: the one file mapped and read in place, or the slice files mapped and copied into one
contiguous buffer (a model reads one flat vector). The files are in the page cache: what is timed is the
reading, not the filesystem. Figures move with the machine's load (printed beside them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def write(path: Path, length: int) -> None:
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(length,))
    array[:] = 1.0
    array.flush()


def bounds(params: int, pieces: int) -> list[int]:
    return [int(b) for b in np.linspace(0, params, pieces + 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=1e7)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--dir", type=Path, default=None, help="where the files go (default: $TMPDIR)")
    args = parser.parse_args(argv)
    params = int(args.params)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        root = Path(folder)
        write(root / "one.npy", params)
        for pieces in (4, 16):
            edges = bounds(params, pieces)
            for j in range(pieces):
                write(root / f"s{pieces}-{j}.npy", edges[j + 1] - edges[j])
        out = np.empty(params, dtype=np.float32)

        def whole() -> float:
            return float(np.load(root / "one.npy", mmap_mode="r").sum())

        def sliced(pieces: int) -> float:
            edges = bounds(params, pieces)
            for j in range(pieces):
                out[edges[j]:edges[j + 1]] = np.load(root / f"s{pieces}-{j}.npy", mmap_mode="r")
            return float(out.sum())

        layouts = {"one file, read in place": whole, "4 slice files, copied": lambda: sliced(4),
                   "16 slice files, copied": lambda: sliced(16)}
        times: dict[str, list[float]] = {name: [] for name in layouts}
        for read in layouts.values():  # once each, untimed: every page in the cache
            read()
        for _ in range(args.repeats):  # interleaved, so that the machine's load falls on each alike
            for name, read in layouts.items():
                started = time.perf_counter()
                read()
                times[name].append(time.perf_counter() - started)
        for name, seconds in times.items():
            print(f"{name}: {statistics.median(seconds) * 1e3:.1f} ms (min {min(seconds) * 1e3:.1f}; "
                  f"load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
