"""A jobs folder -> its life cycle on disk: safety checks, the one-service lock, claims and archives.

``DIR/NAME.toml`` is queued; claiming renames it to ``DIR/running/`` (the rename is the claim: of two
claimers, the loser gets FileNotFoundError); a finished job moves on to ``done/`` or ``failed/`` beside
``NAME.result.json``. Names come from memtrain.layout.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from memtrain.errors import InputError, MemtrainError
from memtrain.files import LockHeld, open_regular, read_json, sweep_orphans, take_pid_lock, write_json
from memtrain.layout import (
    SPOOL_DONE,
    SPOOL_FAILED,
    SPOOL_LOCK,
    SPOOL_LOGS,
    SPOOL_RUNNING,
    SPOOL_STATUS,
    spool_archive_name,
    spool_job_file,
    spool_job_name,
    spool_log_file,
    spool_result_file,
    spool_state_file,
)

# Group- or world-writable: someone else could drop a job file, and a job names code to import.
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
SUBFOLDERS = (SPOOL_RUNNING, SPOOL_DONE, SPOOL_FAILED, SPOOL_LOGS)


@dataclass(frozen=True)
class Spool:
    """The paths of one jobs folder. ``Spool(Path("jobs")).running / "a.toml"``."""

    folder: Path

    @property
    def running(self) -> Path:
        return self.folder / SPOOL_RUNNING

    @property
    def done(self) -> Path:
        return self.folder / SPOOL_DONE

    @property
    def failed(self) -> Path:
        return self.folder / SPOOL_FAILED

    @property
    def logs(self) -> Path:
        return self.folder / SPOOL_LOGS

    @property
    def status_file(self) -> Path:
        return self.folder / SPOOL_STATUS

    def log(self, name: str) -> Path:
        return self.logs / spool_log_file(name)

    def state_file(self, name: str) -> Path:
        return self.running / spool_state_file(name)

    def queued(self) -> list[Path]:
        """Job files waiting in the folder, in order of arrival (modification time, then name)."""
        return job_files(self.folder)

    def claimed(self) -> list[Path]:
        """Job files in running/, oldest claim first."""
        return job_files(self.running)


def open_spool(folder: Path) -> Spool:
    """Check that ``folder`` is safe to watch, create its subfolders, and return it (InputError if not)."""
    folder = Path(os.path.realpath(folder))
    if not folder.is_dir():
        raise InputError("the jobs folder does not exist", path=folder,
                         hint=f"create it with: mkdir -m 755 {folder}")
    check_private(folder)
    for name in SUBFOLDERS:
        sub = folder / name
        with contextlib.suppress(FileExistsError):
            sub.mkdir(mode=0o755)
        check_private(sub)
    return Spool(folder)


def check_private(path: Path, *, role: str = "watch a folder",
                  why: str = "could drop job files, and a job can name Python code to import",
                  file_ok: bool = False) -> None:
    """Refuse a folder (``file_ok``: or a file) that another user can write to, or that is owned by another user.

    The one rule for everything a service trusts: the jobs folder and its subfolders (``role`` "watch a
    folder") and every folder and module file a job's code can be imported from (``check_code``). ``why``
    says what someone who can write there could do.
    """
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not (stat.S_ISDIR(info.st_mode) or file_ok and stat.S_ISREG(info.st_mode)):
        raise InputError(f"expected a directory{' or a file' if file_ok else ''} (not a symbolic link or a "
                         f"{'device' if file_ok else 'file'})", path=path)
    if info.st_uid != os.geteuid():
        raise InputError(f"refusing to {role} owned by another user: its owner {why}", path=path,
                         expected=f"owner uid {os.geteuid()}", found=f"owner uid {info.st_uid}")
    if info.st_mode & OTHERS_WRITE:
        raise InputError(f"refusing to {role} that other users can write to: they {why}", path=path,
                         expected="no group/other write permission", found=stat.filemode(info.st_mode),
                         hint=f"chmod go-w {path}")
    _check_parents(path)


def check_code(folders: list[Path], modules: list[str]) -> None:
    """Apply ``check_private`` to every folder code can be imported from and, below each, to every package
    folder and module file that ``modules`` (dotted names) can be found at. InputError naming the first.
    A folder that does not exist holds no code (the import then fails naming the module)."""
    for root in (folder for folder in folders if os.path.lexists(folder)):
        check_private(root, role="import code from a folder", why="could change the code a job runs")
        for module in modules:
            folder = root
            for part in module.split("."):
                for candidate in (folder / part, folder / f"{part}.py"):
                    if os.path.lexists(candidate):
                        check_private(candidate, role="import code from a folder or file",
                                      why="could change the code a job runs", file_ok=True)
                folder = folder / part


def _check_parents(folder: Path) -> None:
    """A world-writable parent without the sticky bit lets anyone rename the folder away and replace it."""
    for parent in folder.parents:
        mode = os.stat(parent).st_mode
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            raise InputError(f"refusing {folder} inside a world-writable directory (no sticky bit): anyone "
                             "could replace it", path=parent, found=stat.filemode(mode),
                             hint=f"chmod o-w {parent}, or move {folder.name}")


def lock_spool(spool: Spool) -> IO[str]:
    """Take the one-service lock (``flock`` on DIR/.lock, dropped by the kernel when we die)."""
    try:
        return take_pid_lock(spool.folder / SPOOL_LOCK)
    except LockHeld as held:
        raise InputError("another memtrain serve is already watching this folder", path=spool.folder,
                         found=f"lock {SPOOL_LOCK} held by pid {held.owner}",
                         hint="stop it first, or see its jobs with: memtrain serve --status") from None


def service_alive(spool: Spool) -> bool:
    """True while a service holds the folder's lock."""
    try:
        with open_regular(spool.folder / SPOOL_LOCK, text=True) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False
    except FileNotFoundError:
        return False


def claim(spool: Spool, path: Path) -> Path | None:
    """Move a queued job file into running/; None if someone else got it first or the name is busy."""
    name = spool_job_name(path.name)
    assert name is not None, path
    target = spool.running / spool_job_file(name)
    if os.path.lexists(target) or spool.state_file(name).is_file():
        return None  # a job of the same name is running: this one waits for it
    try:
        os.rename(path, target)
    except FileNotFoundError:
        return None
    return target


def archive(spool: Spool, path: Path, outcome: str, result: dict[str, Any]) -> Path:
    """Move a job file to done/ or failed/ with its result record; never overwrites an earlier record."""
    folder = spool.done if outcome == "done" else spool.failed
    name = spool_job_name(path.name) or path.name
    stem = _free_stem(folder, name)
    write_json(folder / spool_result_file(stem), {**result, "name": name, "state": outcome,
                                                   "file": str(folder / spool_job_file(stem))}, durable=True)
    with contextlib.suppress(FileNotFoundError):
        os.rename(path, folder / spool_job_file(stem))
    if path.parent == spool.running:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):  # a directory is not our record
            spool.state_file(name).unlink()
    return folder / spool_job_file(stem)


