"""A job -> its run directory: records, lock, logs, and the exchange area for gradient files.

A new run directory is created complete (its records written under a temporary name, then renamed into
place) or not at all; a resume decides against the records before it writes anything. memtrain deletes
only what it can prove it wrote: its own names in a run it made, and exchange areas that carry its mark.

The run lock is an ``flock`` on ``run.lock``: the kernel drops it when its owner dies, so a crashed run
never blocks the next one. The exchange area holds gradient files and the optimizer's double buffers;
its name carries the owner's pid, so that leftovers of dead runs can be swept without touching live runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from memtrain.config import Job, saved_job
from memtrain.errors import CorruptFileError, InputError, MemtrainError
from memtrain.faults import fault_point
from memtrain.files import (
    LockHeld,
    append_jsonl,
    append_text,
    fsync_dir,
    open_regular,
    pid_alive,
    read_json,
    read_sealed_json,
    seal,
    sweep_orphans,
    take_pid_lock,
    write_sealed_json,
)
from memtrain.layout import (
    CHECKPOINTS_DIR,
    EXCHANGE_PROBE,
    RUN_CSV,
    RUN_EVENTS,
    RUN_FOLDERS,
    RUN_HISTORY,
    RUN_JOB,
    RUN_LINEAGE,
    RUN_LOCK,
    RUN_METRICS,
    RUN_PARAMS,
    RUN_TENSORBOARD,
    STATISTICS_DIR,
    TENSORBOARD_EVENTS,
    WEIGHTS_DIR,
    is_checkpoint_name,
    is_private_name,
    is_version_name,
    numbered_run_dir,
    parse_exchange_owner,
    run_folder,
    tmp_owner_pid,
    tmp_sibling,
    tmp_target,
)
from memtrain.train.exchange.area import make_area, remove_area
from memtrain.train.memory import size_text
from memtrain.train.records.checkpoint import done_epochs
from memtrain.train.records.record import FORMAT as RECORD_FORMAT
from memtrain.train.records.record import Decision, decide, recorded_job, write_records

SHM = Path("/dev/shm")


# Files of a run directory that memtrain rewrites by rename: their temporary names are its own leftovers.
RUN_RECORDS = (RUN_JOB, RUN_PARAMS, RUN_HISTORY, RUN_METRICS, RUN_LINEAGE)


@dataclass
class RunDir:
    path: Path
    exchange: Path
    lock: IO[str]
    decision: Decision | None = None  # a resume: the changes it was allowed to make; None for a new run

    def event(self, text: str) -> None:
        log_event(self.path, text)

    def metric(self, *records: dict[str, Any]) -> None:
        append_jsonl(self.path / RUN_METRICS, *records)

    def lineage(self, *records: dict[str, Any], native: bool = False) -> None:
        """Append lineage records, each sealed (a torn or edited line is found when it is read); ``native``:
        the records are plain JSON values already (``files.json_checksum``)."""
        append_jsonl(self.path / RUN_LINEAGE, *(seal(record, native=native) for record in records))

    def close(self) -> None:
        remove_area(self.exchange)
        fcntl.flock(self.lock, fcntl.LOCK_UN)
        self.lock.close()


def acquire_lock(path: Path) -> IO[str]:
    try:
        return take_pid_lock(path / RUN_LOCK)
    except LockHeld as held:
        raise InputError("another memtrain train is using this run directory", path=path,
                         found=f"lock held by pid {held.owner}",
                         hint=f"wait for it to finish (then `memtrain train --resume {path}` continues it), or "
                              "choose another run directory with --run-dir") from None


def sweep_leftovers(run_dir: Path, exchange_parents: list[Path]) -> list[Path]:
    """Remove temporary files of memtrain's own names in the run (we hold its lock), and exchange areas
    (marked as memtrain's) and exchange probes whose owner is dead. ``notes.tmp-1-x`` or a user's
    ``memtrain-x-*`` stay."""
    removed = []
    def weights_temporary(target: str) -> bool:  # a version being written, or a ring file of the server's rounds
        return is_version_name(target) or is_private_name(target)

    for folder, ours in ((run_dir / WEIGHTS_DIR, weights_temporary), (run_dir, RUN_RECORDS.__contains__)):
        if folder.is_dir():
            for name in os.listdir(folder):
                target = tmp_target(name)
                if target is not None and ours(target) and (folder / name).is_file():
                    (folder / name).unlink(missing_ok=True)
                    removed.append(folder / name)
    for parent in exchange_parents:
        removed += sweep_orphans(parent, EXCHANGE_PROBE.__eq__)  # an older version's server killed while
        # it timed this folder (until issue 32, a 16 MiB probe was timed in each candidate)
        with contextlib.suppress(OSError):
            for name in os.listdir(parent):
                owner = parse_exchange_owner(name)
                if owner is not None and not pid_alive(owner) and remove_area(parent / name):
                    removed.append(parent / name)
    return removed


def exchange_candidates(job: Job) -> list[Path]:
    run_parent = job.run.dir
    choice = job.run.exchange
    if choice == "shm":
        return [SHM]
    if choice == "run":
        return [run_parent]
    if choice != "auto":
        return [Path(choice)]
    if job.run.cluster and not job.run.cluster.startswith("local:"):
        return [run_parent]  # other machines must see it: /dev/shm is this machine's memory
    return [SHM, run_parent] if SHM.is_dir() and os.access(SHM, os.W_OK) else [run_parent]


def choose_exchange(job: Job, need_bytes: int, log: Any, run_bytes: int = 0) -> Path:
    """Pick the exchange parent: the first candidate with room for ``need_bytes`` (``exchange_candidates``
    puts ``/dev/shm`` before the run's filesystem).

    The exchange's buffers are made once and rewritten by every update; nothing in them needs a disk. In
    ``/dev/shm`` (tmpfs) their pages stay in memory; on a disk's filesystem the kernel also writes them back
    (every 30 s by default) and write-protects them, so the next update faults every page again
    (docs/train.md gives the measurements that chose this order). A candidate on the run directory's
    filesystem must also hold the run's own ``run_bytes``."""
    needs = {}
    run_device = os.stat(job.run.dir).st_dev
    for folder in exchange_candidates(job):
        folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder).free
        needs[folder] = need_bytes + (run_bytes if os.stat(folder).st_dev == run_device else 0)
        if free >= needs[folder]:
            return folder
        log(f"exchange: {folder} has {size_text(free)} free, needs {size_text(needs[folder])}; not used")
    raise MemtrainError("no room for the exchange area (gradient files, statistics and optimizer state)",
                        expected=" or ".join(f"{size_text(n)} free in {f}" for f, n in needs.items()),
                        found=", ".join(f"{f}: {size_text(shutil.disk_usage(f).free)} free" for f in needs),
                        hint="free space, lower train.tasks_per_update or train.workers, or set run.exchange "
                             "to a roomier directory")


def open_run_dir(job: Job, *, resume: bool, need_exchange: int, need_run: int, overwrite: bool = False,
                 layout: dict[str, Any] | None = None, asked: Collection[str] = (), one_pass: bool = False) -> RunDir:
    """Create, replace or reopen the run directory, take its lock, sweep leftovers and set up the exchange area.

    A new run directory is built under a temporary name with its records (``job.json`` first) and renamed
    into place: it exists complete or not at all. A resume decides (``record.decide``) before it writes
    anything. ``layout``: the job's parameter layout (``params.json``); ``asked``: the keys named with
    ``--set``, the only settings a resume may change; ``one_pass``: an additive model (no epochs to add).
    """
    path = job.run.dir
    found = _state(path)
    decision = None
    command = f"memtrain train {job.source or 'JOB.toml'}"
    if found == "foreign":
        raise InputError("the run directory exists and is not a memtrain run (no job.json); memtrain writes "
                         "only into a new or empty directory, or into a run it made", path=path,
                         hint=f"choose another with `{command} --run-dir NEW_DIR`")
    if found == "run":
        check_entries(path)  # before anything is written: a resume's lock, an overwrite's clearing
    if found == "run" and resume:
        decision = _decide(path, job, asked, layout, one_pass)
        lock = acquire_lock(path)
        # again under the lock: another resume may have come first
        decision = _decide(path, job, asked, layout, one_pass)
    elif found == "run" and overwrite:
        _check_owned(path)
        lock = acquire_lock(path)
        _clear_run(path)
        write_records(path, job)
        write_params(path, layout)
    elif found == "run":
        raise InputError("the run directory already exists", path=path,
                         hint=f"resume it with `memtrain train --resume {path}`, replace it with "
                              f"`{command} --run-dir {path} --overwrite`, or choose another with --run-dir")
    else:
        lock = _create(path, job, layout)
    try:
        check_entries(path)
        run = _set_up(job, path, lock, need_exchange, need_run, one_pass)
    except BaseException:
        if decision is None and found != "run":
            _uncreate(path, empty=found == "empty")  # a start refused before it began leaves nothing behind
        lock.close()
        raise
    run.decision = decision
    return run


def beside_earlier(job: Job) -> Job:
    """A new run whose run directory is memtrain's default name (``Job.default_dir``), when something is there
    already: the same job in the first free numbered sibling (``runs/job-2``, ``runs/job-3``, ...). A directory
    the job or the command named is left as it is (refused if taken, unless resumed or overwritten)."""
    path, number = job.run.dir, 2
    if not job.default_dir or not os.path.lexists(path):
        return job
    while os.path.lexists(numbered_run_dir(path, number)):
        number += 1
    return dataclasses.replace(job, run=dataclasses.replace(job.run, dir=numbered_run_dir(path, number)))


def _state(path: Path) -> str:
    """``missing``, ``empty``, ``run`` (it has a job.json) or ``foreign`` (anything else)."""
    if not os.path.lexists(path):
        return "missing"
    if not path.is_dir() or path.is_symlink():
        return "foreign"
    names = os.listdir(path)
    if not names:
        return "empty"
    job = path / RUN_JOB
    return "run" if RUN_JOB in names and job.is_file() and not job.is_symlink() else "foreign"


def _decide(path: Path, job: Job, asked: Collection[str], layout: dict[str, Any] | None,
            one_pass: bool) -> Decision:
    try:
        return decide(path, job, asked, done_epochs=done_epochs(path), layout=layout,
                      recorded_layout=read_params(path), one_pass=one_pass)
    except CorruptFileError as exc:
        raise damaged_record(exc, path, job.source) from None


def damaged_record(exc: CorruptFileError, path: Path, source: Path | None) -> CorruptFileError:
    """A damaged record of a run, with what to do about it: it is never resumed from."""
    exc.hint = exc.hint or (f"the run's records cannot be trusted, so it is not resumed; look at it with "
                            f"`memtrain inspect {path}`, or start it over with "
                            f"`memtrain train {source or 'JOB.toml'} --run-dir {path} --overwrite`")
    return exc


def _create(path: Path, job: Job, layout: dict[str, Any] | None) -> IO[str]:
    """Build the run directory under a temporary name (locked, records first) and rename it to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_creations(path)
    tmp = tmp_sibling(path)
    tmp.mkdir()
    lock = None
    try:
        lock = take_pid_lock(tmp / RUN_LOCK)
        write_records(tmp, job)
        write_params(tmp, layout)
        (tmp / WEIGHTS_DIR).mkdir()
        fsync_dir(tmp)
        fault_point("run_before_commit")
        os.rename(tmp, path)  # replaces a missing or empty directory, atomically; refuses anything else
        fsync_dir(path.parent)
    except BaseException as exc:
        if lock is not None:
            lock.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise InputError("the run directory appeared while this run was being created", path=path,
                             hint=f"resume it with `memtrain train --resume {path}`, or choose another with "
                                  "--run-dir") from None
        if isinstance(exc, OSError):
            raise MemtrainError(f"cannot create the run directory: {exc.strerror or exc}", path=path) from exc
        raise
    return lock


def _uncreate(path: Path, *, empty: bool) -> None:
    """Remove a run directory this very call created (we hold its lock): renamed out of sight first.

    ``empty``: it replaced an empty directory, which is put back."""
    with contextlib.suppress(OSError):
        doomed = tmp_sibling(path)
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        if empty:
            path.mkdir()


def _sweep_creations(path: Path) -> None:
    """Remove ``.NAME.tmp-PID-*`` siblings of ``path`` left by a creation that died: only ones whose owner is
    dead and that hold nothing but a new run's records."""
    for name in os.listdir(path.parent):
        if tmp_target(name) != path.name or pid_alive(tmp_owner_pid(name) or 0):
            continue
        folder = path.parent / name
        with contextlib.suppress(OSError):
            if not folder.is_symlink() and folder.is_dir() and all(
                    _record_name(entry) for entry in os.listdir(folder)):
                shutil.rmtree(folder)


def _record_name(name: str) -> bool:
    name = tmp_target(name) or name
    return name in (RUN_JOB, RUN_HISTORY, RUN_PARAMS, RUN_LOCK, WEIGHTS_DIR)


def _check_owned(path: Path) -> None:
    """``--overwrite`` replaces only a directory that proves it is a memtrain run: its job.json says so."""
    try:
        record = read_json(path / RUN_JOB, what="the run's job record")
    except MemtrainError:
        record = None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise InputError("refusing to overwrite: its job.json is not a memtrain job record", path=path,
                         hint="choose another run directory with --run-dir NEW_DIR")


def _clear_run(path: Path) -> None:
    """Delete what memtrain wrote in a run (by its names), oldest products first and the records last;
    anything else in the directory is left where it is."""
    for name in os.listdir(path / CHECKPOINTS_DIR) if (path / CHECKPOINTS_DIR).is_dir() else ():
        if is_checkpoint_name(tmp_target(name) or name):
            shutil.rmtree(path / CHECKPOINTS_DIR / name, ignore_errors=True)
    for name in os.listdir(path / WEIGHTS_DIR) if (path / WEIGHTS_DIR).is_dir() else ():
        if is_version_name(tmp_target(name) or name) or is_private_name(tmp_target(name) or ""):
            (path / WEIGHTS_DIR / name).unlink(missing_ok=True)
    shutil.rmtree(path / STATISTICS_DIR, ignore_errors=True)  # an additive pass's partials: all memtrain's
    for name in os.listdir(path):
        target = tmp_target(name) or name
        if target in (RUN_METRICS, RUN_LINEAGE, RUN_EVENTS, RUN_HISTORY, RUN_PARAMS, RUN_CSV) and \
                not (path / name).is_dir():
            (path / name).unlink(missing_ok=True)
        elif name == RUN_TENSORBOARD and (path / name).is_dir() and not (path / name).is_symlink():
            for event_file in os.listdir(path / name):
                if event_file.startswith(TENSORBOARD_EVENTS):
                    (path / name / event_file).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                (path / name).rmdir()
        elif parse_exchange_owner(name) is not None and not pid_alive(parse_exchange_owner(name) or 0):
            remove_area(path / name)
    left = sorted(set(os.listdir(path)) - {RUN_JOB, RUN_LOCK, WEIGHTS_DIR, CHECKPOINTS_DIR})
    if left:
        log_event(path, f"overwrite: left in place (not written by memtrain): {', '.join(left)}")


def check_entries(path: Path) -> None:
    """The one link check of a run directory: every folder memtrain writes into (``layout.RUN_FOLDERS``, all
    of them, whatever this run's job writes) must be a real directory or absent. A symbolic link (or a file)
    there is refused before anything is written: memtrain never writes through a link it did not make, and
    never removes what it did not write. (Its files are safe by construction: published by rename or opened
    with ``O_NOFOLLOW``.)"""
    for name in RUN_FOLDERS:
        folder = run_folder(path, name)
        if folder.is_symlink() or (os.path.lexists(folder) and not folder.is_dir()):
            raise MemtrainError("expected a directory that memtrain made, found "
                                + ("a symbolic link" if folder.is_symlink() else "a file"), path=folder,
                                hint="remove it (memtrain never writes through a link, nor removes what it did "
                                     "not write); memtrain makes the directory again")


def _set_up(job: Job, path: Path, lock: IO[str], need_exchange: int, need_run: int, additive: bool) -> RunDir:
    (path / WEIGHTS_DIR).mkdir(exist_ok=True)
    free = shutil.disk_usage(path).free
    if free < need_run:
        raise MemtrainError("not enough free space for the run's weight versions and checkpoints"
                            + (" (and an additive model's statistics)" if additive else ""), path=path,
                            expected=f"{size_text(need_run)} free", found=f"{size_text(free)} free",
                            hint="free space, lower run.keep_versions or run.keep_checkpoints, or choose "
                                 "another run directory")
    candidates = exchange_candidates(job)
    sweep_leftovers(path, candidates)
    parent = choose_exchange(job, need_exchange, lambda text: log_event(path, text), need_run)
    exchange = make_area(parent, uuid.uuid4().hex[:8])
    run = RunDir(path, exchange, lock)
    run.event(f"exchange area: {exchange}")
    return run


def write_params(folder: Path, layout: dict[str, Any] | None) -> None:
    if layout is not None:
        write_sealed_json(folder / RUN_PARAMS, layout, durable=True)


def read_params(run_dir: Path) -> dict[str, Any] | None:
    """The run's parameter layout (``params.json``, verified), or None if it has none yet."""
    path = run_dir / RUN_PARAMS
    return read_sealed_json(path, what="the run's parameter layout") if path.exists() else None


def log_event(path: Path, text: str) -> None:
    """One timestamped line in the run's event log (never written through a symlink)."""
    append_text(path / RUN_EVENTS, f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")


def run_is_live(path: Path) -> bool:
    """Whether a live ``memtrain train`` holds the run directory's lock (``refuse_live_run`` refuses it)."""
    try:
        refuse_live_run(path)
    except InputError:
        return True
    return False


def refuse_live_run(path: Path) -> None:
    """Refuse, with advice that works, to start in a run directory that a live ``memtrain train`` holds.

    Checked before anything else: the usual advice for an existing run (``--resume``, ``--overwrite``)
    would fail too while its owner runs. Nothing is created or changed.
    """
    try:
        handle = open_regular(path / RUN_LOCK, text=True)
    except (FileNotFoundError, NotADirectoryError):
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = handle.read().strip() or "unknown"
            raise InputError("another memtrain train is using this run directory", path=path,
                             found=f"lock held by pid {owner}",
                             hint=f"wait for it to finish (or stop it: kill -INT {owner}) and then resume it with "
                                  f"`memtrain train --resume {path}`, or start another run with --run-dir NEW_DIR"
                             ) from None
        fcntl.flock(handle, fcntl.LOCK_UN)


def load_saved_job(run_dir: str | os.PathLike[str], overrides: Sequence[str] = (), *,
                   workers: int | None = None, values: Mapping[str, Any] | None = None) -> Job:
    """The job a run directory follows (for ``--resume``): its record with the changes of its history, then
    ``overrides`` such as more epochs. ``run.dir`` is ``run_dir``, wherever the directory has been moved."""
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise InputError("no run directory here", path=run_dir,
                         hint=f"start a run there with `memtrain train JOB.toml --run-dir {run_dir}`")
    try:
        raw = recorded_job(run_dir)
    except CorruptFileError as exc:
        raise damaged_record(exc, run_dir, None) from None
    return saved_job(raw, run_dir, overrides, workers=workers, values=values)
