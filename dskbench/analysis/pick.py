"""`dskbench pick`: the fastest correct backend of each DeepSeek op at each batch size, and what a step costs.

For every row of data/shapes/deployment.yaml (an op, or ops whose kernels are chosen together) and batch point,
each candidate (one kernel's backend, or a path of several kernels whose medians are summed) is evaluated
from the results: correct only with status ok; wrong/error candidates are excluded with their reason;
candidates without a record are "no measurement". The winner and runner-up are a tie unless the runner-up
is slower beyond run-to-run noise, by dskbench.analysis.verdict's rule (the one dskbench compare uses: its p10 is
beyond the noise floor of the winner's latency band and, with raw samples on both sides, a Mann-Whitney U
test separates them). The step estimate sums the winners over the layer
mix (dense and MoE layers, plus the NextN layer with speculative decoding), listing the rows it lacks.
"""

from __future__ import annotations

import math
import shlex
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dskbench.analysis.compare_inputs import device_name, stat_from_record
from dskbench.analysis.pick_data import Deployment, DeploymentError, Part, PathSpec, RowSpec, load_deployment
from dskbench.analysis.verdict import Stat, judge
from dskbench.results.io import ResultsError, Run, read_runs
from dskbench.shapes.cases import ModelShapes, ShapeError, default_shapes

PHASES = ("decode", "prefill")
REFERENCE = "torch-ref"  # the oracle: never a contender
FAIL_ORDER = ("wrong", "error", "skipped", "missing")


class PickError(ValueError):
    """Inputs pick cannot work from (no results, several GPUs mixed)."""


# -- the results, indexed --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One result record, reduced to what a pick needs (the record is kept for the in-situ script)."""

    kernel: str
    backend: str
    op: str
    variant: str | None
    batch: int
    kv_len: int | None
    status: str
    stat: Stat
    reason: str
    record: dict[str, Any] = field(compare=False, repr=False)


def batch_of(point: dict[str, Any]) -> int | None:
    v = point.get("T", point.get("B"))
    return int(v) if v is not None else None


class ResultIndex:
    """The latest result per (kernel, backend, op, variant, batch, kv_len) of one phase family and tp."""

    def __init__(self, runs: Iterable[Run], phase: str, tp: int):
        self.phase, self.tp = phase, tp
        self.plan_skips: dict[str, str] = {}
        latest: dict[tuple, Measured] = {}
        for run in sorted(runs, key=lambda r: str(r.environment.get("created", ""))):
            for rec in run.results:
                point = rec.get("point")
                if not point or not rec.get("op"):
                    if rec["status"] != "ok":
                        self.plan_skips[rec["kernel"]] = str(rec.get("reason") or rec["status"])
                    continue
                if _family(str(rec.get("phase") or "")) != phase:
                    continue
                if "tp" in point and int(point["tp"]) != tp:
                    continue
                batch = batch_of(point)
                if batch is None:
                    continue
                kv = point.get("kv_len")
                m = Measured(
                    kernel=rec["kernel"],
                    backend=rec["backend"]["name"],
                    op=rec["op"],
                    variant=rec.get("variant"),
                    batch=batch,
                    kv_len=int(kv) if kv is not None else None,
                    status=rec["status"],
                    stat=stat_from_record(rec),
                    reason=str(rec.get("reason") or ""),
                    record=rec,
                )
                latest[(m.kernel, m.backend, m.op, m.variant, m.batch, m.kv_len)] = m
        self._by_opv: dict[tuple[str, str | None], dict[tuple, Measured]] = defaultdict(dict)
        for (k, b, op, v, batch, kv), m in latest.items():
            self._by_opv[(op, v)][(k, b, batch, kv)] = m

    def pairs(self, op: str, variant: str | None) -> list[tuple[str, str]]:
        """(kernel, backend) measured at an op and variant, in name order."""
        return sorted({(k, b) for (k, b, _, _) in self._by_opv.get((op, variant), {})})

    def get(self, op: str, variant: str | None, kernel: str, backend: str, batch: int, kv: int | None):
        table = self._by_opv.get((op, variant), {})
        return table.get((kernel, backend, batch, kv)) or table.get((kernel, backend, batch, None))

    def points(self, op: str, variant: str | None, kernels: Iterable[str] | None = None) -> set:
        ks = set(kernels) if kernels is not None else None
        return {
            (batch, kv) for (k, _, batch, kv) in self._by_opv.get((op, variant), {}) if ks is None or k in ks
        }

    def all_keys(self) -> set[tuple[str, str, str | None, str]]:
        """(kernel, op, variant, backend) of every record."""
        return {(k, op, v, b) for (op, v), t in self._by_opv.items() for (k, b, _, _) in t}


