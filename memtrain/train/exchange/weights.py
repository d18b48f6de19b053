"""Flat parameter vectors -> published weight versions ``weights/vNNNNNNNN.npy``; never modified once published.

The next version is built in a temporary file (``layout.building_path``) that the slice owners write into;
publishing is the rename. Old versions are deleted once nothing can still be reading them, or recycled:
renamed away, then rewritten as a later version, once every task of theirs is finished and no outside
reader holds a lock on them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

import numpy as np

from memtrain.errors import CorruptFileError, MemtrainError
from memtrain.faults import fault_point
from memtrain.files import (
    BLOCK_CHECKSUM_ALGO,
    CHECKSUM_BLOCK_BYTES,
    DIGEST_BYTES,
    allocate_npy,
    block_checksum,
    block_checksum_digest,
    block_digest,
    check_npy,
    checksum_file,
    npy_header_bytes,
    open_reused,
    publish_array,
    rename_new,
    writing_npy,
)
from memtrain.layout import (
    TMP_MARK,
    WEIGHTS_DIR,
    building_path,
    weight_versions,
    weights_path,
)
from memtrain.models.params import PARAM_DTYPE, ParamLayout
from memtrain.train.exchange.area import DIGESTS

# Parameters per checksum block: a slice owner's slice is a whole number of blocks (the last one may be short).
BLOCK = CHECKSUM_BLOCK_BYTES // PARAM_DTYPE.itemsize


def finite(values: np.ndarray, zeros: np.ndarray) -> bool:
    """Whether every element of the 1-D array ``values`` is finite (``zeros``: at least as many zeros of its
    dtype): the one finiteness check of what memtrain publishes -- a step's new weights (train/loops/reduce.py), a
    solve's or an initialisation's parameters (``publish_params``), an additive pass's statistics
    (train/loops/additive.py). A dot product with zeros is 0 exactly when every element is finite (x * 0 is NaN for
    x = NaN or +-Inf, and NaN survives the sum): one read pass in BLAS, half the time of
    ``np.isfinite(...).all()``. A NaN is what it looks for: no RuntimeWarning is raised for it."""
    with np.errstate(invalid="ignore"):
        return bool(np.dot(values, zeros[: len(values)]) == 0)


class NonFiniteParams(MemtrainError):
    """Parameters about to be published hold NaN or Inf: nothing was published."""


def publish_params(run_dir: Path, version: int, layout: ParamLayout, params: dict[str, np.ndarray], *,
                   made_by: str = "the model") -> str:
    """Publish named parameters as ``version``, each written straight into the mapped file (no flat copy in
    memory, as ``layout.flatten`` would make); returns its checksum. The bits are ``flatten``'s.

    Published weights never hold NaN or Inf: each parameter is checked (``finite``) before the rename, and a
    non-finite one is ``NonFiniteParams`` naming it and ``made_by`` (what made the parameters), nothing
    published."""
    path = weights_path(run_dir, version)
    zeros = np.zeros(min(BLOCK, layout.size), dtype=PARAM_DTYPE)
    with writing_npy(path, (layout.size,), PARAM_DTYPE, durable=False) as flat:
        for name, view in layout.views(flat).items():
            view[...] = params[name]
            values = view.reshape(-1)
            if not all(finite(values[a:a + BLOCK], zeros) for a in range(0, values.size, BLOCK)):
                bad = int(np.count_nonzero(~np.isfinite(values)))
                raise NonFiniteParams(f"{made_by} gave non-finite parameters: '{name}' holds {bad} NaN or Inf "
                                      f"of {values.size} values; weight version {version} was not published",
                                      path=run_dir)
    return checksum_file(path, mapped=True, algo=BLOCK_CHECKSUM_ALGO)


def publish_weights(run_dir: Path, version: int, flat: np.ndarray) -> str:
    """Publish ``flat`` as ``version``; returns its checksum."""
    path = weights_path(run_dir, version)
    publish_array(path, np.asarray(flat, dtype=PARAM_DTYPE), durable=False)
    return checksum_file(path, mapped=True, algo=BLOCK_CHECKSUM_ALGO)


def block_count(size: int) -> int:
    return -(-size // BLOCK)


def digests_shape(size: int) -> tuple[int, int, int]:
    """Two banks of block digests, one per version parity: version n's are in bank n % 2, so the step that
    writes version n + 1 never overwrites the digests that version n is being published with (fixed
    staleness in the rounds publishes a version while its peers already step the next)."""
    return 2, block_count(size), DIGEST_BYTES


def create_digests(exchange: Path, size: int) -> np.ndarray:
    """The exchange file the slice owners write each block's digest into; returned mapped read-only."""
    path = DIGESTS.path(exchange)
    shape = digests_shape(size)
    offset = allocate_npy(path, shape, np.dtype(np.uint8))
    return np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=shape)


