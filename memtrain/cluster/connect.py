"""A ClusterAddress -> a connected ``distributed.Client`` whose workers are set up for memtrain.

``tcp://HOST:PORT`` connects to a running scheduler (its workers started by the user's deployment:
dask-jobqueue, dask-mpi, Kubernetes, ``dask worker``); ``local:N`` starts N worker processes on 127.0.0.1,
one thread each, without a dashboard, to try a cluster run on one machine. Every wait has a bound, whatever
is at the other end (an unreachable scheduler, one without workers, a listener that never answers, an HTTP
server, one that answers with other bytes): a clear error, not a hang or a traceback; and every wait ends at a
stop request (SIGINT, SIGTERM, SIGHUP). ``check_scheduler`` is the same handshake alone, done before a run
writes anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from memtrain.cluster.address import ClusterAddress
from memtrain.cluster.dask_settings import configured, slower_heartbeats
from memtrain.errors import InputError, Interrupted, MemtrainError

T = TypeVar("T")

CONNECT_SECONDS = 20.0  # to reach the scheduler
# Beyond Dask's own timeout (which times the TCP connect), for the handshake: the whole connection is
# bounded by the timeout plus this (or plus the timeout, if shorter).
HANDSHAKE_GRACE = 5.0
CLOSE_SECONDS = 10.0  # for a client to close (its own timeout is 5 s)
POLL_SECONDS = 0.1  # how often a bounded wait looks for a stop request
WORKERS_SECONDS = 60.0  # for the first worker to register (a batch system may still be starting them)
LOCAL_START_SECONDS = 120.0  # for a local:N cluster's scheduler and workers to start (a loaded machine)
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
              workers_seconds: float = WORKERS_SECONDS, stopped: Callable[[], int | None] = lambda: None
              ) -> Iterator[Any]:
    """Yield a Client of ``address`` with at least one worker; closes it (and a local cluster) on exit.

    ``stopped``: the signal number of a stop request (SIGINT, SIGTERM...) or None; polled during every
    wait, which then ends with ``Interrupted`` (exit 128 + the signal).
    """
    distributed = import_distributed()
    from memtrain.cluster import memory

    with contextlib.ExitStack() as stack:
        stack.enter_context(_quiet("distributed"))
        if address.local:
            cluster = stack.enter_context(_local_cluster(distributed, address.local_workers, stopped))
            client = stack.enter_context(distributed.Client(cluster, timeout=connect_seconds, direct_to_workers=True))
        else:
            client = stack.enter_context(_client(distributed, address.text, connect_seconds, stopped))
        memory.register(client)
        _wait_for_a_worker(client, address, workers_seconds, stopped)
        yield client


@contextlib.contextmanager
def _local_cluster(distributed: Any, workers: int, stopped: Callable[[], int | None]) -> Iterator[Any]:
    """A Dask LocalCluster of ``workers`` processes on loopback, one thread each, in a scratch directory of its own.

    Dask's default scratch space (``dask-scratch-space`` in the temporary directory) is shared by every Dask
    process of the machine: each scheduler and worker takes its global lock (blocking) to make its directory and
    first deletes the directories left by killed processes. Another user's process holding that lock, or a purge
    of large leftovers, held ``local:N`` up for as long (measured: 40 s behind a lock held 40 s, SIGTERM
    ignored meanwhile). A private directory, removed on exit, waits for no one else. The start is bounded
    and ends at a stop request, as every other wait of the connection.
    """
    import dask

    scratch = tempfile.mkdtemp(prefix="memtrain-dask-")

    def start() -> Any:
        # the scheduler's and the nannies' directories; Dask's background turned down (dask_settings.py)
        with dask.config.set({"temporary-directory": scratch}), configured():
            return distributed.LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address=None, silence_logs=logging.ERROR, local_directory=scratch,
                # no dashboard, but Dask still serves health checks over HTTP: on loopback, on free ports
                # (older releases bind the workers' on every interface unless told an address)
                scheduler_kwargs={"dashboard_address": "127.0.0.1:0"}, worker_dashboard_address="127.0.0.1:0")

    try:
        cluster = bounded(start, seconds=LOCAL_START_SECONDS, stopped=stopped,
                          doing=f"starting {workers} local Dask worker(s)", late=lambda cluster: cluster.close(),
                          timeout_error=MemtrainError(f"{workers} local Dask worker(s) did not start within "
                                                      f"{LOCAL_START_SECONDS:g} s",
                                                      hint="the machine may be out of memory or processes; "
                                                           "try fewer workers (local:1) or run without --cluster"))
        with slower_heartbeats(), cluster:  # its scheduler runs in this process
            yield cluster
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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


def check_scheduler(address: ClusterAddress, *, seconds: float = CONNECT_SECONDS,
                    stopped: Callable[[], int | None] = lambda: None) -> None:
    """Refuse an address where no Dask scheduler answers, with one handshake and nothing else (no client, no
    worker): called before a run writes anything, so a wrong address leaves nothing behind. ``local:N``: nothing
    to check (memtrain starts that cluster itself)."""
    if address.slurm:
        raise InputError(f"run.cluster = {address.text!r} is launched by `memtrain train`, in the tasks of srun",
                         hint="srun memtrain train JOB.toml --cluster slurm (docs/cluster.md)")
    if address.local:
        return
    import_distributed()
    with _quiet("distributed"):
        _probe(address.text, seconds, stopped)


def _probe(address: str, seconds: float, stopped: Callable[[], int | None]) -> None:
    """One Dask handshake with ``address`` on an event loop of its own, bounded inside that loop as well.

    Done before a Client is made: a Client given up on while it waits for a listener that never answers
    keeps its thread inside Dask's process-wide loop machinery, and the next Client of the same process
    (an API user's retry, the next test) then waited 120 s or failed to start its loop."""
    from distributed.comm import connect as dask_connect

    async def handshake() -> None:
        comm = await asyncio.wait_for(dask_connect(address, timeout=seconds), seconds + min(seconds, HANDSHAKE_GRACE))
        await comm.close()

    _handshake(lambda: asyncio.run(handshake()), address, seconds, stopped, late=lambda _: None)


def _handshake(call: Callable[[], T], address: str, seconds: float, stopped: Callable[[], int | None],
               late: Callable[[T], object]) -> T:
    """``call()`` (a connection to ``address``), bounded: Dask's own timeout covers the TCP connect, not the
    handshake after it, so a listener that never answers (an HTTP server waiting for a request) would hang it
    forever; and one that answers with other bytes has them read as a Dask frame's length (8 bytes of "HTTP/1.1"
    ask for 3 EiB). Either is a clear error naming the address, never a traceback; a stop request ends the wait."""
    unreachable = f"cannot reach the Dask scheduler at {address} within {seconds:g} s"
    hint = "start it (`dask scheduler`) or check the address, port and firewall"
    try:
        return bounded(call, seconds=seconds + min(seconds, HANDSHAKE_GRACE), stopped=stopped,
                       doing=f"connecting to {address}", late=late,
                       timeout_error=MemtrainError(unreachable, found="no Dask handshake: something that is not "
                                                   "a Dask scheduler answers there, or nothing does", hint=hint))
    except (OSError, TimeoutError) as exc:
        raise MemtrainError(unreachable, found=_first_line(exc), hint=hint) from None
    except MemtrainError:  # a stop request, memtrain's own
        raise
    except Exception as exc:  # noqa: BLE001 - whatever Dask makes of bytes that are not its protocol
        raise MemtrainError(f"the listener at {address} did not answer as a Dask scheduler",
                            found=f"a reply Dask cannot read, {type(exc).__name__}: {_first_line(exc)}",
                            hint="check the address and port: a scheduler's (default 8786), not its dashboard's "
                                 "(8787) or another server's") from None


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


@contextlib.contextmanager
def _client(distributed: Any, address: str, seconds: float, stopped: Callable[[], int | None]) -> Iterator[Any]:
    _probe(address, seconds, stopped)
    client = _handshake(lambda: distributed.Client(address, timeout=seconds, direct_to_workers=True), address,
                        seconds, stopped, late=lambda client: client.close(timeout=5))
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):  # a lost scheduler must not hide the error that ended the run
            bounded(lambda: client.close(timeout=5), seconds=CLOSE_SECONDS, stopped=lambda: None,
                    doing="disconnecting", timeout_error=MemtrainError("the Dask client did not close"))