def _family(phase: str) -> str:
    return "decode" if phase.startswith("decode") else phase


# -- evaluating candidates -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartResult:
    part: Part
    status: str  # ok | wrong | error | skipped | missing
    chosen: Measured | None = None  # the fastest correct record (ok)
    reason: str = ""


@dataclass(frozen=True)
class Outcome:
    """A candidate at one batch point."""

    path: PathSpec
    status: str
    stat: Stat | None = None
    parts: tuple[PartResult, ...] = ()
    reason: str = ""

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def median(self) -> float:
        return float(self.stat.value) if self.stat and self.stat.value is not None else math.inf


def combine(stats: Sequence[Stat]) -> Stat:
    """A path's Stat: medians summed; p10/p90 half-widths combined in quadrature (independent parts).

    One part keeps its raw samples (so the rank test can run); a sum of several has none.
    """
    value = sum(float(s.value or 0.0) for s in stats)
    if all(s.lo is not None and s.hi is not None and s.value is not None for s in stats):
        lo = value - math.sqrt(sum((float(s.value) - float(s.lo)) ** 2 for s in stats))  # type: ignore[arg-type]
        hi = value + math.sqrt(sum((float(s.hi) - float(s.value)) ** 2 for s in stats))  # type: ignore[arg-type]
    else:
        lo = hi = None
    samples = stats[0].samples if len(stats) == 1 else ()
    p10 = p90 = None
    if all(s.p10 is not None and s.p90 is not None and s.value is not None for s in stats):
        p10 = value - math.sqrt(sum((float(s.value) - float(s.p10)) ** 2 for s in stats))  # type: ignore[arg-type]
        p90 = value + math.sqrt(sum((float(s.p90) - float(s.value)) ** 2 for s in stats))  # type: ignore[arg-type]
    gap = sum(s.gap_us for s in stats)  # a path's raw time is the sum of its parts' raw times
    return Stat(value=value, lo=lo, hi=hi, spread="p10-p90", samples=samples, p10=p10, p90=p90, gap_us=gap)


def eval_part(idx: ResultIndex, part: Part, batch: int, kv: int | None) -> PartResult:
    ok: list[Measured] = []
    bad: list[Measured] = []
    for kernel, backend in idx.pairs(part.op, part.variant):
        if backend == REFERENCE or not part.matches(kernel, backend):
            continue
        m = idx.get(part.op, part.variant, kernel, backend, batch, kv)
        if m is None:
            continue
        (ok if m.status == "ok" and m.stat.value is not None else bad).append(m)
    if ok:
        return PartResult(part, "ok", min(ok, key=lambda m: float(m.stat.value)))  # type: ignore[arg-type]
    for status in ("wrong", "error", "skipped"):
        hits = [m for m in bad if m.status == status]
        if hits:
            return PartResult(part, status, reason=_reasons(hits))
    planned = [f"{k}: {idx.plan_skips[k]}" for k in part.kernels if k in idx.plan_skips]
    if planned:
        return PartResult(part, "skipped", reason="; ".join(planned))
    return PartResult(part, "missing", reason=f"no measurement of {part.label}")


