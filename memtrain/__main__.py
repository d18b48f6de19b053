"""`python -m memtrain` is the `memtrain` command."""

import sys

from memtrain.cli import main

sys.exit(main())