def weights_checksum(digests: np.ndarray, size: int) -> str:
    """The checksum of a weight version of ``size`` parameters whose block digests are ``digests``.

    Equal to ``checksum_file(path, algo="xxh3-128-blocks")`` of the file, without reading it again.
    """
    return block_checksum(npy_header_bytes((size,), PARAM_DTYPE), digests.tobytes())


def weights_digest(digests: np.ndarray, size: int) -> bytes:
    """The raw digest of ``weights_checksum`` (the hex after ``xxh3-128-blocks:``), as the round records keep it."""
    return block_checksum_digest(npy_header_bytes((size,), PARAM_DTYPE), digests.tobytes())


def array_checksum(flat: np.ndarray) -> str:
    """The checksum a weight file holding ``flat`` (1-D float32) has, hashed from memory (the read audit)."""
    digests = b"".join(block_digest(flat[a:a + BLOCK]) for a in range(0, flat.size, BLOCK))
    return block_checksum(npy_header_bytes(flat.shape, PARAM_DTYPE), digests)


def versions_to_keep(keep_versions: int, version: int, oldest_read: int) -> int:
    """The one keep rule: how many versions up to ``version`` stay on disk when the next one is readied --
    the newest ``keep_versions`` (``run.keep_versions``), and every version from ``oldest_read`` on (a
    gradient in flight or still to come reads it). Older ones are retired (weights.retire_weights)."""
    return max(keep_versions, version - oldest_read + 1)


def rounds_keep(keep_versions: int, staleness: int) -> int:
    """The keep rule for the rounds, which ready a file before its version's step (train/loops/rounds.py): run
    synchronously, ``keep_versions``. With fixed staleness k the file readied is two ahead of the newest
    version n (``Participant.ready``), whose gradients in flight read version n - k: one more than
    ``keep_versions``, and at least the k + 2 from n - k to n + 1."""
    if not staleness:
        return keep_versions
    return versions_to_keep(keep_versions + 1, staleness + 1, 0)


def ready_building(run_dir: Path, version: int, size: int, owner_pid: int, keep: int, *, fast: bool = False,
                   recycle: bool = True, path: Path | None = None, left_from: int | None = None) -> Path:
    """Make sure the (unpublished) file of ``version`` exists, ready for the slice owners; returns its path.

    The versions older than the newest ``keep`` before it are retired first, and the newest retired one
    is reused when it has the right size: its pages are allocated and already mapped by the workers, so
    writing it costs no allocation and no page faults. Every value in the file is overwritten by the
    slice owners before it is published. A file already there (a stretch restarted after a fault) is
    kept if its header is whole. ``fast`` (once per update in a stretch) retires only the version that
    has just fallen out of the newest ``keep``, without listing the folder: the stretch's start retired
    every older one. ``recycle`` False: never reuse a retired file (on a cluster a worker on another machine
    may still hold a map of it, and only a new file is sure to be read afresh there). ``path``: the
    file's name if the caller has it already (``layout.building_path``). ``left_from``: the oldest version
    that may be left (the caller retired every older one), to retire without listing the folder when
    ``keep`` may shrink by more than one (the streamed modes).
    """
    path = path or building_path(run_dir, version, owner_pid)
    fd = open_reused(path)  # a link or a foreign file at the name is removed, never followed
    if fd is not None:
        os.close(fd)
        try:
            check_npy(path, shape=(size,), dtype=PARAM_DTYPE)
            return path
        except CorruptFileError:  # its writer died while creating it
            os.unlink(path)
    total = len(npy_header_bytes((size,), PARAM_DTYPE)) + size * PARAM_DTYPE.itemsize
    spare = retire_weights(run_dir, keep, version - 1, recycle=(path, total) if recycle else None,
                           left_from=version - 1 - keep if fast else left_from)
    if spare is not None:
        fault_point("write")  # the same hit as for a fresh file, so fault tests count the same writes
        return path
    allocate_npy(path, (size,), PARAM_DTYPE)
    return path


