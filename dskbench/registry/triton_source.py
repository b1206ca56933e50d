"""Reading Triton kernels out of sglang's Python source with `ast` (sglang is never imported).

A trace document may name a file of Triton kernels without naming the kernels ("mem_cache/allocator.py
| allocator kernels"). `kernels_of_file` answers which `@triton.jit` kernels such a file runs in the
sglang release at hand:

- the kernels the file defines itself (`@triton.jit`, `@jit` imported from triton, `@triton.jit(...)`
  with arguments, under any stack of `@triton.autotune` / `@triton.heuristics`);
- the kernels it reaches through what it imports from other sglang modules: a kernel imported by name,
  a launcher function or class that refers to a kernel, a module imported whole (`m.launcher`), a
  re-export (`from m import *`), followed up to MAX_HOPS modules away. A file that became a shim or
  moved into `sglang/kernels/ops/` keeps its kernels this way.

The source is an unpacked sglang package (a site-packages folder, or the `sglang` folder itself) or a
wheel file, read through `SglangSource`.
"""

from __future__ import annotations

import ast
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

MAX_HOPS = 4  # modules followed away from the traced file


class SourceError(ValueError):
    """A source that is not an sglang package or wheel; the message is one line."""


class SglangSource:
    """The `.py` files of an sglang package: `read("sglang/srt/x.py")`, from a folder or a wheel."""

    def __init__(self, where: Path):
        where = Path(where)
        self.where = where
        self._files: dict[str, str] | None = None
        if where.is_file() and where.suffix == ".whl":
            try:
                self._zip: zipfile.ZipFile | None = zipfile.ZipFile(where)
            except (OSError, zipfile.BadZipFile) as e:
                raise SourceError(f"{where}: not a readable wheel ({e})") from None
            self.root: Path | None = None
            self.names = frozenset(n for n in self._zip.namelist() if n.endswith(".py"))
        elif where.is_dir():
            self._zip = None
            self.root = (
                where.parent if (where / "__init__.py").is_file() and where.name == "sglang" else where
            )
            base = self.root / "sglang"
            self.names = frozenset(str(p.relative_to(self.root)) for p in base.rglob("*.py"))
        else:
            raise SourceError(f"{where}: neither a folder holding the sglang package nor a .whl file")
        if "sglang/__init__.py" not in self.names:
            raise SourceError(f"{where}: holds no sglang package (no sglang/__init__.py)")

    def read(self, rel: str) -> str:
        if self._zip is not None:
            return self._zip.read(rel).decode("utf-8")
        assert self.root is not None
        return (self.root / rel).read_text(encoding="utf-8")

    def version(self) -> str | None:
        """The version its `sglang-<version>.dist-info` folder says (a wheel, or a site-packages folder)."""
        if self._zip is not None:
            dirs = {n.split("/")[0] for n in self._zip.namelist()}
        else:
            assert self.root is not None
            dirs = {p.name for p in self.root.glob("sglang-*.dist-info")}
        versions = sorted(
            d.removeprefix("sglang-").removesuffix(".dist-info") for d in dirs if d.startswith("sglang-")
        )
        return versions[0] if len(versions) == 1 else None

    def module_file(self, module: str) -> str | None:
        """`sglang.a.b` -> `sglang/a/b.py` (or its package's `__init__.py`); None when absent."""
        base = module.replace(".", "/")
        for rel in (f"{base}.py", f"{base}/__init__.py"):
            if rel in self.names:
                return rel
        return None

    def trace_file(self, traced: str) -> list[str]:
        """The files a trace's path names: `mem_cache/memory_pool.py` -> `sglang/srt/mem_cache/memory_pool.py`.

        Tried as written under `sglang/srt/`, `sglang/` and the package root, then as the path's tail; a
        `.py` file that became a package (`allocator.py` -> `allocator/`) gives the package's modules.
        """
        p = traced.strip().strip("`").removeprefix("sglang/python/").removeprefix("python/")
        for prefix in ("sglang/srt/", "sglang/", ""):
            if f"{prefix}{p}" in self.names:
                return [f"{prefix}{p}"]
        tails = sorted(n for n in self.names if n.endswith("/" + p))
        if len(tails) == 1:
            return tails
        if p.endswith(".py"):
            for prefix in ("sglang/srt/", "sglang/"):
                pkg = f"{prefix}{p[:-3]}/"
                inside = sorted(n for n in self.names if n.startswith(pkg) and "/" not in n[len(pkg) :])
                if inside:
                    return inside
        return []


