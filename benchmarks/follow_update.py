"""Follow one update by hand, as a reader would: the files of memtrain it enters, and how often it comes back.

Run: ``python -m benchmarks.follow_update MODE [--dir DIR] [--edges] [--json]`` from the repository's top
folder, MODE one of ``sync`` (the rounds, the server alone), ``async`` (async mode in the server: ``workers =
0``, ``async_group`` 2) or ``cluster`` (the rounds on a local two-worker Dask cluster). A tiny job (2,000 rows, 20
features, 4 classes, a softmax model, one epoch of 100-row batches in 2 tasks) runs in this process under
``sys.setprofile``, which follows the server's thread between the 5th and the 6th call of the mode's
per-update function (the rounds' ``Participant.round``, the server's ``Overlap.apply``):

- **files**: the distinct memtrain files a call entered from another file;
- **returns**: the calls into a file entered, and left, before (a reader going back to a file already read).

Both are counted over the whole package and over ``memtrain/train/`` alone; ``--edges`` lists the returns into
``train/`` by caller, callee and function. docs/development.md ("Following one update") keeps the figures, and
tests/test_follow_update.py bounds them, so that a change which tangles an update's path again is seen. The
counts are the code's, not the machine's: the server's chores (the logbook written, the progress line, a stop or
the placement's probe looked at: ``logbook.Chores``) run at most every ``logbook.PROGRESS_SECONDS`` between two
updates, so whether they fall inside the followed update depends on the machine's speed (on a loaded one, often:
the rounds then entered 2 to 4 more files of train/ and 13 more returns); the calls made inside them are not
counted (the call into the chores is).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import numpy as np

import memtrain

ROOT = str(Path(memtrain.__file__).parent) + "/"
TESTS = Path(__file__).resolve().parent.parent / "tests"  # tiny_data.py: the engine tests' datasets
MODES = ("sync", "async", "cluster")
FIRST, LAST = 5, 6  # the window: from the 5th call of the per-update function to the 6th


def marker(mode: str) -> tuple[str, str]:
    """The per-update function of ``mode``: its file and name."""
    if mode == "async":
        from memtrain.train.loops.overlap import Overlap

        code = Overlap.apply.__code__
    else:
        from memtrain.train.loops.rounds import Participant

        code = Participant.round.__code__
    return code.co_filename, code.co_name


@dataclass
class Followed:
    """What one update entered: per scope (``package``, ``train``), its files in the order entered and the
    returns; ``edges``: each return into train/ as (caller, callee, function) -> times; ``calls``: the per-update
    function's calls seen (at least ``LAST`` once the window closed)."""

    mode: str
    files: dict[str, list[str]] = field(default_factory=lambda: {"package": [], "train": []})
    returns: dict[str, int] = field(default_factory=lambda: {"package": 0, "train": 0})
    edges: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    calls: int = 0

    def summary(self) -> dict[str, Any]:
        return {"mode": self.mode, "calls": self.calls,
                **{f"{scope}_files": len(self.files[scope]) for scope in self.files},
                **{f"{scope}_returns": self.returns[scope] for scope in self.returns}}


def chores_code() -> set[CodeType]:
    """The server's chores' entry points (``logbook.Chores``), whose inner calls the follower leaves out."""
    from memtrain.train.records.logbook import Chores

    return {Chores.after_update.__code__, Chores.in_stretch.__code__}


class Tracer:
    """The profile hook: counts the calls across memtrain's files inside the window, but those inside the
    server's chores (``chores_code``)."""

    def __init__(self, mode: str):
        self.followed = Followed(mode)
        self.marker = marker(mode)
        self.chores = chores_code()
        self.on = False

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        code = frame.f_code
        if (code.co_filename, code.co_name) == self.marker:
            self.followed.calls += 1
            self.on = self.followed.calls == FIRST or (self.on and self.followed.calls < LAST)
        if self.on and code.co_filename.startswith(ROOT) and not self.in_chores(frame.f_back):
            self.count(code.co_filename[len(ROOT):], frame.f_back, code.co_name)

    def in_chores(self, frame: FrameType | None) -> bool:
        """Whether ``frame`` is inside the server's chores (one of their entry points on its stack)."""
        while frame is not None:
            if frame.f_code in self.chores:
                return True
            frame = frame.f_back
        return False

    def count(self, path: str, back: FrameType | None, name: str) -> None:
        caller = back.f_code.co_filename if back is not None else ""
        caller = caller[len(ROOT):] if caller.startswith(ROOT) else ""
        if path == caller:
            return
        for scope in ("package", "train"):
            if scope == "train" and not path.startswith("train/"):
                continue
            if path in self.followed.files[scope]:
                self.followed.returns[scope] += 1
                if scope == "train":
                    self.followed.edges[caller, path, name] += 1
            else:
                self.followed.files[scope].append(path)


def follow(mode: str, folder: Path) -> Followed:
    """One run of the tiny job in ``mode``, in ``folder`` (its data and run directory), followed."""
    sys.path.insert(0, str(TESTS))
    from tiny_data import blobs, write_dataset

    x, y = blobs(n=2000, features=20, classes=4, seed=1)
    data = write_dataset(folder / "data", x, y, shard_rows=500)
    train: dict[str, Any] = {"epochs": 1, "batch_size": 100, "tasks_per_update": 2, "lr": 0.05, "workers": 0}
    run: dict[str, Any] = {"dir": str(folder / "run")}
    if mode == "async":
        train |= {"mode": "async", "async_group": 2}
    if mode == "cluster":
        train["workers"] = "auto"
        run["cluster"] = "local:2"
    tracer = Tracer(mode)
    threading.setprofile(None)  # the server's own thread only
    sys.setprofile(tracer)
    try:
        with np.errstate(all="ignore"):
            memtrain.fit(data={"path": str(data)}, model={"kind": "softmax"}, train=train, run=run, quiet=True,
                         overwrite=True)
    finally:
        sys.setprofile(None)
    return tracer.followed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--dir", type=Path, default=None, help="where the job's files go (default: a new temporary "
                                                              "folder, removed after)")
    parser.add_argument("--edges", action="store_true", help="list the returns into train/")
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        followed = follow(args.mode, Path(folder))
    if args.json:
        print(json.dumps(followed.summary()))
        return 0
    print(f"{args.mode}: {len(followed.files['train'])} files of train/, {followed.returns['train']} returns; "
          f"whole package: {len(followed.files['package'])} files, {followed.returns['package']} returns "
          f"(per-update calls seen: {followed.calls})")
    print("  " + " -> ".join(followed.files["package"]))
    if args.edges:
        for (caller, callee, name), times in followed.edges.most_common():
            print(f"  {times:3d}  {caller} -> {callee}:{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
