"""memtrain: data-parallel training of numpy models across processes on memory-mapped files.

The Python API (the command line, ``memtrain --help``, does the same from a shell)::

    import memtrain
    summary = memtrain.fit("job.toml", train={"epochs": 5})   # train a job file; no __main__ guard needed
    print(summary)                                            # a short table: best and final epochs
    model = memtrain.load_model(summary.run_dir)              # the best epoch's; predict / predict_proba
    ds = memtrain.open_dataset("data/digits")                 # a prepared dataset, mapped read-only
    for x, y in ds.batches(128, seed=0, epoch=0): ...          # numpy batches for your own training loop
    # memtrain.torch.BatchDataset(ds, 128, epoch=0): the same batches as tensors for a torch DataLoader

- ``fit(job, **settings)``: run a training job (``memtrain train``): a job file, a dict of its sections, or
  the sections as keywords (``data=``, ``model=``, ``train=``, ``run=``); returns a ``TrainSummary``.
- ``load_job(path)``: read and validate a job file without running it.
- ``open_dataset(path)``: a ``Dataset`` made by ``memtrain prepare``.
- ``load_model(run, which=None | "best" | "last")``: a ``TrainedModel`` from a run (by default its best
  epoch's checkpoint) or a checkpoint.
- ``load_checkpoint(path)``: the raw parameter arrays and metadata of a checkpoint.
- ``MemtrainError``: every error memtrain raises on purpose (``InputError``: bad input or settings).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["fit", "load_job", "open_dataset", "Dataset", "load_model", "TrainedModel", "load_checkpoint",
           "TrainSummary", "MemtrainError", "InputError", "__version__"]

# Lazy: `import memtrain` stays cheap for worker processes and for `memtrain --help`.
_WHERE = {
    "fit": "memtrain.train.server.fit", "load_job": "memtrain.config", "open_dataset": "memtrain.dataset",
    "Dataset": "memtrain.dataset", "load_model": "memtrain.predict", "TrainedModel": "memtrain.predict",
    "load_checkpoint": "memtrain.train.records.checkpoint", "TrainSummary": "memtrain.train.server.server",
    "MemtrainError": "memtrain.errors", "InputError": "memtrain.errors",
}

if TYPE_CHECKING:
    from memtrain.config import load_job
    from memtrain.dataset import Dataset, open_dataset
    from memtrain.errors import InputError, MemtrainError
    from memtrain.predict import TrainedModel, load_model
    from memtrain.train.records.checkpoint import load_checkpoint
    from memtrain.train.server.fit import fit
    from memtrain.train.server.server import TrainSummary


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'memtrain' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


def __dir__() -> list[str]:
    """The API and the module's own dunder names (not the helpers imported to implement the laziness)."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
