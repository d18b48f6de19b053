"""A ClusterAddress -> a connected ``distributed.Client`` whose workers are set up for memtrain.

``tcp://HOST:PORT`` connects to a running scheduler (its workers started by the user's deployment:
dask-jobqueue, dask-mpi, Kubernetes, ``dask worker``); ``local:N`` starts N worker processes on 127.0.0.1,
one thread each, without a dashboard, to try a cluster run on one machine. Every wait has a bound: an
unreachable scheduler, or one without workers, is a clear error, not a hang.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator
from typing import Any

from memtrain.cluster.address import ClusterAddress
from memtrain.errors import InputError, MemtrainError

CONNECT_SECONDS = 20.0  # to reach the scheduler
WORKERS_SECONDS = 60.0  # for the first worker to register (a batch system may still be starting them)
INSTALL_HINT = 'install the cluster extra: pip install "memtrain[cluster]"'


def import_distributed() -> Any:
    """The ``distributed`` module, or an InputError saying how to install it."""
    try:
        return importlib.import_module("distributed")
    except ImportError as exc:
        raise InputError(f"--cluster needs Dask distributed, which is not installed ({exc})",
                         hint=INSTALL_HINT) from None


@contextlib.contextmanager
def connected(address: ClusterAddress, *, connect_seconds: float = CONNECT_SECONDS,
              workers_seconds: float = WORKERS_SECONDS) -> Iterator[Any]:
    """Yield a Client of ``address`` with at least one worker; closes it (and a local cluster) on exit."""
    distributed = import_distributed()
    from memtrain.cluster import memory

    with contextlib.ExitStack() as stack:
        stack.enter_context(_quiet("distributed"))
        if address.local:
            cluster = stack.enter_context(distributed.LocalCluster(
                n_workers=address.local_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address=None, silence_logs=logging.ERROR,
                # no dashboard, but Dask still serves health checks over HTTP: on loopback, on free ports
                # (older releases bind the workers' on every interface unless told an address)
                scheduler_kwargs={"dashboard_address": "127.0.0.1:0"}, worker_dashboard_address="127.0.0.1:0"))
            client = stack.enter_context(distributed.Client(cluster, timeout=connect_seconds, direct_to_workers=True))
        else:
            client = stack.enter_context(_client(distributed, address.text, connect_seconds))
        memory.register(client)
        _wait_for_a_worker(client, address, workers_seconds)
        yield client


@contextlib.contextmanager
def _quiet(prefix: str) -> Iterator[None]:
    """Dask's own log lines (tracebacks of reconnection attempts, worker restarts) stay off memtrain's stderr:
    what matters reaches the run's event log and the error message. Restored when the connection closes.

    Dask sets levels on several of its loggers (``distributed.client``, ...), so each one is raised."""
    names = [prefix, *(name for name in logging.root.manager.loggerDict if name.startswith(prefix + "."))]
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def _client(distributed: Any, address: str, seconds: float) -> Iterator[Any]:
    try:
        client = distributed.Client(address, timeout=seconds, direct_to_workers=True)
    except (OSError, TimeoutError) as exc:
        raise MemtrainError(f"cannot reach the Dask scheduler at {address} within {seconds:g} s",
                            found=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                            hint="start it (`dask scheduler`) or check the address, port and firewall") from None
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):  # a lost scheduler must not hide the error that ended the run
            client.close(timeout=5)


def _wait_for_a_worker(client: Any, address: ClusterAddress, seconds: float) -> None:
    try:
        client.wait_for_workers(1, timeout=seconds)
    except TimeoutError:
        raise MemtrainError(f"the Dask scheduler at {address.text} has no workers after {seconds:g} s",
                            hint="start workers with `dask worker " + address.text + "` (docs/cluster.md)") from None
