"""Merging what every trace document says about one kernel into its registry entry (a dict in the
order of ENTRY_KEYS): category and source by vote, ops, call sites, trace shapes, disagreements with the
model config, and a status (benchmark it, or why not)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dskbench.registry.aliases import Aliases, Vocab
from dskbench.registry.model import ENTRY_KEYS
from dskbench.registry.ops import (
    chain_ops,
    kernel_weight_format,
    op_entry,
    resolve_label,
    runs_in_r1,
    shape_disagreement,
)
from dskbench.registry.trace_cells import IDENT
from dskbench.registry.trace_model import FileRow, KernelFacts, OpRef, Site, TraceDoc, Vote
from dskbench.registry.triton_data import TritonFiles, TritonKernel
from dskbench.shapes.cases import ModelShapes, canonical_op_name
from dskbench.shapes.schema import MODELS


@dataclass(frozen=True)
class StatusRule:
    """A kernel gets `status` when its name, a section it is traced under, or its category matches."""

    status: str
    reason: str
    names: tuple[str, ...] = ()
    sections: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()


# First match wins; kernels no rule matches are `not-in-model` (see below) or `benchmark`.
STATUS_RULES = (
    StatusRule(
        "host-only",
        "host function that sizes a workspace; it launches no GPU kernel",
        names=(r"get_workspace_size",),
        sections=(r"\battention utility\b",),
    ),
    StatusRule(
        "needs-multi-gpu",
        "communication kernel: needs two or more GPUs",
        names=(r"all_?reduce", r"communication"),
        sections=(r"\bcommunication\b",),
        categories=("communication",),
    ),
    StatusRule(
        "utility",
        "runtime bookkeeping, not a model op (CUDA-graph weak references): host overhead only",
        sections=(r"^utility\b",),
        categories=("utility",),
    ),
)
# Sections about DeepSeek-V3.2 sparse attention (a kernel traced only there is not in DeepSeek-R1).
V32_SECTIONS = re.compile(r"\bnsa\b|\bdsa\b|native sparse attention|v3\.2", re.I)
GEMM_CATEGORIES = frozenset({"gemm", "moe-gemm"})
DATA_REF = "traces/triton_kernels.yaml"


def build(
    docs: list[TraceDoc], shapes: ModelShapes, aliases: Aliases, triton: TritonFiles | None = None
) -> dict[str, dict]:
    """Every registry entry the parsed documents give (name -> entry dict), names through `aliases`.

    A row that names a file of kernels but not the kernels gives one entry per kernel `triton` (the
    data file traces/triton_kernels.yaml) lists for that file, with the status written there.
    """
    triton = triton if triton is not None else TritonFiles()
    groups: dict[str, list[tuple[TraceDoc, KernelFacts]]] = defaultdict(list)
    for doc in docs:
        for raw, facts in doc.kernels.items():
            groups[aliases.canonical(raw)].append((doc, facts))
        for row in doc.file_rows:
            for k in triton.for_row(row, doc.name):
                groups[aliases.canonical(k.name)].append((doc, _file_row_facts(k, row)))
    return {
        name: _KernelMerge(name, groups[name], shapes, aliases, triton.kernels.get(name)).build()
        for name in sorted(groups)
    }


def _file_row_facts(k: TritonKernel, row: FileRow) -> KernelFacts:
    """What a file row says about one of its kernels, with the data file's file, line and ops."""
    f = KernelFacts(k.name)
    f.mentions.append((row.line, row.section))
    f.sources.append(Vote("triton", row.line))
    if k.category:
        f.categories.append(Vote(k.category, row.line))
    f.definitions.append(Site(f"{k.file}:{k.line}", row.line, "definition"))
    if IDENT.match(k.via):
        f.call_sites.append(Site(row.file, row.line, "kernel", k.via))
    f.ops.extend(OpRef(op, row.line) for op in k.ops)
    return f


def _ref(doc: TraceDoc, line: int) -> str:
    return f"{doc.name}:{line}"


