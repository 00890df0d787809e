"""python/ has no import circles (issue 25, "Python without circles").

Every module of each package under python/ is parsed with `ast` (nothing
is imported), and every import is read, those inside functions too. The
test fails naming each circle among the package's modules, and naming each
import of a package module inside a function: such an import is how a
circle hides (the module imports at call time what imports it). An import
inside a function is left to optional heavy dependencies from outside the
package (pallas, safetensors, tokenizers), each with a comment why.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / "python"


def modules(pkg_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for the package at |pkg_dir| (its
    __init__ is the package's own name)."""
    out = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        parts = list(path.relative_to(pkg_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names (its base)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_pkg:
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str, path: Path, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported package module, line, inside a function) for every import
    of |module| that names a module of |known|. `from X import name` names
    X.name when that is a module, else X."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_pkg = path.name == "__init__.py"
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    name = alias.name
                    while name and name not in known:
                        name = name.rpartition(".")[0]
                    if name:
                        found.append((name, child.lineno, in_function))
            elif isinstance(child, ast.ImportFrom):
                base = _resolve(module, is_pkg, child)
                for alias in child.names:
                    full = f"{base}.{alias.name}" if base else alias.name
                    target = full if full in known else base
                    if target in known:
                        found.append((target, child.lineno, in_function))
            visit(child, inner)

    visit(tree, False)
    return found


def graph(pkg_dir: Path) -> tuple[dict[str, set[str]], list[str]]:
    """(module -> the package modules it imports, anywhere), and one line
    per import of a package module inside a function."""
    mods = modules(pkg_dir)
    known = set(mods)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    inside: list[str] = []
    for m, path in mods.items():
        for target, line, in_function in imports(m, path, known):
            if target == m:
                continue
            edges[m].add(target)
            where = f"{path.relative_to(pkg_dir.parent.parent)}:{line}: imports {target} inside a function"
            if in_function and where not in inside:
                inside.append(where)
    return edges, inside


def cycles(edges: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """The circles of |edges|: per strongly connected component of more
    than one module (Tarjan's algorithm), one circle through its first
    module (a -> ... -> a) and the component's modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strongconnect(v)
    return [(_path_through(edges, set(c)), c) for c in comps]


def _path_through(edges: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest circle from the component's first module back to it."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start] + list(reversed(path[:-1])) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def problems(python_dir: Path) -> list[str]:
    """Every circle and every function-level import of a package module,
    in every package under |python_dir|, as lines for a failure message."""
    out = []
    for pkg in sorted(p.parent for p in python_dir.glob("*/__init__.py")):
        edges, inside = graph(pkg)
        for circle, comp in cycles(edges):
            line = f"import circle in {pkg.name}: {' -> '.join(circle)}"
            if len(comp) + 1 > len(circle):
                line += f" (one of the circles among {', '.join(comp)})"
            out.append(line)
        out += inside
    return out


def test_no_import_circles_and_no_function_level_imports() -> None:
    assert list(PYTHON.glob("*/__init__.py")), f"no package under {PYTHON}"
    found = problems(PYTHON)
    assert not found, "\n".join(found)


def test_the_check_sees_a_circle_and_a_hidden_import(tmp_path: Path) -> None:
    """The check can fail: a scratch package with a circle (a -> b -> a) and
    an import inside a function (c imports a at call time)."""
    pkg = tmp_path / "scratch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from .a import x\n")
    (pkg / "c.py").write_text("import os\n\ndef f():\n    from . import a\n    import json\n    return a, json, os\n")
    found = problems(tmp_path)
    assert "import circle in scratch: scratch.a -> scratch.b -> scratch.a" in found, found
    assert any("c.py:4: imports scratch.a inside a function" in line for line in found), found
    assert not any("json" in line or "os" in line.split(": ")[-1] for line in found), found
    assert len(found) == 2, found


if __name__ == "__main__":
    lines = problems(Path(sys.argv[1]) if len(sys.argv) > 1 else PYTHON)
    print("\n".join(lines) if lines else f"no import circles under {os.path.relpath(PYTHON)}")
    sys.exit(1 if lines else 0)
