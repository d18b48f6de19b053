"""Every on-disk name memtrain uses, in one place: dataset dirs, run dirs, weights, gradients, checkpoints.

No other module formats a path. Numbers are zero-padded so that names sort in order.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import uuid
from pathlib import Path

# --- dataset directory (written by `memtrain prepare`) ---
MANIFEST = "manifest.json"
SPLITS = ("train", "val", "test")
OPTIONAL_SPLITS = ("test",)  # written only when asked for (prepare --test-fraction)


def shard_name(split: str, part: str, index: int) -> str:
    """Relative name of one shard file: ``train/x-00000.npy`` (part is ``x`` or ``y``)."""
    return f"{split}/{part}-{index:05d}.npy"


def is_shard_name(name: str) -> bool:
    """True for the file name of a shard within its split folder (``x-00000.npy``)."""
    return re.fullmatch(r"[xy]-\d{5,}\.npy", name) is not None


# --- work area of `memtrain prepare` (a hidden sibling of the output, so the final rename is atomic) ---
PREPARE_WORK_MARK = ".prepare-"
PREPARE_SPOOL_DIR = "spool"  # the external shuffle's bucket files
PREPARE_SPOOL_INFO = "spool.json"  # written once every bucket is complete: the spool's commit marker
PREPARE_DONE_LOG = "done.jsonl"  # one line per finished shard pair, with checksums, for resume
PREPARE_DATASET_DIR = "dataset"  # becomes OUT by one rename
PREPARE_REPLACED_DIR = "replaced"  # an older OUT moved aside by --overwrite, removed after the rename
PREPARE_LOCK = "lock"


def prepare_work_dir(out: Path, key: str) -> Path:
    """``OUT/../.OUT.prepare-<key>``: deterministic, so a rerun with the same arguments finds it."""
    return out.parent / f".{out.name}{PREPARE_WORK_MARK}{key}"


def prepare_work_dirs(out: Path) -> list[Path]:
    """Every work area of ``out`` on disk, whatever its key."""
    prefix = f".{out.name}{PREPARE_WORK_MARK}"
    if not out.parent.is_dir():
        return []
    return sorted(out.parent / name for name in os.listdir(out.parent) if name.startswith(prefix))


def spool_bucket_names(bucket: int) -> tuple[str, str]:
    """Bucket files of the external shuffle: raw rows of x (output dtype) and y (float64 label codes)."""
    return f"x-{bucket:05d}.bin", f"y-{bucket:05d}.bin"


# --- run directory (written by `memtrain train`) ---
RUN_JOB = "job.json"  # the job the run was started with, every default filled in; written once, sealed
RUN_HISTORY = "history.jsonl"  # one sealed line per start or resume, with the changes asked for on resume
RUN_PARAMS = "params.json"  # parameter layout: name, shape, offset, dtype
RUN_METRICS = "metrics.jsonl"
RUN_EVENTS = "events.log"
RUN_LINEAGE = "lineage.jsonl"  # which version and tasks produced each published version
RUN_LOCK = "run.lock"
RUN_CSV = "metrics.csv"  # run.log_to = ["csv"]: the epoch records of metrics.jsonl as a table
RUN_TENSORBOARD = "tensorboard"  # run.log_to = ["tensorboard"]: TensorBoard event files (tensorboardX)
TENSORBOARD_EVENTS = "events.out.tfevents."  # how tensorboardX begins an event file's name (+ time.host)
WEIGHTS_DIR = "weights"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_META = "meta.json"
CHECKPOINT_WEIGHTS = "weights.npy"

STATISTICS_DIR = "statistics"  # an additive model's pass (train/loops/additive.py): partials, their sum, its plan
STATISTICS_PLAN = "plan.json"  # sealed: the tasks' row ranges, chunk_rows and the statistics' size
STATISTICS_SUM = "sum.npy"
_PARTIAL_RE = re.compile(r"^t(\d{5})-a(\d{3})\.npy$")

_VERSION_RE = re.compile(r"^v(\d{8})\.npy$")
_CHECKPOINT_RE = re.compile(r"^c(\d{8})$")

# Every name memtrain writes directly in a run directory, besides exchange areas (``exchange_dir_name``, new
# names made with mkdir) and temporary names (``tmp_sibling``). The files are never written through a link by
# construction: each is published by rename (which replaces a link, never follows it) or opened with
# ``O_NOFOLLOW`` (files.py). The folders are what every file below them is written through, so a link at a
# folder's name would be followed by all of them: train/records/run_dir.py's one link check (``check_entries``)
# requires each to be a real directory (or absent) before anything is written, on a start, a resume and an
# ``--overwrite``. A folder is had through ``run_folder``, which knows only these; tests/test_links.py walks a
# run made with every feature on and fails on any name it finds that is not declared here.
RUN_FILES = (RUN_JOB, RUN_HISTORY, RUN_PARAMS, RUN_METRICS, RUN_EVENTS, RUN_LINEAGE, RUN_LOCK, RUN_CSV)
RUN_FOLDERS = (WEIGHTS_DIR, CHECKPOINTS_DIR, STATISTICS_DIR, RUN_TENSORBOARD)


def run_folder(run_dir: Path, name: str) -> Path:
    """The folder ``name`` of a run directory, one the run directory's link check covers (``RUN_FOLDERS``)."""
    if name not in RUN_FOLDERS:
        raise ValueError(f"{name!r} is not a run directory folder declared in layout.RUN_FOLDERS")
    return run_dir / name


