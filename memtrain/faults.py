"""Fault injection for tests: ``MEMTRAIN_FAULT=point:n[,point:n]`` SIGKILLs this process at the n-th hit.

Points are named where a crash matters (``before_grad_write``, ``after_grad_tmp``, ``after_grad_rename``,
``before_notify``, ``mid_reduce``, ``ckpt_after_data``, ``ckpt_before_commit``, ``prepare_mid_shard``,
``serve_after_claim``, ``serve_after_launch``, ``exchange_probe``, ...)
so a test can loop n over every reachable hit, SQLite style, instead of killing at one lucky moment.
``MEMTRAIN_FAULT_ACTION=raise`` raises OSError(ENOSPC) instead (disk-full tests),
``MEMTRAIN_FAULT_ACTION=stop`` sends SIGSTOP (hang tests).
``MEMTRAIN_FAULT_ONCE=/path/marker`` makes the fault fire in one process only, once per marker file
(the first process to create the marker fires; replacements and other workers then run clean).
"""

from __future__ import annotations

import errno
import os
import signal
from collections import Counter

ENV = "MEMTRAIN_FAULT"
ACTION_ENV = "MEMTRAIN_FAULT_ACTION"
ONCE_ENV = "MEMTRAIN_FAULT_ONCE"

# Process-local hit counts of the test hook. This is the one piece of module state in memtrain: the
# hook must count hits across call sites without threading a counter through every function.
_hits: Counter[str] = Counter()


def _targets() -> dict[str, int]:
    spec = os.environ.get(ENV, "")
    targets = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, count = item.partition(":")
        targets[name] = int(count or 1)
    return targets


def fault_point(name: str) -> None:
    """Die here if the test environment asks for it; a no-op (one dict lookup) otherwise."""
    if ENV not in os.environ:
        return
    wanted = _targets().get(name)
    if wanted is None:
        return
    _hits[name] += 1
    if _hits[name] != wanted or not _claim_once():
        return
    action = os.environ.get(ACTION_ENV, "kill")
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
