"""The `memtrain` command: parses arguments, dispatches to the command modules, maps errors to exit codes.

Each command module exposes ``add_arguments(parser)`` and ``run(args) -> int``. Errors of the
MemtrainError family print one paragraph (exit 2 for bad input or configuration, 1 for failures); a stop
signal (Interrupted: exit 128 + the signal) prints where the run stopped and how to resume, not as an error;
``--debug`` shows the traceback instead. Console output is best effort (memtrain/streams.py): a closed
pipe or terminal never stops a command, and never turns a failure into exit 0.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from pathlib import Path

from memtrain import __version__
from memtrain.errors import DiskFullError, Interrupted, MemtrainError
from memtrain.faults import check_spec as check_fault_spec
from memtrain.files import is_no_space, no_space_error
from memtrain.streams import guarded_streams
from memtrain.train.worker.launch import end_command

COMMANDS = {
    "prepare": ("memtrain.prepare.command", "turn a CSV/NPY/NPZ/HDF5/Parquet source into a sharded dataset"),
    "train": ("memtrain.train.server.command", "run a training job (TOML job file)"),
    "inspect": ("memtrain.inspection", "show datasets, runs, checkpoints and .npy files on disk"),
    "serve": ("memtrain.serve", "run job files dropped into a jobs/ folder"),
    "bench": ("memtrain.bench", "measure memtrain against one process, pickling and shared memory"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser for ``command`` (only that command's module is imported: startup stays fast)."""
    parser = argparse.ArgumentParser(
        prog="memtrain",
        description="Data-parallel training of numpy models across processes on memory-mapped files.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of short errors")
    parser.add_argument("--version", action="version", version=f"memtrain {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        if name != command:
            commands.add_parser(name, help=help_text)
            continue
        module = importlib.import_module(module_name)
        sub = commands.add_parser(name, help=help_text, description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help="show tracebacks instead of short errors")
        module.add_arguments(sub)
        sub.set_defaults(module=module)
    return parser


def _command_in(argv: list[str]) -> str | None:
    return next((arg for arg in argv if arg in COMMANDS), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(_command_in(argv)).parse_args(argv)
    with guarded_streams():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        check_fault_spec()  # a test asking for a fault point that does not exist would pass by killing nothing
        return int(args.module.run(args) or 0)
    except Interrupted as exc:  # a stop the user asked for (Ctrl-C, SIGTERM), with how to resume: not an error
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"memtrain {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except MemtrainError as exc:
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"memtrain {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        # The last net: an operating-system error is reported in one line, never as a traceback.
        if getattr(args, "debug", False):
            traceback.print_exc()
        if is_no_space(exc):  # naming the filesystem written to; never guessing it (the working directory's)
            error = no_space_error(Path(exc.filename)) if exc.filename else \
                DiskFullError("no space left on the device while writing", hint="free some space and run it again")
        else:
            error = MemtrainError(exc.strerror or str(exc), path=exc.filename)
        print(f"memtrain {args.command}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"memtrain {args.command}: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        # memtrain's commands return their exit code: a SystemExit inside one was raised by user code (a
        # model, a factory, a loss) or a library. A non-zero code keeps its meaning; 0 or None must not
        # make a run that did not finish look successful.
        if exc.code not in (0, None):
            raise
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"memtrain {args.command}: error: stopped by SystemExit({exc.code!r}) raised inside the command "
              "(by user code: a model, a factory or a loss?) before it finished", file=sys.stderr)
        return 1
    except BaseException as exc:  # noqa: BLE001 - the last net: a BaseException class of the user's own
        if isinstance(exc, Exception | GeneratorExit):  # an Exception here is a bug: its traceback is wanted
            raise
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"memtrain {args.command}: error: stopped by {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def console() -> None:
    """The ``memtrain`` command: ``main``, then, when no other thread runs, the end without the interpreter's
    teardown (train/worker/launch.py ``end_command``: 58-91 ms of a command that loaded numpy, h5py and memtrain).
    ``main`` itself returns, for callers in the same process (the tests)."""
    end_command(main())


if __name__ == "__main__":
    console()