def _reasons(hits: list[Measured]) -> str:
    """`kernel/b1, b2: reason; ...`: backends that failed for the same reason share one phrase."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for m in hits:
        by_reason[m.reason].append(f"{m.kernel}/{m.backend}")
    return "; ".join(f"{', '.join(who)}: {why}" for why, who in by_reason.items())


def eval_path(idx: ResultIndex, path: PathSpec, batch: int, kv: int | None) -> Outcome:
    parts = tuple(eval_part(idx, p, batch, kv) for p in path.parts)
    if all(p.status == "ok" for p in parts):
        return Outcome(path, "ok", combine([p.chosen.stat for p in parts]), parts)  # type: ignore[union-attr]
    status = next(s for s in FAIL_ORDER if any(p.status == s for p in parts))
    reason = "; ".join(p.reason for s in FAIL_ORDER for p in parts if p.status == s)
    return Outcome(path, status, None, parts, reason)


@dataclass
class Cell:
    """One row at one batch point: the ranking of correct candidates and everything left out."""

    batch: int
    kv_len: int | None
    ranked: list[Outcome] = field(default_factory=list)  # ok, not what-if, fastest first
    what_if: list[Outcome] = field(default_factory=list)  # ok what-if candidates, fastest first
    excluded: list[Outcome] = field(default_factory=list)  # wrong / error
    skipped: list[Outcome] = field(default_factory=list)
    missing: list[Outcome] = field(default_factory=list)
    tie: bool = False
    how: str = ""

    @property
    def winner(self) -> Outcome | None:
        return self.ranked[0] if self.ranked else None

    @property
    def runner_up(self) -> Outcome | None:
        return self.ranked[1] if len(self.ranked) > 1 else None

    @property
    def margin(self) -> float | None:
        """How much slower the runner-up is than the winner (0.05 = 5%)."""
        w, r = self.winner, self.runner_up
        if w is None or r is None or not w.median:
            return None
        return r.median / w.median - 1.0


def judge_cell(outcomes: list[Outcome], batch: int, kv: int | None, threshold: float = 0.0) -> Cell:
    """Rank the correct candidates; winner and runner-up tie unless dskbench.analysis.verdict.judge calls the
    runner-up slower (the margin above `threshold`, its p10 beyond the noise floor, the U test)."""
    cell = Cell(batch, kv)
    for o in outcomes:
        if o.status == "ok":
            (cell.what_if if o.path.what_if else cell.ranked).append(o)
        elif o.status in ("wrong", "error"):
            cell.excluded.append(o)
        elif o.status == "skipped":
            cell.skipped.append(o)
        else:
            cell.missing.append(o)
    cell.ranked.sort(key=lambda o: (o.median, o.name))
    cell.what_if.sort(key=lambda o: (o.median, o.name))
    w, r = cell.winner, cell.runner_up
    if w is not None and r is not None:
        v = judge(w.stat, r.stat, threshold)
        cell.tie = v.verdict != "slower"
        cell.how = f"margin under {threshold:.0%}" if v.verdict == "same" else v.note
    return cell


# -- rows ------------------------------------------------------------------------------------------------


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
            outcomes = [eval_path(self.idx, c, batch, kv) for c in self.candidates[row.name]]
            self._cache[key] = judge_cell(outcomes, batch, kv, self.threshold)
        return self._cache[key]

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


# -- the step estimate -----------------------------------------------------------------------------------


@dataclass
class Total:
    """Microseconds summed over the measured rows, and the rows that had no measurement."""

    us: float = 0.0
    missing: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """False when some row had no measurement: `us` is then a lower bound, never the total."""
        return not self.missing

    def add(self, us: float, weight: float = 1.0) -> None:
        self.us += us * weight

    def plus(self, other: Total, weight: float = 1.0) -> Total:
        return Total(self.us + other.us * weight, sorted(set(self.missing) | set(other.missing)))


@dataclass
class Estimate:
    batch: int
    kv_len: int
    dense_layer: Total
    moe_layer: Total
    per_step: Total
    step: Total
    contributions: dict[str, float]  # row -> us per step in `step`
    spec_step: Total | None = None
    spec_note: str = ""


def multiplicity(row: RowSpec, counts: dict[str, int]) -> int:
    if row.scope != "layer":
        return 1
    if row.layers in counts:
        return counts[row.layers]
    return sum(counts.values())


def _row_kv(p: Picker, row: RowSpec, kv: int) -> int | None:
    return kv if p.kv_values(row) != [None] else None


def _layer_total(p: Picker, kind: str, batch: int, kv: int, scope: str = "layer") -> Total:
    """Sum of the winners of one layer kind (or of the rows of another scope) at one batch point."""
    t = Total()
    for row in p.rows:
        if row.scope != scope or (scope == "layer" and row.layers not in (None, kind)):
            continue
        w = p.cell(row, batch, _row_kv(p, row, kv)).winner
        if w is None:
            t.missing.append(row.name)
        else:
            t.add(w.median, row.calls)
    return t


def estimate(p: Picker, batch: int, kv: int) -> Estimate:
    counts = p.dep.layer_counts
    n_dense, n_moe = counts.get("dense", 0), counts.get("moe", 0)
    dense = _layer_total(p, "dense", batch, kv)
    moe = _layer_total(p, "moe", batch, kv)
    per_step = _layer_total(p, "", batch, kv, scope="step")
    step = Total().plus(dense, n_dense).plus(moe, n_moe).plus(per_step)
    contrib: dict[str, float] = {}
    for row in p.rows:
        if row.scope not in ("layer", "step"):
            continue
        w = p.cell(row, batch, _row_kv(p, row, kv)).winner
        if w is not None:
            contrib[row.name] = multiplicity(row, counts) * row.calls * w.median
    est = Estimate(batch, kv, dense, moe, per_step, step, contrib)
    spec = p.dep.speculative
    if p.phase == "decode" and spec.get("target_tokens") and spec.get("draft_forwards"):
        tb = batch * spec["target_tokens"]
        target = Total().plus(_tag(_layer_total(p, "dense", tb, kv), tb), n_dense)
        target = target.plus(_tag(_layer_total(p, "moe", tb, kv), tb), n_moe)
        draft_layer = _layer_total(p, p.dep.draft_layer, batch, kv)
        draft = draft_layer.plus(_layer_total(p, "", batch, kv, scope="nextn"))
        extra = _layer_total(p, "", batch, kv, scope="spec")
        est.spec_step = target.plus(draft, spec["draft_forwards"]).plus(extra)
        est.spec_note = (
            f"target layers at T = {spec['target_tokens']}·B (tokens verified per request), "
            f"{spec['draft_forwards']} NextN draft forwards at T = B, EAGLE kernels once"
        )
    return est


def _tag(t: Total, batch: int) -> Total:
    t.missing = [f"{m} @T={batch}" for m in t.missing]
    return t


# -- flags -----------------------------------------------------------------------------------------------


@dataclass
class FlagChoice:
    """One server flag at one batch point: the value with the lowest per-step total over the rows it
    governs (a flag sets every such row at once, so the per-row winners may disagree)."""

    flag: str
    value: str | None
    totals: dict[str, tuple[float, list[str]]]  # value -> (us per step, rows it has no measurement for)
    disagree: list[str]  # rows whose own winner wants another value (or none)


def flag_choices(p: Picker, batch: int, kv: int) -> list[FlagChoice]:
    counts = p.dep.layer_counts
    governed: dict[str, list[RowSpec]] = defaultdict(list)
    for row in p.rows:
        if row.scope not in ("layer", "step"):
            continue
        for flag in sorted({f for c in p.candidates[row.name] if not c.what_if for f in c.flags}):
            governed[flag].append(row)
    out = []
    for flag, rows in sorted(governed.items()):
        values = sorted(
            {c.flags[flag] for r in rows for c in p.candidates[r.name] if flag in c.flags and not c.what_if}
        )
        totals: dict[str, tuple[float, list[str]]] = {}
        cells = {}
        for r in rows:
            cells[r.name] = p.cell(r, batch, _row_kv(p, r, kv))
        for v in values:
            us, lacking = 0.0, []
            for r in rows:
                best = [o for o in cells[r.name].ranked if o.path.flags.get(flag) == v]
                if best:
                    us += multiplicity(r, counts) * r.calls * best[0].median
                else:
                    lacking.append(r.name)
            totals[v] = (us, lacking)
        complete = [v for v in values if not totals[v][1]]
        value = min(complete, key=lambda v: totals[v][0]) if complete else None
        disagree = [
            r.name
            for r in rows
            if cells[r.name].winner is not None and cells[r.name].winner.path.flags.get(flag) != value  # type: ignore[union-attr]
        ]
        out.append(FlagChoice(flag, value, totals, disagree))
    return out


# -- one phase, and the whole pick ------------------------------------------------------------------------


@dataclass
class PhasePick:
    phase: str
    batches: list[int]
    rows: list[RowPick]
    estimates: list[Estimate]
    flags: dict[int, list[FlagChoice]]
    unassigned: list[str]
    picker: Picker = field(repr=False)


@dataclass
class Launch:
    """One SGLang launch command: the deployment's command, `--tp N`, and one value per server flag."""

    argv: list[str]
    varies: list[str] = field(default_factory=list)  # flags whose choice differs across batches/phases
    unset: list[str] = field(default_factory=list)  # flags with no value measured for every row they set

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def _var(phase: str) -> str:
    return "B" if phase == "decode" else "T"


