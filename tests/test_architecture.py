"""Architecture rules checked over the source: no import cycles, errors only in the error modules.

The import graph covers ``shardkv`` and ``transformers`` (installed as
``shardkv.transformers``) and counts every import statement, at module level
or inside a function, so a cycle hidden behind a function-level import fails
too. Importing a submodule is not counted as importing its parent package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"shardkv": ROOT / "shardkv", "shardkv.transformers": ROOT / "transformers"}
# Error classes defined outside shardkv/errors.py, pending the owners' edits; do not add to it.
ERRORS_ELSEWHERE_ALLOWED: set[tuple[str, str]] = set()


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _imports(module: str) -> set[str]:
    """The in-project modules ``module`` imports (any depth in the file)."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if _is_package(module) else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in found if name in MODULES and name != module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_graph_sees_the_packages() -> None:
    graph = {m: _imports(m) for m in MODULES}
    assert "shardkv.proxy.store" in graph and "shardkv.transformers.registry" in graph
    assert "shardkv.errors" in graph["shardkv.proxy.store"]
    assert "shardkv.transformers" in graph["shardkv.metadata.draft"]


def test_cycle_finder_finds_function_level_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    graph = {m: _imports(m) for m in MODULES}
    assert _cycles(graph) == []


def test_error_classes_live_in_errors_module() -> None:
    elsewhere = set()
    for module, path in MODULES.items():
        if module in ("shardkv.errors", "shardkv.cli.errors"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                elsewhere.add((module, node.name))
    assert elsewhere == ERRORS_ELSEWHERE_ALLOWED
