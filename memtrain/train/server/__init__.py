"""The server process: the `memtrain train` command and memtrain.fit, the epoch loop (server.py's Trainer), the
engine chosen once from one table (choice.py) among the engines (engines.py; replay.py, onepass.py), where rounds
run (placement.py), the workers' pipes and their watch (exchange.py, scheduler.py, pools.py), the model outline,
the start-up checks (room, datacheck, advice) and an epoch's end (monitor.py, summary.py). Runs in the server
only: nothing in worker/ imports it (tests/test_layering.py)."""
