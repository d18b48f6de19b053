"""Run the job files dropped into a jobs folder, one machine's worth at a time, surviving restarts.

Drop a job file (the TOML of `memtrain train`) into the folder; write it under another name and rename
it in, so that it is never seen half-written:
  cp my-job.toml jobs/my-job.toml.tmp && mv jobs/my-job.toml.tmp jobs/my-job.toml

It moves to jobs/running/ while it trains (output in jobs/logs/NAME.log), then to jobs/done/ or
jobs/failed/ beside NAME.result.json (final metrics, run directory, times, or the error). Paths in a job
are relative to the jobs folder. SIGTERM or Ctrl-C: running jobs checkpoint and stay in running/; the
next start resumes them. Subfolders such as jobs/examples/ are never run.

Examples:
  memtrain serve                                  # watch jobs/, one job at a time
  memtrain serve --jobs /srv/jobs --max-concurrent 2 --root /srv
  memtrain serve --status                         # queued, running (with progress), done, failed
  memtrain serve --once                           # run what is there, then exit
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from memtrain.errors import InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=Path, default=Path("jobs"), metavar="DIR",
                        help="the jobs folder to watch (default: jobs/)")
    parser.add_argument("--max-concurrent", type=int, default=1, metavar="N", help="jobs run at once (default 1)")
    parser.add_argument("--root", type=Path, metavar="DIR",
                        help="refuse jobs whose data, run or exchange paths resolve outside DIR")
    parser.add_argument("--polling", action="store_true",
                        help="poll the folder instead of inotify (network filesystems, containers' bind mounts)")
    parser.add_argument("--once", action="store_true", help="exit once nothing is queued, waiting or running")
    parser.add_argument("--status", action="store_true", help="show the folder's jobs and exit")
    parser.add_argument("--json", action="store_true", help="with --status: print the status as JSON")
    parser.add_argument("--settle", type=float, default=1.0, metavar="SECONDS",
                        help="how long a file found without a close or rename event must stay unchanged (1)")
    parser.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                        help="how long an incomplete (empty, not TOML, never closed) file may wait before it "
                             "is failed (30)")
    parser.add_argument("--rescan", type=float, default=10.0, metavar="SECONDS",
                        help="seconds between full scans of the folder; events can be lost (10)")


def run(args: argparse.Namespace) -> int:
    # Imported here: every `memtrain train` child imports the CLI too, and needs none of the service.
    from memtrain.serve.service import Service, Settings
    from memtrain.serve.spool import Spool
    from memtrain.serve.status import show

    if args.status:
        folder = Path(args.jobs).absolute()
        if not folder.is_dir():
            raise InputError("the jobs folder does not exist", path=folder)
        return show(Spool(folder), as_json=args.json)
    _check_numbers(args)
    settings = Settings(Path(args.jobs).absolute(), max_concurrent=args.max_concurrent, polling=args.polling,
                        root=args.root.resolve() if args.root else None, settle=args.settle, grace=args.grace,
                        rescan=args.rescan, once=args.once)
    return Service(settings).run()


def _check_numbers(args: argparse.Namespace) -> None:
    if args.max_concurrent < 1:
        raise InputError("--max-concurrent must be at least 1", found=args.max_concurrent)
    for flag in ("settle", "grace", "rescan"):
        value = getattr(args, flag)
        if not math.isfinite(value) or value <= 0:
            raise InputError(f"--{flag} out of range", expected="a finite number of seconds > 0", found=value)
    if args.root is not None and not args.root.is_dir():
        raise InputError("the --root folder does not exist", path=args.root)
