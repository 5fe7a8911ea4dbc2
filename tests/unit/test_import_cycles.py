"""No import cycle among hookbus's modules: each module can be read, and loaded, on its own
terms. Every import counts, also those inside functions or under TYPE_CHECKING: a cycle
hidden by a late import is still a cycle in the design."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import hookbus

PACKAGE = Path(hookbus.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["hookbus", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    # the package's source folders are links (hookbus/bus -> ../bus); walk through them
    paths = [
        Path(folder) / file
        for folder, _dirs, files in os.walk(PACKAGE, followlinks=True)
        if "__pycache__" not in folder
        for file in files
        if file.endswith(".py")
    ]
    return {_module_name(p): p for p in paths}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The hookbus modules that module `name` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in known else base)
    return {target for target in found if target in known and target != name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle (its modules in import order, first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_graph_covers_the_package() -> None:
    graph = import_graph()
    assert "hookbus.services.orchestrator.loop.stage_runner" in graph
    assert "hookbus.skills.runner" in graph["hookbus.services.orchestrator.loop.stage_runner"]
    assert "hookbus.bus.keys" in graph["hookbus.services.orchestrator.serving.service"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_among_hookbus_modules() -> None:
    graph = import_graph()
    cycles = []
    while (cycle := find_cycle(graph)) is not None:  # list them all: break each found edge
        cycles.append(" -> ".join(cycle))
        graph[cycle[-2]].discard(cycle[-1])
    assert cycles == []
