"""Sources (CSV, NPY/NPZ, HDF5, Parquet, synthetic) -> sharded dataset directories: ``memtrain prepare``.

>>> from memtrain.prepare import PrepareOptions, prepare          # doctest: +SKIP
>>> prepare(PrepareOptions(Path("data/digits.csv"), Path("data/digits")))
"""

from memtrain.prepare.options import PrepareOptions
from memtrain.prepare.pipeline import PrepareSummary, prepare

__all__ = ["PrepareOptions", "PrepareSummary", "prepare"]