def decorator_name(node: ast.expr) -> str:
    """`@triton.jit(do_not_specialize=[...])` -> `triton.jit`; `@jit` -> `jit`."""
    if isinstance(node, ast.Call):
        node = node.func
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


@dataclass(frozen=True)
class Kernel:
    """One `@triton.jit` kernel: its name, the file that defines it and the line of its `def`."""

    name: str
    file: str
    line: int
    via: str = ""  # how the traced file reaches it: "" when it defines it, else "launcher <- module"


@dataclass
class Module:
    """What one source file defines and imports, for the closure in `kernels_of_file`."""

    file: str
    jit: dict[str, int] = field(default_factory=dict)  # kernel name -> line of its def
    defs: dict[str, ast.AST] = field(default_factory=dict)  # top-level functions and classes
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # alias -> (module, name)
    star: list[str] = field(default_factory=list)  # modules re-exported with `from m import *`
    reexports: set[str] = field(default_factory=set)  # `from m import x as x`
    helpers: set[str] = field(default_factory=set)  # jit functions only other kernels call: not launched


def _package(file: str) -> str:
    parts = file.removesuffix(".py").split("/")
    return ".".join(parts[:-1])


def parse_module(file: str, text: str) -> Module:
    """The kernels, top-level definitions and imports of one file (SyntaxError propagates)."""
    tree = ast.parse(text, filename=file)
    mod = Module(file)
    triton_aliases = {"triton"}  # `import triton as tr`
    jit_aliases: set[str] = set()  # `from triton import jit` / `from triton import jit as tjit`
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "triton":
                    triton_aliases.add(a.asname or "triton")
                mod.imports[a.asname or a.name.split(".")[0]] = (
                    a.name if a.asname else a.name.split(".")[0],
                    None,
                )
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = _package(file).split(".")
                pkg = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                base = ".".join([*pkg, base] if base else pkg)
            for a in node.names:
                if base == "triton" and a.name == "jit":
                    jit_aliases.add(a.asname or "jit")
                if a.name == "*":
                    mod.star.append(base)
                else:
                    mod.imports[a.asname or a.name] = (base, a.name)
                    if a.asname == a.name:
                        mod.reexports.add(a.name)
    jit_names = {f"{t}.jit" for t in triton_aliases} | jit_aliases
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
            decorator_name(d) in jit_names for d in node.decorator_list
        ):
            mod.jit[node.name] = node.lineno
    for node in tree.body:
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.name not in mod.jit
        ):
            mod.defs[node.name] = node
    mod.helpers = _helpers(tree, set(mod.jit))
    return mod


def _helpers(tree: ast.Module, jit: set[str]) -> set[str]:
    """The `@triton.jit` functions called from inside another kernel and never launched (`k[grid](...)`)
    in the file: device functions inlined into the kernels that call them."""
    launched, called = set(), set()
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Subscript)
            and isinstance(n.func.value, ast.Name)
        ):
            launched.add(n.func.value.id)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in jit:
            for n in ast.walk(node):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in jit:
                    called.add(n.func.id)
    return called - launched


def _explicit_reexport(mod: Module, alias: str) -> bool:
    """`from m import x as x`: the file re-exports `x` (what moved out of it keeps its old import path)."""
    return alias in mod.reexports


def _refs(node: ast.AST) -> tuple[set[str], set[tuple[str, str]]]:
    """Names a definition refers to, and `alias.attr` pairs (a module imported whole)."""
    names, attrs = set(), set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            names.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            attrs.add((n.value.id, n.attr))
    return names, attrs


