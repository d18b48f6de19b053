"""(not yet built)"""

import argparse

from memtrain.errors import MemtrainError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise MemtrainError("this command is not built yet")