def launch_command(phases: Sequence[PhasePick], tp: int, prefix: Sequence[str]) -> Launch:
    """One value per flag from the per-batch flag choices. A flag takes its value from the first phase
    (decode before prefill: decode is the steady state of serving) that chose one, and there the value
    chosen at the most batch points (a tie: the one chosen at the largest batch). Flags whose choice
    differs are listed, so the reader can pick again with `--batch` at their own load."""
    seen: dict[str, list[tuple[str, int, str | None]]] = defaultdict(list)
    for pp in phases:
        for b in pp.batches:
            for fc in pp.flags.get(b, []):
                seen[fc.flag].append((pp.phase, b, fc.value))
    argv = [*prefix, "--tp", str(tp)]
    launch = Launch(argv)
    for flag in sorted(seen):
        chosen = [(ph, b, v) for ph, b, v in seen[flag] if v is not None]
        if not chosen:
            launch.unset.append(flag)
            continue
        phase = chosen[0][0]
        votes: dict[str, tuple[int, int]] = {}
        for ph, b, v in chosen:
            if ph == phase:
                n, top = votes.get(v, (0, 0))  # type: ignore[arg-type]
                votes[v] = (n + 1, max(top, b))  # type: ignore[index]
        value = max(votes, key=lambda v: votes[v])
        argv += [flag, value]
        if len({v for _, _, v in chosen}) > 1:
            by: dict[tuple[str, str], list[int]] = defaultdict(list)
            for ph, b, v in chosen:
                by[(ph, v)].append(b)  # type: ignore[index]
            where = "; ".join(f"{ph} {_var(ph)}={','.join(map(str, bs))}: {v}" for (ph, v), bs in by.items())
            launch.varies.append(f"{flag} {value} ({where})")
    return launch


