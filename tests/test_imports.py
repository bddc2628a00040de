"""Import direction and cycles: harness -> granikv only, and no cycle among imports, wherever they sit.

The engine must run without the benchmark harness (a server image ships granikv alone), so no
module of granikv/ may import harness, not even inside a function. A cycle among module-level
imports makes import order matter (a half-initialised module answers AttributeError), so the
graph of top-level imports of harness/ and granikv/ must be acyclic. Pure AST walks: nothing is
imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("granikv", "harness")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The modules an import statement names (relative imports resolved against `module`)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parent = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
            base = ".".join(parent + ([base] if base else []))
        return [base] + [f"{base}.{a.name}" for a in node.names]  # `from pkg import mod` names a module
    return []


def _top_level_imports(path: Path, module: str, known: set[str]) -> set[str]:
    """Project modules imported at module level (not inside a function, not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.If | ast.Try | ast.With):
            stack += [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)]
            if isinstance(node, ast.Try):
                stack += [n for h in node.handlers for n in h.body]
            continue
        out |= {name for name in _imported(node, module, path.name == "__init__.py") if name in known}
    return out - {module}


def test_granikv_never_imports_harness():
    offenders = []
    for module, path in _modules().items():
        if not module.startswith("granikv"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = _imported(node, module, path.name == "__init__.py")
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                          if n == "harness" or n.startswith("harness.")]
    assert not offenders, "\n".join(offenders)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def _all_imports(path: Path, module: str, known: set[str]) -> set[str]:
    """Project modules imported anywhere in the file: at module level, inside functions, under
    TYPE_CHECKING. A function-level import hides a cycle from the interpreter, not from a reader:
    the two modules still cannot be understood, tested or moved apart."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        out |= {name for name in _imported(node, module, path.name == "__init__.py") if name in known}
    return out - {module}


def _without_parent_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # importing a submodule runs its package's __init__ first; that edge is not a cycle of ours
    return {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}


def test_no_import_cycle_at_all():
    modules = _modules()
    known = set(modules)
    cycle = _cycle(_without_parent_packages({m: _all_imports(p, m, known) for m, p in modules.items()}))
    assert cycle is None, " -> ".join(cycle or [])


def test_no_import_cycle_among_top_level_imports():
    modules = _modules()
    known = set(modules)
    cycle = _cycle(_without_parent_packages({m: _top_level_imports(p, m, known) for m, p in modules.items()}))
    assert cycle is None, " -> ".join(cycle or [])


@pytest.mark.parametrize("graph, cyclic", [({"a": {"b"}, "b": {"a"}}, True), ({"a": {"b"}, "b": set()}, False),
                                           ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True)])
def test_the_cycle_finder_finds_cycles(graph, cyclic):
    assert (_cycle(graph) is not None) == cyclic
