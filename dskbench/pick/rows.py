"""The rows of one phase and their candidates: the deployment file's paths plus every measured backend the
row's patterns admit, evaluated on demand (the step estimate reads other batches)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from dskbench.pick.deployment import Deployment, Part, PathSpec, RowSpec
from dskbench.pick.evaluate import Cell, Outcome, combine, eval_path, judge_cell
from dskbench.pick.index import REFERENCE, ResultIndex


@dataclass
class RowPick:
    row: RowSpec
    kv_len: int | None
    cells: dict[int, Cell]
    candidates: list[PathSpec]

    @property
    def label(self) -> str:
        return self.row.name + (f" (kv_len={self.kv_len})" if self.kv_len is not None else "")


class Picker:
    """Candidates of every row of one phase, evaluated on demand (the estimate reads other batches)."""

    def __init__(self, idx: ResultIndex, dep: Deployment, phase: str, tp: int, threshold: float = 0.0):
        self.idx, self.dep, self.phase, self.tp, self.threshold = idx, dep, phase, tp, threshold
        self.rows = [r for r in dep.rows.get(phase, []) if r.min_tp <= tp]
        self.used: set[tuple[str, str, str | None, str]] = set()
        self.candidates = {r.name: self._candidates(r) for r in self.rows}
        self._by_name = {r.name: r for r in self.rows}
        self._cache: dict[tuple[str, int, int | None], Cell] = {}

    def _candidates(self, row: RowSpec) -> list[PathSpec]:
        out = list(row.paths)
        for p in row.paths:
            for part in p.parts:
                for k, b in self.idx.pairs(part.op, part.variant):
                    if part.matches(k, b):
                        self.used.add((k, part.op, part.variant, b))
        auto: list[tuple[str, str, str | None]] = []
        for kernel, backend in self.idx.pairs(row.op, row.variant):
            if backend == REFERENCE:
                continue
            cls = row.classify(kernel, backend)
            if cls is None:
                continue
            self.used.add((kernel, row.op, row.variant, backend))
            auto.append((kernel, backend, cls[1] if cls[0] == "what_if" else None))
        # backend alone when one kernel is measured for the row (an unmeasured one shows as its kernel name)
        real_kernels = {k for k, _, w in auto if w is None}
        real_kernels |= {k for p in row.paths for part in p.parts for k in part.kernels}
        for kernel, backend, what_if in auto:
            short = len(real_kernels) == 1 and kernel in real_kernels
            name = backend if short else f"{kernel}/{backend}"
            part = Part(row.op, (kernel,), row.variant, (backend,))
            out.append(PathSpec(name, (part,), self.dep.flags_of(kernel, backend), what_if))
        measured = {(k, b) for k, b, w in auto if w is None}
        for kernel, backend in row.expected:
            if not any(k == kernel and (backend is None or b == backend) for k, b in measured):
                # named by the row, absent from the results: said at every point, never dropped
                name = f"{kernel}/{backend}" if backend else kernel
                out.append(
                    PathSpec(name, (Part(row.op, (kernel,), row.variant, (backend,) if backend else None),))
                )
        return out

    def kv_values(self, row: RowSpec) -> list[int | None]:
        keys = [(p.op, p.variant) for c in self.candidates[row.name] for p in c.parts]
        kvs = {kv for op, v in keys for (_, kv) in self.idx.points(op, v) if kv is not None}
        return sorted(kvs) if kvs else [None]

    def batches(self) -> list[int]:
        """Every batch point some candidate of some row was measured at."""
        out: set[int] = set()
        for row in self.rows:
            for c in self.candidates[row.name]:
                for p in c.parts:
                    out |= {b for b, _ in self.idx.points(p.op, p.variant, p.kernels)}
        return sorted(out)

    def cell(self, row: RowSpec, batch: int, kv: int | None) -> Cell:
        key = (row.name, batch, kv)
        if key not in self._cache:
            cands = self._follow_fusion(row, batch, kv)
            fused = self.fused_rows(row)
            outcomes = [
                self._with_separate(eval_path(self.idx, c, batch, kv), fused, batch, kv) for c in cands
            ]
            self._cache[key] = judge_cell(outcomes, batch, kv, self.threshold)
        return self._cache[key]

    # -- shared-expert fusion (paths with `fuses`) ------------------------------------------------------

    def fused_rows(self, row: RowSpec) -> tuple[str, ...]:
        """Rows some candidate of `row` fuses (its own work for those candidates, separate for the rest)."""
        names = dict.fromkeys(n for c in self.candidates[row.name] for n in c.fuses)
        return tuple(n for n in names if n in self._by_name)

    def row_kv(self, row: RowSpec, kv: int | None) -> int | None:
        return kv if self.kv_values(row) != [None] else None

    def _with_separate(self, o: Outcome, fused: tuple[str, ...], batch: int, kv: int | None) -> Outcome:
        """A candidate that does not fuse the rows its siblings fuse is priced with their winners added."""
        if not fused or o.path.fuses or o.status != "ok":
            return o
        stats = [o.stat]
        for name in fused:
            r = self._by_name[name]
            w = self.cell(r, batch, self.row_kv(r, kv)).winner
            if w is None:
                why = f"no winner for {name}, which {o.name} runs separately (its siblings fuse it)"
                return replace(o, status="missing", stat=None, reason=why, separate=fused)
            stats.append(w.stat)
        return replace(o, stat=combine(stats), separate=fused)  # type: ignore[arg-type]

    def _follow_fusion(self, row: RowSpec, batch: int, kv: int | None) -> list[PathSpec]:
        """A NextN row that replaces a layer row fuses the shared expert exactly when that row's winner does
        (SGLang decides the fusion once, for the target and its draft): the candidates of the other kind are
        kept as what-ifs; with no winner there, every candidate is (the draft's path is not known)."""
        cands = self.candidates[row.name]
        target = self._by_name.get(row.replaces or "")
        if row.scope != "nextn" or target is None or not self.fused_rows(row):
            return cands
        w = self.cell(target, batch, self.row_kv(target, kv)).winner
        if w is None:
            why = f"no pick for {target.name}: whether SGLang fuses the draft's shared expert follows it"
            return [c if c.what_if else replace(c, what_if=why) for c in cands]
        on = bool(w.path.fuses)
        why = f"the target's MoE ({w.name}) {'fuses' if on else 'does not fuse'} the shared expert; the draft follows"
        return [c if bool(c.fuses) == on or c.what_if else replace(c, what_if=why) for c in cands]

    def row_picks(self, batches: Sequence[int], kv_filter: int | None = None) -> list[RowPick]:
        out = []
        for row in self.rows:
            for kv in self.kv_values(row):
                if kv_filter is not None and kv is not None and kv != kv_filter:
                    continue
                cells = {b: self.cell(row, b, kv) for b in batches}
                out.append(RowPick(row, kv, cells, self.candidates[row.name]))
        return out

    def unassigned(self) -> list[str]:
        """Measured kernels no row uses (components of unlisted paths, other ops): listed, not dropped."""
        groups: dict[tuple[str, str, str | None], set[str]] = defaultdict(set)
        for k, op, v, b in self.idx.all_keys() - self.used:
            groups[(k, op, v)].add(b)
        return [
            f"{k}@{op}{':' + v if v else ''} ({', '.join(sorted(bs))})"
            for (k, op, v), bs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0], str(kv[0][2])))
        ]
