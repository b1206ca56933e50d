"""What a registry file holds, as typed records: the kernel entry, the ops it serves, where it is called.

The generator writes these fields (ENTRY_KEYS, OP_KEYS, in this order); the loader reads them back
into a KernelEntry. Every other module of the registry speaks in these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENTRY_KEYS = (
    "name",
    "aliases",
    "category",
    "source",
    "status",
    "status_reason",
    "definition",
    "call_sites",
    "ops",
    "unmatched_ops",
    "trace_shapes",
    "disagreements",
    "traces",
)
OP_KEYS = (
    "name",
    "trace_names",
    "executed",
    "models",
    "reason",
    "phases",
    "layers",
    "weight",
    "shapes",
    "in",
    "out",
    "sweeps",
    "symbols",
)
LIST_KEYS = ("definition", "call_sites", "unmatched_ops", "trace_shapes", "disagreements", "traces")
STATUSES = ("benchmark", "host-only", "needs-multi-gpu", "utility", "not-in-model", "absent")


class RegistryError(ValueError):
    """A registry folder or file dskbench cannot use; the message is one line naming the file (and line)."""


def show_path(p: Path) -> str:
    """`p` as the user would type it: relative to the working folder when it lies under it."""
    try:
        return str(p.absolute().relative_to(Path.cwd()))
    except (ValueError, OSError):
        return str(p)


def few(names: list[str], n: int = 3) -> str:
    """`a, b, c and 4 more`: enough names for a one-line message."""
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


@dataclass(frozen=True)
class CallSite:
    """Where a trace saw the kernel called (kind "kernel") or the op that calls it (kind "op")."""

    site: str  # "path:line" or "path" as traced
    kind: str
    doc: str  # "document.md:line" that says so
    via: str | None = None  # the function at that site, when the trace names it

    @classmethod
    def from_raw(cls, d: dict[str, Any]) -> CallSite:
        return cls(d["site"], d["kind"], d["doc"], d.get("via"))


@dataclass(frozen=True)
class OpEntry:
    """One model op the kernel serves. An op the model does not run has `executed` false and a reason;
    its shape fields stay in the entry's raw data (shapes, in, out, sweeps, symbols)."""

    name: str
    executed: bool = True
    models: tuple[str, ...] = ()  # empty: the shapes file's model
    reason: str | None = None
    phases: tuple[str, ...] = ()
    layers: str | None = None  # "all", "dense" or "moe"
    weight: str | None = None  # the weight format of a GEMM op

    @classmethod
    def from_raw(cls, d: dict[str, Any]) -> OpEntry:
        return cls(
            name=d["name"],
            executed=d.get("executed", True),
            models=tuple(d.get("models") or ()),
            reason=d.get("reason"),
            phases=tuple(d.get("phases") or ()),
            layers=d.get("layers"),
            weight=d.get("weight"),
        )


@dataclass(frozen=True)
class KernelEntry:
    """One registry file. `op_names` are the ops planning sweeps: the executed ones, in file order."""

    name: str
    aliases: tuple[str, ...]
    category: str | None
    source: str | None
    status: str
    status_reason: str
    op_names: tuple[str, ...]  # canonical, executed ops only
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    ops: tuple[OpEntry, ...] = field(repr=False, compare=False, default=())
    call_sites: tuple[CallSite, ...] = field(repr=False, compare=False, default=())

    @classmethod
    def from_raw(cls, raw: dict[str, Any]) -> KernelEntry:
        """The entry of a checked registry file's data (the loader checks every field read here)."""
        ops = tuple(OpEntry.from_raw(o) for o in raw.get("ops") or ())
        return cls(
            name=raw["name"],
            aliases=tuple(raw.get("aliases") or ()),
            category=raw.get("category"),
            source=raw.get("source"),
            status=raw.get("status", "benchmark"),
            status_reason=raw.get("status_reason", ""),
            op_names=tuple(o.name for o in ops if o.executed),
            raw=raw,
            ops=ops,
            call_sites=tuple(CallSite.from_raw(s) for s in raw.get("call_sites") or ()),
        )
