"""Filesystem events and folder scans -> complete job files, in order of arrival (never a half-written one).

A job file is complete once it is non-empty, parses as TOML, and
- it was renamed into the folder (the convention: write ``NAME.toml.tmp``, then rename), or a writer
  closed it (inotify ``IN_CLOSE_WRITE``) and nothing wrote to it since; or
- it was found by a scan, or the observer cannot see closes (polling), and it has not changed for
  ``settle`` seconds; or
- a writer was seen (created/modified events) but its close was not, and it has not changed for
  ``grace`` seconds (the close event was lost).
A file still empty or not TOML after ``grace`` quiet seconds is rejected, and so at once is a symbolic
link, a FIFO or a file over the size limit. Events can be lost or doubled (watchdog#654, #93), so
events only say *when to look*: every decision is made on ``lstat`` and the bytes themselves.
"""

from __future__ import annotations

import itertools
import os
import queue
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from memtrain.errors import InputError
from memtrain.layout import spool_job_name
from memtrain.serve.admit import MAX_JOB_BYTES, parse_toml, read_job_file
from memtrain.serve.spool import job_files

Signature = tuple[int, int, int]  # size, mtime in ns, inode: any change means "still being written"


@dataclass
class Candidate:
    path: Path
    seq: int  # order of arrival
    sig: Signature | None = None
    changed: float = 0.0  # monotonic time of the last change seen
    writing: bool = False  # a writer was seen and its close was not
    committed: bool = False  # renamed in, or closed after its last write
    settled: bool = False  # complete and handed out; until it changes again
    bad_sig: Signature | None = None  # the version that did not parse, and why
    bad: InputError | None = None


@dataclass(frozen=True)
class Settled:
    path: Path
    content: bytes


@dataclass(frozen=True)
class Rejected:
    path: Path
    error: InputError


class Arrivals:
    """The job files in one folder and how complete each is. ``note`` events, ``poll`` for results."""

    def __init__(self, folder: Path, *, settle: float, grace: float, sees_closes: bool = True):
        self.folder = folder
        self.settle, self.grace, self.sees_closes = settle, grace, sees_closes
        self.candidates: dict[Path, Candidate] = {}
        self._order = itertools.count()

    def note(self, path: Path, kind: str) -> None:
        """An event (``created``, ``modified``, ``closed``, ``moved``, ``deleted``...) or a scan hit."""
        if path.parent != self.folder or spool_job_name(path.name) is None:
            return
        if kind == "deleted":
            self.candidates.pop(path, None)
            return
        candidate = self.candidates.get(path)
        if candidate is None:
            candidate = self.candidates[path] = Candidate(path, next(self._order))
        if kind in ("moved", "closed"):
            candidate.committed, candidate.writing = True, False
        elif kind in ("created", "modified") and self.sees_closes:
            candidate.committed, candidate.writing = False, True

    def scan(self) -> None:
        """Note every job file in the folder (oldest first): events are not needed to see them."""
        for entry in job_files(self.folder):
            self.note(entry, "scan")

    def forget(self, path: Path) -> None:
        self.candidates.pop(path, None)

    def settled(self) -> list[Path]:
        """Complete job files not yet claimed, in order of arrival."""
        return [c.path for c in sorted(self.candidates.values(), key=lambda c: c.seq) if c.settled]

    def poll(self, now: float) -> list[Settled | Rejected]:
        """Look at every pending file once; return the ones that became complete or were rejected."""
        found = []
        for candidate in sorted(self.candidates.values(), key=lambda c: c.seq):
            outcome = self._look(candidate, now)
            if outcome is not None:
                found.append(outcome)
        return found

    def _look(self, c: Candidate, now: float) -> Settled | Rejected | None:
        try:
            info = os.lstat(c.path)
        except FileNotFoundError:
            self.candidates.pop(c.path, None)
            return None
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_JOB_BYTES:
            return self._refuse(c)
        sig = (info.st_size, info.st_mtime_ns, info.st_ino)
        if sig != c.sig:
            c.sig, c.changed, c.settled = sig, now, False
        quiet = now - c.changed
        if c.settled or quiet < self._wait(c):
            return None
        if c.bad_sig != sig:
            outcome = _read_complete(c.path)
            if isinstance(outcome, bytes):
                if _signature(c.path) != sig:
                    return None  # it changed while we read it: look again next time
                c.settled = True
                return Settled(c.path, outcome)
            c.bad_sig, c.bad = sig, outcome
        if quiet >= self.grace:
            self.candidates.pop(c.path, None)
            return Rejected(c.path, c.bad or InputError("the job file is not complete", path=c.path))
        return None

    def _wait(self, c: Candidate) -> float:
        if c.committed:
            return 0.0
        return self.grace if c.writing else self.settle

    def _refuse(self, c: Candidate) -> Rejected | None:
        """A symlink, FIFO, device, directory or oversized file: read_job_file says why."""
        self.candidates.pop(c.path, None)
        try:
            read_job_file(c.path)
        except InputError as exc:
            return Rejected(c.path, exc)
        except FileNotFoundError:
            return None
        return None  # it became a regular file meanwhile: the next scan or event sees it again


def _read_complete(path: Path) -> bytes | InputError:
    """The bytes of ``path`` if it is a complete TOML job file, else why it is not (yet)."""
    try:
        content = read_job_file(path)
    except FileNotFoundError:
        return InputError("the job file disappeared", path=path)
    except InputError as exc:
        return exc
    if not content.strip():
        return InputError("the job file is empty", path=path, hint="write NAME.toml.tmp, then rename it")
    try:
        parse_toml(content, path)
    except InputError as exc:
        return exc
    return content


def _signature(path: Path) -> Signature | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return info.st_size, info.st_mtime_ns, info.st_ino


class _Inbox(FileSystemEventHandler):
    """Runs in the observer thread: only queues ``(kind, path)``; the service loop does the rest."""

    def __init__(self, inbox: queue.SimpleQueue[tuple[str, Path]]):
        self.inbox = inbox

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            return
        src = Path(os.fsdecode(event.src_path)) if event.src_path else None
        if event.event_type == "moved":
            if src is not None:
                self.inbox.put(("deleted", src))
            if event.dest_path:
                self.inbox.put(("moved", Path(os.fsdecode(event.dest_path))))
        elif src is not None:
            self.inbox.put((event.event_type, src))


def start_observer(folder: Path, inbox: queue.SimpleQueue[tuple[str, Path]], *, polling: bool,
                   interval: float, warn: Callable[[str], None]) -> tuple[BaseObserver, bool]:
    """Watch ``folder`` (not its subfolders); returns the observer and whether it reports closed files.

    Falls back to polling when inotify cannot be used (watch or instance limit reached: watchdog#673).
    """
    if not polling:
        observer = Observer()
        try:
            observer.schedule(_Inbox(inbox), str(folder), recursive=False)
            observer.start()
            return observer, type(observer).__name__ == "InotifyObserver"
        except OSError as exc:
            warn(f"cannot watch {folder} with inotify ({exc}); polling every {interval:g} s instead")
    observer = PollingObserver(timeout=interval)
    observer.schedule(_Inbox(inbox), str(folder), recursive=False)
    observer.start()
    return observer, False