@functools.lru_cache(maxsize=256)
def weights_path(run_dir: Path, version: int) -> Path:
    """A version's file. Cached: asked for several times per update (published, read, retired some updates
    later), and a Path costs more to build than to look up; a few hundred names, never stale."""
    return Path(f"{run_dir}/{WEIGHTS_DIR}/v{version:08d}.npy")  # one Path, not three


def weight_versions(run_dir: Path) -> list[int]:
    """Published weight versions on disk, oldest first."""
    folder = run_dir / WEIGHTS_DIR
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for name in os.listdir(folder) if (m := _VERSION_RE.match(name)))


def statistics_dir(run_dir: Path) -> Path:
    return run_folder(run_dir, STATISTICS_DIR)


def partial_name(task: int, attempt: int) -> str:
    """One statistics task's partial sums (float64, flat): one file per (task, attempt)."""
    return f"t{task:05d}-a{attempt:03d}.npy"


def statistics_record_name(name: str) -> str:
    """The sealed record of a statistics file (``t00000-a000.npy`` or ``sum.npy`` -> ``t00000-a000.json``,
    ``sum.json``): its checksum, written once the file is published (train/loops/additive.py)."""
    return name.removesuffix(".npy") + ".json"


def parse_partial_name(name: str) -> tuple[int, int] | None:
    """(task, attempt) of a partial's name, or None for any other name (a temporary one included)."""
    match = _PARTIAL_RE.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def checkpoint_path(run_dir: Path, update: int) -> Path:
    return run_dir / CHECKPOINTS_DIR / f"c{update:08d}"


def checkpoint_updates(run_dir: Path) -> list[int]:
    """Committed checkpoint directories (by name; a tmp dir never matches), oldest first."""
    folder = run_dir / CHECKPOINTS_DIR
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for name in os.listdir(folder) if (m := _CHECKPOINT_RE.match(name)))


