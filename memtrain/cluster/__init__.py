"""memtrain's workers on a Dask cluster: address -> connection -> shared-files check -> task transport.

``address`` parses ``--cluster`` / ``[run] cluster``; ``connect`` opens a ``distributed.Client`` (or a local
Dask cluster for ``local:N``) and configures the workers; ``memory`` keeps Dask's memory monitor off mapped
file pages; ``sharedfs`` checks at start that every worker sees the run's files; ``transport`` carries the
task and result records to Dask workers, as ``train/server/exchange.py`` does to local processes.
Only this package imports ``distributed`` (installed with ``pip install "memtrain[cluster]"``).
"""