def _free_stem(folder: Path, name: str) -> str:
    index = 0
    while True:
        stem = spool_archive_name(name, index)
        if not (folder / spool_job_file(stem)).exists() and not (folder / spool_result_file(stem)).exists():
            return stem
        index += 1


def read_state(spool: Spool, name: str) -> dict[str, Any]:
    """The claim record of a job in running/ (empty if it was never written or is unreadable)."""
    try:
        state = read_json(spool.state_file(name), what="claim record")
    except MemtrainError:
        return {}
    return state if isinstance(state, dict) else {}


def write_state(spool: Spool, name: str, state: dict[str, Any]) -> None:
    write_json(spool.state_file(name), state, durable=True)


def sweep_claim_records(spool: Spool) -> None:
    """Remove claim records whose job file is gone (a crash between archiving a job and this cleanup), and
    the temporary files of records that a service killed while writing them left behind."""
    for folder in (spool.folder, spool.running, spool.done, spool.failed):
        sweep_orphans(folder, _record_name)
    claimed = {spool_state_file(spool_job_name(path.name) or path.name) for path in spool.claimed()}
    for file_name in os.listdir(spool.running):
        path = spool.running / file_name
        if file_name.endswith(spool_state_file("")) and file_name not in claimed and not path.is_dir():
            path.unlink(missing_ok=True)  # (a directory of that name is not a record the service wrote)


def _record_name(name: str) -> bool:
    """The names of the records a service writes (by rename): status.json, NAME.state.json, NAME.result.json."""
    return name == SPOOL_STATUS or name.endswith((spool_state_file(""), spool_result_file("")))


def results(folder: Path, newest: int) -> tuple[int, list[dict[str, Any]]]:
    """How many result records ``folder`` holds, and the newest ``newest`` of them."""
    files = [folder / name for name in os.listdir(folder) if name.endswith(spool_result_file(""))] \
        if folder.is_dir() else []
    stamped = []
    for path in files:
        with contextlib.suppress(OSError):
            stamped.append((path.stat().st_mtime, path))
    stamped.sort(reverse=True)
    records = []
    for _, path in stamped[:newest]:
        with contextlib.suppress(MemtrainError):
            record = read_json(path, what="result record")
            if isinstance(record, dict):
                records.append(record)
    return len(files), records


def job_files(folder: Path) -> list[Path]:
    """The job files directly in ``folder``, oldest first (modification time, then name)."""
    entries = []
    with contextlib.suppress(FileNotFoundError), os.scandir(folder) as scan:
        for entry in scan:
            if spool_job_name(entry.name) is not None:
                with contextlib.suppress(OSError):
                    entries.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.name))
    return [folder / name for _, name in sorted(entries)]