def existing_hint(path: Path) -> str | None:
    """For a checkpoint or weight version that does not exist: the ones its run has (an error's hint)."""
    run = path.parent.parent
    if path.parent.name == CHECKPOINTS_DIR or _CHECKPOINT_RE.match(path.name):
        run = run if path.parent.name == CHECKPOINTS_DIR else path.parent
        names = [checkpoint_path(run, u).name for u in checkpoint_updates(run)]
        what = "checkpoints"
    elif path.parent.name == WEIGHTS_DIR or _VERSION_RE.match(path.name):
        run = run if path.parent.name == WEIGHTS_DIR else path.parent
        names = [weights_path(run, v).name for v in weight_versions(run)]
        what = "weight versions"
    else:
        return None
    if not (run / CHECKPOINTS_DIR).is_dir() and not (run / WEIGHTS_DIR).is_dir():
        return None  # not in a run: nothing to list
    if not names:
        return f"{run} has no {what}"
    return f"{run} has {what} {', '.join(names)}"


def numbered_run_dir(path: Path, number: int) -> Path:
    """A new run beside the earlier run at memtrain's default name: ``runs/job`` -> ``runs/job-2``, ``-3``, ..."""
    return path.with_name(f"{path.name}-{number}")


def checkpoint_version_name(version: int) -> str:
    """An older weight version in a checkpoint of a fixed-staleness run stopped mid-epoch: the next updates'
    gradients are computed at it."""
    return f"weights-v{version:08d}.npy"


def optimizer_state_name(name: str) -> str:
    return f"opt-{name}.npy"


# --- exchange area (gradient files and scratch; on /dev/shm or in the run dir) ---
EXCHANGE_PREFIX = "memtrain-x-"


def exchange_dir_name(run_id: str, owner_pid: int) -> str:
    """The owner's pid is in the name so that leftovers of dead runs can be told from live ones."""
    return f"{EXCHANGE_PREFIX}{run_id}-{owner_pid}"


EXCHANGE_MARK = ".memtrain-exchange.json"  # created first in every exchange area: what proves the directory is ours
_EXCHANGE_RE = re.compile(rf"^{EXCHANGE_PREFIX}[0-9a-f]{{8}}-(\d+)$")


def parse_exchange_owner(name: str) -> int | None:
    """The owner pid of an exchange area's name, or None if ``name`` is not one memtrain makes."""
    match = _EXCHANGE_RE.match(name)
    return int(match.group(1)) if match else None


def trajectory_name(version: int, slot: int) -> str:
    """The trajectory shard that collection task (version, slot) publishes whole (memtrain/rl/trajectory.py).

    A collection task is pure (its bits depend on the job, the version and the slot only), so a re-run
    writes the same bytes under the same name: no attempt number.
    """
    return f"r-v{version:08d}-s{slot:05d}.npy"


TRAJECTORIES_DIR = "trajectories"  # a reinforcement-learning run's shards, retired once learned from
EPISODES_DIR = "episodes"  # a reinforcement-learning run's slot states at the version being collected


def rl_gradient_name(version: int, slot: int) -> str:
    """The A3C gradient collection task (version, slot) publishes beside its shard (memtrain/rl/asynchronous.py)."""
    return f"g-v{version:08d}-s{slot:05d}.npy"


def rl_step_name(step: int) -> str:
    """What optimizer step ``step`` of a run whose learner is on its workers takes its gradient from: the weights and
    the minibatch's rows (memtrain/rl/server.py ``worker_shares``); gone once the step is taken."""
    return f"m-p{step:08d}.npy"


def rl_share_name(step: int, chunk: int, attempt: int) -> str:
    """A worker's share of step ``step``'s minibatch gradient: chunk ``chunk``'s, attempt ``attempt``'s
    (memtrain/rl/worker.py); gone once the step is taken."""
    return f"h-p{step:08d}-c{chunk:05d}-a{attempt:03d}.npy"


def is_rl_step_file(name: str) -> bool:
    """True for an ``rl_step_name`` or ``rl_share_name`` file: never needed across a restart (a step is made again
    from the checkpoint), so a resumed run removes what a killed server left."""
    return re.fullmatch(r"m-p\d{8,}\.npy|h-p\d{8,}-c\d{5,}-a\d{3,}\.npy", name) is not None


