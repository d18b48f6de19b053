"""Train a memtrain job with its workers on Slurm nodes, through dask-jobqueue (an example to adapt).

    pip install "memtrain[cluster]" dask-jobqueue
    python jobs/examples/slurm-dask.py JOB.toml --nodes 4 --cores 32 --partition compute

It asks Slurm for ``--nodes`` jobs, each running one Dask worker process per core (one thread each,
as memtrain's workers compute with one BLAS thread by default), then runs ``memtrain train JOB.toml
--cluster <the scheduler's address>`` in this process, which stays the server (run it on a login or
head node, or inside an allocation). The dataset, the job's run directory and the exchange area must
be on the shared filesystem at the same path on every node: memtrain checks that before training and
names the worker that cannot see them. Interrupted? ``memtrain train --resume RUN_DIR --cluster ...``
continues from the newest checkpoint, on the cluster or (``--cluster ""``) on one machine.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", help="the memtrain job file (TOML)")
    parser.add_argument("--nodes", type=int, default=2, help="Slurm jobs (one per node) to ask for")
    parser.add_argument("--cores", type=int, default=16, help="cores per node: one Dask worker process each")
    parser.add_argument("--memory", default="64GB", help="memory per node (Dask's limit for its workers)")
    parser.add_argument("--partition", default=None, help="Slurm partition (queue)")
    parser.add_argument("--walltime", default="04:00:00", help="Slurm time limit per job")
    parser.add_argument("--account", default=None, help="Slurm account to charge")
    args, train_args = parser.parse_known_args()

    from dask_jobqueue import SLURMCluster

    from memtrain.cli import main as memtrain

    with SLURMCluster(
        queue=args.partition, account=args.account, cores=args.cores, processes=args.cores, memory=args.memory,
        walltime=args.walltime,
        # Each node's workers keep their scratch on node-local disk; memtrain's own files stay on the
        # shared filesystem named in the job.
        local_directory="$TMPDIR",
        scheduler_options={"dashboard_address": None},
    ) as cluster:
        cluster.scale(jobs=args.nodes)
        # memtrain waits (up to a minute) for the first worker; workers that start later join the run.
        return memtrain(["train", args.job, "--cluster", cluster.scheduler_address, *train_args])


if __name__ == "__main__":
    sys.exit(main())
