"""The training core's layering (docs/how-it-works.md): no import cycle among memtrain/train/, config.py and
memtrain/cluster/; config.py imports nothing from train/; the cluster imports none of the engine it serves; a
worker process's code (train/worker/) reaches nothing of the server's (train/server/), not even through another module.

Imports are read from the source (module level and inside functions, as they run; those under
``TYPE_CHECKING`` are for type checkers only), so a cycle closed by a function-level import counts too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import memtrain

ROOT = Path(memtrain.__file__).parent
CORE = ("memtrain.train", "memtrain.config", "memtrain.cluster")
# what the cluster may import of train/: the records that cross, the plan, the weights' names and the exchange's
# files (their one owner), nothing that runs
CLUSTER_MAY_IMPORT = {"memtrain.train.messages", "memtrain.train.plan", "memtrain.train.exchange.weights",
                      "memtrain.train.exchange.area", "memtrain.train.timing"}


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(("memtrain", *path.relative_to(ROOT).with_suffix("").parts))
        found[name.removesuffix(".__init__")] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("memtrain"):
                for alias in child.names:
                    full = f"{child.module}.{alias.name}"
                    out.add(full if full in known else child.module)
            elif isinstance(child, ast.Import):
                out.update(alias.name for alias in child.names if alias.name.startswith("memtrain"))
            visit(child)

    visit(ast.parse(path.read_text()))
    return out & known


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) for name, path in found.items() if name.startswith(CORE)}


def cycle(edges: dict[str, set[str]]) -> list[str]:
    """One import cycle among ``edges``' modules, or [] (a depth-first search for a back edge)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in edges:
                continue
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state and (found := walk(node)):
            return found
    return []


def test_the_training_core_has_no_import_cycle() -> None:
    assert cycle(graph()) == []


def test_config_imports_nothing_from_train() -> None:
    assert not {m for m in graph()["memtrain.config"] if m.startswith("memtrain.train")}


def test_the_cluster_imports_none_of_the_engine_it_serves() -> None:
    for name, deps in graph().items():
        if name.startswith("memtrain.cluster"):
            assert {m for m in deps if m.startswith("memtrain.train")} <= CLUSTER_MAY_IMPORT, name


def reached(edges: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_a_worker_reaches_nothing_of_the_server() -> None:
    edges = graph()
    workers = [name for name in edges if name.startswith("memtrain.train.worker.")]
    assert workers
    for name in workers:
        assert not {m for m in reached(edges, name) if m.startswith("memtrain.train.server")}, name


def test_the_search_finds_a_cycle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


# --- the one-off measurement scripts (benchmarks/) time through train/timing.py's hook, never by patching ---

BENCHMARKS = ROOT.parent / "benchmarks"
# The one patch left, named here so that no other can hide: stream_profile's ``--cluster processes`` swaps the
# server's cluster transport for local worker processes (a transport, not a timing; no hook for it yet).
PATCHES_LEFT = {("stream_profile.py", "server.open_cluster")}


def patches(path: Path) -> set[str]:
    """What ``path`` assigns on a name it imported from memtrain (a class's or a module's attribute), and every
    ``setattr``/``delattr`` it calls."""
    tree = ast.parse(path.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("memtrain"):
            imported |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            imported |= {(alias.asname or alias.name).split(".")[0] for alias in node.names
                         if alias.name.startswith("memtrain")}
    found = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AugAssign | ast.AnnAssign) else []
        for target in targets:
            base = target
            while isinstance(base, ast.Attribute):
                base = base.value
            if target is not base and isinstance(base, ast.Name) and base.id in imported:
                found.add(ast.unparse(target))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            found.add(ast.unparse(node))
    return found


def test_no_benchmark_script_patches_memtrain() -> None:
    scripts = sorted(BENCHMARKS.glob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))  # and the bench's own
    assert scripts
    found = {(path.name, patch) for path in scripts for patch in patches(path)}
    assert found == PATCHES_LEFT, f"benchmarks/ patching memtrain (time through memtrain/train/timing.py): {found}"
