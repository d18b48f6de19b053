"""A plain torch DDP training script, as a user writes one: the outside harness's baseline (torch_outside.py).

    python benchmarks/torch_ddp_script.py DATASET --hidden H --epochs E [--order rows|batches] [--ranks 2]

Two ranks spawned on gloo over loopback, one torch thread each; every rank reads the training and validation
rows into memory once (standardized with the dataset's statistics, as memtrain's default ``data.normalize``
does), then per epoch visits batches of 512: ``--order rows`` (the default, like memtrain's default
``train.shuffle = "rows"`` and a ``DistributedSampler(shuffle=True)``) draws a new permutation of the rows
every epoch and each rank gathers its half of each batch (``x[idx]``); ``--order batches`` slices contiguous
batches (a view), in a seeded order of the batches. SGD at lr 0.01 on each batch's mean cross-entropy (DDP
averages the ranks' gradients); after every epoch each rank validates its half of the validation rows and one
``all_reduce`` adds them up. No checkpoint is written. Prints one JSON line (rank 0): the last validation.
It uses memtrain only to read the dataset's files.
"""

from __future__ import annotations

import argparse
import json
import os
import socket

BATCH = 512
LR = 0.01


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--order", choices=("rows", "batches"), default="rows")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(rank_main, args=(args, port), nprocs=args.ranks, join=True)


def rank_main(rank: int, args: argparse.Namespace, port: int) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import memtrain

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    ds = memtrain.open_dataset(args.dataset)
    norm = ds.normalizer
    x_np, y_np = ds.split("train")[:]
    xs, ys = torch.from_numpy(norm(x_np)), torch.from_numpy(np.asarray(y_np, dtype=np.int64))
    vx_np, vy_np = ds.split("val")[:]
    half = (len(vy_np) + args.ranks - 1) // args.ranks
    vx = torch.from_numpy(norm(vx_np))[rank * half:(rank + 1) * half]
    vy = torch.from_numpy(np.asarray(vy_np, dtype=np.int64))[rank * half:(rank + 1) * half]
    torch.manual_seed(args.seed)
    net = nn.Sequential(nn.Linear(ds.n_features, args.hidden), nn.ReLU(), nn.Linear(args.hidden, len(ds.classes)))
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    n = len(ys)
    batches = n // BATCH
    part = BATCH // args.ranks
    last = {}
    for epoch in range(args.epochs):
        generator = torch.Generator().manual_seed(args.seed + epoch)
        if args.order == "rows":
            perm = torch.randperm(n, generator=generator)
        else:
            perm = torch.randperm(batches, generator=generator)
        for b in range(batches):
            if args.order == "rows":
                idx = perm[b * BATCH + rank * part:b * BATCH + (rank + 1) * part]
                x, y = xs[idx], ys[idx]
            else:
                lo = int(perm[b]) * BATCH + rank * part
                x, y = xs[lo:lo + part], ys[lo:lo + part]
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        net.eval()
        with torch.no_grad():
            scores = net(vx)
            sums = torch.tensor([float(F.cross_entropy(scores, vy, reduction="sum")),
                                 float((scores.argmax(1) == vy).sum()), float(len(vy))], dtype=torch.float64)
        net.train()
        dist.all_reduce(sums)
        last = {"epoch": epoch + 1, "val_loss": float(sums[0] / sums[2]), "val_accuracy": float(sums[1] / sums[2])}
    dist.barrier()
    if rank == 0:
        print(json.dumps(last), flush=True)
    dist.destroy_process_group()
    os._exit(0)  # a gloo rank's interpreter teardown sometimes aborts in a C++ destructor (torch_peers.py)


if __name__ == "__main__":
    main()
