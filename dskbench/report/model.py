"""What the report shows, computed once: machines, the latest result per case, panels, history.

Nothing here formats text; html.py and markdown.py render the same model. Results are grouped by
machine (``device.name``) first, so two GPUs never share a series.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from dskbench.analysis.compare import DISAGREE_MARK, natural_key, timed_apart  # noqa: F401 - the mark too
from dskbench.analysis.compare_inputs import aggregate, aggregate_kernel_times, settings_of, stat_from_record
from dskbench.analysis.verdict import Stat, judge
from dskbench.results.access import part_of, rate
from dskbench.results.io import STATUSES, Run
from dskbench.results.records import Metrics

X_PREFERENCE = ("T", "B", "kv_len", "tp")
CPU_NOTE = "CPU reference timings (torch references on the CPU; not GPU kernel performance)"


@dataclass
class Machine:
    name: str
    kind: str  # cuda | cpu
    runs: list[Run]  # oldest first
    latest: dict[tuple[str, str], dict[str, Any]]  # (case_id, backend) -> latest record

    @property
    def is_cpu(self) -> bool:
        return self.kind != "cuda"

    @property
    def slug(self) -> str:
        return slug(self.name)

    @property
    def newest(self) -> dict[str, Any]:
        return self.runs[-1].environment

    def kernels(self) -> list[str]:
        return sorted({r["kernel"] for r in self.latest.values()}, key=str.lower)

    def records(self, kernel: str | None = None) -> list[dict[str, Any]]:
        recs = [r for r in self.latest.values() if kernel is None or r["kernel"] == kernel]
        return sorted(recs, key=lambda r: (natural_key(r.get("case_id") or ""), r["backend"]["name"]))


@dataclass
class Panel:
    """One chart pair and table: an op (and variant) over one sweep variable, other variables fixed."""

    op: str
    variant: str | None
    phases: list[str]
    x_var: str
    fixed: dict[str, int]
    ok: dict[str, list[dict[str, Any]]]  # backend -> ok records sorted by x
    twins: list[str] = field(default_factory=list)  # other ops of the kernel with the very same shapes

    @property
    def name(self) -> str:
        return f"{self.op}:{self.variant}" if self.variant else self.op

    @property
    def names(self) -> str:
        """The op and its same-shape twins: `input_layernorm / enorm / hnorm`."""
        return " / ".join([self.name, *self.twins])

    @property
    def title(self) -> str:
        parts = [self.names, "+".join(self.phases)] + [f"{k}={v}" for k, v in self.fixed.items()]
        return " · ".join(parts)

    def anchor(self, kernel_anchor: str) -> str:
        """The panel's id in the page (unique within its kernel's section)."""
        own = [self.name, "+".join(self.phases)] + [f"{k}={v}" for k, v in self.fixed.items()]
        return f"{kernel_anchor}--{slug('-'.join(own))}"

    def x(self, rec: dict[str, Any]) -> float:
        return float(rec.get("point", {}).get(self.x_var, 0))


@dataclass
class History:
    """Median latency of each (case, backend) at each commit (several runs of one commit: their
    run-level median, as dskbench compare takes them)."""

    commits: list[tuple[str, str, str]]  # (commit, label, created)
    values: dict[tuple[str, str], list[Stat | None]] = field(default_factory=dict)
    twins: set[tuple[str, str]] = field(default_factory=set)  # copies of another case's measurement
    # each commit's timers of the case, and its Stat in kernel times (gaps left subtracted): the last two
    # commits timed by different timers are judged on these, as dskbench compare judges them
    timers: dict[tuple[str, str], list[set[str]]] = field(default_factory=dict)
    kernel_values: dict[tuple[str, str], list[Stat | None]] = field(default_factory=dict)

    def changes(self, threshold: float = 0.05) -> list[tuple[str, str, str, float | None, Stat, Stat]]:
        """(case, backend, verdict, change, old, new) between the last two commits, not 'same'; judged
        by dskbench compare's rule (dskbench.analysis.verdict), the earlier commits being the case's history.
        Each measurement once: twins are left out."""
        out = []
        for (case, backend), stats in self.values.items():
            old, new = stats[-2], stats[-1]
            if old is None or new is None or (case, backend) in self.twins:
                continue
            timers = self.timers.get((case, backend))
            apart = bool(timers) and timed_apart(timers[-2], timers[-1])
            if apart:
                old, new = self.kernel_values[(case, backend)][-2], self.kernel_values[(case, backend)][-1]
            history = [] if apart else [s for s in stats[:-2] if s is not None]
            v = judge(old, new, threshold, history=history, timers_apart=apart)
            if v.verdict not in ("same", "skipped"):
                out.append((case, backend, v.verdict, v.change, old, new))
        return sorted(out, key=lambda c: (natural_key(c[0]), c[1]))


def slug(s: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in s).strip("-").lower() or "x"


def machines(runs: list[Run]) -> list[Machine]:
    """Runs grouped by device name (oldest first), each with its latest result per (case, backend)."""
    by_name: dict[str, list[Run]] = defaultdict(list)
    for run in sorted(runs, key=lambda r: str(r.environment.get("created", ""))):
        dev = run.environment.get("device") or {}
        by_name[str(dev.get("name") or dev.get("kind") or "unknown")].append(run)
    out = []
    for name, rs in by_name.items():
        latest: dict[tuple[str, str], dict[str, Any]] = {}
        for run in rs:
            for rec in run.results:
                latest[(rec.get("case_id") or rec["kernel"], rec["backend"]["name"])] = rec
        kind = str((rs[-1].environment.get("device") or {}).get("kind") or "cuda")
        out.append(Machine(name, kind, rs, latest))
    out.sort(key=lambda m: (m.is_cpu, m.name))
    return out


def status_counts(records: list[dict[str, Any]]) -> Counter:
    c = Counter(r["status"] for r in records)
    return Counter({s: c.get(s, 0) for s in STATUSES})


def is_plan_skip(rec: dict[str, Any]) -> bool:
    """A kernel skipped while planning (no adapter, host-only...): it has no case, only a reason."""
    return rec["backend"].get("name") == "-" and "point" not in rec


def kernel_anchor(machine_slug: str, kernel: str) -> str:
    return f"{machine_slug}--{slug(kernel)}"


def is_unmeasured(records: list[dict[str, Any]]) -> bool:
    """A kernel with nothing measured: every record is a skip (at planning, or of every case)."""
    return bool(records) and all(r["status"] == "skipped" for r in records)


def panels(records: list[dict[str, Any]]) -> list[Panel]:
    """The kernel's ok records cut into panels, identical-shape panels of different ops merged."""
    return merge_twins(split_panels(records))


