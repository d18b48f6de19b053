"""bench's runs report the CPU time of the process and its waited-for children (memory.run_sampled)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from memtrain.benchmarks.memory import run_sampled

BURN = textwrap.dedent("""
    import json, multiprocessing, sys, time

    def burn(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass

    if __name__ == "__main__":
        seconds = json.loads(sys.argv[1])["seconds"]
        child = multiprocessing.get_context("spawn").Process(target=burn, args=(seconds,))
        child.start()
        burn(seconds)
        child.join()
        print(json.dumps({"done": True}))
""")


def test_a_runs_cpu_counts_the_process_and_its_workers(tmp_path: Path) -> None:
    script = tmp_path / "burn.py"
    script.write_text(BURN)
    result, _, _ = run_sampled("", {"seconds": 0.3}, what="burn", timeout=60,
                               command=[sys.executable, str(script)], cwd=tmp_path)
    assert result["done"]
    assert 0.6 <= result["cpu_seconds"] < 1.5, result  # 0.3 s in the process, 0.3 s in its child, and start-up
