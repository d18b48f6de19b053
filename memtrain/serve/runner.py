"""A claimed job -> a ``memtrain train`` child process (own log, own session) -> its outcome and metrics.

The child is ``python -m memtrain.serve.child`` (``memtrain train`` with SIGTERM armed for the service's
death) running in the jobs folder, so a model module beside the job files can be imported. It runs in
its own session: a Ctrl-C in the service's terminal reaches the service only, and the service decides
what the children get (one SIGTERM: checkpoint and exit 143).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtrain.errors import MemtrainError
from memtrain.files import open_own, open_regular
from memtrain.layout import RUN_JOB, RUN_LOCK, RUN_METRICS
from memtrain.serve.admit import Admission
from memtrain.train.records.record import compare, recorded_job

ERROR_PREFIX = "memtrain train: error: "
# Enough of the end of a log or metrics file to find its last error line or epoch record; reading
# only the tail keeps status updates cheap on long runs.
TAIL_BYTES = 64 << 10
STOPPED_CODES = tuple(code for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) for code in (128 + sig, -sig))


@dataclass
class Child:
    """A running ``memtrain train`` of one claimed job; ``state`` is its claim record."""

    name: str
    admission: Admission
    claimed: Path
    proc: subprocess.Popen[bytes]
    log: Path
    log_offset: int  # where this attempt's output starts in the log
    state: dict[str, Any] = field(default_factory=dict)


def run_lock_owner(run_dir: Path) -> str | None:
    """Who holds the run directory's lock (a pid as text), or None if it is free.

    The same ``flock`` that makes ``memtrain train`` refuse a second run on one directory: a train left
    running by a service that died without killing it is waited for, never doubled.
    """
    try:
        handle = open_regular(run_dir / RUN_LOCK, text=True)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except MemtrainError:
        return "unknown (run.lock is not a regular file)"
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "unknown"
    return None


def wants_resume(admission: Admission) -> bool:
    """Resume only a run this very job created: the job its records say it follows is this job (nothing but
    how it is executed differs; see ``train.record``).

    So a restarted service continues its own runs, a job submitted again after it finished finds its run
    complete, and a job pointed at someone else's run directory is refused by ``memtrain train``.
    """
    if not (admission.job.run.dir / RUN_JOB).exists():
        return False
    try:
        _, unasked, fixed = compare(recorded_job(admission.job.run.dir), admission.job, asked=())
    except MemtrainError:
        return False
    return not unasked and not fixed


def launch(admission: Admission, claimed: Path, *, folder: Path, log: Path, resume: bool) -> Child:
    """Start ``memtrain train`` on a claimed job file, its output appended to ``log``."""
    args = admission.train_args(claimed, resume=resume)
    with os.fdopen(open_own(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as handle:  # never via a symlink
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        handle.write(f"=== {stamp} memtrain serve: {' '.join(args)}\n".encode(errors="backslashreplace"))
        handle.flush()
        offset = handle.tell()
        proc = subprocess.Popen(
            [sys.executable, "-m", "memtrain.serve.child", str(os.getpid()), *args],
            cwd=folder, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return Child(admission.name, admission, claimed, proc, log, offset)


def stop(child: Child) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.proc.send_signal(signal.SIGTERM)


def failure_message(child: Child, code: int) -> str:
    """One line: the child's own error message if it printed one, else how it ended."""
    tail = _tail(child.log, child.log_offset)
    errors = [line[len(ERROR_PREFIX):] for line in tail if line.startswith(ERROR_PREFIX)]
    if errors:
        return errors[-1]
    if code < 0:
        return f"memtrain train was killed by {signal.Signals(-code).name}; see {child.log}"
    last = next((line for line in reversed(tail) if line.strip()), "no output")
    return f"memtrain train exited with code {code} ({last.strip()}); see {child.log}"


def progress(run_dir: Path) -> dict[str, Any]:
    """Where a run stands from the end of its metrics.jsonl: epochs done, and the last update."""
    records = _records(run_dir / RUN_METRICS)
    epochs = [r for r in records if r.get("kind") == "epoch"]
    updates = [r for r in records if r.get("kind") == "update"]
    found: dict[str, Any] = {}
    if epochs:
        found["epochs_done"] = epochs[-1].get("epoch")
        found["last_epoch"] = {k: epochs[-1][k] for k in ("loss", "val_loss", "val_accuracy") if k in epochs[-1]}
    if updates:
        found["update"] = updates[-1].get("update")
        found["loss"] = updates[-1].get("loss")
    return found


def final_record(run_dir: Path) -> dict[str, Any] | None:
    """The last epoch record of a run (its final metrics), or None."""
    epochs = [r for r in _records(run_dir / RUN_METRICS) if r.get("kind") == "epoch"]
    return epochs[-1] if epochs else None


def _tail(path: Path, start: int) -> list[str]:
    try:
        with open_regular(path) as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(start, size - TAIL_BYTES))
            data = handle.read()
    except (FileNotFoundError, MemtrainError):
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[1:] if start < size - TAIL_BYTES else lines  # the first line may be cut


def _records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects among the last lines of a JSON-lines file (a torn line is skipped)."""
    records = []
    for line in _tail(path, 0):
        with contextlib.suppress(json.JSONDecodeError):
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records
