"""A worker process's start -> a spawned interpreter that never runs the user's script again; its end ->
no interpreter teardown (``exit_at_once``, also the ``memtrain`` command's end).

multiprocessing's ``spawn`` makes every child import the parent's ``__main__`` (by path for a script, by
name for ``python -m``), so that objects defined there can be unpickled. A plain script that calls
``memtrain.fit`` without an ``if __name__ == "__main__":`` guard then runs again in each worker, which
starts training again, which multiprocessing refuses: every worker dies and the task gets the blame.
Workers need nothing from ``__main__`` -- every record they receive is a memtrain class and models are
imported by name -- so while a worker starts, the parent's ``__main__`` is an empty module. The one
exception is a model class defined in the script itself (``kind = "__main__:Class"``): its workers must
import the script, which then needs the guard, as with any spawned process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

MAIN_MODULES = ("__main__", "__mp_main__")


@contextmanager
def script_not_rerun(model_kind: str) -> Iterator[None]:
    """Start processes inside this block: they begin with an empty ``__main__`` (see the module docstring)."""
    if model_kind.partition(":")[0] in MAIN_MODULES:
        yield
        return
    script = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = script


def exit_at_once(code: int = 0) -> NoReturn:
    """End this process with ``code`` once its work is done: its ``atexit`` hooks run and its output is
    flushed, but the interpreter's teardown is skipped.

    Everything a worker owes its server has been written (and answered) before its last message, and
    everything a command owes its user before it returns: what the teardown does is free modules and
    objects, which for a process that imported torch took 0.35-0.52 s (``python -c "import torch"`` against
    the same ending in ``atexit``'s hooks and ``os._exit``: 0.03-0.04 s) and for the ``memtrain`` command
    with numpy, h5py and memtrain loaded 58-91 ms (4.6-6.4 ms). The server waits for it when it stops its
    workers or lets an outline's child go; the user waits for the command. Called after a normal end, and
    with 1 by a worker that could not start once its error is sent to the server (train/worker/worker.py ``start``)."""
    atexit._run_exitfuncs()  # noqa: SLF001 - the hooks users and libraries registered run as at a normal exit
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def end_command(code: int) -> NoReturn:
    """End the ``memtrain`` command (memtrain/cli.py ``console``) with ``code``: at once (``exit_at_once``)
    when no other thread runs, else the usual way, which waits for those threads."""
    if threading.active_count() == 1:
        exit_at_once(code)
    sys.exit(code)