def episode_state_name(slot: int) -> str:
    """Where slot ``slot``'s episode stands at the start of the version being collected (memtrain/rl/collect.py
    ``write_state``): its episode, step and the actions since its seeded reset; rewritten by rename per version."""
    return f"e-s{slot:05d}.npy"


def gradient_name(version: int, task: int, attempt: int) -> str:
    """One file per (weight version, task, attempt): an additive model's statistics of one task."""
    return f"g-v{version:08d}-t{task:05d}-a{attempt:03d}.npy"


def streamed_gradient_name(ticket: int, task: int, attempt: int) -> str:
    """A streamed gradient (train/loops/stream.py): one file per (ticket, task, attempt) (``GradTask.ticket``: the
    plan's update number, async's ticket or a replay's step), so a name is never reused in a run -- not by the
    next update after a skipped one, nor by a retry."""
    return f"g-u{ticket:08d}-t{task:05d}-a{attempt:03d}.npy"


def spare_gradient_name(ticket: int, task: int, attempt: int) -> str:
    """A stepped streamed gradient's file (``streamed_gradient_name``'s numbers: never reused in a run), handed
    to a worker to rewrite as a later gradient (train/loops/stream.py)."""
    return f"g-s{ticket:08d}-t{task:05d}-a{attempt:03d}.npy"


def chain_sum_name(update: int, attempt: int, tasks: int, segment: int) -> str:
    """A two-level round's partial sum (train/loops/node_sum.py): the first ``tasks`` tasks of ``update``
    added in order, segment ``segment`` of the vector, in the chain's attempt ``attempt``. Named by what it
    holds, never by the node that wrote it."""
    return f"c-u{update:08d}-a{attempt:03d}-t{tasks:05d}-s{segment:05d}.npy"


def metrics_name(version: int, task: int, attempt: int) -> str:
    """The summed validation statistics of one evaluation task at a weight version (train/records/metrics.py)."""
    return f"m-v{version:08d}-t{task:05d}-a{attempt:03d}.npy"


def gradient_buffer_name(task: int, bank: int = 0) -> str:
    """The buffer that task ``task`` of every update writes its gradient into (see train/loops/rounds.py); with
    fixed staleness in the rounds, of every other update (``bank`` 0 or 1: plan.gradient_bank)."""
    return f"g-t{task:05d}.npy" if bank == 0 else f"g-t{task:05d}-b{bank}.npy"


def state_buffer_name(name: str, parity: int) -> str:
    """Optimizer state is double-buffered: update n reads parity n%2 and writes the other one."""
    return f"opt-{name}-{parity}.npy"


def state_building_name(name: str, version: int) -> str:
    """On a cluster (train/loops/sliced.py): the optimizer state of ``version`` while its slice owners write it, a new
    file per version, renamed over ``state_buffer_name(name, version % 2)`` once every slice is written."""
    return f"opt-{name}-n{version:08d}.npy"


# The block digests of the weight version being written (see files.block_checksum): one 16-byte row per
# block, each row written by the slice owner of that block, combined into the checksum by the server.
WEIGHT_DIGESTS = "weight-digests.npy"

# The marks the participants of a round meet at, the ledger of the last finished update, and what each
# participant is doing (int64 words, see train/exchange/marks.py).
ROUND_BOARD = "round-board.npy"

# One record per update of the current epoch: each task's loss and compute time, and how the update
# ended (published as which version, with which checksum, when; or skipped). See train/exchange/marks.py.
ROUND_RECORDS = "round-records.npy"
# async mode at the desk (train/loops/desk.py): the shared words, the stretch's task list, one record per group
ASYNC_DESK = "async-desk.npy"
ASYNC_TASKS = "async-tasks.npy"
ASYNC_RECORDS = "async-records.npy"