def merge_twins(ps: list[Panel]) -> list[Panel]:
    """Panels of different ops whose cases have the same shapes (``dims``), phases and points, shown once.

    Such ops (enorm, hnorm and input_layernorm are all rmsnorm over [T, 7168]) run the same kernel on the
    same inputs; a run measures one of them and records the others as ``shared_with`` copies. The panel
    kept is the one measured (fewest copies); the others' names go into its title.
    """
    groups: dict[Any, list[Panel]] = {}
    for p in ps:
        groups.setdefault(_shape_key(p), []).append(p)
    out = []
    for p in ps:
        group = groups[_shape_key(p)]
        if len(group) == 1:
            out.append(p)
            continue
        primary = min(group, key=lambda q: (_copies(q), group.index(q)))
        if p is primary:
            p.twins = sorted({q.name for q in group if q is not p} - {p.name})
            out.append(p)
    return out


def _shape_key(p: Panel) -> Any:
    cells = []
    for backend, recs in p.ok.items():
        for r in recs:
            dims = r.get("dims")
            if not isinstance(dims, dict) or not dims:
                return ("no-dims", p.name, id(p))  # without shapes nothing can be called the same
            cells.append((backend, tuple(sorted(r["point"].items())), tuple(sorted(map(str, dims.items())))))
    return (tuple(p.phases), p.x_var, tuple(sorted(p.fixed.items())), frozenset(cells))