def commit_weights(tmp: Path, run_dir: Path, version: int) -> None:
    """Publish the complete file ``tmp`` as ``version``: stamp it with the time of publication, then rename
    it without replacing (``files.rename_new``): a published version, whose readers must keep their bytes,
    is never replaced.

    The stamp matters for a recycled file: it is written through maps, and a write to a page that is
    still dirty from its earlier life does not update the file's mtime, so without it a version could
    show an older ``written`` time than the version before it.
    """
    os.utime(tmp)
    path = weights_path(run_dir, version)
    try:
        rename_new(tmp, path)
    except FileExistsError:
        raise MemtrainError(f"weight version {version} is already published; refusing to replace it", path=path,
                            hint="this is a bug in memtrain: please report it with the run's events.log") from None


def unpublish_after(run_dir: Path, version: int) -> list[int]:
    """Delete the versions newer than ``version`` (a run resumed from an older checkpoint makes them again)."""
    newer = [v for v in weight_versions(run_dir) if v > version]
    for v in newer:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(weights_path(run_dir, v))
    return newer


def discard_building(run_dir: Path, owner_pid: int) -> None:
    """Delete every unpublished version file of ``owner_pid``'s run (at its end, or after a fault)."""
    folder = run_dir / WEIGHTS_DIR
    suffix = building_path(run_dir, 0, owner_pid).name.split(TMP_MARK, 1)[1]
    for name in os.listdir(folder):
        if TMP_MARK in name and name.split(TMP_MARK, 1)[1] == suffix:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(folder / name)


def retire_weights(run_dir: Path, keep: int, current: int, *, recycle: tuple[Path, int] | None = None,
                   left_from: int | None = None) -> Path | None:
    """Unpublish versions older than the newest ``keep`` (the current one is always kept).

    They are deleted, except that with ``recycle = (path, size)`` the newest of them, if it has that size
    in bytes, is renamed to ``path`` and returned, to be rewritten as a later version -- the caller vouches
    that every task of that version is finished -- and only if no other process holds an flock on it: a
    reader outside the run that needs a retired version to stay unchanged may hold ``flock(LOCK_SH)`` on
    it, and a locked file is deleted, never rewritten. (``inspect`` takes no lock: it confirms after
    reading that the name still holds the same inode, see ``files.still_published``.) ``left_from``: the
    oldest version that may be left (the caller knows every older one is retired): the folder is not listed.
    """
    spare = None
    versions = (range(current - keep, left_from - 1, -1) if left_from is not None
                else sorted(weight_versions(run_dir), reverse=True))
    for version in versions:
        if version > current - keep:
            continue
        path = weights_path(run_dir, version)
        if recycle is not None and spare is None:
            spare = _take_unlocked(path, *recycle)
            if spare is not None:
                continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return spare


def _take_unlocked(path: Path, to: Path, size: int) -> Path | None:
    """Rename ``path`` to ``to`` if it is a regular file memtrain made (``files.open_reused``: a link is
    removed, never followed) of ``size`` bytes and nobody holds a lock on it (checked under our own lock)."""
    fd = open_reused(path)
    if fd is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        info = os.fstat(fd)
        if info.st_size != size:
            return None
        os.replace(path, to)
        if os.lstat(to).st_ino != info.st_ino:  # swapped between the check and the rename: not ours to reuse
            os.unlink(to)
            return None
        return to
    except BlockingIOError:
        return None
    finally:
        os.close(fd)
