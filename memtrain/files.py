"""Safe file primitives: publish by rename, safe .npy headers and maps, checksums, sealed JSON.

A file written whole goes through ``publish`` (temp name in the same directory, write, optional fsync,
``os.replace``, optional directory fsync) or ``writing_npy`` (the same, for a map filled in place); a
file appended to or locked goes through a descriptor opened with ``O_NOFOLLOW``: memtrain never writes
through a symbolic link it did not make. The other renames are their owners': a dataset or a checkpoint
directory built under a temporary name (prepare/workdir.py, train/records/checkpoint.py), a weight version
written by the slice owners and published by a rename that never replaces (``rename_new``,
train/exchange/weights.py), a job moved between the spool's folders (serve/spool.py), an export
(inspection/export.py). A JSON record that decides what memtrain does
next (a job record, a checkpoint's metadata, a manifest, a lineage line) is *sealed*: it carries the
checksum of its own content, and a reader that finds it damaged never trusts it.

Every ``.npy`` it reads goes through ``open_npy``, which checks the header, the dtype and the exact file
size before mapping, so a truncated file, trailing junk, a pickled object array or a header claiming a huge
shape is an error naming the file, never a SIGBUS, a numpy traceback or an allocation.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import json
import mmap
import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import IO, Any

import numpy as np
import xxhash

from memtrain.errors import CorruptFileError, DiskFullError, InputError, MemtrainError
from memtrain.faults import fault_point
from memtrain.layout import tmp_owner_pid, tmp_sibling, tmp_target

CHECKSUM_ALGO = "xxh3-128"
# Weight versions are written in parallel, each slice owner writing whole blocks of the data: their
# checksum is a hash of per-block hashes, so every owner hashes the blocks it writes while they are
# still in its cache, and nobody reads the file again to checksum it. See ``block_checksum``.
BLOCK_CHECKSUM_ALGO = "xxh3-128-blocks"
CHECKSUM_BLOCK_BYTES = 256 << 10
# 8 MiB: large enough that hashing runs at memory bandwidth, small enough to stay in L3-ish caches.
HASH_CHUNK = 8 << 20
# A header longer than this is not one numpy writes for any real array; refuse it before reading it.
MAX_NPY_HEADER = 1 << 16


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_no_space(exc: OSError) -> bool:
    # np.save on a full disk raises OSError("... requested and ... written") with errno None.
    return exc.errno in (errno.ENOSPC, errno.EDQUOT) or (exc.errno is None and "written" in str(exc))


def reserve(fd: int, size: int, path: Path) -> None:
    """Allocate ``size`` bytes up front: a full disk is then a clean error here, not a SIGBUS in a memmap."""
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            return  # filesystem without fallocate: writes will still raise ENOSPC cleanly
        raise


def no_space_error(path: Path, size: int | None = None) -> DiskFullError:
    try:
        free = shutil.disk_usage(path.parent if not path.is_dir() else path).free
    except OSError:
        free = None
    return DiskFullError(
        "no space left on the device while writing",
        path=path,
        expected=f"{size} bytes free" if size else None,
        found=f"{free} bytes free" if free is not None else None,
        hint="free some space or point the output elsewhere; nothing partial was published",
    )


def publish(path: Path, write: Callable[[IO[bytes]], None], *, durable: bool, size_hint: int = 0) -> None:
    """Write a file under a temporary name, then rename it to ``path`` atomically.

    ``durable`` adds fsync of the file and of its directory (datasets, checkpoints, manifests); files
    that can be recomputed after a crash (weight versions, gradients) skip it. An existing ``path`` keeps
    its old inode, so a process that has it mapped keeps reading the old bytes, never torn ones.
    """
    tmp = tmp_sibling(path)
    created = _create(tmp, path, size_hint)
    with _cleaning_up(tmp, path, size_hint):
        with created as handle:
            reserve(handle.fileno(), size_hint, tmp)
            fault_point("write")
            write(handle)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


AT_FDCWD, RENAME_NOREPLACE = -100, 1  # renameat2(2): paths relative to the working directory; never replace


@functools.cache
def _renameat2() -> Any:
    """libc's renameat2, or None (not Linux, or a libc without it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


