"""A test model whose processes leave marks of how they ended (tests/test_pools.py, tests/test_cli.py).

In a process other than pytest's (a worker, a ``memtrain`` command), importing this module registers an
``atexit`` hook and keeps an object whose ``__del__`` runs when the interpreter tears its modules down; each
writes a file named after itself and the pid into ``MEMTRAIN_TEST_EXIT_MARKS``. A worker or the command ends
with its ``atexit`` hooks but without the teardown."""

from __future__ import annotations

import atexit
import os
import sys
from dataclasses import dataclass

from memtrain.models.softmax import SoftmaxRegression

MARKS = os.environ.get("MEMTRAIN_TEST_EXIT_MARKS")


def _mark(name: str, *, open_file=os.open, close=os.close, flags=os.O_CREAT | os.O_WRONLY, pid=os.getpid) -> None:
    close(open_file(os.path.join(MARKS, f"{name}-{pid()}"), flags))


class _TornDown:
    def __del__(self, mark=_mark) -> None:
        mark("teardown")


if MARKS and "pytest" not in sys.modules:
    atexit.register(_mark, "atexit")
    KEPT = _TornDown()


@dataclass(frozen=True)
class MarksItsExit(SoftmaxRegression):
    """Softmax regression, imported by its workers (see the module docstring)."""
