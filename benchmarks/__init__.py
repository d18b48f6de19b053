"""One-off measurements behind decisions recorded in docs/ (not shipped in the wheel: pyproject.toml packages
``memtrain*`` only). Run each from the repository's top folder, e.g. ``python -m benchmarks.torch_binding``;
they import memtrain and, where they share its problems and runners, ``memtrain.benchmarks`` (the modules of
``memtrain bench``)."""
