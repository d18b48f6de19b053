"""What the data order does to a model: a source sorted by class, prepared with ``--no-shuffle``, trained with
each ``train.shuffle``, against the same rows prepared shuffled (issue 27). Accuracies are deterministic.

    python -m benchmarks.sorted_classes                 # 240,000 rows, MLP and softmax, 3 epochs
    python -m benchmarks.sorted_classes --rows 24000 --models softmax --json

The source: ``--rows`` rows of ``FEATURES`` features in ``CLASSES`` overlapping Gaussian classes (class c
centred at a seeded random point, unit noise scaled by ``NOISE``, so no model gets far above 0.37),
written sorted by class as ``x.npy`` / ``y.npy``. It is prepared twice through ``memtrain prepare``: with
``--no-shuffle`` (the rows stay sorted; the validation rows are still a random subset) and shuffled. Each
model then trains ``--epochs`` epochs with ``batch_size = BATCH`` on each dataset with each shuffle, through
``memtrain train`` in this process; the table is the final validation accuracy. With ``"batches"`` every
batch of the sorted dataset is rows of one class, and so is the last one of each epoch: the model ends
each epoch tilted towards that class. ``"rows"`` mixes the classes in every batch.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from memtrain.files import read_jsonl
from memtrain.layout import RUN_METRICS
from memtrain.order import WINDOW

CLASSES = 10
FEATURES = 8
NOISE = 2.2  # the classes overlap: no model gets much above 0.37 (chance: 0.1)
BATCH = 256
SEED = 0
MODELS = {"mlp": 'kind = "mlp"\nhidden = [64]', "softmax": 'kind = "softmax"'}
JOB = """
[data]
path = "{data}"

[model]
{model}

[train]
epochs = {epochs}
batch_size = {batch}
tasks_per_update = 2
optimizer = "{optimizer}"
lr = {lr}
seed = 0
workers = {workers}
shuffle = "{shuffle}"
shuffle_window = {window}

[run]
dir = "{run}"
checkpoint_every = 1000
"""
LR = 0.003
OPTIMIZER = "adam"


def write_sorted_source(folder: Path, rows: int, *, noise: float = NOISE, seed: int = SEED) -> tuple[Path, Path]:
    """``x.npy`` and ``y.npy`` of ``rows`` rows of classes overlapping by ``noise``, sorted by class (equal
    shares)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(CLASSES, FEATURES)).astype(np.float32)
    y = np.repeat(np.arange(CLASSES, dtype=np.int64), -(-rows // CLASSES))[:rows]
    x = centres[y] + noise * rng.normal(size=(rows, FEATURES)).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    return folder / "x.npy", folder / "y.npy"


def prepare(x: Path, y: Path, out: Path, *, shuffle: bool) -> Path:
    """``memtrain prepare x.npy out --y y.npy`` (with ``--no-shuffle`` unless ``shuffle``)."""
    from memtrain.cli import main

    args = ["prepare", str(x), str(out), "--y", str(y), "--quiet", "--overwrite"]
    args += [] if shuffle else ["--no-shuffle"]
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    if code != 0:
        raise RuntimeError(f"memtrain {' '.join(args)} failed")
    return out


def val_accuracy(data: Path, run: Path, *, model: str, shuffle: str, epochs: int, batch: int = BATCH,
                 lr: float = LR, optimizer: str = OPTIMIZER, window: int = WINDOW, workers: int = 0) -> float:
    """``memtrain train`` of ``model`` on ``data`` with ``train.shuffle = shuffle``: the last epoch's val_accuracy."""
    from memtrain.cli import main

    run.mkdir(parents=True, exist_ok=True)
    job = run.parent / f"{run.name}.toml"
    job.write_text(JOB.format(data=data, model=MODELS[model], epochs=epochs, batch=batch, lr=lr, workers=workers,
                              shuffle=shuffle, window=window, run=run, optimizer=optimizer))
    with contextlib.redirect_stdout(io.StringIO()):  # the run's summary: the table says what matters here
        code = main(["train", str(job), "--quiet", "--overwrite"])
    if code != 0:
        raise RuntimeError(f"memtrain train {job} failed")
    epochs_logged = [r for r in read_jsonl(run / RUN_METRICS) if r.get("kind") == "epoch"]
    return float(epochs_logged[-1]["val_accuracy"])


def run(args: argparse.Namespace) -> list[dict[str, object]]:
    scratch = Path(tempfile.mkdtemp(prefix="memtrain-sorted-", dir=args.dir))
    try:
        x, y = write_sorted_source(scratch / "source", args.rows)
        datasets = {"sorted (--no-shuffle)": prepare(x, y, scratch / "sorted", shuffle=False),
                    "prepared shuffled": prepare(x, y, scratch / "shuffled", shuffle=True)}
        table = []
        for model in args.models.split(","):
            for source, data in datasets.items():
                for shuffle in args.shuffles.split(","):
                    accuracy = val_accuracy(data, scratch / "runs" / f"{model}-{data.name}-{shuffle}", model=model,
                                            shuffle=shuffle, epochs=args.epochs, window=args.window)
                    table.append({"model": model, "dataset": source, "shuffle": shuffle, "val_accuracy": accuracy})
                    if not args.json:
                        print(f"{model:8} {source:22} train.shuffle = {shuffle!r:10} val_accuracy {accuracy:.3f}",
                              flush=True)
        return table
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sorted_classes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=240_000, help="rows of the source (default %(default)s)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of every run (default %(default)s)")
    parser.add_argument("--models", default="mlp,softmax", help="comma-separated (default %(default)s)")
    parser.add_argument("--shuffles", default="rows,batches", help="train.shuffle values (default %(default)s)")
    parser.add_argument("--window", type=int, default=WINDOW, help="train.shuffle_window (default %(default)s)")
    parser.add_argument("--dir", type=Path, help="where to put the temporary files (default: $TMPDIR)")
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    args = parser.parse_args(argv)
    table = run(args)
    if args.json:
        print(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
