"""Every JSON record memtrain writes, its fields declared once (as layout.py declares every on-disk name).

A record is a list of fields: name, type, whether it is always there, one line of meaning. docs/formats.md
has one table per record (marked ``<!-- record: NAME -->``); tests/test_format_spec.py checks each table
against these declarations, and the records real runs write against them (``problems``). Writers build a
record with ``make``, which refuses a key the declaration lacks or a required one missing: the dict it
returns is the one given, in the order given, so the bytes written do not depend on this module.

Types are words of JSON: ``int``, ``float``, ``string``, ``bool``, ``object``, ``list`` (``list of ...``
says of what), ``null``, joined by `` or ``. Nested objects are records of their own where a reader needs
their fields (a checkpoint's ``position`` and ``data``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    meaning: str
    required: bool = True


@dataclass(frozen=True)
class Record:
    name: str  # the marker of its table in docs/formats.md
    fields: tuple[Field, ...]

    @cached_property
    def keys(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @cached_property
    def names(self) -> frozenset[str]:
        """The declared names as a set (``make`` asks it for every key of every per-update record: made once)."""
        return frozenset(self.keys)

    @cached_property
    def accepted(self) -> set[tuple[str, ...]]:
        """The lists of keys ``make`` has accepted for this record in this process (it checks each list once)."""
        return set()

    @cached_property
    def required(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.required and f.name != SEAL[0])

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)


def _record(name: str, *fields: tuple[Any, ...]) -> Record:
    """``(name, type, meaning)`` or ``(name, type, meaning, False)`` for a field that may be absent."""
    return Record(name, tuple(Field(*spec) for spec in fields))


SEAL = ("record_checksum", "string", "the record's seal: xxh3-128 of every other field (files.seal)")

MANIFEST = _record(
    "manifest",
    ("format", "string", "always memtrain.dataset"),
    ("version", "int", "3"),
    ("task", "string", "classification or regression"),
    ("rows", "int", "rows of every split"),
    ("x", "object", "one row's features: shape and dtype"),
    ("y", "object", "one row's label: shape and dtype"),
    ("classes", "list of strings or null", "class names by index; null for regression"),
    ("splits", "object", "split name -> rows and shards"),
    ("stats", "object", "per-feature mean, std, min, max over train"),
    ("source", "object", "where the data came from"),
    ("options", "object", "the options that decide the bytes"),
    ("created", "string", "ISO-8601 UTC time"),
    ("feature_names", "list of strings or null", "each feature's name"),
    ("task_note", "string", "how the task was decided"),
    ("dropped_rows", "int", "rows dropped by --drop-nonfinite"),
    ("encoding", "object or null", "tables: how raw rows became x"),
    ("label_missing_rows", "int", "rows dropped for a missing label"),
    ("missing_dropped_rows", "int", "rows dropped by --missing drop"),
    ("shard_rows", "int or null", "rows per full shard"),
    SEAL,
)
ENCODING = _record(
    "encoding",
    ("columns", "list of objects", "the feature columns in the order of x"),
    ("categorical", "string", "one-hot or ordinal"),
    ("na_values", "list of strings", "spellings of a missing cell"),
    ("missing", "string", "the --missing mode"),
    ("label", "string", "the label column"),
    ("source_columns", "list of strings", "every column of the source"),
)

SHARD = _record(
    "shard",
    ("rows", "int", "rows in the shard"),
    ("x", "string", "the x file, relative to the dataset"),
    ("y", "string", "the y file, relative to the dataset"),
    ("x_bytes", "int", "the x file's size"),
    ("y_bytes", "int", "the y file's size"),
    ("x_checksum", "string", "xxh3-128 of the x file"),
    ("y_checksum", "string", "xxh3-128 of the y file"),
)
PREPARE_DONE = _record(
    "prepare-done",
    ("split", "string", "the shard's split"),
    ("index", "int", "its number in the split"),
    ("entry", "object", "its SHARD entry"),
    SEAL,
)
SERVE_STATUS = _record(
    "serve-status",
    ("format", "string", "always memtrain.serve-status"),
    ("version", "int", "1"),
    ("updated_at", "float", "Unix time"),
    ("folder", "string", "the jobs folder"),
    ("service", "object or null", "the live service; null if none"),
    ("counts", "object", "jobs queued, running, done, failed"),
    ("queued", "list of objects", "the queued jobs"),
    ("running", "list of objects", "the running jobs"),
    ("done", "list of objects", "the newest finished jobs"),
    ("failed", "list of objects", "the newest failed jobs"),
)

JOB = _record(
    "job",
    ("format", "string", "always memtrain.job"),
    ("version", "int", "1"),
    ("data", "object", "the job's [data], every default filled in"),
    ("model", "object", "the job's [model]"),
    ("train", "object", "the job's [train]"),
    ("run", "object", "the job's [run], without dir"),
    SEAL,
)
HISTORY_START = _record(
    "history-start",
    ("event", "string", "start"),
    ("time", "string", "local time of the start"),
    SEAL,
)
HISTORY_RESUME = _record(
    "history-resume",
    ("time", "string", "local time of the resume"),
    ("event", "string", "resume"),
    ("from_checkpoint", "string or null", "the checkpoint resumed from"),
    ("epoch", "int", "epochs done at the resume"),
    ("changes", "object", "setting -> from, to"),
    SEAL,
)
PARAMS = _record(
    "params",
    ("dtype", "string", "<f4"),
    ("size", "int", "P, values in a weight version"),
    ("params", "list of objects", "name, shape, offset (and buffer) of each parameter"),
    SEAL,
)

LINEAGE_INIT = _record(
    "lineage-init",
    ("version", "int", "0"),
    ("parent", "null", "none"),
    ("init", "object", "seed of the initial weights"),
    ("checksum", "string", "the version's weight checksum"),
    ("format", "string", "always memtrain.lineage"),
    ("format_version", "int", "2"),
    SEAL,
)
LINEAGE_UPDATE = _record(
    "lineage-update",
    ("version", "int", "the version this line publishes"),
    ("parent", "int", "version - 1"),
    ("update", "int", "the update, from 1 over the run"),
    ("epoch", "int", "its epoch, from 1"),
    ("batch", "int", "its batch in the epoch, from 1"),
    ("split", "string", "train"),
    ("tasks", "list of [lo, hi]", "the gradients' rows, in reduction order"),
    ("at", "list of ints", "the version each gradient was computed at"),
    ("lr", "float", "the learning rate of the step"),
    ("checksum", "string", "the version's weight checksum"),
    ("ids", "list of ints", "async: each gradient's task number in its epoch", False),
    ("discarded", "int", "async: stale gradients computed again", False),
    SEAL,
)
LINEAGE_SOLVE = _record(
    "lineage-solve",
    ("version", "int", "1"),
    ("parent", "int", "0"),
    ("update", "int", "1"),
    ("epoch", "int", "1"),
    ("split", "string", "train"),
    ("tasks", "list of [lo, hi]", "the statistics' rows, summed in this order"),
    ("solve", "string", "the model kind whose solve made the version"),
    ("checksum", "string", "the version's weight checksum"),
    SEAL,
)

METRICS_UPDATE = _record(
    "metrics-update",
    ("kind", "string", "update"),
    ("epoch", "int", "from 1"),
    ("batch", "int", "from 1 in the epoch"),
    ("update", "int", "from 1 over the run"),
    ("version", "int", "the newest version after it"),
    ("loss", "float", "mean training loss of its rows at the weights before it"),
    ("rows", "int", "its rows"),
    ("skipped", "bool", "true if not published (non-finite)"),
    ("compute_s", "float", "seconds its gradients took"),
    ("time", "float", "Unix time of its publication"),
)
METRICS_EPOCH = _record(
    "metrics-epoch",
    ("kind", "string", "epoch"),
    ("epoch", "int", "from 1"),
    ("update", "int", "the update that ended it"),
    ("version", "int", "the version evaluated"),
    ("loss", "float or null", "mean training loss; null for an additive model"),
    ("val_loss", "float", "validation loss", False),
    ("val_accuracy", "float", "classifiers", False),
    ("val_macro_f1", "float", "classifiers", False),
    ("val_log_loss", "float", "classifiers with predict_proba", False),
    ("val_r2", "float", "regression", False),
    ("val_mae", "float", "regression", False),
    ("val_rmse", "float", "regression", False),
    ("samples_per_s", "float", "training rows per second"),
    ("time", "float", "Unix time"),
)

CHECKPOINT = _record(
    "checkpoint",
    ("format", "string", "always memtrain.checkpoint"),
    ("version", "int", "2"),
    ("position", "object", "where training resumes"),
    ("epoch", "int", "epochs finished"),
    ("update", "int", "updates done"),
    ("weights_version", "int", "the version in weights.npy"),
    ("rng", "object", "seed and scheme"),
    ("optimizer", "object", "name, slots, step"),
    ("model", "object", "kind and options"),
    ("data", "object", "what load_model needs of the dataset"),
    ("layout", "object", "params.json"),
    ("metrics", "object", "the last epoch record"),
    ("best", "object", "the best epoch record so far"),
    ("best_only", "bool", "written only because the epoch was the best"),
    ("files", "object", "file name -> checksum and bytes"),
    ("created", "string", "local time"),
    SEAL,
)
CHECKPOINT_POSITION = _record(
    "checkpoint-position",
    ("epoch", "int", "epochs finished"),
    ("batch", "int", "batches done in the next epoch"),
    ("version", "int", "the newest version"),
    ("epoch_loss", "float", "summed loss of the epoch so far"),
    ("epoch_rows", "int", "rows of the epoch so far"),
    ("skipped", "int", "updates skipped"),
    ("best", "object", "the best epoch record"),
    # the run's schedule's own state, under the schedule's name (train/schedule.py ScheduleState)
    ("planned", "object", "sync: {bases: [updates, version] pairs}, the older versions still read", False),
    ("arrival", "object", "async: {applied: ints}, the tasks already applied this epoch", False),
    # before the schedules owned their state, both at the top level of every position: still read
    ("bases", "list of [updates, version]", "earlier releases: planned's bases", False),
    ("applied", "list of ints", "earlier releases: arrival's applied", False),
)
CHECKPOINT_DATA = _record(
    "checkpoint-data",
    ("task", "string", "classification or regression"),
    ("x", "object", "the manifest's x"),
    ("y", "object", "the manifest's y"),
    ("classes", "list of strings or null", "the manifest's classes"),
    ("stats", "object", "the manifest's stats"),
    ("normalize", "bool", "data.normalize"),
    ("dataset", "string", "the dataset's path"),
    ("encoding", "object or null", "the manifest's encoding"),
    ("target_scale", "object or null", "data.scale_target: the training target's mean and std", False),
)
STATISTICS_PLAN = _record(
    "statistics-plan",
    ("format", "int", "1"),
    ("tasks", "list of [lo, hi]", "the pass's tasks"),
    ("chunk_rows", "int", "rows added at a time"),
    ("size", "int", "values in a partial"),
    ("source", "string", "checksum of the dataset's manifest, the model and data.normalize"),
    SEAL,
)
STATISTICS_FILE = _record(
    "statistics-file",
    ("file", "string", "the .npy file"),
    ("checksum", "string", "xxh3-128 of the whole file"),
    SEAL,
)

RECORDS = (MANIFEST, ENCODING, SHARD, PREPARE_DONE, SERVE_STATUS, JOB, HISTORY_START, HISTORY_RESUME, PARAMS,
           LINEAGE_INIT, LINEAGE_UPDATE, LINEAGE_SOLVE, METRICS_UPDATE, METRICS_EPOCH, CHECKPOINT, CHECKPOINT_POSITION,
           CHECKPOINT_DATA, STATISTICS_PLAN, STATISTICS_FILE)
_JSON_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (float, int), "string": (str,), "bool": (bool,),
                                            "object": (dict,), "list": (list,), "null": (type(None),)}


def type_problem(type_text: str, value: Any) -> str | None:
    """None if ``value`` is one of the types ``type_text`` names (``"list of ints or null"``), else why not."""
    kinds = [alternative.split()[0] for alternative in type_text.split(" or ")]
    for kind in kinds:
        if isinstance(value, bool) and kind in ("int", "float"):
            continue  # a JSON true is no number
        if isinstance(value, _JSON_TYPES[kind]):
            return None
    return f"expected {type_text}, found {type(value).__name__} {value!r:.60}"


def problems(record: Record, obj: dict[str, Any]) -> list[str]:
    """What is wrong with ``obj`` as a ``record``: undeclared keys, missing required ones, wrong types."""
    found = [f"{key}: not a field of {record.name}" for key in obj if key not in record.names]
    found += [f"{f.name}: missing" for f in record.fields if f.required and f.name not in obj]
    found += [f"{f.name}: {why}" for f in record.fields if f.name in obj
              if (why := type_problem(f.type, obj[f.name])) is not None]
    return found


def make(record: Record, **values: Any) -> dict[str, Any]:
    """``values`` as a dict (in the order given), refused (ValueError: a bug) unless its keys are ``record``'s
    and every required one is there; the seal is added later, by whoever writes it. The keys a record is made
    with are checked once per process (a run makes two records per update, always with the same keys)."""
    keys = tuple(values)
    if keys in record.accepted:
        return values
    wrong = [key for key in values if key not in record.names]
    missing = [name for name in record.required if name not in values]
    if wrong or missing:
        raise ValueError(f"{record.name} record: undeclared {wrong}, missing {missing} (memtrain/records.py)")
    record.accepted.add(keys)
    return values