@dataclass
class Pick:
    device: str
    tp: int
    kv_len: int
    inputs: list[str]
    runs: list[str]
    phases: list[PhasePick]
    threshold: float = 0.0
    launch: Launch | None = None


def load_runs(paths: Sequence[str | Path], device: str | None = None) -> tuple[list[Run], str]:
    """The runs of one device (several GPUs are never mixed in one pick)."""
    runs = [r for r in read_runs(paths) if r.results]
    if device:
        runs = [r for r in runs if device_name(r.environment) == device]
    devices = sorted({device_name(r.environment) for r in runs})
    if not devices:
        raise PickError("no results" + (f" for device {device!r}" if device else "") + " in the inputs")
    if len(devices) > 1:
        raise PickError(f"results of several devices ({', '.join(devices)}): pick one with device=")
    return runs, devices[0]


def measured_tps(runs: Iterable[Run], phases: Sequence[str] = PHASES) -> set[int]:
    """The tp degrees of the tp-dependent records (a point with a `tp` value) of the given phases."""
    out: set[int] = set()
    for run in runs:
        for rec in run.results:
            point = rec.get("point") or {}
            if "tp" in point and _family(str(rec.get("phase") or "")) in phases:
                out.add(int(point["tp"]))
    return out


def check_tp(runs: Sequence[Run], tp: int, phases: Sequence[str] = PHASES) -> None:
    """Refuse a tp the results never measured: every tp-dependent row would read "no measurement"."""
    held = measured_tps(runs, phases)
    if held and tp not in held:
        raise PickError(
            f"--tp {tp}: no measurement at tp {tp} in the results (they hold tp "
            f"{', '.join(map(str, sorted(held)))}); measure it with `dskbench run --tp {tp}`"
        )


