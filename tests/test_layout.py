"""The repository's shape: no import cycles in the package, no module anywhere (tests and scripts included)
over the size a reader can hold, no reach into another module's private names, every product feature a
`dskbench` command (scripts/ holds set-up, run, test and the evidence plans, and never imports tests).
Read from the source (AST), so it runs without torch or a GPU."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PKG = REPO / "dskbench"
MAX_LINES = 500
CODE_DIRS = ("dskbench", "tests", "scripts", "bench", "benchmarks")
SCRIPTS = {"setup.sh", "run.sh", "test.sh", "wheelhouse.py"}  # set-up, run, test; evidence/ beside them


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


def python_files() -> list[Path]:
    """Every .py file of the repository's code folders: the ones git tracks (untracked scratch files left
    out), or every one on disk where there is no git checkout."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", *CODE_DIRS], cwd=REPO, capture_output=True, check=True
        ).stdout.decode()
        files = [REPO / f for f in listed.split("\0") if f.endswith(".py")]
    except (OSError, subprocess.CalledProcessError):
        files = []
    if not files:
        files = [f for d in CODE_DIRS for f in sorted((REPO / d).rglob("*.py"))]
    return [f for f in files if f.is_file()]  # a tracked file deleted in the work tree is gone


def oversized(files: list[Path], limit: int = MAX_LINES) -> dict[str, int]:
    return {str(f.relative_to(REPO)): n for f in files if (n := len(f.read_text().splitlines())) > limit}


def test_the_size_rule_sees_every_code_folder_and_finds_a_long_file(tmp_path):
    found = {f.relative_to(REPO).parts[0] for f in python_files()}
    assert {"dskbench", "tests", "scripts", "bench", "benchmarks"} <= found
    assert REPO / "tests" / "test_layout.py" in python_files()
    long = REPO / "tests" / "test_layout.py"
    assert oversized([long], limit=10) == {"tests/test_layout.py": len(long.read_text().splitlines())}


def test_no_module_over_the_size_limit():
    big = oversized(python_files())
    assert big == {}, f"modules over {MAX_LINES} lines: {big}"


def test_scripts_hold_set_up_run_test_and_the_evidence_plans_only():
    entries = {p.name for p in (REPO / "scripts").iterdir() if p.name != "__pycache__"}
    assert entries - {"evidence"} == SCRIPTS, "a product feature belongs in dskbench as a command"


def imported_roots(path: Path) -> set[str]:
    """The top-level names a file imports (function bodies included)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def test_scripts_never_import_tests():
    scripts = [f for f in python_files() if f.relative_to(REPO).parts[0] == "scripts"]
    assert scripts, "scripts/wheelhouse.py at least"
    assert {str(f.relative_to(REPO)) for f in scripts if "tests" in imported_roots(f)} == set()
    assert "tests" in imported_roots(REPO / "tests" / "cli_with_fakes.py")  # the rule can see one


def test_no_module_imports_another_modules_private_names():
    known = modules()
    reach = []
    for name, path in known.items():
        for mod, names in imports_of(path, known):
            reach += [
                f"{name} imports {mod}.{n}" for n in names if n.startswith("_") and not n.startswith("__")
            ]
    assert reach == []
