"""What a trace document says, as records: the facts of each kernel it names, with their line numbers.

The walker (dskbench/registry/traces.py) fills them in as written; the generator
(dskbench/registry/merge.py) normalises and merges them across documents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class TraceError(ValueError):
    """A malformed trace document; the message names the file and line."""

    def __init__(self, path: Path | str, line: int, msg: str):
        super().__init__(f"{path}:{line}: {msg}")
        self.path = str(path)
        self.line = line


@dataclass(frozen=True)
class Vote:
    """A category or source label as written, with how much it says: 1 an explicit column or mark,
    2 an enclosing heading, 3 a module name."""

    value: str
    line: int
    level: int = 1


@dataclass(frozen=True)
class Site:
    site: str  # "path:line" or "path" as traced (leading "../" removed)
    line: int  # line in the trace document
    kind: str = "kernel"  # "kernel": where the kernel is called; "op": where the calling op is called
    via: str | None = None  # the function at that site, when the trace names it


@dataclass(frozen=True)
class OpRef:
    label: str  # as written, backticks removed: "self.q_b_proj()", "experts (cutlass MoE path)"
    line: int


@dataclass(frozen=True)
class Frame:
    """One line of a call chain: the kernel call (parent -1) or a caller further up."""

    fn: str
    site: str | None
    line: int
    parent: int
    self_call: bool  # a `self.<module>()` call: the only frames that can name a model op


@dataclass(frozen=True)
class ShapeRow:
    op_label: str
    input: str
    output: str
    line: int
    section: str
    remark: str | None = None  # e.g. "B<=16" after the kernel name


@dataclass(frozen=True)
class FileRow:
    """A table row that names a file of kernels without naming them ("mem_cache/allocator.py | allocator
    kernels"); registry/triton_data.py says which kernels the file holds in the pinned sglang."""

    file: str  # as written: "mem_cache/allocator.py"
    text: str  # the kernels cell: "allocator kernels"
    line: int
    section: str


@dataclass
class KernelFacts:
    """Everything one document says about one kernel name."""

    name: str
    mentions: list[tuple[int, str]] = field(default_factory=list)  # (line, section)
    categories: list[Vote] = field(default_factory=list)
    sources: list[Vote] = field(default_factory=list)
    call_sites: list[Site] = field(default_factory=list)
    definitions: list[Site] = field(default_factory=list)
    ops: list[OpRef] = field(default_factory=list)
    chains: list[list[Frame]] = field(default_factory=list)
    chain_sections: list[str] = field(default_factory=list)
    shapes: list[ShapeRow] = field(default_factory=list)


@dataclass
class TraceDoc:
    path: Path
    format: str
    text: str
    generated: str | None = None
    kernels: dict[str, KernelFacts] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    file_rows: list[FileRow] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name