def desk_buffer_name(slot: int, buffer: int) -> str:
    """One of a participant's gradient buffers at the desk (train/loops/desk.py)."""
    return f"d-s{slot:03d}-b{buffer:03d}.npy"


@functools.lru_cache(maxsize=64)
def building_path(run_dir: Path, version: int, owner_pid: int) -> Path:
    """The unpublished file of ``version`` while the slice owners write it: a temporary name of the server's
    with a fixed tag, the same in every process (so no message has to carry it), swept like any temporary
    name of a version; publishing links it to ``weights_path`` and drops this name. Cached, as ``weights_path``
    is: asked for several times per update."""
    return Path(f"{run_dir}/{WEIGHTS_DIR}/.v{version:08d}.npy{TMP_MARK}{owner_pid}-00000000")



def private_path(run_dir: Path, ring: int, owner_pid: int) -> Path:
    """One of the files the server steps its versions into in turn when no other process maps them (the rounds
    in the server alone: train/loops/rounds.py), ``ring`` its place in the ring: a temporary name of the server's
    with the same tag as ``building_path`` (swept with them), renamed to ``weights_path`` when its version is
    published."""
    return Path(f"{run_dir}/{WEIGHTS_DIR}/.p{ring:08d}.npy{TMP_MARK}{owner_pid}-00000000")

# --- a cluster run (memtrain/cluster/) ---
def wave_file_name(round_id: str, wave: int = -1, rank: int | str = -1) -> str:
    """A round of nodes' wave file in the exchange area (memtrain/cluster/broadcast.py, ``WaveFiles``): the
    record of ``wave`` (the server's), member ``rank``'s answer to it, every member's answers in one file
    (``rank`` "all": written by the member that completed the wave), or (no wave) the round's end mark."""
    if wave < 0:
        return f"w-{round_id}-end.json"
    if rank == "all":
        return f"w-{round_id}-{wave:08d}-all.json"
    return f"w-{round_id}-{wave:08d}.json" if int(rank) < 0 else f"w-{round_id}-{wave:08d}-r{int(rank):05d}.json"


def cluster_probe_name(token: str) -> str:
    """The start-up probe a Dask worker writes into the exchange area (or the server into the run dir)."""
    return f".cluster-probe-{token}.json"


def slurm_rendezvous_path(run_dir: Path, job_id: str, restart: int) -> Path:
    """Beside the run directory (which may not exist yet), where rank 0 of ``--cluster slurm`` publishes its
    Dask scheduler's address: one name per job and requeue, so no attempt reads a previous one's."""
    return run_dir.parent / f"{run_dir.name}.slurm-{job_id}-{restart}.json"


# --- temporary names ---
TMP_MARK = ".tmp-"


def tmp_sibling(path: Path) -> Path:
    """A temporary name in the same directory (so os.replace is atomic); the pid lets sweeps find orphans."""
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


_TMP_RE = re.compile(r"^\.(?P<target>.+)\.tmp-(?P<pid>\d+)-[0-9a-f]{8}$")


def tmp_owner_pid(name: str) -> int | None:
    """The pid that created a temporary file or directory, or None if ``name`` is not a temporary name."""
    match = _TMP_RE.match(name)
    return int(match.group("pid")) if match else None


def tmp_target(name: str) -> str | None:
    """The final name that the temporary name ``name`` stands for (``.job.json.tmp-12-0a1b2c3d`` -> ``job.json``).

    None for anything ``tmp_sibling`` does not make: ``notes.tmp-123-abc`` is a user's file, not ours.
    """
    match = _TMP_RE.match(name)
    return match.group("target") if match else None


def is_version_name(name: str) -> bool:
    return _VERSION_RE.match(name) is not None


_PRIVATE_RE = re.compile(r"^p(\d{8})\.npy$")


def is_private_name(target: str) -> bool:
    """Whether ``target``, a temporary name's target (``tmp_target``), is a ring file's (``private_path``)."""
    return _PRIVATE_RE.match(target) is not None


