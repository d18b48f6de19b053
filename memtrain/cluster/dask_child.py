"""``python -m memtrain.cluster.dask_child scheduler|worker ARGS``: Dask's own command, deaf to the stop signals.

Slurm signals every process of a job step's task (``scancel --signal``, the time limit's warning), not only
its leader: a ``dask scheduler`` or ``dask worker`` started by a ``--cluster slurm`` rank would close at the
SIGTERM meant for memtrain, before the server has finished its update and written its checkpoint. Here
SIGINT, SIGTERM and SIGHUP are ignored (an ignored signal stays ignored in the worker processes the nanny
starts) and Dask's command closes at SIGUSR1 instead, which only the rank that started it sends
(cluster/slurm.py).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import sys

END_SIGNAL = signal.SIGUSR1


async def _wait_for_end() -> int:
    """Stands in for ``distributed._signals.wait_for_signals``: Dask's command closes when this returns."""
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()
    loop.add_signal_handler(END_SIGNAL, ended.set)
    await ended.wait()
    return int(END_SIGNAL)


class HeartbeatWithoutTraceback(logging.Filter):
    """A worker whose scheduler closes under it (rank 0 ending the run while a heartbeat is in flight) logs Dask's
    "Failed to communicate with scheduler during heartbeat" with a traceback of Dask's own: the line is kept, the
    traceback dropped, so that a run's clean end never prints a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Failed to communicate with scheduler during heartbeat"):
            record.exc_info, record.exc_text = None, None
        return True


def dask_setup(worker: object) -> None:
    """Dask's preload hook, run in each worker process (cluster/slurm.py passes ``--preload`` with this module: the
    nanny's worker processes are new processes, which a filter added in ``main`` would not reach)."""
    logging.getLogger("distributed.worker").addFilter(HeartbeatWithoutTraceback())


def main() -> None:
    kind = sys.argv.pop(1)
    logging.getLogger("distributed.worker").addFilter(HeartbeatWithoutTraceback())
    command = importlib.import_module(f"distributed.cli.dask_{kind}")
    command.wait_for_signals = _wait_for_end
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    command.main()


if __name__ == "__main__":
    main()
