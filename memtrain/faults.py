"""Fault injection for tests: ``MEMTRAIN_FAULT=point:n[,point:n]`` SIGKILLs this process at the n-th hit.

The points are declared in ``POINTS`` below, each where a crash matters, so a test can loop n over every
reachable hit, SQLite style, instead of killing at one lucky moment. A name not in ``POINTS`` is refused
at the start of every command (``check_spec``); tests/test_fault_points.py makes each point fire.
``MEMTRAIN_FAULT`` is read once per process, at its first fault point, and again at the start of every
command (``check_spec``): a fault point runs several times per update, where reading the environment
each time was a measurable part of a small model's run. A test that changes the variable within its
own process calls ``reread`` (tests/conftest.py does before and after every test).
``MEMTRAIN_FAULT_ACTION=raise`` raises OSError(ENOSPC) instead (disk-full tests),
``MEMTRAIN_FAULT_ACTION=stop`` sends SIGSTOP (hang tests).
``MEMTRAIN_FAULT_ONCE=/path/marker`` makes the fault fire in one process only, once per marker file
(the first process to create the marker fires; replacements and other workers then run clean).
``MEMTRAIN_FAULT_ACTION=record`` with ``MEMTRAIN_FAULT_LOG=/path`` appends the point's name to that file and
goes on (a test that every point is reached).

Two more test hooks, read by the workers' streamed gradient tasks (train/loops/stream.py), for the overlapping
modes: ``MEMTRAIN_STRAGGLER=factor:/path/marker`` makes the first worker process to create the marker take
``factor`` times as long for each gradient (it sleeps the difference: a slower machine, without taking a
core from the others), and ``MEMTRAIN_READ_AUDIT=/path/audit.jsonl`` makes every gradient task append the
checksum of the weights it computed at, taken before and after computing, so a test can compare them
with the lineage: a torn read (weights written while read) cannot pass it.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import threading
from collections import Counter

from memtrain.errors import InputError

ENV = "MEMTRAIN_FAULT"
ACTION_ENV = "MEMTRAIN_FAULT_ACTION"
ONCE_ENV = "MEMTRAIN_FAULT_ONCE"
LOG_ENV = "MEMTRAIN_FAULT_LOG"
STRAGGLER_ENV = "MEMTRAIN_STRAGGLER"
READ_AUDIT_ENV = "MEMTRAIN_READ_AUDIT"

# Every fault point: its name and where it fires.
POINTS = {
    # the rounds: in a worker, or in the server when it runs them itself (train/loops/rounds.py)
    "before_grad_write": "a task's rows are read, its gradient not computed yet",
    "after_grad_write": "a task's gradient is in its buffer (its own file on a cluster), not marked (answered) yet",
    "mid_step": "after each chunk of a step slice (weights, optimizer state and block digest written)",
    "mid_publish": "fixed staleness in the rounds: a version recorded as published and the oldest recycled, "
                   "not renamed into place yet",
    "after_publish": "a version renamed into place, the ledger not yet past its update",
    "desk_done": "async mode at the desk: a participant found every task of its stretch applied, not answered yet",
    # the server
    "after_result": "an evaluation or statistics result accepted",
    "statistics_chunk": "a chunk of a statistics task added into its partial (not published yet)",
    "statistics_summed": "the server's sum of the statistics published (its partials removed), not solved yet",
    "after_update_logged": "an update's lineage and metric lines made, not written yet",
    "ckpt_after_data": "a checkpoint's files copied, its meta.json not written",
    "ckpt_before_commit": "a checkpoint complete under its temporary name, not renamed",
    "run_before_commit": "a new run directory's records written under its temporary name, not renamed",
    # any process
    "write": "every file memtrain creates or reuses (ENOSPC with MEMTRAIN_FAULT_ACTION=raise)",
    # prepare
    "prepare_mid_spool": "while the shuffle's spool is written",
    "prepare_mid_shard": "while a shard is written",
    "prepare_after_shard": "a shard pair written and logged",
    "prepare_before_publish": "the dataset complete, not renamed into place",
    # reinforcement learning (memtrain/rl)
    "rl_mid_collect": "a collection task half way through its steps (in a worker, or the server with 0 workers)",
    "rl_mid_share": "a worker's learner task computed its share of a minibatch gradient, its file not written yet",
    "rl_after_publish": "the server published a version, its lineage and metrics lines not written yet",
    # serve
    "serve_after_claim": "a job claimed (moved to running/), its train not launched",
    "serve_after_launch": "a job's train launched",
}

# Process-local hit counts of the test hook (and, in ``_armed``, the spec as read). This is the one piece
# of module state in memtrain: the hook must count hits across call sites without threading a counter
# through every function.
_hits: Counter[str] = Counter()
_counting = threading.Lock()  # points hit from several threads (a prepare's split writers) count each hit once


def _targets() -> dict[str, int]:
    """The points ``MEMTRAIN_FAULT`` names, with the hit each fires at, as the environment says now."""
    spec = os.environ.get(ENV, "")
    targets = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, count = item.partition(":")
        targets[name] = int(count) if count.isdigit() else 1 if not count else -1  # no count: the first hit
    return targets


@functools.cache
def _armed() -> dict[str, int] | None:
    """``_targets()`` as this process first read it; None when ``MEMTRAIN_FAULT`` is unset."""
    return _targets() if ENV in os.environ else None


def reread() -> None:
    """Read ``MEMTRAIN_FAULT`` again at the next fault point, and count hits from zero again."""
    _armed.cache_clear()
    _hits.clear()


def check_spec() -> None:
    """Refuse a ``MEMTRAIN_FAULT`` that names an unknown point or a bad count (a test that would kill nothing).

    Called at the start of every command, it also makes the command read the variable afresh (``reread``).
    """
    reread()
    for name, count in _targets().items():
        if name not in POINTS:
            raise InputError(f"unknown fault point {name!r} in {ENV}", expected=", ".join(POINTS), found=name)
        if count < 1:
            raise InputError(f"bad hit count for fault point {name!r} in {ENV}", expected="point:n with n >= 1",
                             found=os.environ[ENV])


def fault_point(name: str) -> None:
    """Die here if the test environment asks for it; a no-op (one cached call) otherwise."""
    targets = _armed()
    if targets is None:
        return
    if name not in POINTS:
        raise AssertionError(f"fault point {name!r} is not declared in memtrain/faults.py POINTS")
    wanted = targets.get(name)
    if wanted is None:
        return
    with _counting:
        _hits[name] += 1
        hit = _hits[name]
    if hit != wanted or not _claim_once():
        return
    action = os.environ.get(ACTION_ENV, "kill")
    if action == "record":
        with open(os.environ[LOG_ENV], "a", encoding="utf-8") as log:
            log.write(name + "\n")
        return
    if action == "raise":
        raise OSError(errno.ENOSPC, f"injected fault at {name}")
    os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)


def _claim_once() -> bool:
    marker = os.environ.get(ONCE_ENV)
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def straggler_factor() -> float:
    """How many times slower this worker's gradients are made (the straggler hook); 1.0 when unset.

    The first process to create the hook's marker file is the straggler, for the rest of its life."""
    spec = os.environ.get(STRAGGLER_ENV)
    if not spec:
        return 1.0
    factor, _, marker = spec.partition(":")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return 1.0
    return float(factor)


def read_audit_path() -> str | None:
    """Where gradient tasks record the checksums of the weights they read (the read-audit hook), or None."""
    return os.environ.get(READ_AUDIT_ENV) or None