def is_checkpoint_name(name: str) -> bool:
    return _CHECKPOINT_RE.match(name) is not None


# The file written to measure a candidate exchange location at start (``.memtrain-probe.tmp-PID-HEX``, a
# ``tmp_sibling`` name, so that a server killed while measuring leaves nothing the next start cannot sweep).
EXCHANGE_PROBE = "memtrain-probe"


# --- the jobs spool of `memtrain serve` ---
SPOOL_RUNNING = "running"
SPOOL_DONE = "done"
SPOOL_FAILED = "failed"
SPOOL_STATUS = "status.json"
SPOOL_LOCK = ".lock"
SPOOL_LOGS = "logs"  # one log per job: the output of its `memtrain train` child, every attempt appended
SPOOL_JOB_SUFFIX = ".toml"  # only DIR/*.toml are jobs; NAME.toml.tmp, dotfiles and subfolders are not


def spool_job_name(file_name: str) -> str | None:
    """``NAME`` of a job file ``NAME.toml`` in the spool, or None for anything that is not a job file."""
    if file_name.startswith(".") or not file_name.endswith(SPOOL_JOB_SUFFIX):
        return None
    name = file_name[: -len(SPOOL_JOB_SUFFIX)]
    return name or None


def spool_job_file(name: str) -> str:
    return name + SPOOL_JOB_SUFFIX


# The service's own files for a job are named from the job's name, which can be anything a file name can:
# up to 250 bytes, not UTF-8, unprintable. A stem longer than this would leave no room within NAME_MAX (255
# bytes) for ".result.json", an archive's "~N" and a temporary name's ".tmp-PID-XXXXXXXX".
MAX_RECORD_STEM = 100  # bytes
_PLAIN = re.compile(r"[A-Za-z0-9._+-]")


def spool_record_stem(name: str) -> str:
    """The stem of the service's files for job ``name``: the name itself when it is short, printable UTF-8;
    else a readable prefix and a hash of its bytes (``aaaa…aaaa-3f2c1d0e9b8a7c6d``), unique and always valid.

    >>> spool_record_stem("nightly"), spool_record_stem("a" * 230)[-17:]
    ('nightly', '-ae935371d83221b0')
    """
    raw = os.fsencode(name)
    try:
        plain = raw.decode("utf-8").isprintable() and not name.startswith(".")
    except UnicodeDecodeError:
        plain = False
    if plain and len(raw) <= MAX_RECORD_STEM:
        return name
    readable = "".join(c if _PLAIN.fullmatch(c) else "_" for c in raw.decode("utf-8", errors="replace"))
    return f"{readable[:40].lstrip('.')}-{hashlib.sha256(raw).hexdigest()[:16]}"


def spool_state_file(name: str) -> str:
    """``running/NAME.state.json``: the claim record (run dir, starts, pid) of the claimed job ``name``."""
    return f"{spool_record_stem(name)}.state.json"


def spool_result_file(stem: str) -> str:
    """``done/STEM.result.json`` or ``failed/STEM.result.json``: how the job ended (STEM: ``spool_archive_name``)."""
    return f"{stem}.result.json"


def spool_log_file(name: str) -> str:
    return f"{spool_record_stem(name)}.log"


def spool_archive_name(name: str, index: int) -> str:
    """Stem under which a finished job is kept in done/ or failed/: ``NAME``, then ``NAME~1``, ``NAME~2``...

    A job name can be submitted again after it finished; the earlier record is never overwritten.
    """
    stem = spool_record_stem(name)
    return stem if index == 0 else f"{stem}~{index}"


def tensorboard_suffix(first_epoch: int, token: str) -> str:
    """What ends the name of a session's TensorBoard event file, after tensorboardX's
    ``events.out.tfevents.<time>.<host>``: the epoch the session starts from and a random token."""
    return f".e{first_epoch:08d}.{token}"
