"""import-linter's contracts over this checkout's own modules (.importlinter).

import-linter builds its graph of packages only, and the service's spine is plain modules at the
root (app.py, auth.py, ...), which it refuses as root packages. The contracts here are its own
layers and acyclic_siblings contracts, checked against a graph of the checkout read the way grimp
reads a package: every import statement of every module outside tests/, bench/ and tools/, at module level
or inside a function, under the module's dotted name (gunicorn.conf.py as gunicorn_conf)."""

import ast
import copy
import functools
from pathlib import Path

import grimp
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.layers import LayersContract

ROOT = Path(__file__).resolve().parents[2]
# Packages of the checkout that are not the service.
NOT_THE_SERVICE = {"tests", "bench", "tools"}
# The one package the rooms contract puts every room in.
ROOMS = "service"


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts).replace("gunicorn.conf", "gunicorn_conf")


def service_files():
    """The root's modules and its packages' (folders with __init__.py): never a virtualenv or
    node_modules that happens to sit in the checkout."""
    yield from sorted(ROOT.glob("*.py"))
    for package in sorted(ROOT.glob("*/__init__.py")):
        if package.parent.name not in NOT_THE_SERVICE:
            yield from sorted(package.parent.rglob("*.py"))


def imported_modules(node, modules):
    """The service's modules an import statement imports: `from a import b` imports the module a.b
    where there is one, else a (whose name b is)."""
    if isinstance(node, ast.ImportFrom) and node.level:
        raise ValueError(f"line {node.lineno}: a relative import; the service imports absolutely")
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                 for alias in node.names]
    found = set()
    for name in names:
        # `import a.b.c` imports a.b.c, or the deepest of its parents that is one of the modules.
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


@functools.cache
def checkout_graph():
    """The import graph of the service's modules, as grimp would build it for a package."""
    graph = grimp.ImportGraph()
    sources = {module_name(path): path for path in service_files()}
    for name in sources:
        graph.add_module(name)
    for name, path in sources.items():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for imported in imported_modules(node, sources) - {name}:
                graph.add_import(importer=name, imported=imported, line_number=node.lineno,
                                 line_contents=lines[node.lineno - 1].strip())
    return graph


class CheckoutLayersContract(LayersContract):
    """import-linter's layers contract on the checkout's graph."""

    def check(self, graph, verbose):
        return super().check(copy.deepcopy(checkout_graph()), verbose)


class CheckoutAcyclicSiblingsContract(AcyclicSiblingsContract):
    """import-linter's acyclic_siblings contract on the checkout's graph."""

    def check(self, graph, verbose):
        return super().check(copy.deepcopy(checkout_graph()), verbose)


class CheckoutAcyclicRoomsContract(AcyclicSiblingsContract):
    """No circle between the checkout's rooms (its root modules and folders): acyclic_siblings on a
    graph where every module sits in one package, ROOMS, whose children are the rooms."""

    def __init__(self, name, session_options, contract_options):
        super().__init__(name, session_options, {**contract_options, "ancestors": [ROOMS], "depth": "0"})

    def check(self, graph, verbose):
        return super().check(in_one_package(checkout_graph()), verbose)


def in_one_package(graph):
    """A copy of the graph with every module under ROOMS (`app` as `service.app`)."""
    rooms = grimp.ImportGraph()
    rooms.add_module(ROOMS)
    for module in graph.modules:
        rooms.add_module(f"{ROOMS}.{module}")
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            rooms.add_import(importer=f"{ROOMS}.{module}", imported=f"{ROOMS}.{imported}")
    return rooms
