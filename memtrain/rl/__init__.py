"""Reinforcement learning (docs/rl.md): the building blocks, and ``memtrain train``'s synchronous loop (server.py)."""