# What the Trainer must not name: it asks the Choice (train/server/choice.py) and its engine, never which mode
# it runs (an additive model's pass and solve, a replay of a lineage, async mode). Words of identifiers.
MODE_WORDS = {"additive", "replay", "replaying", "lineage", "recorded", "mode", "async"}


def named_modes(source: str, cls: str = "Trainer") -> set[str]:
    """Every identifier in class ``cls`` of ``source`` (names, attributes, arguments, functions) with a word
    that names a mode (words: split at underscores and capitals)."""
    [tree] = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef) and node.name == cls]
    found = set()
    for node in ast.walk(tree):
        name = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                else node.arg if isinstance(node, (ast.arg, ast.keyword)) and node.arg
                else node.name if isinstance(node, ast.FunctionDef) else None)
        if name and MODE_WORDS & {w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", name)}:
            found.add(name)
    return found


def test_the_trainer_names_no_mode() -> None:
    """The epoch loop and the choice of its engine read one Choice: no branch on an additive model, a replay's
    lineage or the training mode (the words of its log lines are the Choice's)."""
    assert named_modes((ROOT / "train" / "server" / "server.py").read_text()) == set()


def branches_on_modes(source: str, functions: tuple[str, ...] = ("train", "_train")) -> set[str]:
    """The conditions (of an ``if``, a conditional expression, a ``while``) in the start-up ``functions`` of ``source``
    that name a mode (``MODE_WORDS``, or the overlapping modes): a start-up that asks which engine it runs."""
    trees = [node for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.FunctionDef) and node.name in functions]
    assert len(trees) == len(functions)
    found = set()
    for tree in trees:
        for node in ast.walk(tree):
            for test in [node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else []:
                words = {w.lower() for name in identifiers(ast.unparse(test))
                         for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", name)}
                if words & (MODE_WORDS | {"overlapping", "staleness"}):
                    found.add(ast.unparse(test))
    return found


def test_no_start_up_function_branches_on_a_mode() -> None:
    """``train`` and ``_train`` choose no engine themselves: an additive model's solve and a replay are rows of the
    one table (train/server/choice.py), which also refuses the jobs no engine runs."""
    assert branches_on_modes((ROOT / "train" / "server" / "server.py").read_text()) == set()


def test_the_start_up_branch_search_finds_one() -> None:
    source = ("def train(job, replay):\n    if job.run.cluster and replay is not None:\n        raise X\n"
              "def _train(context):\n    notes = [a(job) if context.additive else b(job)]\n")
    assert branches_on_modes(source) == {"job.run.cluster and replay is not None", "context.additive"}


def test_the_mode_search_finds_a_branch() -> None:
    source = "class Trainer:\n    def fit(self):\n        if self.context.additive or self.lineage:\n            pass\n"
    assert named_modes(source) == {"additive", "lineage"}
    assert named_modes(source.replace("self.lineage", "self.modelLineage")) == {"additive", "modelLineage"}
    assert named_modes(source.replace(" or self.lineage", ".model_kind")) == {"additive"}


# Names the glossary (memtrain/train/__init__.py) retired, each with the one name kept for its concept: the
# server's own work between updates is its chores; the optimizer's vectors are its state vectors.
RETIRED = {"heartbeat": "chores", "housekeeping": "chores", "between_updates": "chores", "while_waiting": "chores",
           "meanwhile": "chores", "Looks": "Chores", "looks": "chores", "state_slots": "state_names",
           "run_state_slots": "run_state_names"}


def identifiers(source: str) -> set[str]:
    """Every name, attribute, argument, keyword, function and class name of ``source``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, (ast.arg, ast.keyword)) and node.arg:
            found.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found.add(node.name)
    return found


def test_one_name_per_concept() -> None:
    for name, path in modules().items():
        if name.startswith(CORE):
            assert not identifiers(path.read_text()) & set(RETIRED), name
    from dataclasses import fields

    from memtrain.train.messages import GradTask
    assert "ticket" in {f.name for f in fields(GradTask)} and "update" not in {f.name for f in fields(GradTask)}, \
        "a streamed gradient's number is its ticket; 'update' is the plan's number only"
