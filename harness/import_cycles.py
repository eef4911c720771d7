"""Finds import cycles among a project's own modules, including those hidden in functions.

A cycle can hide from Python itself: when one of its imports sits inside a function, nothing
fails at start-up, yet the modules still depend on each other and cannot be understood, tested
or moved apart. So every `import` and `from ... import` in a module counts here, at any depth
(function bodies included, and `if TYPE_CHECKING:` blocks: a module whose types name another
depends on it as much). Only the project's own modules, the `.py` files under the given paths,
are nodes; anything else (the standard library, third-party packages) is ignored.

    python -m harness.import_cycles [PATH ...]   # default: the current directory

prints each cycle as a chain of modules, with the line of every import on it, and exits 1 if
there is one (0 if none, 2 if a file cannot be parsed).
"""

from __future__ import annotations

import argparse
import ast
import itertools
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

# Enumerating every cycle of a tangled graph can take exponentially long; past this many the
# report says how many strongly connected groups remain, which is enough to act on.
MAX_CYCLES_REPORTED = 100
# Generated copies of the project's modules (a build's, a wheel's) would shadow the real ones.
SKIPPED_DIRECTORIES = frozenset({"__pycache__", "build", "dist", "node_modules"})


@dataclass(frozen=True, slots=True)
class ImportSite:
    """Where one module imports another: the file, the line, and where in the module."""

    path: Path
    line: int
    where: str  # "at module level", "inside a function" or "only for type checking"


@dataclass(frozen=True, slots=True)
class Module:
    name: str
    path: Path

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


# module name -> imported module name -> the first place it is imported
ImportGraph = dict[str, dict[str, ImportSite]]


class UnparsableModule(Exception):
    """A file under the given paths is not valid Python."""


def find_modules(paths: Iterable[Path]) -> dict[str, Module]:
    """The `.py` files under `paths`, by dotted module name.

    A file's name is taken from the packages above it: its directory and each parent that has
    an `__init__.py`. Hidden directories, build output and virtual environments are skipped.
    """
    modules: dict[str, Module] = {}
    for path in paths:
        for file in _python_files(path.resolve()):
            name = module_name(file)
            modules.setdefault(name, Module(name, file))
    return modules


def module_name(file: Path) -> str:
    parts = [] if file.name == "__init__.py" else [file.stem]
    directory = file.parent
    while (directory / "__init__.py").is_file():
        parts.append(directory.name)
        directory = directory.parent
    return ".".join(reversed(parts))


def _python_files(path: Path) -> Iterator[Path]:
    if path.is_file():
        if path.suffix == ".py":
            yield path
        return
    if _is_skipped(path):
        return
    for child in sorted(path.iterdir()):
        if child.is_dir():
            yield from _python_files(child)
        elif child.suffix == ".py":
            yield child


def _is_skipped(directory: Path) -> bool:
    return (
        directory.name.startswith(".")
        or directory.name in SKIPPED_DIRECTORIES
        or directory.name.endswith(".egg-info")
        or (directory / "pyvenv.cfg").exists()
    )


def build_graph(modules: dict[str, Module]) -> ImportGraph:
    """Each module's imports of other project modules; raises UnparsableModule."""
    graph: ImportGraph = {}
    for module in modules.values():
        try:
            tree = ast.parse(module.path.read_bytes(), filename=str(module.path))
        except SyntaxError as error:
            raise UnparsableModule(f"{module.path}:{error.lineno}: {error.msg}") from error
        edges: dict[str, ImportSite] = {}
        for node, where in _import_nodes(tree.body):
            for target in _imported_modules(node, module, modules):
                if target != module.name and target not in edges:
                    edges[target] = ImportSite(module.path, node.lineno, where)
        graph[module.name] = edges
    return graph


def _import_nodes(
    nodes: Iterable[ast.AST], where: str = "at module level"
) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement among `nodes` and inside them, with where it sits."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, where
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _import_nodes(ast.iter_child_nodes(node), "inside a function")
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _import_nodes(node.body, "only for type checking")
            yield from _import_nodes(node.orelse, where)
        else:
            yield from _import_nodes(ast.iter_child_nodes(node), where)