def rename_new(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` unless ``dst`` exists (then FileExistsError, and both stay as they were).

    Unlike ``os.replace`` it never replaces a file, so a published name can never be given a second
    content. One system call where the kernel and the filesystem have ``RENAME_NOREPLACE`` (ext4, XFS,
    btrfs, tmpfs); elsewhere a hard link, then the old name dropped: the same outcome in two steps.
    """
    call = _renameat2()
    if call is not None:
        if call(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # not a lack of support: a real failure
            raise FileExistsError(code, os.strerror(code), str(dst)) if code == errno.EEXIST else \
                OSError(code, os.strerror(code), str(src))
    os.link(src, dst)
    os.unlink(src)


def publish_new(path: Path, write: Callable[[IO[bytes]], None], *, durable: bool) -> bool:
    """Write a file under a temporary name, then rename it to ``path`` unless ``path`` exists (``rename_new``):
    whether this one was published. For names several writers may publish with the same bytes (a backup copy of
    a chain's link, two members that both saw a wave complete): the first stays, the others are dropped.
    ``durable`` syncs the file before the rename."""
    tmp = tmp_sibling(path)
    try:
        with open_new(tmp) as handle:
            write(handle)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        rename_new(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


# Flags of every descriptor memtrain writes through: a symbolic link (which memtrain never makes) is
# refused rather than followed out of the directory, and a FIFO cannot block the open.
WRITE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def open_new(path: Path) -> IO[bytes]:
    """Create ``path`` for writing; it must not exist yet (so nothing at that name is followed or clobbered)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | WRITE_FLAGS, 0o644)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "wb")


def open_own(path: Path, flags: int) -> int:
    """A descriptor of the regular file ``path`` (created if ``flags`` say so), never through a symlink.

    A symbolic link, a FIFO, a directory or a device at a name memtrain writes is an error naming it.
    """
    try:
        fd = os.open(path, flags | WRITE_FLAGS, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise MemtrainError("refusing to write through a symbolic link (memtrain never makes one here)",
                                path=path, hint="remove the link; memtrain recreates the file") from exc
        if exc.errno in (errno.ENXIO, errno.EISDIR):
            raise MemtrainError("expected a regular file", path=path, found=_kind(path)) from exc
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise MemtrainError("expected a regular file", path=path, found=file_kind(info.st_mode))
    os.set_blocking(fd, True)
    return fd


def open_reused(path: Path, flags: int = os.O_RDONLY) -> int | None:
    """A descriptor of the file memtrain made at ``path``, to reuse it (recycle, rewrite, map writable), or None.

    Only a regular file with one name, opened without following a link, is reused. Anything else at
    the name -- a symbolic link, a hard link to a file elsewhere, a FIFO, a device -- is removed (the name
    only: a link is removed, never followed) and None returned, so the caller makes a new file. None too
    if nothing is there. A directory is left in place (the caller's write then fails naming it).
    """
    try:
        fd = os.open(path, flags | WRITE_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EOPNOTSUPP):
            raise
        _drop_name(path)
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        _drop_name(path)
        return None
    os.set_blocking(fd, True)
    return fd


def _drop_name(path: Path) -> None:
    """Unlink ``path`` unless it is a directory (unlink never follows a link: only the name goes)."""
    with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)


def _create(tmp: Path, path: Path, size: int) -> IO[bytes]:
    """``open_new(tmp)``, its failure reported for ``path`` (and nothing removed: the name is not ours)."""
    try:
        return open_new(tmp)
    except OSError as exc:
        raise _write_error(exc, path, size) from exc


def _write_error(exc: OSError, path: Path, size: int) -> MemtrainError:
    if is_no_space(exc):
        return no_space_error(path, size)
    return MemtrainError(f"cannot write: {exc.strerror or exc}", path=path)


def _kind(path: Path) -> str:
    try:
        return file_kind(os.lstat(path).st_mode)
    except OSError:
        return "something else"


def append_text(path: Path, text: str) -> None:
    """Append ``text`` to the regular file ``path`` (created if missing), never through a symlink."""
    fd = open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as handle:  # any file name's bytes
        handle.write(text)


@contextlib.contextmanager
def _cleaning_up(tmp: Path, path: Path, size: int) -> Iterator[None]:
    """On any failure remove the temporary file; a full disk becomes DiskFullError, other OS errors one line."""
    try:
        yield
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _write_error(exc, path, size) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@functools.lru_cache(maxsize=64)
def npy_header_bytes(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The exact header numpy writes for an array of this shape and dtype (C order); cached, it is
    asked for on every update."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    buffer = _Sink()
    np.lib.format.write_array_header_1_0(buffer, header) if _fits_v1(header) else \
        np.lib.format.write_array_header_2_0(buffer, header)
    return bytes(buffer.data)


class _Sink:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, chunk: bytes) -> None:
        self.data += chunk


def _fits_v1(header: dict[str, Any]) -> bool:
    return len(repr(header)) < 65000


def publish_array(path: Path, array: np.ndarray, *, durable: bool) -> None:
    """Publish ``array`` as a standard .npy file (never pickled)."""
    array = np.asarray(array)
    if not array.flags.c_contiguous:  # (np.ascontiguousarray would turn a 0-d array into 1-d)
        array = array.copy(order="C")
    if array.dtype.hasobject:
        raise MemtrainError("refusing to write an object array", path=path)
    header = npy_header_bytes(array.shape, array.dtype)

    def write(handle: IO[bytes]) -> None:
        handle.write(header)
        handle.write(memoryview(array.reshape(-1).view(np.uint8)))

    publish(path, write, durable=durable, size_hint=len(header) + array.nbytes)


def allocate_npy(path: Path, shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Create the file ``path`` as a .npy of ``shape`` with all its space reserved; returns the data offset.

    The caller maps and fills it. Reserving first turns a full disk into DiskFullError here, instead of a
    SIGBUS at the first write through the map. On failure nothing is left at ``path``.
    """
    dtype = np.dtype(dtype)
    header = npy_header_bytes(tuple(shape), dtype)
    total = len(header) + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    created = _create(path, path, total)
    with _cleaning_up(path, path, total), created as handle:
        reserve(handle.fileno(), total, path)
        fault_point("write")
        handle.write(header)
        handle.truncate(total)
    return len(header)


@contextlib.contextmanager
def writing_npy(path: Path, shape: tuple[int, ...], dtype: np.dtype, *, durable: bool) -> Iterator[np.memmap]:
    """Yield a writable map of a new .npy file (space reserved first); published at ``path`` on success.

    Lets a producer compute straight into the file instead of into memory and then copying.
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    tmp = tmp_sibling(path)
    offset = allocate_npy(tmp, shape, dtype)
    with _cleaning_up(tmp, path, nbytes):
        view = np.memmap(tmp, dtype=dtype, mode="r+", offset=offset, shape=tuple(shape))
        yield view
        if durable:  # a map's pages are the page cache: other processes see them without msync
            view.flush()
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
        del view
        os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


class NpyRows:
    """Rows written into a reserved .npy file at their offsets (``pwrite``): see ``writing_npy_rows``."""

    def __init__(self, fd: int, offset: int, shape: tuple[int, ...], dtype: np.dtype):
        self.fd, self.offset, self.shape, self.dtype = fd, offset, shape, dtype
        self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize

    def write(self, row: int, rows: np.ndarray) -> None:
        """Write C-contiguous ``rows`` (this file's dtype) starting at row ``row``."""
        data = memoryview(rows).cast("B")
        at = self.offset + row * self.row_bytes
        while data:  # pwrite may write less than asked
            done = os.pwrite(self.fd, data, at)
            data, at = data[done:], at + done


@contextlib.contextmanager
def writing_npy_rows(path: Path, shape: tuple[int, ...], dtype: np.dtype, *, durable: bool) -> Iterator[NpyRows]:
    """Like ``writing_npy``, but the rows are written with ``pwrite`` instead of through a map.

    For a producer that has its rows in memory already: the kernel copies them into the page cache, about
    twice as fast as filling a new map page fault by page fault (measured 2.7 vs 1.3 GB/s). The space is
    reserved first, so a full disk is a clean error here too.
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    tmp = tmp_sibling(path)
    offset = allocate_npy(tmp, shape, dtype)
    with _cleaning_up(tmp, path, nbytes):
        fd = os.open(tmp, os.O_WRONLY)
        try:
            yield NpyRows(fd, offset, tuple(shape), dtype)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


class NpyHeader:
    """What a .npy header says, read without trusting it."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, fortran_order: bool, offset: int):
        self.shape = shape
        self.dtype = dtype
        self.fortran_order = fortran_order
        self.offset = offset

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * self.dtype.itemsize


def read_npy_header(path: Path) -> NpyHeader:
    """Parse the header of a .npy file, refusing object dtypes, absurd headers and malformed files."""
    with _open_npy_file(path) as handle:
        return _parse_header(handle, path)


def _open_npy_file(path: Path, *, write: bool = False) -> IO[bytes]:
    try:
        return open_regular(path, what="a .npy file", write=write)
    except FileNotFoundError as exc:
        raise MemtrainError("file not found", path=path) from exc


def _parse_header(handle: IO[bytes], path: Path) -> NpyHeader:
    try:
        version = np.lib.format.read_magic(handle)
    except ValueError as exc:
        raise CorruptFileError("not a .npy file (bad magic string)", path=path) from exc
    length_bytes = handle.read(2 if version == (1, 0) else 4)
    header_len = int.from_bytes(length_bytes, "little") if length_bytes else 0
    if header_len > MAX_NPY_HEADER:
        raise CorruptFileError(
            "the .npy header is implausibly long", path=path,
            expected=f"at most {MAX_NPY_HEADER} bytes", found=f"{header_len} bytes")
    handle.seek(0)
    np.lib.format.read_magic(handle)
    try:
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = reader(handle, max_header_size=MAX_NPY_HEADER)
    except (ValueError, SyntaxError, EOFError) as exc:
        raise CorruptFileError(f"unreadable .npy header ({exc})", path=path) from exc
    offset = handle.tell()
    if dtype.hasobject:
        raise CorruptFileError(
            "refusing a .npy file that holds Python objects (loading it would unpickle)", path=path,
            expected="a numeric dtype", found=str(dtype))
    if any(dim < 0 for dim in shape):
        raise CorruptFileError("negative dimension in the .npy header", path=path, found=shape)
    return NpyHeader(tuple(int(d) for d in shape), dtype, bool(fortran_order), offset)


def open_npy(path: Path, *, shape: tuple[int, ...] | None = None, dtype: Any = None,
             mode: str = "r") -> np.ndarray:
    """Map a .npy file read-only after checking its header and its exact size.

    ``shape``/``dtype``, when given, must match the header (a manifest's record of the file). The map is
    made from the descriptor that was checked, so a name swapped meanwhile is never mapped.
    """
    path = Path(path)
    with _open_npy_file(path, write=mode != "r") as handle:
        header = _check_header(handle, path, shape, dtype)
        if header.nbytes == 0:  # mmap cannot map zero bytes; an empty array behaves the same
            empty = np.zeros(header.shape, dtype=header.dtype)
            empty.flags.writeable = mode != "r"
            return empty
        mapped = np.memmap(handle, dtype=header.dtype, mode=mode, offset=header.offset, shape=header.shape or (1,))
    return mapped.reshape(header.shape)  # np.memmap turns shape () into (1,)


def check_npy(path: Path, *, shape: tuple[int, ...] | None = None, dtype: Any = None) -> NpyHeader:
    """Validate a .npy file's header against what was recorded, and its exact size, without mapping it."""
    with _open_npy_file(path) as handle:
        return _check_header(handle, path, shape, dtype)


def _check_header(handle: IO[bytes], path: Path, shape: tuple[int, ...] | None, dtype: Any) -> NpyHeader:
    header = _parse_header(handle, path)
    if dtype is not None and header.dtype != np.dtype(dtype):
        raise CorruptFileError("dtype differs from what was recorded", path=path,
                               expected=str(np.dtype(dtype)), found=str(header.dtype))
    if shape is not None and header.shape != tuple(shape):
        raise CorruptFileError("shape differs from what was recorded", path=path,
                               expected=tuple(shape), found=header.shape)
    if header.fortran_order:
        raise CorruptFileError("Fortran-ordered arrays are not used by memtrain", path=path,
                               expected="fortran_order False", found="True")
    actual = os.fstat(handle.fileno()).st_size
    wanted = header.offset + header.nbytes
    if actual != wanted:
        what = "file is truncated" if actual < wanted else "file has trailing bytes after the array"
        raise CorruptFileError(what, path=path, expected=f"{wanted} bytes",
                               found=f"{actual} bytes")
    return header


# --- reading: regular files only ---

def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words: ``a FIFO (named pipe)``, ``a directory``, ``a regular file``..."""
    kinds = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISLNK, "a symbolic link"))
    return next((name for test, name in kinds if test(mode)), f"a file of mode {stat.filemode(mode)}")


def regular_file_error(path: Path, kind: str, *, what: str = "a regular file",
                       error: type[MemtrainError] = MemtrainError) -> MemtrainError:
    return error(f"expected {what}, found {kind}", path=path,
                 hint="memtrain opens only regular files (a FIFO, socket or device could block it forever)")


def open_fd(path: Path, *, what: str = "a regular file", write: bool = False,
            error: type[MemtrainError] = MemtrainError) -> int:
    """A descriptor of the regular file ``path``, opened without blocking, then checked with ``fstat``.

    ``O_NONBLOCK`` keeps a FIFO from blocking the open (one without a writer would hang memtrain forever);
    ``fstat`` on the descriptor then refuses anything that is not a regular file, naming what it is. The
    descriptor is switched back to blocking mode. FileNotFoundError passes through. ``write`` (a file mapped
    or rewritten in place) never follows a symbolic link: one is an error naming it. (Appending: ``open_own``;
    reusing a file memtrain made, removing whatever else is at its name: ``open_reused``.)
    """
    flags = (os.O_RDWR | os.O_NOFOLLOW if write else os.O_RDONLY) | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if write and exc.errno == errno.ELOOP:  # memtrain never writes through a link it did not make
            raise error("refusing to write through a symbolic link (memtrain never makes one here)", path=path,
                        hint="remove the link; memtrain writes only files it made") from exc
        if exc.errno not in (errno.ENXIO, errno.EISDIR, errno.EOPNOTSUPP):  # a socket, a directory to write
            raise
        try:
            kind = file_kind(os.stat(path).st_mode)
        except OSError:
            raise exc from None
        raise regular_file_error(path, kind, what=what, error=error) from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise regular_file_error(path, file_kind(info.st_mode), what=what, error=error)
    os.set_blocking(fd, True)
    return fd


def open_regular(path: Path, *, what: str = "a regular file", write: bool = False, text: bool = False,
                 error: type[MemtrainError] = MemtrainError) -> IO[Any]:
    """``open(path)`` for reading (``write``: reading and writing), refusing anything but a regular file.

    >>> with open_regular(Path("data/digits/manifest.json"), text=True) as handle:   # doctest: +SKIP
    ...     text = handle.read()
    """
    fd = open_fd(path, what=what, write=write, error=error)
    mode = ("r+" if write else "r") + ("" if text else "b")
    return os.fdopen(fd, mode, encoding="utf-8" if text else None)


def check_regular(path: Path, *, what: str = "a regular file", error: type[MemtrainError] = MemtrainError) -> None:
    """Refuse ``path`` unless it is a regular file (for readers that open it by name: h5py, pyarrow, zipfile)."""
    os.close(open_fd(path, what=what, error=error))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_orphans(folder: Path, ours: Callable[[str], bool]) -> list[Path]:
    """Remove what ``tmp_sibling`` left in ``folder`` for a final name ``ours`` accepts, if its maker is dead.

    A process killed between creating a temporary name and renaming it leaves it behind; the pid in the
    name tells a dead writer's leftover from a live writer's file in progress. Returns what was removed.
    """
    removed = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for name in os.listdir(folder):
            target, owner = tmp_target(name), tmp_owner_pid(name)
            if target is None or owner is None or not ours(target) or pid_alive(owner):
                continue
            path = folder / name
            with contextlib.suppress(FileNotFoundError):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                removed.append(path)
    return removed


class LockHeld(Exception):
    """``take_pid_lock`` found the lock held; ``owner`` is the pid written in the lock file."""

    def __init__(self, owner: str):
        super().__init__(owner)
        self.owner = owner


def take_pid_lock(path: Path) -> IO[str]:
    """Hold an ``flock`` on ``path`` and write our pid in it; the kernel drops it when we die.

    Raises ``LockHeld`` (with the holder's pid) instead of waiting.
    """
    handle = os.fdopen(open_own(path, os.O_RDWR | os.O_CREAT), "r+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        handle.close()
        raise LockHeld(owner) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def still_published(path: Path, inode: int) -> bool:
    """True if ``path`` still names ``inode``.

    A live run rewrites a retired weight file only after renaming it away, and a published name never
    comes back: so bytes read from ``inode`` are untorn if this holds after the read. Readers need no lock.
    """
    try:
        return os.stat(path).st_ino == inode
    except FileNotFoundError:
        return False


def checksum_file(path: Path, *, mapped: bool = False, algo: str = CHECKSUM_ALGO) -> str:
    """``<algo>:<hex>`` of the whole file, streamed; FileNotFoundError if it was retired while read.

    ``algo`` is ``xxh3-128`` (the bytes in order) or ``xxh3-128-blocks`` (see ``block_checksum``).
    ``mapped`` hashes the page cache through a map instead of copying it into buffers (2-5x faster for
    a file just written); only for files memtrain owns, which nobody truncates while it hashes them.
    """
    if algo not in (CHECKSUM_ALGO, BLOCK_CHECKSUM_ALGO):
        raise ValueError(f"unknown checksum algorithm {algo!r}")
    with open_regular(path) as handle:
        inode = os.fstat(handle.fileno()).st_ino
        size = os.fstat(handle.fileno()).st_size
        if mapped and size:
            with mmap.mmap(handle.fileno(), size, prot=mmap.PROT_READ) as pages, memoryview(pages) as view:
                found = _hash(algo, bytes(view[:MAX_NPY_HEADER]), partial(_view_chunks, view))
        else:
            found = _hash(algo, handle.read(MAX_NPY_HEADER), partial(_read_chunks, handle))
    if not still_published(path, inode):
        raise FileNotFoundError(errno.ENOENT, "retired while being read", str(path))
    return found


def checksum_algo(recorded: str) -> str:
    """The algorithm a recorded checksum was made with (``xxh3-128`` for anything unrecognised)."""
    algo = recorded.split(":", 1)[0]
    return algo if algo == BLOCK_CHECKSUM_ALGO else CHECKSUM_ALGO


def _hash(algo: str, head: bytes, chunks: Callable[[int, int], Iterator[Any]]) -> str:
    """``head``: the file's first bytes; ``chunks(start, n)``: its bytes from ``start`` on, ``n`` at a time."""
    if algo == BLOCK_CHECKSUM_ALGO:
        offset = npy_data_offset(head)
        return block_checksum(head[:offset], b"".join(map(block_digest, chunks(offset, CHECKSUM_BLOCK_BYTES))))
    digest = xxhash.xxh3_128()
    for chunk in chunks(0, HASH_CHUNK):
        digest.update(chunk)
    return f"{CHECKSUM_ALGO}:{digest.hexdigest()}"


def _view_chunks(view: memoryview, start: int, n: int) -> Iterator[memoryview]:
    return (view[at:at + n] for at in range(start, len(view), n))


def _read_chunks(handle: IO[bytes], start: int, n: int) -> Iterator[bytes]:
    handle.seek(start)
    while chunk := handle.read(n):
        yield chunk


DIGEST_BYTES = 16  # of one block's digest


def block_digest(block: Any) -> bytes:
    """The DIGEST_BYTES-byte hash of one block (any buffer: bytes, a memoryview, a contiguous array slice)."""
    return xxhash.xxh3_128_digest(block)


def block_checksum(header: Any, digests: bytes) -> str:
    """``xxh3-128-blocks:<hex>``: xxh3-128 of the .npy header bytes followed by the digests of the data's blocks.

    The data (everything after the header) is cut into ``CHECKSUM_BLOCK_BYTES`` blocks from its first
    byte, the last one possibly shorter; each block's ``block_digest`` is 16 bytes, in file order. The
    value depends only on the file's bytes, never on who wrote which block.
    """
    return f"{BLOCK_CHECKSUM_ALGO}:{block_checksum_digest(header, digests).hex()}"


def block_checksum_digest(header: Any, digests: bytes) -> bytes:
    """The 16 bytes whose hex ``block_checksum`` gives after its algorithm's name."""
    return xxhash.xxh3_128_digest(bytes(header) + digests)


def npy_data_offset(head: Any) -> int:
    """Where the data of a .npy file starts, from its first bytes; 0 if they are not a .npy header.

    Never raises: a damaged header gives a different offset, hence a checksum that does not match.
    """
    head = bytes(head)
    if head[:6] != b"\x93NUMPY" or len(head) < 12:
        return 0
    if head[6] == 1:
        offset = 10 + int.from_bytes(head[8:10], "little")
    elif head[6] in (2, 3):
        offset = 12 + int.from_bytes(head[8:12], "little")
    else:
        return 0
    return offset if offset <= MAX_NPY_HEADER else 0


def verify_checksum(path: Path, expected: str) -> None:
    if not path.exists():
        raise CorruptFileError("file is missing", path=path, expected=expected, found="no file")
    found = checksum_file(path, algo=checksum_algo(expected))
    if found != expected:
        raise CorruptFileError("checksum mismatch: the file changed since it was written", path=path,
                               expected=expected, found=found)


def write_json(path: Path, obj: Any, *, durable: bool) -> None:
    text = json.dumps(obj, indent=2, sort_keys=False) + "\n"
    publish(path, lambda handle: handle.write(text.encode()), durable=durable)


def read_json(path: Path, *, what: str = "JSON file") -> Any:
    try:
        with open_regular(path, what=f"a {what}", text=True) as handle:
            return json.load(handle)
    except FileNotFoundError as exc:
        raise InputError(f"{what} not found", path=path) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f"line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else None
        raise CorruptFileError(f"{what} is not valid JSON ({exc})", path=path, where=where) from exc


def json_encoder(*, sort_keys: bool, separators: tuple[str, str]) -> Callable[[Any], str]:
    """``json.dumps(value, sort_keys=sort_keys, separators=separators)`` as one reusable function: the same text.

    ``json.dumps`` (and ``JSONEncoder.encode``) builds a new C encoder for every value it is given, which costs as
    much again as encoding a small record; a log writes a few per update (its lineage line, the seal's canonical
    form, its metric line), so the C encoder is built once here. It keeps no state between calls: without
    ``check_circular``'s table (which one encoder shared by threads could not keep), a value that contains itself
    fails with RecursionError instead of ValueError -- memtrain's records never do. Where CPython's C encoder is
    missing, ``json.dumps`` itself."""
    from json import encoder

    if encoder.c_make_encoder is None:  # pragma: no cover -- an interpreter without the _json accelerator
        return partial(json.dumps, sort_keys=sort_keys, separators=separators)
    item, key = separators
    encode = encoder.c_make_encoder(None, _not_serializable, encoder.encode_basestring_ascii, None, key, item,
                                    sort_keys, False, True)  # markers, default, str, indent, ..., skipkeys, allow_nan

    def dumps(value: Any) -> str:
        if isinstance(value, str):  # as JSONEncoder.encode: a bare string is not a container the C encoder takes
            return encoder.encode_basestring_ascii(value)
        return "".join(encode(value, 0))

    return dumps


def _not_serializable(value: Any) -> Any:
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


# A log line as ``json.dumps(record)`` writes it (its default separators), and a seal's compact canonical form
JSON_LINE = json_encoder(sort_keys=False, separators=(", ", ": "))
CANONICAL_JSON = json_encoder(sort_keys=True, separators=(",", ":"))


def append_jsonl(path: Path, *records: dict[str, Any]) -> None:
    """Append one line per record (``json.dumps``'s text), in one write; a crash can leave at most one partial last
    line, which readers skip."""
    append_text(path, "".join(JSON_LINE(record) + "\n" for record in records))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSON-lines log, skipping a torn last line left by a crash."""
    if not path.exists():
        return []
    records = []
    with open_regular(path, text=True) as handle:
        for line in handle:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


# --- sealed JSON records ---
SEAL_KEY = "record_checksum"


def json_checksum(body: dict[str, Any], *, native: bool = False) -> str:
    """``xxh3-128:<hex>`` of the compact JSON of ``body``: keys sorted, separators ``,`` and ``:``, ASCII only.

    Computed on the JSON round trip of ``body``, so that the writer hashes exactly what a reader parses.
    ``native``: the caller vouches that ``body`` is its own round trip (str keys only; str, int, float,
    bool, None, lists and dicts), so the round trip is skipped (one per update in a run's lineage).
    """
    canonical = body if native else json.loads(json.dumps(body))
    text = CANONICAL_JSON(canonical)  # made once (``json_encoder``)
    return f"{CHECKSUM_ALGO}:{xxhash.xxh3_128_hexdigest(text.encode())}"


def seal(record: dict[str, Any], *, native: bool = False) -> dict[str, Any]:
    """``record`` with a ``record_checksum`` field covering every other field (``native``: see json_checksum)."""
    body = {key: value for key, value in record.items() if key != SEAL_KEY} if SEAL_KEY in record else record
    return {**body, SEAL_KEY: json_checksum(body, native=native)}


def unseal(record: Any, *, path: Path, what: str, where: str | None = None) -> dict[str, Any]:
    """The fields of a sealed record (without its checksum) once the checksum matches; CorruptFileError if not."""
    if not isinstance(record, dict):
        raise CorruptFileError(f"{what} is not a JSON object", path=path, where=where,
                               found=type(record).__name__)
    recorded = record.get(SEAL_KEY)
    body = {key: value for key, value in record.items() if key != SEAL_KEY}
    if not isinstance(recorded, str):
        raise CorruptFileError(f"{what} has no checksum of its content: damaged, or not written by this memtrain",
                               path=path, where=where)
    found = json_checksum(body)
    if found != recorded:
        raise CorruptFileError(f"{what} is damaged: its content does not match its checksum", path=path,
                               where=where, expected=recorded, found=found)
    return body


def write_sealed_json(path: Path, record: dict[str, Any], *, durable: bool) -> None:
    write_json(path, seal(record), durable=durable)


def read_sealed_json(path: Path, *, what: str) -> dict[str, Any]:
    return unseal(read_json(path, what=what), path=path, what=what)


def read_sealed_jsonl(path: Path, *, what: str) -> tuple[list[dict[str, Any]], list[CorruptFileError]]:
    """The verified records of a sealed JSON-lines file, and one error per damaged line.

    A torn last line (no newline: a crash while appending) is skipped silently, like ``read_jsonl``.
    """
    if not path.exists():
        return [], []
    records, damaged = [], []
    with os.fdopen(open_fd(path), encoding="utf-8", errors="replace") as handle:
        lines = handle.readlines()
    for number, line in enumerate(lines, start=1):
        torn = number == len(lines) and not line.endswith("\n")
        try:
            records.append(unseal(json.loads(line), path=path, what=what, where=f"line {number}"))
        except json.JSONDecodeError:
            if not torn:
                damaged.append(CorruptFileError(f"{what} is not valid JSON", path=path, where=f"line {number}"))
        except CorruptFileError as exc:
            damaged.append(exc)
    return records, damaged