def pick(
    runs: Sequence[Run],
    device: str,
    phases: Sequence[str] = PHASES,
    batches: Sequence[int] | None = None,
    tp: int = 1,
    kv_len: int | None = None,
    dep: Deployment | None = None,
    shapes: ModelShapes | None = None,
    threshold: float = 0.0,
    inputs: Sequence[str] = (),
) -> Pick:
    shapes = shapes or default_shapes()
    dep = dep or load_deployment(shapes)
    kv = kv_len or dep.kv_len
    out = []
    for phase in phases:
        picker = Picker(ResultIndex(runs, phase, tp), dep, phase, tp, threshold)
        bs = sorted(set(batches)) if batches else picker.batches()
        rows = picker.row_picks(bs)
        ests = [estimate(picker, b, kv) for b in bs]
        flags = {b: flag_choices(picker, b, kv) for b in bs}
        out.append(PhasePick(phase, bs, rows, ests, flags, picker.unassigned(), picker))
    launch = launch_command(out, tp, dep.launch)
    return Pick(device, tp, kv, list(inputs), [r.run_id for r in runs], out, threshold, launch)


def cli_pick(
    paths: list[Path],
    phase: str | None,
    batch: list[int] | None,
    tp: int,
    out: Path | None,
    kv_len: int | None = None,
    device: str | None = None,
) -> int:
    """Print the pick as Markdown; or, with `out`, write pick.md, pick.html and pick.json there and print
    a short summary (the launch command, the step estimate per batch, the files).

    0 on success, 2 on bad input (unreadable results, several devices, a bad deployment file).
    """
    from dskbench.report.pick_page import render_html, render_json, render_markdown, render_summary

    if phase is not None and phase not in PHASES:
        print(f"dskbench pick: phase {phase!r} is not one of {', '.join(PHASES)}", file=sys.stderr)
        return 2
    try:
        runs, dev = load_runs(paths, device)
        check_tp(runs, tp, [phase] if phase else PHASES)
        result = pick(
            runs,
            dev,
            phases=[phase] if phase else PHASES,
            batches=batch,
            tp=tp,
            kv_len=kv_len,
            inputs=[str(p) for p in paths],
        )
    except (ResultsError, PickError, DeploymentError, ShapeError) as e:
        print(f"dskbench pick: {e}", file=sys.stderr)
        return 2
    md = render_markdown(result)
    if out is None:
        print(md, end="")
        return 0
    import json

    files = {
        "pick.md": md,
        "pick.html": render_html(result),
        "pick.json": json.dumps(render_json(result), indent=1) + "\n",
    }
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text, encoding="utf-8")
    except OSError as e:
        print(f"dskbench pick: cannot write into {out}: {e.strerror}", file=sys.stderr)
        return 2
    print(render_summary(result, [str(out / name) for name in files]), end="")
    return 0
