"""bench/'s modules among themselves: every name one takes from another (`from bench.servers import
CLIENT_CORE`, or `capacity.PATH` after `from bench import capacity`) is defined there. The parts run
only by hand, and some import what only bench/requirements.txt installs, so this reads the source
rather than importing it."""

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
MODULES = sorted(path.stem for path in BENCH.glob("*.py") if "." not in path.stem and path.stem != "__init__")


def tree_of(module):
    return ast.parse((BENCH / f"{module}.py").read_text(encoding="utf-8"))


def defined_in(module):
    """The names bench/<module>.py binds at its top level."""
    names = set()
    for node in tree_of(module).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {name.id for name in ast.walk(target) if isinstance(name, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
    return names


def names_taken(module):
    """(bench module, name) for each name bench/<module>.py takes from another bench module."""
    tree = tree_of(module)
    aliases = {}
    taken = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "bench":
            aliases |= {alias.asname or alias.name: alias.name for alias in node.names if alias.name in MODULES}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench."):
            taken += [(node.module.removeprefix("bench."), alias.name) for alias in node.names]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            taken.append((aliases[node.value.id], node.attr))
    return taken


@pytest.mark.parametrize("module", MODULES)
def test_every_name_a_bench_module_takes_from_another_is_defined_there(module):
    missing = [f"bench.{source}.{name}" for source, name in names_taken(module) if name not in defined_in(source)]
    assert missing == []


def test_the_check_sees_both_ways_of_taking_a_name():
    assert ("servers", "CLIENT_CORE") in names_taken("wrk")
    assert ("capacity", "PATH") in names_taken("pgbouncer")
