"""A job's model, built once in a short child process -> its outline: shapes, version 0, the start-up note.

When workers compute every gradient (``train.workers`` a count, one machine), the server only steps and
publishes a flat vector: it needs the model's parameter layout, its version 0 and the verdict of its dry
run on two training rows (``context.startup_check``), never the model itself. A model that says
``outlined = True`` (a torch module: importing torch costs the process about 0.5 GB of PSS and seconds of
start-up) is then built in a spawned child that sends those three back and exits; the server holds a
``ModelOutline`` in its place and never imports the framework. Version 0 is the child's ``model.init``
for the job's seed, so its bits are the in-server ones (tests/test_goldens.py).

With ``train.workers = "auto"`` (the rounds would run in the server; train/server/placement.py) the child is kept
(``keep``): it prepares itself as a worker does before it builds the model, and once it has sent the outline
it waits for the run's ``WorkerSetup`` and becomes the run's first worker (``KeptWorker``, adopted by
train/server/exchange.py's ``WorkerPool``), so the module is built once, in that worker, and the server computes
nothing. A kept child that is never adopted (the run failed before its rounds) is told to exit (``release``).

What crosses the pipe: the shapes and the note as small Python values, version 0 as raw float32 bytes
(``send_bytes``), an error as its fields. Nothing is read back from disk.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from memtrain.dataset import Dataset
from memtrain.errors import InputError, MemtrainError
from memtrain.models.params import ParamLayout
from memtrain.models.registry import CODE_DIR, code_on_path, model_class
from memtrain.models.torch_module import seed_of
from memtrain.train.context import ModelContext, data_spec, job_target_scale, model_context
from memtrain.train.normalize import Normalizer
from memtrain.train.plan import in_rounds
from memtrain.train.worker.launch import exit_at_once, script_not_rerun

if TYPE_CHECKING:
    from collections.abc import Callable
    from multiprocessing.connection import Connection

START_METHOD = "spawn"  # as the workers (train/server/exchange.py): never fork a server that may hold threads


@dataclass(kw_only=True)
class KeptWorker:
    """A kept outline child, waiting for its ``WorkerSetup``: its process and the server's ends of its pipes."""

    process: Any
    inbox: Connection  # the server's end of the pipe the child reads
    outbox: Connection  # the server's end of the pipe the child answers on


