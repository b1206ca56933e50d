"""The package's shape: no import cycles, no module over the size a reader can hold, no reach into another
module's private names. Read from the source (AST), so it runs without torch or a GPU."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "dskbench"
MAX_LINES = 500


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py in the package."""
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(path: Path, known: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(imported dskbench module, names taken from it) for every import in the file, function bodies
    included, `if TYPE_CHECKING:` blocks excluded."""
    tree = ast.parse(path.read_text(), str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if _type_checking_only(node):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("dskbench")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dskbench"):
            names = [a.name for a in node.names]
            submodules = [f"{node.module}.{n}" for n in names if f"{node.module}.{n}" in known]
            attrs = [n for n in names if f"{node.module}.{n}" not in known]
            found += [(m, []) for m in submodules]
            if attrs:
                found.append((node.module, attrs))
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {
        name: {m for m, _ in imports_of(path, known) if m in known and m != name}
        for name, path in known.items()
    }


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_the_package():
    assert cycles(graph()) == []


def test_no_module_over_the_size_limit():
    big = {name: n for name, f in modules().items() if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert big == {}, f"modules over {MAX_LINES} lines: {big}"


def test_no_module_imports_another_modules_private_names():
    known = modules()
    reach = []
    for name, path in known.items():
        for mod, names in imports_of(path, known):
            reach += [
                f"{name} imports {mod}.{n}" for n in names if n.startswith("_") and not n.startswith("__")
            ]
    assert reach == []