class _Closure:
    def __init__(self, source: SglangSource):
        self.source = source
        self.modules: dict[str, Module | None] = {}
        self.found: dict[tuple[str, str], Kernel] = {}
        self.seen: dict[tuple[str, str], int] = {}  # (file, name) -> fewest hops it was followed at

    def module(self, file: str) -> Module | None:
        if file not in self.modules:
            try:
                self.modules[file] = parse_module(file, self.source.read(file))
            except SyntaxError:
                self.modules[file] = None
        return self.modules[file]

    def add(self, mod: Module, name: str, via: str) -> None:
        key = (mod.file, name)
        if name not in mod.helpers and key not in self.found:
            self.found[key] = Kernel(name, mod.file, mod.jit[name], via)

    def follow(self, mod: Module, name: str, hops: int, via: str, whole: bool = False) -> None:
        """Every kernel `name` in `mod` is or refers to, through definitions and imports."""
        if name in mod.jit:
            self.add(mod, name, via)
            return
        if name in mod.defs and hops > 0 and isinstance(mod.defs[name], ast.ClassDef) and not whole:
            return  # another module's class is another component (a pool, a worker), not a launcher
        key = (mod.file, name)
        if self.seen.get(key, MAX_HOPS + 1) <= hops:
            return  # already followed from as near or nearer
        self.seen[key] = hops
        if name in mod.defs:
            names, attrs = _refs(mod.defs[name])
            here = via or name
            for n in sorted(names - {name}):
                if n in mod.jit:
                    self.add(mod, n, here)
                elif n in mod.defs or n in mod.imports:
                    self.follow(mod, n, hops, here)
            for alias, attr in sorted(attrs):
                target = mod.imports.get(alias)
                if target and target[1] is None:
                    self.imported(target[0], attr, hops, here)
                elif target:
                    self.imported(f"{target[0]}.{target[1]}", attr, hops, here)
            return
        if name in mod.imports:
            base, orig = mod.imports[name]
            if orig is not None:
                self.imported(base, orig, hops, via)
            return
        for base in mod.star:
            self.imported(base, name, hops, via)

    def imported(self, module: str, name: str, hops: int, via: str) -> None:
        if not module.startswith("sglang") or hops >= MAX_HOPS:
            return
        file = self.source.module_file(module)
        sub = self.source.module_file(f"{module}.{name}")
        if sub is not None and (file is None or name not in (self.module(file) or Module("")).defs):
            target = self.module(sub)  # `from pkg import module`: the module's kernels all count
            if target is not None:
                for n in sorted(set(target.jit) | set(target.defs)):
                    self.follow(target, n, hops + 1, via)
            return
        target = self.module(file) if file else None
        if target is not None:
            self.follow(target, name, hops + 1, via)

    def _is_kernel(self, module: str, name: str) -> bool:
        file = self.source.module_file(module) if module.startswith("sglang") else None
        target = self.module(file) if file else None
        return target is not None and name in target.jit

    def whole(self, file: str) -> None:
        mod = self.module(file)
        if mod is None:
            raise SourceError(f"{file}: not valid Python")
        for n in sorted(mod.jit):
            self.add(mod, n, "")
        for n in sorted(mod.defs):
            self.follow(mod, n, 0, "")
        for alias, (base, orig) in sorted(mod.imports.items()):
            if orig is not None and (
                alias == orig and _explicit_reexport(mod, alias) or self._is_kernel(base, orig)
            ):
                self.imported(base, orig, 0, f"imported from {base}")
        for base in mod.star:  # a re-export shim: everything the module it re-exports runs
            f = self.source.module_file(base)
            target = self.module(f) if f else None
            if target is not None:
                for n in sorted(set(target.jit) | set(target.defs)):
                    self.follow(target, n, 1, f"re-exported from {base}", whole=True)


def kernels_of_file(source: SglangSource, files: list[str]) -> list[Kernel]:
    """The Triton kernels `files` define or launch through their imports, sorted by file and line."""
    c = _Closure(source)
    for f in files:
        c.whole(f)
    return sorted(c.found.values(), key=lambda k: (k.file, k.line, k.name))


def kernels_in_text(text: str, file: str = "<text>") -> list[Kernel]:
    """The `@triton.jit` kernels one file's text defines (no imports followed)."""
    mod = parse_module(file, text)
    return sorted((Kernel(n, file, line) for n, line in mod.jit.items()), key=lambda k: k.line)