class ModelOutline:
    """A model's stand-in in a server that never computes with it: shapes, version 0 for one seed, the
    start-up note. Asked to compute, it fails loudly (a bug in the placement, never a silent wrong answer)."""

    additive: ClassVar[bool] = False

    def __init__(self, *, kind: str, shapes: dict[str, tuple[int, ...]], buffers: dict[str, tuple[int, ...]],
                 seed: int, version0: np.ndarray | None, note: str | None,
                 fetch_version0: Callable[[], np.ndarray], build_seconds: float = 0.0,
                 kept: KeptWorker | None = None):
        self.kind, self.shapes, self.buffers, self.seed = kind, shapes, buffers, seed
        self.version0, self.note, self.fetch_version0 = version0, note, fetch_version0
        self.build_seconds = build_seconds  # the child's CPU seconds to build the model, torch's import included
        self.kept = kept

    def adopt(self) -> KeptWorker | None:
        """The kept child, handed over once (to the run's first worker slot); None if not kept or taken."""
        kept, self.kept = self.kept, None
        return kept

    def release(self) -> None:
        """Tell a kept child that was never adopted to exit (its inbox closed), and wait for it."""
        kept = self.adopt()
        if kept is None:
            return
        for end in (kept.inbox, kept.outbox):
            end.close()
        kept.process.join(timeout=5)
        if kept.process.is_alive():
            kept.process.kill()
            kept.process.join()

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.shapes)

    def buffer_shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.buffers)

    def init(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        if seed_of(rng) != self.seed:
            raise AssertionError(f"the outline of model {self.kind!r} holds version 0 for seed {self.seed}, "
                                 f"not {seed_of(rng)}")
        flat, self.version0 = self.version0, None  # held until now only: a resumed run never asks for it
        if flat is None:  # a resume that found nothing to resume starts afresh: built again
            flat = self.fetch_version0()
        return ParamLayout.from_shapes(self.shapes, self.buffers).views(flat)

    def startup(self, x: np.ndarray, y: np.ndarray, threads: int) -> str | None:
        """The child ran the dry run on the same rows (``context.startup_check``): its note."""
        return self.note

    def loss(self, params: Any, x: Any, y: Any) -> float:
        raise AssertionError(f"model {self.kind!r} is only outlined in the server: its workers compute")

    predict = loss_and_grad = loss


def outline_model(*, dataset: str, kind: str, options: dict[str, Any], normalize: bool, seed: int,
                  threads: int, version0: bool = True, keep: bool = False) -> ModelOutline:
    """Build the model in a spawned child and return its outline; the child's errors are raised here as they
    were raised there (an InputError from the factory or the dry run exits 2). ``version0`` False: a resume,
    which needs no version 0 (the outline builds it again if asked after all). ``keep``: the child stays,
    to become the run's first worker (``ModelOutline.adopt``; ``release`` if it never does)."""
    import multiprocessing

    settings = {"dataset": dataset, "kind": kind, "options": options, "normalize": normalize, "seed": seed,
                "threads": threads}
    context = multiprocessing.get_context(START_METHOD)
    receive, send = context.Pipe(duplex=False)
    orders, order = context.Pipe(duplex=False) if keep else (None, None)
    child = context.Process(target=_child, args=(send, dataset, kind, options, normalize, seed, threads, version0,
                                                 orders, os.getpid()),
                            name="memtrain-worker-0" if keep else "memtrain-outline", daemon=True)
    with script_not_rerun(kind):
        child.start()
    send.close()
    if orders is not None:
        orders.close()
    kept = None
    try:
        try:
            answer = receive.recv()
            if answer[0] != "ok":
                raise _error(answer)
            _, shapes, buffers, note, build_seconds = answer
            size = ParamLayout.from_shapes(shapes, buffers).size
            flat = np.empty(size, dtype=np.float32) if version0 else None
            if flat is not None and size:
                receive.recv_bytes_into(flat)
        except (EOFError, OSError) as exc:
            child.join(timeout=5)
            raise MemtrainError(f"the process that builds model {kind!r} for the server ended without an answer "
                                f"(exit code {child.exitcode})",
                                hint="run with train.workers = 0 to build it in the server and see why") from exc
        if keep:
            kept = KeptWorker(process=child, inbox=order, outbox=receive)
    finally:
        if kept is None:
            _end_child(child, receive, order)
    return ModelOutline(kind=kind, shapes=shapes, buffers=buffers, seed=seed, version0=flat, note=note,
                        fetch_version0=lambda: outline_model(**settings).version0, build_seconds=build_seconds,
                        kept=kept)


def _end_child(child: Any, receive: Connection, order: Connection | None) -> None:
    for end in (receive, order):
        if end is not None:
            end.close()
    if child.is_alive():
        child.join(timeout=5)
    if child.is_alive():
        child.kill()
        child.join()


def _error(answer: tuple[Any, ...]) -> MemtrainError:
    if answer[0] == "error":
        _, input_error, fields = answer
        return (InputError if input_error else MemtrainError)(**fields)
    return MemtrainError(f"building the model failed in the process that outlines it: {answer[1]}")


def _child(send: Connection, dataset: str, kind: str, options: dict[str, Any], normalize: bool, seed: int,
           threads: int, version0: bool, orders: Connection | None, server_pid: int) -> None:
    """Build the model and send its outline; kept (``orders`` given), then serve as a worker with it."""
    if orders is None:
        try:
            _outline(send, dataset, kind, options, normalize, seed, threads, version0)
        finally:
            with contextlib.suppress(OSError):
                send.close()
        exit_at_once()
    from threadpoolctl import threadpool_limits

    from memtrain.train.worker.worker import become_worker, release_freed_memory

    become_worker(server_pid, threads)  # as a worker prepares itself before it builds its model
    with threadpool_limits(limits=threads):
        built = _outline(send, dataset, kind, options, normalize, seed, threads, version0)
        if built is not None:
            release_freed_memory()  # the outline's garbage, kept by the worker's allocator policy: not a worker's
            _serve_when_adopted(orders, send, *built)
    exit_at_once()


def _outline(send: Connection, dataset: str, kind: str, options: dict[str, Any], normalize: bool, seed: int,
             threads: int, version0: bool) -> tuple[Any, Any] | None:
    """Build the model, send the outline; the dataset and model context built (None after an error)."""
    from memtrain.dataset import open_dataset
    from memtrain.train.context import model_context, startup_check

    try:
        opened = open_dataset(dataset)
        context = model_context(opened, kind, options, normalize)
        model = context.model
        shapes = model.parameter_shapes()  # before the dry run: a torch module is left unbound by it
        buffers = model.buffer_shapes() if hasattr(model, "buffer_shapes") else {}
        flat = context.layout.flatten(model.init(np.random.default_rng(seed))) if version0 else None
        note = startup_check(context, opened, threads)
        send.send(("ok", {k: tuple(v) for k, v in shapes.items()}, {k: tuple(v) for k, v in buffers.items()}, note,
                   context.build_seconds))
        if flat is not None and flat.size:
            send.send_bytes(memoryview(np.ascontiguousarray(flat, dtype=np.float32)).cast("B"))
        return opened, context
    except MemtrainError as exc:
        fields = {key: value if value is None or isinstance(value, (int, float)) else str(value)
                  for key, value in asdict(exc).items()}
        send.send(("error", isinstance(exc, InputError), fields))
    except BaseException:  # noqa: BLE001 - reported to the server whole, whatever it was
        send.send(("crash", traceback.format_exc(limit=5)))
    return None


def _serve_when_adopted(orders: Connection, send: Connection, dataset: Any, context: Any) -> None:
    """Wait for the run's ``WorkerSetup`` (nothing, when the run never adopts it: exit), then serve the run as
    its first worker with the dataset and model built for the outline."""
    from memtrain.train.messages import WorkerSetup
    from memtrain.train.worker.worker import WorkerState, exit_if_orphaned, serve, start

    try:
        setup = orders.recv()
    except (EOFError, OSError):
        return
    if not isinstance(setup, WorkerSetup):
        return
    state = start(lambda: WorkerState(setup, alive=lambda: exit_if_orphaned(setup.server_pid), dataset=dataset,
                                      context=context), send)
    serve(state, orders, send)


def server_context(dataset: Dataset, job: Any, *, resuming: bool = False, replaying: bool = False,
                   cores: int = 1) -> ModelContext:
    """The server's model context: the model itself, or (workers compute every gradient and the model asks
    for it, a torch module) its outline, built in a short child process (train/server/outline.py), so that the
    server never imports the framework. ``train.workers = "auto"`` outlines it too when the rounds it would
    run in the server can run on one worker instead (``auto_outlined``): the child is then kept, to become
    that worker. ``resuming``: a resume, which needs no version 0 from the outline; ``replaying``: a replay
    (the server's own engine); ``cores``: the machine's."""
    kind, options = job.model.kind, job.model.options
    workers = job.train.workers
    keep = workers == "auto" and auto_outlined(job, replaying=replaying, cores=cores)
    fixed = not isinstance(workers, str) and workers >= 1
    if not (fixed or keep) or job.run.cluster or not outlined(kind, options):
        return model_context(dataset, kind, options, job.data.normalize, job_target_scale(dataset, job))
    outline = outline_model(dataset=str(dataset.path), kind=kind, options=dict(options),
                            normalize=job.data.normalize, seed=job.train.seed, threads=job.train.blas_threads,
                            version0=not resuming, keep=keep)
    layout = ParamLayout.from_shapes(outline.parameter_shapes(), outline.buffer_shapes())
    return ModelContext(data_spec(dataset.manifest), outline, layout, None,
                        Normalizer.from_stats(dataset.manifest.get("stats"), job.data.normalize), dataset.manifest,
                        outline.build_seconds)


def auto_outlined(job: Any, *, replaying: bool, cores: int) -> bool:
    """Whether ``train.workers = "auto"`` runs the rounds (synchronous, on one machine, not a replay) with two
    or more participants to share an update's tasks: then the server's own rounds can run on one worker."""
    return (not job.run.cluster and in_rounds(job.train, replaying=replaying)
            and min(cores, job.train.tasks_per_update) >= 2)


def outlined(kind: str, options: dict[str, Any]) -> bool:
    """Whether model ``kind`` asks to be outlined in a server that does not compute (``outlined = True``); its
    ``check_installed`` (if any) raises here, in the server, what building it would raise (a missing torch)."""
    with code_on_path(options.get(CODE_DIR)):
        cls = model_class(kind)
    if getattr(cls, "outlined", False) is not True:
        return False
    getattr(cls, "check_installed", lambda: None)()
    return True
