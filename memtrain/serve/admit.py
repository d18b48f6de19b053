"""An untrusted job file -> an Admission (validated job, paths resolved against its folder) or InputError.

The file is read without following symbolic links and only up to MAX_JOB_BYTES; the TOML is validated
by memtrain.config (unknown keys, wrong types); every path is resolved with its symlinks against the
folder the file was dropped in, and with ``--root`` must stay under the root; the worker count must fit
the machine. The ``memtrain train`` child then gets those resolved paths on its command line, so the
job means the same thing after its file moved to running/.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrain.config import Job, job_from_dict, job_to_dict
from memtrain.errors import InputError
from memtrain.files import file_kind
from memtrain.layout import SPOOL_DONE, SPOOL_FAILED, SPOOL_LOGS, SPOOL_RUNNING, spool_job_name, spool_record_stem
from memtrain.models.registry import CODE_DIR, check_kind
from memtrain.serve.spool import check_code

# A real job file is a few hundred bytes. 1 MiB is far beyond any of them and small enough that
# reading and parsing a hostile one costs nothing.
MAX_JOB_BYTES = 1 << 20
EXCHANGE_CHOICES = ("auto", "shm", "run")  # run.exchange values that are not directories


@dataclass(frozen=True)
class Admission:
    """A job that may run: ``train_args`` is the command line of its ``memtrain train`` child."""

    name: str
    job: Job
    content: bytes  # the bytes that were validated
    resolved: dict[str, Any]  # what the run's job.json holds when this very job created the run

    def train_args(self, claimed: Path, *, resume: bool) -> list[str]:
        """``train running/NAME.toml --set data.path="/abs" --run-dir /abs [--resume]``."""
        args = ["train", str(claimed), "--set", f"data.path={json.dumps(str(self.job.data.path))}",
                "--run-dir", str(self.job.run.dir)]
        exchange = self.resolved["run"]["exchange"]
        if exchange not in EXCHANGE_CHOICES:
            args += ["--set", f"run.exchange={json.dumps(exchange)}"]
        if CODE_DIR in self.job.model.options:  # the folder that was checked is the one imported from and recorded
            args += ["--set", f"model.code_dir={json.dumps(self.job.model.options[CODE_DIR])}"]
        return args + (["--resume"] if resume else [])


def read_job_file(path: Path) -> bytes:
    """The bytes of a job file: a regular file (not a symlink, FIFO or device) of at most MAX_JOB_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        reason = "it is a symbolic link" if os.path.islink(path) else exc.strerror
        raise InputError(f"cannot open the job file: {reason}", path=path,
                         hint="drop the job file itself into the folder, not a link to it") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # checked before os.fdopen, which refuses a directory with a traceback
        os.close(fd)
        raise InputError("a job file must be a regular file", path=path, expected="a regular file",
                         found=file_kind(info.st_mode))
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > MAX_JOB_BYTES:
            raise InputError("the job file is too large", path=path, expected=f"at most {MAX_JOB_BYTES} bytes",
                             found=f"{info.st_size} bytes")
        content = handle.read(MAX_JOB_BYTES + 1)
    if len(content) > MAX_JOB_BYTES:
        raise InputError("the job file is too large", path=path, expected=f"at most {MAX_JOB_BYTES} bytes",
                         found="more")
    return content


def parse_toml(content: bytes, path: Path) -> dict[str, Any]:
    """The TOML document in ``content`` (InputError naming the file and the parser's complaint)."""
    try:
        return tomllib.loads(content.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"not valid TOML: not UTF-8 text ({exc.reason} at byte {exc.start})", path=path) from exc
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML: {exc}", path=path) from exc
    except RecursionError as exc:
        raise InputError("not valid TOML: nested too deeply", path=path) from exc


def admit(content: bytes, path: Path, *, base: Path, root: Path | None, spool: Path) -> Admission:
    """Validate a job. ``base`` is the folder the file was dropped in: its relative paths start there.

    >>> admit(b'[data]\\npath = "/srv/ds"', Path("jobs/a.toml"), base=Path("/srv/jobs"), root=None,
    ...       spool=Path("/srv/jobs")).job.run.dir
    PosixPath('/srv/jobs/runs/a')
    """
    raw = parse_toml(content, path)
    name = spool_job_name(path.name) or path.name
    run = raw.setdefault("run", {})
    if isinstance(run, dict):
        run.setdefault("dir", str(Path("runs") / spool_record_stem(name)))  # `memtrain train JOB.toml`'s default
    try:
        job = job_from_dict(raw, base=base, source=None, where=path)
        resolved = json.loads(json.dumps(job_to_dict(job)))
    except (TypeError, ValueError) as exc:
        raise InputError(f"invalid job ({exc})", path=path,
                         expected="numbers, strings, booleans, arrays and tables") from exc
    try:  # a typo in the kind fails now, not when a slot frees and the child starts (user code is not imported)
        check_kind(job.model.kind)
    except InputError as exc:
        exc.path = path
        raise
    _check_paths(job, resolved, path, base=base, root=root, spool=spool)
    _check_code(job, spool)
    cores = os.cpu_count() or 1
    if job.train.workers != "auto" and job.train.workers > cores:
        raise InputError("train.workers is more than this machine's cores", path=path,
                         expected=f"at most {cores}", found=job.train.workers)
    return Admission(name, job, content, resolved)


def _check_paths(job: Job, resolved: dict[str, Any], path: Path, *, base: Path, root: Path | None,
                 spool: Path) -> None:
    run_dir = Path(os.path.realpath(job.run.dir))
    named = {"data.path": Path(os.path.realpath(job.data.path)), "run.dir": run_dir}
    if "code_dir" in job.model.options:  # where model code is imported from: confined like the data
        named["model.code_dir"] = Path(os.path.realpath(job.model.options["code_dir"]))
    exchange = resolved["run"]["exchange"]
    if exchange not in EXCHANGE_CHOICES:
        resolved["run"]["exchange"] = os.path.realpath(base / exchange)
        named["run.exchange"] = Path(resolved["run"]["exchange"])
    real_spool = Path(os.path.realpath(spool))
    for sub in ("", SPOOL_RUNNING, SPOOL_DONE, SPOOL_FAILED, SPOOL_LOGS):
        folder = real_spool / sub if sub else real_spool
        if run_dir == folder or (sub and _inside(run_dir, folder)):
            raise InputError("run.dir would be inside the service's own folders", path=path, found=str(run_dir),
                             hint="point run.dir elsewhere (the default is runs/NAME beside the job file)")
    if root is None:
        return
    real_root = Path(os.path.realpath(root))
    for key, value in named.items():
        if not _inside(value, real_root):
            raise InputError(f"{key} resolves outside the root the service is confined to", path=path,
                             expected=f"a path under {real_root}", found=str(value))


def _check_code(job: Job, spool: Path) -> None:
    """Every folder the child can import the job's code from -- its working directory (the jobs folder) and
    ``model.code_dir`` -- and every package folder and module file below them that the job's module names
    can be found at, must be private (``spool.check_code``): the rule the jobs folder itself follows."""
    folders = [Path(os.path.realpath(spool))]
    if CODE_DIR in job.model.options:
        folders.append(Path(os.path.realpath(job.model.options[CODE_DIR])))
    names = [job.model.kind, job.model.options.get("factory"), job.model.options.get("loss")]
    modules = [name.partition(":")[0] for name in names if isinstance(name, str) and ":" in name]
    check_code(list(dict.fromkeys(folders)), modules)


def _inside(path: Path, root: Path) -> bool:
    return os.path.commonpath([path, root]) == str(root)