def _copies(p: Panel) -> int:
    return sum(1 for recs in p.ok.values() for r in recs if r.get("shared_with"))


def split_panels(records: list[dict[str, Any]]) -> list[Panel]:
    """The kernel's ok records cut into panels: per (op, variant), x = the first varying sweep variable."""
    groups: dict[tuple[str, str | None], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r["status"] == "ok" and isinstance(r.get("point"), dict):
            groups[(str(r.get("op") or ""), r.get("variant"))].append(r)
    out: list[Panel] = []
    for (op, variant), recs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        # phases share a chart when they cover different points (decode T=1..256, prefill T=512..)
        by_phase: dict[str, set] = defaultdict(set)
        for r in recs:
            by_phase[str(r.get("phase"))].add(tuple(sorted(r["point"].items())))
        sets = list(by_phase.values())
        overlap = any(a & b for i, a in enumerate(sets) for b in sets[i + 1 :])
        phase_groups = [[p] for p in by_phase] if overlap else [list(by_phase)]
        for phases in phase_groups:
            sub = [r for r in recs if str(r.get("phase")) in phases]
            out.extend(_split_fixed(op, variant, phases, sub))
    return out


def _split_fixed(op: str, variant: str | None, phases: list[str], recs: list[dict[str, Any]]) -> list[Panel]:
    values: dict[str, set] = defaultdict(set)
    for r in recs:
        for k, v in r["point"].items():
            values[k].add(v)
    order = sorted(values, key=lambda k: (X_PREFERENCE.index(k) if k in X_PREFERENCE else 99, k))
    varying = [k for k in order if len(values[k]) > 1]
    x_var = varying[0] if varying else order[0] if order else "T"
    others = [k for k in varying if k != x_var]
    out = []
    combos = product(*(sorted(values[k]) for k in others)) if others else [()]
    for combo in combos:
        fixed = dict(zip(others, combo, strict=True))
        sel = [r for r in recs if all(r["point"].get(k) == v for k, v in fixed.items())]
        if not sel:
            continue
        ok: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in sel:
            ok[r["backend"]["name"]].append(r)
        for b in ok:
            ok[b].sort(key=lambda r: r["point"].get(x_var, 0))
        out.append(Panel(op, variant, phases, x_var, fixed, dict(sorted(ok.items()))))
    return out


# The stack whose versions tell two runs of one commit apart: a run at another release of a kernel
# library is another point of a kernel's history (scripts/evidence/versions.sh makes such runs).
STACK = ("torch", "triton", "sglang-kernel", "flashinfer-python", "sglang", "apache-tvm-ffi", "cuda_runtime")


def run_points(runs: list[Run]) -> list[tuple[str, str]]:
    """Each run's point of a history, (key, label): its commit and its stack's versions. The label names
    what differs between the points: the commit where commits differ (or nothing else does), and each
    library whose version differs (`flashinfer-python 0.7.2.post1`)."""
    keys = []
    for run in runs:
        git = run.environment.get("git") or {}
        versions = run.environment.get("versions") or {}
        keys.append(
            (
                str(git.get("commit") or "unknown"),
                bool(git.get("dirty")),
                tuple(versions.get(n) for n in STACK),
            )
        )
    varying = [i for i in range(len(STACK)) if len({k[2][i] for k in keys}) > 1]
    show_commit = len({k[0] for k in keys}) > 1 or not varying
    out = []
    for commit, dirty, stack in keys:
        parts = [commit[:8] + ("+dirty" if dirty else "")] if show_commit else []
        parts += [f"{STACK[i]} {stack[i] or '-'}" for i in varying]
        out.append(("|".join([commit, *map(str, stack)]), " · ".join(parts)))
    return out


def history(machine: Machine, kernel: str) -> History | None:
    """Per-point medians of the kernel's cases (a point: a commit and its stack's versions, run_points),
    when at least two points measured the same case."""
    commits: list[tuple[str, str, str]] = []
    per_commit: dict[str, dict[tuple[str, str], list[Stat]]] = {}
    timers: dict[str, dict[tuple[str, str], set[str]]] = {}
    twins: set[tuple[str, str]] = set()
    for run, (commit, label) in zip(machine.runs, run_points(machine.runs), strict=True):
        if commit not in per_commit:
            commits.append((commit, label, str(run.environment.get("created", ""))))
            per_commit[commit], timers[commit] = {}, {}
        timer = settings_of(run.environment).timer
        for rec in run.results:
            if rec["kernel"] == kernel and not is_plan_skip(rec):
                key = (rec.get("case_id") or kernel, rec["backend"]["name"])
                per_commit[commit].setdefault(key, []).append(stat_from_record(rec, commit))
                timers[commit].setdefault(key, set()).add(timer)
                if rec.get("shared_with"):
                    twins.add(key)
    if len(commits) < 2:
        return None
    h = History(commits, twins=twins)
    keys = sorted({k for d in per_commit.values() for k in d}, key=lambda k: (natural_key(k[0]), k[1]))
    for key in keys:
        stats = [aggregate(per_commit[c][key]) if key in per_commit[c] else None for c, _, _ in commits]
        present = [s for s in stats if s is not None and s.status != "skipped"]
        if len(present) >= 2 and any(s.status == "ok" for s in present):
            h.values[key] = stats
            h.timers[key] = [timers[c].get(key, set()) for c, _, _ in commits]
            h.kernel_values[key] = [
                aggregate_kernel_times(per_commit[c][key]) if key in per_commit[c] else None
                for c, _, _ in commits
            ]
    return h if h.values else None


# -- metrics -------------------------------------------------------------------------------------------


def pct_of_peak(metrics: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
    """(% of the datasheet bandwidth, % of the datasheet compute rate); None where the GPU has no
    datasheet entry. The run's measured ceilings are shown beside the datasheet ones, never instead."""
    if not metrics:
        return None, None
    m = Metrics.from_json(metrics)
    return m.pct_bw, m.pct_compute


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def gbps(rec: dict[str, Any]) -> float | None:
    return rate(rec, "gbps")


def tflops(rec: dict[str, Any]) -> float | None:
    return rate(rec, "tflops")


def disagreement(rec: Mapping[str, Any]) -> str | None:
    """Why the record's two timers disagree (its cross-check outside the band), or None: they agree, or
    it was not cross-checked (skipped, or written before cross-checks)."""
    t = part_of(rec, "timing")
    cc = t.cross_check if t is not None else None
    if cc is None or not cc.flagged:
        return None
    return cc.note or f"{cc.method} ratio {cc.ratio}"


def flags(rec: dict[str, Any]) -> list[str]:
    """Warnings that qualify a number: throttled clocks, a measurement that did not converge, timers
    that disagree."""
    out = []
    clocks, t = part_of(rec, "clocks"), part_of(rec, "timing")
    if why := disagreement(rec):
        out.append(f"timers disagree: {why}")
    if clocks and clocks.throttled:
        reasons = ", ".join(str(r) for r in clocks.throttle_reasons or []) or "clocks"
        out.append(f"throttled ({reasons})")
    if t and t.converged is False:
        out.append("not converged" + (f" (cv {t.cv:.1%})" if _num(t.cv) else ""))
    shared = rec.get("shared_gpu")
    if isinstance(shared, Mapping):
        pids = ", ".join(str(p) for p in shared.get("pids") or []) or "?"
        out.append(f"shared GPU (pid {pids})")
    return out


def category_of(kernel: str, categories: Mapping[str, str] | None, rec: dict[str, Any] | None = None) -> str:
    if rec and rec.get("category"):
        return str(rec["category"])
    if categories and categories.get(kernel):
        return str(categories[kernel])
    return "uncategorised"


def registry_categories() -> dict[str, str]:
    """Kernel -> category from the kernel registry, or nothing when it cannot be read here."""
    try:
        from dskbench import paths
        from dskbench.registry.load import load_registry

        reg = load_registry(paths.REGISTRY_DIR)
        return {name: str(getattr(e, "category", "") or "") for name, e in reg.items()}
    except Exception:  # the report must not depend on the registry being present
        return {}
