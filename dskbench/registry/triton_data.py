"""The Triton kernels behind the trace rows that name a file but not its kernels: `traces/triton_kernels.yaml`.

A trace table row such as "mem_cache/allocator.py | allocator kernels" names a file of Triton kernels.
`dskbench registry triton-files --from <sglang folder or wheel>` reads that file (and what it imports)
in the pinned sglang with `ast` (triton_source.py) and writes the kernels it finds into the data file;
`dskbench registry generate` reads the data file, never sglang, so generating needs no sglang and
gives the same registry everywhere.

The data file holds, per traced file, the source files it resolved to and the kernels found, and per
kernel its file and line (extracted) and a `status` and `why` (written by hand: whether DeepSeek's
decode or prefill step runs it, and why), with optional `category` and `ops` (ops of the shapes file
its adapter measures it at). Re-extracting keeps the hand-written fields; a new kernel gets no status,
which `generate` refuses until someone writes one. `moved` (hand-written) names the files that hold
the kernels of a traced file the release no longer has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dskbench import paths
from dskbench.registry.model import STATUSES, RegistryError, show_path
from dskbench.registry.trace_model import FileRow
from dskbench.registry.triton_source import SglangSource, kernels_of_file

DATA_NAME = "triton_kernels.yaml"
HAND_KEYS = ("status", "why", "category", "ops")  # kept when the file is extracted again
KERNEL_KEYS = ("file", "line", "via", "traced_as", *HAND_KEYS)
FILE_KEYS = ("source", "kernels")
MOVED_KEYS = ("to", "why")
HEADER = """\
# The Triton kernels behind the trace rows that name a file of kernels but not the kernels
# (traces/kernel_traces_2026-01-18.md, "Triton JIT"), in the pinned sglang.
#
# Extracted by `dskbench registry triton-files --from <sglang folder or wheel>` (Python's ast; see
# dskbench/registry/triton_source.py): `files` and each kernel's file, line, via and traced_as.
# Written by hand and kept on re-extraction: `moved`, and each kernel's status, why, category and ops.
# Read by `dskbench registry generate`: one registry entry per kernel.
"""


def default_data_file() -> Path:
    return paths.TRACES_DIR / DATA_NAME


@dataclass(frozen=True)
class TritonKernel:
    name: str
    file: str
    line: int
    via: str
    traced_as: tuple[str, ...]  # the traced files whose rows it resolves
    status: str
    why: str
    category: str | None = None
    ops: tuple[str, ...] = ()


@dataclass(frozen=True)
class TritonFiles:
    """The data file, checked: traced file -> kernel names, and each kernel."""

    path: Path | None = None
    sglang: str | None = None
    files: dict[str, tuple[str, ...]] = field(default_factory=dict)
    kernels: dict[str, TritonKernel] = field(default_factory=dict)

    def for_row(self, row: FileRow, doc: str) -> list[TritonKernel]:
        """The kernels of a trace row; a RegistryError naming the data file when it has no such file."""
        if row.file not in self.files:
            where = show_path(self.path) if self.path else DATA_NAME
            raise RegistryError(
                f"{where}: files: no entry for {row.file!r} ({doc}:{row.line}): "
                "run `dskbench registry triton-files --from <sglang folder or wheel>`"
            )
        return [self.kernels[n] for n in self.files[row.file]]


def _bad(path: Path, key: str, msg: str) -> RegistryError:
    return RegistryError(f"{show_path(path)}: {key}: {msg}")


def _str_list(path: Path, key: str, v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _bad(path, key, f"expected a list of strings, got {v!r}")
    return tuple(v)


def _mapping(path: Path, key: str, v: Any, allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _bad(path, key, f"expected a mapping, got {type(v).__name__}")
    for k in v:
        if not isinstance(k, str):
            raise _bad(path, key, f"key {k!r} is not a string")
        if allowed is not None and k not in allowed:
            raise _bad(path, f"{key}.{k}", f"unknown key; expected one of {', '.join(allowed)}")
    return v


def read_raw(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise RegistryError(f"{show_path(path)}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise RegistryError(f"{show_path(path)}{line}: bad YAML: {getattr(e, 'problem', e)}") from None
    return _mapping(path, "(top level)", data or {}, ("sglang", "moved", "files", "kernels"))


def load_triton_kernels(path: Path | None = None) -> TritonFiles:
    """The data file, every key checked; RegistryError names the file and the key. No file: no kernels."""
    path = Path(path or default_data_file())
    if not path.exists():
        return TritonFiles(path)
    data = read_raw(path)
    sglang = data.get("sglang")
    if sglang is not None and not isinstance(sglang, str):
        raise _bad(path, "sglang", f"expected a version string, got {sglang!r}")
    for name, m in _mapping(path, "moved", data.get("moved") or {}).items():
        m = _mapping(path, f"moved.{name}", m, MOVED_KEYS)
        _str_list(path, f"moved.{name}.to", m.get("to"))
    kernels: dict[str, TritonKernel] = {}
    for name, k in _mapping(path, "kernels", data.get("kernels") or {}).items():
        kernels[name] = _kernel(path, name, _mapping(path, f"kernels.{name}", k, KERNEL_KEYS))
    files: dict[str, tuple[str, ...]] = {}
    for traced, f in _mapping(path, "files", data.get("files") or {}).items():
        f = _mapping(path, f"files.{traced}", f, FILE_KEYS)
        _str_list(path, f"files.{traced}.source", f.get("source") or [])
        names = _str_list(path, f"files.{traced}.kernels", f.get("kernels") or [])
        for n in names:
            if n not in kernels:
                raise _bad(path, f"files.{traced}.kernels", f"{n!r} is not under `kernels`")
        files[traced] = names
    return TritonFiles(path, sglang, files, kernels)


def _kernel(path: Path, name: str, k: dict[str, Any]) -> TritonKernel:
    at = f"kernels.{name}"
    for key in ("file", "via"):
        if not isinstance(k.get(key, ""), str):
            raise _bad(path, f"{at}.{key}", f"expected a string, got {k[key]!r}")
    if not k.get("file"):
        raise _bad(path, f"{at}.file", "missing: the file that defines the kernel")
    line = k.get("line")
    if not isinstance(line, int) or isinstance(line, bool) or line < 1:
        raise _bad(path, f"{at}.line", f"expected the line of its def (a positive integer), got {line!r}")
    status = k.get("status")
    if status not in STATUSES:
        got = "missing" if status is None else repr(status)
        raise _bad(path, f"{at}.status", f"{got}: expected one of {', '.join(STATUSES)} (decide it by hand)")
    why = k.get("why")
    if not isinstance(why, str) or not why.strip():
        raise _bad(path, f"{at}.why", "missing: say in one line why it has that status")
    category = k.get("category")
    if category is not None and not isinstance(category, str):
        raise _bad(path, f"{at}.category", f"expected a string, got {category!r}")
    return TritonKernel(
        name,
        k["file"],
        line,
        k.get("via") or "",
        _str_list(path, f"{at}.traced_as", k.get("traced_as") or []),
        status,
        " ".join(why.split()),
        category,
        _str_list(path, f"{at}.ops", k.get("ops") or []),
    )


# -- extraction ------------------------------------------------------------------------------------


def extract(rows: list[FileRow], source: SglangSource, old: dict[str, Any]) -> dict[str, Any]:
    """The data file's content for `rows`, read from `source`, keeping `old`'s hand-written fields.

    A kernel name two different files define is an error (the registry keys kernels by name).
    """
    moved = old.get("moved") or {}
    files: dict[str, Any] = {}
    found: dict[str, dict[str, Any]] = {}
    for row in sorted({r.file: r for r in rows}.values(), key=lambda r: r.file):
        hand = moved.get(row.file)
        source_files = list(hand["to"]) if hand else source.trace_file(row.file)
        if not source_files:
            raise RegistryError(
                f"{row.file}: no such file in {source.where}; name the files that hold its kernels "
                f"now under `moved` in {DATA_NAME}"
            )
        kernels = kernels_of_file(source, source_files)
        files[row.file] = {"source": source_files, "kernels": [k.name for k in kernels]}
        for k in kernels:
            have = found.get(k.name)
            if have is not None and have["file"] != k.file:
                raise RegistryError(
                    f"kernel name {k.name!r} is defined in both {have['file']} and {k.file}: "
                    "the registry needs one kernel per name"
                )
            if have is None:
                found[k.name] = {"file": k.file, "line": k.line, "via": k.via, "traced_as": []}
            found[k.name]["traced_as"].append(row.file)
    old_kernels = old.get("kernels") or {}
    for name, k in found.items():
        for key in HAND_KEYS:
            v = (old_kernels.get(name) or {}).get(key)
            k[key] = v if v is not None else ([] if key == "ops" else None)
    out: dict[str, Any] = {"sglang": source.version() or old.get("sglang")}
    if moved:
        out["moved"] = moved
    out["files"] = files
    out["kernels"] = {n: found[n] for n in sorted(found)}
    return out


def render(data: dict[str, Any]) -> str:
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, allow_unicode=True, width=110)
    return HEADER + body
