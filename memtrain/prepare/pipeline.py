"""PrepareOptions -> a complete dataset directory at OUT (manifest + shards), resumable, or an error and no OUT.

The stages, each its own module: source (``sources``/``csv_source``/...) -> checks, label codes and the
scatter into the spool (pass 1, ``shuffle.Spool``) -> gather in shuffled order, split, statistics and
shards (pass 2, ``shuffle.gather``, ``stats``, ``shard_writer``) -> manifest, written last -> one rename
into place (``workdir``). With ``--no-shuffle``, an array source (NPY, NPZ, HDF5) is read again in pass
2 instead of being copied into the spool, which then holds only the label codes: the rows are written
once, as they are by a plain copy. A table (CSV, Parquet) spools compact rows in pass 1 while ``table.Survey``
counts its levels, missing cells and means (``table_chunks`` drops rows without a label and applies
``--missing``); pass 2 expands them with the finished ``table.Encoding`` (one-hot, fill values).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.dataset import FORMAT, FORMAT_VERSION, write_manifest
from memtrain.errors import DiskFullError, InputError, Interrupted, plural
from memtrain.faults import fault_point
from memtrain.prepare.background import BackgroundJobs
from memtrain.prepare.labels import LabelCoder, Labels
from memtrain.prepare.options import PrepareOptions, parse_synthetic
from memtrain.prepare.shard_writer import ShardWriter, SplitSpec
from memtrain.prepare.shuffle import (
    CODE_DTYPE,
    TRAIN,
    RowSplit,
    Spool,
    bucket_count,
    gather,
    spool_codes,
    spool_intact,
    unshuffled_codes,
)
from memtrain.prepare.sources import Chunk, Source, open_source
from memtrain.prepare.stats import RunningStats
from memtrain.prepare.synthetic import SyntheticSource
from memtrain.prepare.table import CATEGORY, Encoding, Survey, final_codes
from memtrain.prepare.table_chunks import holes_of, rows_of, table_rows
from memtrain.prepare.table_notes import column_notes, distinct_levels, levels_line, rare_note, size_note
from memtrain.prepare.workdir import WorkArea, check_out
from memtrain.progress import reporting

Say = Callable[[str], None]
# Sources read again in pass 2 under --no-shuffle instead of being copied into the spool: reading them is
# cheaper than writing, syncing and reading a copy (CSV would be parsed twice, synthetic data generated twice).
REREAD_FORMATS = ("npy", "npz", "hdf5")


@dataclass(frozen=True)
class Display:
    """How progress is shown: ``plain`` lines even on a terminal; ``quiet``: nothing."""

    plain: bool = False
    quiet: bool = False


@dataclass
class PrepareSummary:
    out: Path
    rows: int
    splits: dict[str, int]
    shards: int
    task: str
    classes: list[str] | None
    bytes: int
    seconds: float
    dropped: int  # rows dropped as non-finite (--drop-nonfinite)
    resumed_shards: int
    notes: list[str] = field(default_factory=list)
    # wall seconds of each stage: "scatter" (pass 1; absent when resumed from a spool), "shards" (pass 2),
    # "publish" (manifest, rename, removal of the work area)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # tables: missing feature cells per column (imputed), rows dropped for a missing label / a missing cell
    missing: dict[str, int] = field(default_factory=dict)
    label_missing: int = 0
    missing_dropped: int = 0
    encoded: list[str] = field(default_factory=list)  # "island: 3 levels (one-hot)", per category column


def prepare(options: PrepareOptions, *, say: Say = print, force_plain: bool = False,
            quiet: bool = False) -> PrepareSummary:
    """Prepare ``options.source`` (or synthetic data) into the dataset directory ``options.out``.

    >>> prepare(PrepareOptions(Path("data/digits.csv"), Path("data/digits")))   # doctest: +SKIP
    """
    started = time.monotonic()
    check_out(options.out, options.overwrite)
    source = _open(options)
    work = WorkArea(options.out, options.resume_key(_identity(source)))
    work.claim()
    try:
        for other in work.sweep_others():
            say(f"removed an unfinished prepare made with other arguments: {other}")
        summary = _run(source, options, work, say, Display(force_plain, quiet))
    except KeyboardInterrupt as exc:  # (SIGTERM too): a rerun continues from the finished work
        raise Interrupted("interrupted; the shards finished so far are kept", path=work.root,
                          hint="run the same command again to continue from them") from exc
    except DiskFullError as exc:  # a rerun with more room continues from the finished work
        exc.hint = f"{exc.hint}; the finished shards are kept in {work.root}: run the same command again to " \
                   "continue from them"
        raise
    except BaseException:  # bad input, or anything unforeseen: a rerun could not use the work, so none is left
        work.discard()
        raise
    finally:
        work.release()
    summary.seconds = time.monotonic() - started
    return summary


def _open(options: PrepareOptions) -> Source:
    if options.synthetic is None:
        return open_source(options)
    rows, features = parse_synthetic(options.synthetic)
    return SyntheticSource(rows, features, classes=options.classes, regression=options.task == "regression",
                           seed=options.seed)


def _identity(source: Source) -> dict[str, Any]:
    identity = source.describe()
    for key in ("path", "y"):
        value = identity.get(key)
        if isinstance(value, str) and Path(value).exists():
            stat = Path(value).stat()
            identity[key] = {"path": str(Path(value).resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return identity


def spool_dtype(source: Source, options: PrepareOptions) -> np.dtype:
    """The dtype of x in the spool: the output dtype, but float32 at least when it holds level ids (float16
    holds whole numbers exactly only up to 2,048)."""
    if CATEGORY in (getattr(source, "kinds", None) or ()):
        return np.promote_types(options.np_dtype, np.float32)
    return options.np_dtype


def _run(source: Source, options: PrepareOptions, work: WorkArea, say: Say, display: Display) -> PrepareSummary:
    x_row_bytes = int(np.prod(source.feature_shape)) * spool_dtype(source, options).itemsize
    clock = time.monotonic()
    stages: dict[str, float] = {}
    spool = work.load_spool()
    if spool is not None and spool_intact(work.spool, spool["counts"],
                                          x_row_bytes if spool.get("x_spooled", True) else 0):
        finished = work.finished_shards()
        done = sum(len(v) for v in finished.values())
        say(f"resuming: the shuffle spool is complete; {plural(done, 'shard')} already complete "
            "(verified by checksum)")
    else:
        work.reset()
        spool = _scatter(source, options, work, display)
        finished = {}
        stages["scatter"], clock = time.monotonic() - clock, time.monotonic()
    labels = Labels(spool["task"], spool["classes"], spool["note"],
                    None if spool["table"] is None else np.asarray(spool["table"]), spool.get("warning"))
    if spool["rows"] == 0:
        raise _no_rows(source, spool["dropped"] + spool.get("label_missing", 0) + spool.get("missing_dropped", 0))
    if labels.warning:
        say(f"warning: {labels.warning}")
    for note in spool.get("table_notes", []):  # before the shards: a wrong column can still be left out
        say(f"warning: {note}")
    splits, stats = _write_shards(source, options, work, spool, labels, finished, display)
    stages["shards"], clock = time.monotonic() - clock, time.monotonic()
    manifest = _manifest(source, options, spool, labels, splits, stats)
    write_manifest(work.dataset, manifest, durable=True)
    fault_point("prepare_before_publish")
    work.publish(options.overwrite)
    work.discard()
    stages["publish"] = time.monotonic() - clock
    shards = sum(len(s["shards"]) for s in splits.values())
    size = sum(e["x_bytes"] + e["y_bytes"] for s in splits.values() for e in s["shards"])
    encoding = _encoding(spool)
    return PrepareSummary(options.out, spool["rows"], {k: v["rows"] for k, v in splits.items()}, shards,
                          labels.task, labels.classes, size, 0.0, spool["dropped"],
                          sum(len(v) for v in finished.values()), [labels.note], stages,
                          missing={c.name: c.missing for c in encoding.columns if c.missing} if encoding else {},
                          label_missing=spool.get("label_missing", 0), missing_dropped=spool.get("missing_dropped", 0),
                          encoded=levels_line(encoding, spool.get("distinct", {})) if encoding else [])


def _encoding(spool: dict[str, Any]) -> Encoding | None:
    return Encoding.from_dict(spool["encoding"]) if spool.get("encoding") else None


def _no_rows(source: Source, dropped: int) -> InputError:
    if dropped:
        return InputError("every row was dropped (non-finite or missing values)", path=source.path,
                          found=f"{plural(dropped, 'row')} dropped")
    expected = "data rows after the header" if source.format == "csv" else "at least one row"
    return InputError("no data rows", path=source.path, expected=expected, found="none")


# --- pass 1: read, check, code the labels, scatter into the spool ---

def _scatter(source: Source, options: PrepareOptions, work: WorkArea, display: Display) -> dict[str, Any]:
    features = int(np.prod(source.feature_shape))
    rows_per_chunk = max(1, options.chunk_bytes // (8 * features))
    buckets = bucket_count(_estimated_bytes(source, options), options.chunk_bytes, options.shuffle)
    coder = LabelCoder(options.task, source.path, source.label_name)
    survey = _survey(source, options)
    counts_dropped = {"label_missing": 0, "missing_dropped": 0}
    rows = dropped = read_bytes = 0
    started = time.monotonic()
    keep_x = options.shuffle or source.format not in REREAD_FORMATS
    with Spool(work.spool, buckets, options.seed, keep_x=keep_x) as spool, \
            reporting(f"reading {source.path or 'synthetic data'}", 1.0, plain_every=5.0,
                      force_plain=display.plain, quiet=display.quiet) as report:
        for chunk in source.chunks(rows_per_chunk):
            x, codes, bad = _check_chunk(chunk, source, options, coder, survey, counts_dropped)
            spool.add(x, codes)
            rows, dropped = rows + len(x), dropped + bad
            read_bytes += chunk.nbytes or len(chunk.x) * source.size_bytes // max(1, source.rows or 1)
            mbps = read_bytes / 1e6 / max(1e-9, time.monotonic() - started)
            report.update(min(1.0, read_bytes / max(1, source.size_bytes)), f"{rows:,} rows {mbps:.0f} MB/s")
        report.update(1.0, f"{rows:,} rows")  # the whole source is read (the byte count leaves out its header)
        counts = spool.finish()
    labels = coder.finish() if rows else Labels("classification", [], "", None)
    encoding, remaps = survey.finish() if survey is not None else (None, None)
    notes, distinct = _table_notes(source, options, survey, encoding, rows)
    info = {"rows": rows, "dropped": dropped, "counts": counts, "x_spooled": keep_x, "source": _identity(source),
            "encoding": None if encoding is None else encoding.as_dict(), "remaps": remaps, **counts_dropped,
            "table_notes": notes, "distinct": distinct,
            "warning": labels.warning,
            "task": labels.task,
            "classes": labels.classes, "note": labels.note, "text": bool(coder.text),
            "table": None if labels.table is None else labels.table.tolist()}
    work.commit_spool(info)
    return info


def _table_notes(source: Source, options: PrepareOptions, survey: Survey | None, encoding: Encoding | None,
                 rows: int) -> tuple[list[str], dict[str, int]]:
    """The warnings said before the shards are written, and each text column's distinct levels."""
    if survey is None or encoding is None:
        return [], {}
    distinct = distinct_levels(survey)
    notes = [*column_notes(survey, rows), rare_note(encoding, distinct, options.table),
             size_note(encoding, rows, options.np_dtype.itemsize, source.size_bytes)]
    return [note for note in notes if note], distinct


