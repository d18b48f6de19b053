"""``python -m memtrain.serve.child SERVICE_PID ARGS...`` -> ``memtrain ARGS...``, stopped if the service dies.

Linux's ``PR_SET_PDEATHSIG`` sends this process SIGTERM when the service dies, even by SIGKILL, and
``memtrain train`` answers SIGTERM by checkpointing and exiting 143, so the next service resumes the run
instead of finding an orphan. The signal is armed only after the fork, so a service that died before
that is caught by comparing the parent pid (RELIABILITY.md 2.2).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def arm_parent_death_signal(service_pid: int) -> None:
    """SIGTERM this process when its parent dies; exit 143 now if the parent is already gone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: a restarted service finds this run's lock held and waits for it instead
    if os.getppid() != service_pid:
        sys.exit(128 + signal.SIGTERM)


def main(argv: list[str]) -> int:
    arm_parent_death_signal(int(argv[0]))
    from memtrain.cli import main as memtrain_main

    return memtrain_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
