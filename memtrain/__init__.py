"""memtrain: data-parallel training of numpy models across processes on memory-mapped files."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["open_dataset", "load_model", "load_checkpoint", "__version__"]

if TYPE_CHECKING:
    from memtrain.dataset import open_dataset


def __getattr__(name: str) -> Any:
    # Lazy: `import memtrain` stays cheap for worker processes and for `memtrain --help`.
    if name == "open_dataset":
        from memtrain.dataset import open_dataset
        return open_dataset
    if name == "load_model":
        from memtrain.predict import load_model
        return load_model
    if name == "load_checkpoint":
        from memtrain.train.checkpoint import load_checkpoint
        return load_checkpoint
    raise AttributeError(name)