def _wait_for_a_worker(client: Any, address: ClusterAddress, seconds: float, stopped: Callable[[], int | None]
                       ) -> None:
    no_workers = MemtrainError(f"the Dask scheduler at {address.text} has no workers after {seconds:g} s",
                               hint="start workers with `dask worker " + address.text + "` (docs/cluster.md)")
    try:
        bounded(lambda: client.wait_for_workers(1, timeout=seconds), seconds=seconds + min(seconds, HANDSHAKE_GRACE),
                stopped=stopped, doing=f"waiting for a worker of {address.text}", timeout_error=no_workers)
    except TimeoutError:
        raise no_workers from None


def bounded(call: Callable[[], T], *, seconds: float, stopped: Callable[[], int | None], doing: str,
            timeout_error: MemtrainError, late: Callable[[T], object] | None = None) -> T:
    """``call()`` run in a daemon thread, waited for at most ``seconds`` and only while ``stopped()`` is None.

    For a library call that may block beyond its own timeout: past the bound, ``timeout_error`` is raised;
    on a stop request, ``Interrupted`` (exit 128 + the signal). The thread is left behind (a daemon: it never
    holds up the exit), and whatever it returns after being given up on goes to ``late`` (to close it).
    Exceptions of ``call`` are raised here.
    """
    outcome: dict[str, Any] = {}
    finished, lock = threading.Event(), threading.Lock()

    def run() -> None:
        try:
            value, error = call(), None
        except BaseException as exc:  # handed over to the waiting thread, which raises it
            value, error = None, exc
        with lock:
            abandoned = outcome.get("abandoned", False)
            outcome.update(value=value, error=error)
            finished.set()
        if abandoned and error is None and late is not None:
            with contextlib.suppress(Exception):
                late(value)

    threading.Thread(target=run, name=f"memtrain: {doing}", daemon=True).start()
    deadline = time.monotonic() + seconds
    while not finished.wait(POLL_SECONDS):
        signum = stopped()
        if signum is None and time.monotonic() < deadline:
            continue
        with lock:
            if finished.is_set():
                break
            outcome["abandoned"] = True
        if signum is not None:
            error = Interrupted(f"stopped by {signal.Signals(signum).name} while {doing}",
                                hint="nothing was trained meanwhile; run the same command (with --resume) again")
            error.exit_code = 128 + signum
            raise error
        raise timeout_error
    if outcome["error"] is not None:
        raise outcome["error"]
    return outcome["value"]
