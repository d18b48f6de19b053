"""``memtrain ARGS`` run in the test's own process, for a command that needs no process boundary of its own.

Each ``python -m memtrain`` costs an interpreter's start (~0.25 s of CPU before it does anything). A command with no
fault armed in its own process, no signal sent to it and nothing to learn from a fresh interpreter's imports can run
through ``memtrain.cli.main`` here instead, with its output as a separate process would show it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

from memtrain.cli import main


def here(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``memtrain ARGS`` through ``memtrain.cli.main``, as ``subprocess.run(..., capture_output=True)`` returns it.

    stdout and stderr are captured at the file-descriptor level, so the output of the processes it starts (its
    workers) is in them as it is in a separate process's. ``env``: variables set for the call (its workers inherit
    them), then restored. A usage error gives argparse's exit code; an exception the command does not turn into
    its message fails the test, as a traceback would."""
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        with _environment(env or {}), _descriptors(out.fileno(), err.fileno()), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            try:
                code = main([str(arg) for arg in args])
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 2
            finally:
                out.flush()
                err.flush()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(["memtrain", *map(str, args)], code, out.read(), err.read())


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _descriptors(out: int, err: int) -> Iterator[None]:
    """File descriptors 1 and 2 pointed at ``out`` and ``err``, then restored."""
    saved = os.dup(1), os.dup(2)
    os.dup2(out, 1)
    os.dup2(err, 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