def _is_type_checking(test: ast.expr) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`."""
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
    return name == "TYPE_CHECKING"


def _imported_modules(
    node: ast.Import | ast.ImportFrom, importer: Module, modules: dict[str, Module]
) -> Iterator[str]:
    """The project modules an import statement names.

    NOTE: `import a.b.c` also runs `a` and `a.b`, but those package edges are left out: every
    module of a package would otherwise "import" its `__init__.py`, and an `__init__.py` that
    re-exports its submodules (a package's public API) would be a cycle with each of them. The
    package itself counts when it is what is imported (`from a import name`, `import a`).
    """
    if isinstance(node, ast.Import):
        for alias in node.names:
            target = _longest_known_prefix(alias.name, modules)
            if target is not None:
                yield target
        return
    base = _absolute_base(node, importer)
    if base is None:
        return
    for alias in node.names:
        submodule = f"{base}.{alias.name}" if base else alias.name
        if alias.name != "*" and submodule in modules:
            yield submodule  # `from package import module`
        else:
            target = _longest_known_prefix(base, modules)
            if target is not None:
                yield target


def _absolute_base(node: ast.ImportFrom, importer: Module) -> str | None:
    """The dotted module a `from ... import` reads from, relative levels resolved."""
    if node.level == 0:
        return node.module
    package = importer.name.split(".")
    if not importer.is_package:
        package = package[:-1]
    if node.level - 1 > len(package):
        return None  # beyond the top-level package: Python refuses it too
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def _longest_known_prefix(dotted: str, modules: dict[str, Module]) -> str | None:
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def strongly_connected_groups(graph: ImportGraph) -> list[list[str]]:
    """The groups of two or more modules that all reach each other (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    # NOTE: iterative, not recursive: a long import chain must not hit the recursion limit.
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = []
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work.append((root, iter(sorted(graph[root]))))
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in graph:
                    continue
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def find_cycles(graph: ImportGraph, limit: int = MAX_CYCLES_REPORTED) -> list[list[str]]:
    """Every elementary cycle (up to `limit`), each as a chain that ends where it starts.

    Each cycle is listed once: it is searched for from its smallest member, through larger ones.
    """
    cycles: list[list[str]] = []
    for group in strongly_connected_groups(graph):
        for start in group:
            allowed = {name for name in group if name > start}
            _extend_path(graph, [start], allowed, cycles, limit)
            if len(cycles) >= limit:
                return cycles
    return cycles


def _extend_path(
    graph: ImportGraph, path: list[str], allowed: set[str], cycles: list[list[str]], limit: int
) -> None:
    """Depth-first from `path`'s end through `allowed`, recording each way back to its start."""
    for successor in sorted(graph[path[-1]]):
        if len(cycles) >= limit:
            return
        if successor == path[0]:
            cycles.append([*path, successor])
        elif successor in allowed and successor not in path:
            path.append(successor)
            _extend_path(graph, path, allowed, cycles, limit)
            path.pop()


def describe(cycle: Sequence[str], graph: ImportGraph, root: Path) -> str:
    lines = ["import cycle: " + " -> ".join(cycle)]
    for importer, imported in itertools.pairwise(cycle):
        site = graph[importer][imported]
        lines.append(
            f"  {_relative(site.path, root)}:{site.line}: {importer} imports {imported} "
            f"({site.where})"
        )
    return "\n".join(lines)


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.import_cycles",
        description="Fail on any import cycle among the modules under PATH, hidden ones included.",
    )
    parser.add_argument("paths", nargs="*", type=Path, default=[Path(".")], metavar="PATH")
    arguments = parser.parse_args(argv)
    missing = [str(path) for path in arguments.paths if not path.exists()]
    if missing:
        parser.error(f"no such file or directory: {', '.join(missing)}")
    try:
        graph = build_graph(find_modules(arguments.paths))
    except UnparsableModule as error:
        print(f"cannot parse {error}", file=sys.stderr)
        return 2
    cycles = find_cycles(graph)
    root = Path.cwd().resolve()
    for cycle in cycles:
        print(describe(cycle, graph, root))
    if len(cycles) >= MAX_CYCLES_REPORTED:
        groups = strongly_connected_groups(graph)
        print(f"(stopped after {len(cycles)} cycles; {len(groups)} groups of modules in cycles)")
    if cycles:
        print(f"{len(cycles)} import cycle(s) among {len(graph)} modules", file=sys.stderr)
        return 1
    print(f"no import cycles among {len(graph)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