def _survey(source: Source, options: PrepareOptions) -> Survey | None:
    """A table source's survey (levels, means, missing cells); None for array sources."""
    kinds = getattr(source, "kinds", None)
    if kinds is None:
        return None
    return Survey(options.table, list(source.feature_names or []), kinds, source.label_name,
                  list(getattr(source, "columns", [])), source.path)


def _estimated_bytes(source: Source, options: PrepareOptions) -> int:
    features = int(np.prod(source.feature_shape))
    # CSV (rows unknown): every value takes at least 2 bytes of text ("0,"), which bounds the row count.
    rows = source.rows if source.rows is not None else source.size_bytes // (2 * (features + 1)) + 1
    return rows * (features * options.np_dtype.itemsize + CODE_DTYPE.itemsize)


def _check_chunk(chunk: Chunk, source: Source, options: PrepareOptions, coder: LabelCoder,
                 survey: Survey | None = None,
                 counts: dict[str, int] | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    n = len(chunk.x)
    raw = np.asarray(chunk.x).reshape(n, -1)
    if survey is not None:
        chunk, raw = table_rows(chunk, raw, source, options.missing, counts if counts is not None else {})
        n = len(raw)
    holes = holes_of(chunk, raw)
    with np.errstate(over="ignore", invalid="ignore"):  # out-of-range values become inf: reported below
        x = raw.astype(options.np_dtype, copy=False) if holes is None else \
            np.where(holes, 0.0, raw).astype(options.np_dtype)
    y = np.asarray(chunk.y).reshape(-1)
    dropped = 0
    if not chunk.finite:
        bad = _nonfinite_rows(x, y)
        dropped = int(bad.sum())
    if dropped:
        if not options.drop_nonfinite:
            raise _nonfinite_error(chunk, source, options, raw, x, y, int(np.flatnonzero(bad)[0]))
        x, y, raw = x[~bad], y[~bad], raw[~bad]
        chunk = rows_of(chunk, ~bad)
    codes = coder.encode(y, chunk.where(0)) if len(y) else np.empty(0, dtype=CODE_DTYPE)
    if survey is not None:
        x = survey.compact(raw, chunk.missing, chunk.text or {}, spool_dtype(source, options))
    return x, codes, dropped


def _nonfinite_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    bad = ~np.isfinite(x).all(axis=1)
    if y.dtype.kind in "biuf":
        bad |= ~np.isfinite(y)
    return bad


def _nonfinite_error(chunk: Chunk, source: Source, options: PrepareOptions, raw: np.ndarray, x: np.ndarray,
                     y: np.ndarray, row: int) -> InputError:
    columns = np.flatnonzero(~np.isfinite(x[row]))
    if len(columns):
        column = int(columns[0])
        name = source.feature_names[column] if source.feature_names else f"feature {column}"
        found = raw[row, column]
    else:
        name, found = source.label_name, y[row]
    return InputError(f"a value is not a finite {options.dtype} (NaN, Inf or out of range)", path=source.path,
                      where=f"{chunk.where(row)}, column '{name}'", expected="a finite number", found=found,
                      hint="pass --drop-nonfinite to drop such rows (the summary reports how many)")


# --- pass 2: gather in shuffled order, split, statistics, shards ---

def _write_shards(source: Source, options: PrepareOptions, work: WorkArea, spool: dict[str, Any], labels: Labels,
                  finished: dict[str, dict[int, Any]], display: Display) -> tuple[dict[str, Any], RunningStats]:
    rows = spool["rows"]
    encoding = _encoding(spool)
    width = encoding.width if encoding is not None else int(np.prod(source.feature_shape))
    piece_rows = max(1, options.chunk_bytes // (4 * max(1, max(width, int(np.prod(source.feature_shape))) * 8)))
    groups = _split_groups(options, labels, rows, work, spool, piece_rows)
    sizes = {"train": sum(g[0] - g[1] - g[2] for g in groups), "val": sum(g[1] for g in groups)}
    if options.test_fraction > 0:
        sizes["test"] = sum(g[2] for g in groups)
    specs = _split_specs(source, options, labels, sizes, encoding)
    stats = RunningStats(width)
    splitter = RowSplit(groups, options.seed)
    if spool.get("x_spooled", True):
        pieces = gather(work.spool, spool["counts"], (int(np.prod(source.feature_shape)),),
                        spool_dtype(source, options), seed=options.seed, shuffle=options.shuffle,
                        piece_rows=piece_rows)
    else:
        pieces = _reread(source, options, work, spool, piece_rows)
    done = 0
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(ShardWriter(work.dataset, specs[name], finished.get(name, {}),
                                                   work.record_shard)) for name in sizes]
        report = stack.enter_context(reporting("writing shards", rows, force_plain=display.plain,
                                               quiet=display.quiet))
        summing = stack.enter_context(BackgroundJobs(0))  # the statistics, beside the writes
        for x, codes in pieces:
            if encoding is not None:
                x = encoding.expand(final_codes(x, spool["remaps"], encoding), options.np_dtype)
            y = labels.encode(codes, text=spool["text"])
            split = splitter.take(y if options.stratify else np.zeros(len(y), dtype=np.int64))
            for code, writer in enumerate(writers):  # TRAIN, VAL, TEST
                rows = x[split == code]
                writer.push(rows, y[split == code])
                if code == TRAIN:
                    summing.submit(partial(stats.update, rows), rows.nbytes)
            done += len(x)
            report.update(done, f"{done:,} rows")
        summing.drain()
    splits = {name: {"rows": specs[name].rows, "shards": writer.entries} for name, writer in zip(sizes, writers,
                                                                                                 strict=True)}
    return splits, stats


def _reread(source: Source, options: PrepareOptions, work: WorkArea, spool: dict[str, Any],
            piece_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(x, codes) pieces in source order: the rows read again from the source (checked in pass 1, with the
    same non-finite rows dropped) beside their label codes from the spool, cut where ``gather`` cuts a
    spooled source (every ``piece_rows`` rows), so that the split draws, and the bytes, are the same."""
    if spool.get("source") != _identity(source):
        raise InputError("the source changed while it was being prepared", path=source.path,
                         hint="run the command again once nothing writes to the source")
    labels = unshuffled_codes(work.spool, spool["counts"])
    at = 0
    for piece in _cut(_checked_rows(source, options), piece_rows):
        yield piece, labels[at:at + len(piece)]
        at += len(piece)
    if at != spool["rows"]:
        raise InputError("the source changed while it was being prepared", path=source.path,
                         expected=f"{spool['rows']:,} rows", found=f"{at:,} rows")


def _checked_rows(source: Source, options: PrepareOptions) -> Iterator[np.ndarray]:
    """The source's rows as pass 1 spooled them: in the output dtype, non-finite rows dropped if asked."""
    for chunk in source.chunks(max(1, options.chunk_bytes // (8 * int(np.prod(source.feature_shape))))):
        n = len(chunk.x)
        with np.errstate(over="ignore", invalid="ignore"):
            x = np.asarray(chunk.x).reshape(n, -1).astype(options.np_dtype, copy=False)
        yield x[~_nonfinite_rows(x, np.asarray(chunk.y).reshape(-1))] if options.drop_nonfinite else x


def _cut(blocks: Iterator[np.ndarray], rows: int) -> Iterator[np.ndarray]:
    """The rows of ``blocks``, re-cut into pieces of exactly ``rows`` rows (the last one shorter)."""
    pending: list[np.ndarray] = []
    have = 0
    for block in blocks:
        while len(block):
            take = min(rows - have, len(block))
            pending.append(block[:take])
            have, block = have + take, block[take:]
            if have == rows:
                yield pending[0] if len(pending) == 1 else np.concatenate(pending)
                pending, have = [], 0
    if have:
        yield pending[0] if len(pending) == 1 else np.concatenate(pending)


def _split_groups(options: PrepareOptions, labels: Labels, rows: int, work: WorkArea, spool: dict[str, Any],
                  piece_rows: int) -> list[tuple[int, int, int]]:
    """(rows, val rows, test rows) of the whole data, or of each class when stratified (see RowSplit)."""
    def counts(n: int) -> tuple[int, int, int]:
        val = min(round(n * options.val_fraction), max(n - 1, 0))
        return n, val, min(round(n * options.test_fraction), max(n - 1 - val, 0))

    if not options.stratify:
        return [counts(rows)]
    if labels.task != "classification":
        raise InputError("--stratify needs classification labels", expected="task classification",
                         found=f"task {labels.task}", hint="leave out --stratify for regression targets")
    per_class = np.zeros(len(labels.classes), dtype=np.int64)
    for codes in spool_codes(work.spool, spool["counts"], piece_rows):
        per_class += np.bincount(labels.encode(codes, text=spool["text"]), minlength=len(per_class))
    return [counts(int(n)) for n in per_class]


def _split_specs(source: Source, options: PrepareOptions, labels: Labels, sizes: dict[str, int],
                 encoding: Encoding | None = None) -> dict[str, SplitSpec]:
    x_shape = (encoding.width,) if encoding is not None else tuple(source.feature_shape)
    row_bytes = int(np.prod(x_shape)) * options.np_dtype.itemsize + labels.y_dtype.itemsize
    per_shard = max(1, options.shard_bytes // row_bytes)
    return {name: SplitSpec(name, count, per_shard, x_shape, options.np_dtype, (), labels.y_dtype)
            for name, count in sizes.items()}


def _manifest(source: Source, options: PrepareOptions, spool: dict[str, Any], labels: Labels,
              splits: dict[str, Any], stats: RunningStats) -> dict[str, Any]:
    encoding = _encoding(spool)
    return {
        "format": FORMAT, "version": FORMAT_VERSION, "task": labels.task, "rows": spool["rows"],
        "x": {"shape": [encoding.width] if encoding else list(source.feature_shape), "dtype": options.dtype},
        "y": {"shape": [], "dtype": str(labels.y_dtype)},
        "classes": labels.classes if labels.task == "classification" else None,
        "splits": splits, "stats": stats.as_dict(),
        "source": source.describe(), "options": options.manifest_options(),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "feature_names": encoding.feature_names if encoding else source.feature_names, "task_note": labels.note,
        "dropped_rows": spool["dropped"], "encoding": encoding.as_dict() if encoding else None,
        "label_missing_rows": spool.get("label_missing", 0), "missing_dropped_rows": spool.get("missing_dropped", 0),
        "shard_rows": splits["train"]["shards"][0]["rows"] if splits["train"]["shards"] else None,
    }