class _KernelMerge:
    """Merges what every document says about one kernel into its registry entry."""

    def __init__(
        self,
        name: str,
        group: list[tuple[TraceDoc, KernelFacts]],
        shapes: ModelShapes,
        aliases: Aliases,
        triton: TritonKernel | None = None,
    ):
        self.name = name
        self.triton = triton
        self.group = sorted(group, key=lambda df: df[0].name)
        self.shapes = shapes
        self.aliases = aliases
        self.names = (
            {name} | {f.name for _, f in group} | {a for a, c in aliases.kernels.items() if c == name}
        )
        self.ops: dict[str, set[str]] = {}
        self.unmatched: dict[str, list[str]] = {}
        self.op_sites: list[tuple[TraceDoc, int, str, str | None]] = []

    def build(self) -> dict[str, Any]:
        category = _vote([(d, v) for d, f in self.group for v in f.categories], self.aliases.categories)
        source = _vote([(d, v) for d, f in self.group for v in f.sources], self.aliases.sources)
        self.collect_ops()
        ops = [op_entry(op, self.ops[op], self.shapes) for op in self.shapes.ops if op in self.ops]
        status, reason = self.status(category, ops)
        entry = {
            "name": self.name,
            "aliases": sorted(self.names - {self.name}),
            "category": category,
            "source": source,
            "status": status,
            "status_reason": reason,
            "definition": self.sites(lambda f: f.definitions, kind=False),
            "call_sites": self.call_sites(),
            "ops": ops,
            "unmatched_ops": [{"name": n, "traces": refs} for n, refs in sorted(self.unmatched.items())],
            "trace_shapes": self.trace_shapes(),
            "disagreements": self.disagreements(category),
            "traces": self.traces(),
        }
        return {k: entry[k] for k in ENTRY_KEYS}

    # -- ops --
    def resolve(self, label: str) -> list[str] | None:
        """Ops a trace label names; [] when the label is the kernel itself; None when unknown."""
        return resolve_label(label, self.shapes, self.names)

    def collect_ops(self) -> None:
        for doc, f in self.group:
            for ref in f.ops:
                ops = self.resolve(ref.label)
                if ops is None:
                    self.unmatched.setdefault(canonical_op_name(ref.label), []).append(_ref(doc, ref.line))
                for op in ops or ():
                    self.ops.setdefault(op, set()).add(ref.label)
            for chain in f.chains:
                for frame, op in chain_ops(chain, self.shapes):
                    self.ops.setdefault(op, set()).add(frame.fn)
                    if frame.site:
                        self.op_sites.append((doc, frame.line, frame.site, canonical_op_name(frame.fn)))
        for refs in self.unmatched.values():
            refs[:] = sorted(set(refs), key=_ref_key)

    # -- sites --
    def sites(self, pick: Callable[[KernelFacts], list[Site]], kind: bool) -> list[dict[str, Any]]:
        out: dict[tuple[str, str, str], dict[str, Any]] = {}
        for doc, f in self.group:
            for s in pick(f):
                key = (s.site, s.kind if kind else "", doc.name)
                if key in out:
                    continue
                d: dict[str, Any] = {"site": s.site}
                if kind:
                    d["kind"] = s.kind
                if kind and s.via:
                    d["via"] = s.via
                d["doc"] = _ref(doc, s.line)
                out[key] = d
        return sorted(out.values(), key=lambda d: (_ref_key(d["doc"]), d["site"]))

    def call_sites(self) -> list[dict[str, Any]]:
        rows = self.sites(lambda f: f.call_sites, kind=True)
        seen = {(r["site"], r["kind"], r["doc"].split(":")[0]) for r in rows}
        for doc, line, site, via in self.op_sites:
            if (site, "op", doc.name) not in seen:
                seen.add((site, "op", doc.name))
                rows.append({"site": site, "kind": "op", "via": via, "doc": _ref(doc, line)})
        return sorted(rows, key=lambda d: (_ref_key(d["doc"]), d["site"]))

    # -- shapes from the op shape tables --
    def trace_shapes(self) -> list[dict[str, Any]]:
        rows = []
        for doc, f in self.group:
            for r in f.shapes:
                ops = self.resolve(r.op_label) or []
                d: dict[str, Any] = {"op": ops[0] if len(ops) == 1 else None, "label": r.op_label}
                d.update({"section": r.section, "input": r.input, "output": r.output})
                if r.remark:
                    d["note"] = r.remark
                d["doc"] = _ref(doc, r.line)
                rows.append(d)
        return sorted(rows, key=lambda d: _ref_key(d["doc"]))

    def disagreements(self, category: str | None) -> list[dict[str, Any]]:
        out: dict[tuple[str, ...], dict[str, Any]] = {}
        for doc, f in self.group:
            for r in f.shapes:
                ops = self.resolve(r.op_label) or []
                if len(ops) != 1:
                    continue
                d = shape_disagreement(ops[0], r.input, r.output, self.shapes)
                if d:
                    d["doc"] = _ref(doc, r.line)
                    d["resolution"] = "config wins"
                    out.setdefault(("shape", ops[0], d["trace"]), d)
            if category not in GEMM_CATEGORIES or not _names_model(doc, self.shapes):
                continue
            fmt = kernel_weight_format(self.name)
            for ref in f.ops:
                for op in self.resolve(ref.label) or ():
                    have = self.shapes.weight_format(op)
                    if fmt and have and have != fmt:
                        out.setdefault(
                            ("weight-format", op),
                            {
                                "op": op,
                                "kind": "weight-format",
                                "trace": f"{self.name} (GEMM on {fmt} weights) at {ref.label}",
                                "config": f"{op} weights are {have} in {self.shapes.model_name}",
                                "doc": _ref(doc, ref.line),
                                "resolution": "config wins",
                            },
                        )
        return sorted(out.values(), key=lambda d: (d["kind"], d["op"], _ref_key(d["doc"])))

    # -- status --
    def sections(self) -> list[str]:
        secs = {s for _, f in self.group for _, s in f.mentions} | {
            s for _, f in self.group for s in f.chain_sections
        }
        return sorted(norm_section(s) for s in secs if s)

    def status(self, category: str | None, ops: list[dict[str, Any]]) -> tuple[str, str]:
        if self.name in self.aliases.absent:
            return "absent", self.aliases.absent[self.name]
        if self.triton is not None:  # decided by hand in the data file, kernel by kernel
            return self.triton.status, f"{self.triton.why} ({DATA_REF})"
        sections = self.sections()
        for rule in STATUS_RULES:
            why = None
            if any(re.search(p, self.name, re.I) for p in rule.names):
                why = f"name {self.name!r}"
            elif category in rule.categories:
                why = f"category {category!r}"
            else:
                hit = next((s for s in sections if any(re.search(p, s) for p in rule.sections)), None)
                if hit:
                    why = f"traced under {hit!r}"
            if why:
                return rule.status, f"{rule.reason} ({why})"
        executed = [o["name"] for o in ops if o["executed"]]
        if ops and not executed:
            reasons = "; ".join(sorted({f"{o['name']}: {o['reason']}" for o in ops}))
            return "not-in-model", f"every op it serves is one DeepSeek-R1 does not run ({reasons})"
        in_r1 = [o["name"] for o in ops if o["executed"] and runs_in_r1(o)]
        if executed and not in_r1:
            models = sorted({m for o in ops if o["executed"] for m in o["models"]})
            names = ", ".join(MODELS[m] for m in models)
            return (
                "benchmark",
                f"GPU kernel at {len(executed)} {names} op(s) DeepSeek-R1 does not run: {', '.join(executed)}",
            )
        chain_secs = [norm_section(s) for _, f in self.group for s in f.chain_sections]
        if not ops and not self.unmatched and chain_secs and all(V32_SECTIONS.search(s) for s in chain_secs):
            return (
                "not-in-model",
                f"no op, traced only under DeepSeek-V3.2 sparse attention ({chain_secs[0]!r})",
            )
        if in_r1:
            return "benchmark", f"GPU kernel at {len(in_r1)} DeepSeek-R1 op(s): {', '.join(in_r1)}"
        return "benchmark", "GPU kernel traced with no op the shapes file knows: its adapter picks the ops"

    def traces(self) -> list[dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for doc, f in self.group:
            for line, section in f.mentions:
                ref = _ref(doc, line)
                if ref in out:
                    continue
                d: dict[str, Any] = {"doc": ref, "section": section}
                if f.name != self.name:
                    d["as"] = f.name
                out[ref] = d
        return sorted(out.values(), key=lambda d: _ref_key(d["doc"]))


def _ref_key(ref: str) -> tuple[str, int]:
    doc, _, line = ref.rpartition(":")
    return doc, int(line) if line.isdigit() else 0


def norm_section(s: str) -> str:
    return re.sub(r"(^|/ )\d+(?:\.\d+)*\.?\s+", r"\1", re.sub(r"\*\*|`", "", s)).lower().strip()


def _vote(votes: list[tuple[TraceDoc, Vote]], vocab: Vocab) -> str | None:
    """The label the most explicit evidence agrees on: lowest level first, then most votes, then the
    newest document (its "Generated:" date), then alphabetical."""
    normed = [(v.level, vocab.normalise(v.value, v.level), doc.generated or "") for doc, v in votes]
    normed = [x for x in normed if x[1]]
    if not normed:
        return None
    level = min(x[0] for x in normed)
    score: dict[str, tuple[int, str]] = {}
    for lv, value, date in normed:
        if lv == level:
            n, newest = score.get(value, (0, ""))
            score[value] = (n + 1, max(newest, date))  # type: ignore[index]
    return max(sorted(score), key=lambda v: score[v])  # max() keeps the first of equals: alphabetical


def _names_model(doc: TraceDoc, shapes: ModelShapes) -> bool:
    """A document about this very checkpoint (it names the shapes file's model)."""
    return bool(shapes.model_name) and shapes.model_name in doc.text
