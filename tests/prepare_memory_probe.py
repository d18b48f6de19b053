"""Run `memtrain prepare ARGS...` while sampling this process's anonymous memory; print the peak as JSON.

Used by test_prepare_memory.py in a subprocess: RssAnon (heap, numpy arrays) is what the chunk size must
bound; file-backed pages (mapped shards, page cache of the source) are the kernel's to reclaim.
"""

from __future__ import annotations

import json
import sys
import threading
import time


def rss_anon_kib() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status")


def main() -> int:
    from memtrain.cli import main as memtrain_main

    baseline = rss_anon_kib()
    peak = [baseline]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_anon_kib())
            time.sleep(0.002)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    code = memtrain_main(["prepare", *sys.argv[1:]])
    stop.set()
    thread.join()
    peak[0] = max(peak[0], rss_anon_kib())
    print(json.dumps({"code": code, "baseline_mib": baseline / 1024, "peak_mib": peak[0] / 1024,
                      "growth_mib": (peak[0] - baseline) / 1024}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
