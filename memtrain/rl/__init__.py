"""Reinforcement learning: the building blocks of issue 40's engines (docs/rl.md). Not yet `memtrain train`."""
