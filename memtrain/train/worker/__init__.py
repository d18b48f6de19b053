"""A worker process (one per slot, spawned by the server): launch.py makes the process quiet and single-threaded,
worker.py answers the server's messages with the loops of loops/; pool.py starts and watches such processes
(for the server, or for a node of a two-level round). Runs in a worker only; imports nothing of
server/ (tests/test_layering.py)."""
