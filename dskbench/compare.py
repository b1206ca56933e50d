"""Compare two sets of results (ours, or asv's) and say which cases got slower, noise-aware.

The rule (modelled on nvbench-compare and asv compare, one rule for both formats):

* Cases match by (machine, case, backend): for our results the machine is ``device.name`` (two GPUs
  are never compared with each other), the case is ``case_id`` and the backend its name; for asv the
  machine is the asv machine, the case the benchmark name with its parameters, and the backend the
  ``backend`` parameter when there is one, else the asv environment name.
* Each side has a median and a spread: p10-p90 of the samples for our results, q_25-q_75 for asv
  (its 99% confidence interval of the median when the quartiles are missing).
* A change is real only when BOTH hold:
  1. the median moved by more than ``threshold`` (default 5%) in the bad (or good) direction, and
  2. it stands out of the noise: the spreads do not overlap (slower: new p10 > old p90), or, when
     both sides kept their raw samples (>= 8 each), a two-sided Mann-Whitney U test gives p < 0.001
     (asv's ``is_different`` uses the same test). Without any spread the threshold alone decides.
* Beyond the threshold but inside the noise is reported as ``~slower`` / ``~faster``, never failing.
* Status changes: ok -> wrong or error is a regression (``broke``), wrong/error -> ok an improvement
  (``fixed``). ok -> skipped (``now skipped``), skipped -> wrong/error (``now failing``) and
  skipped -> ok (``now measured``) are shown but do not fail: a skip is decided by the machine or the
  install, so there is no baseline to regress from. Cases on one side only are ``added``/``missing``.
* Latency: lower is better. asv values whose unit ends in ``/s`` (GB/s, TFLOP/s) count higher as
  better (asv itself treats every bigger number as worse, asv#1617).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

from dskbench.results import ResultsError, Run, is_results_file, read_runs

MIN_SAMPLES = 8  # both sides need this many raw samples before the rank test is used
P_THRESHOLD = 0.001
MAX_TEST_SAMPLES = 4000  # larger sample lists are thinned to evenly spaced order statistics

REGRESSIONS = frozenset({"slower", "broke"})
IMPROVEMENTS = frozenset({"faster", "fixed"})
VERDICT_ORDER = (
    "broke",
    "slower",
    "~slower",
    "now skipped",
    "missing",
    "still failing",
    "now failing",
    "fixed",
    "now measured",
    "faster",
    "~faster",
    "added",
    "same",
    "skipped",
)


@dataclass(frozen=True)
class Key:
    machine: str
    kernel: str
    case: str
    backend: str


@dataclass(frozen=True)
class Stat:
    """One side of a comparison: a median with its spread, or a status without numbers."""

    status: str = "ok"  # ok | wrong | skipped | error
    value: float | None = None  # median; microseconds for times
    lo: float | None = None
    hi: float | None = None
    spread: str = ""  # what lo-hi is: p10-p90 | q25-q75 | ci99
    samples: tuple[float, ...] = ()
    unit: str = "us"
    higher_is_better: bool = False
    reason: str = ""
    throttled: bool = False
    commit: str = ""


@dataclass(frozen=True)
class Change:
    key: Key
    old: Stat | None
    new: Stat | None
    verdict: str
    change: float | None = None  # new/old - 1
    note: str = ""

    @property
    def is_regression(self) -> bool:
        return self.verdict in REGRESSIONS

    @property
    def is_improvement(self) -> bool:
        return self.verdict in IMPROVEMENTS


@dataclass
class Comparison:
    threshold: float
    changes: list[Change] = field(default_factory=list)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.is_regression]

    @property
    def improvements(self) -> list[Change]:
        return [c for c in self.changes if c.is_improvement]

    def counts(self) -> Counter:
        return Counter(c.verdict for c in self.changes)

    def summary(self) -> str:
        n = self.counts()
        parts = [f"{n[v]} {v}" for v in VERDICT_ORDER if n.get(v)]
        return f"{len(self.changes)} cases compared (threshold {self.threshold:.0%}): " + ", ".join(parts)

    def format_table(self, verbose: bool = False, max_quiet_rows: int = 200) -> str:
        """A per-kernel table; with many rows, unchanged ones are left out unless verbose."""
        rows = sorted(self.changes, key=_row_order)
        hide_same = not verbose and len(rows) > max_quiet_rows
        shown = [c for c in rows if not (hide_same and c.verdict in ("same", "skipped"))]
        cells = [("kernel", "case", "backend", "old", "new", "change", "verdict")]
        for c in shown:
            cells.append(
                (
                    c.key.kernel,
                    _short_case(c.key),
                    c.key.backend,
                    format_stat(c.old),
                    format_stat(c.new),
                    f"{c.change:+.1%}" if c.change is not None else "",
                    c.verdict + (f" ({c.note})" if c.note else ""),
                )
            )
        widths = [min(max(len(r[i]) for r in cells), 60) for i in range(len(cells[0]))]
        lines = []
        last_group = None
        for i, r in enumerate(cells):
            if i > 0:
                group = (shown[i - 1].key.machine, shown[i - 1].key.kernel)
                if group != last_group:
                    lines.append(f"-- {group[1]} on {group[0]}")
                    last_group = group
            lines.append("  ".join(_fit(v, w) for v, w in zip(r, widths, strict=True)).rstrip())
        if hide_same:
            hidden = len(rows) - len(shown)
            lines.append(f"({hidden} unchanged or skipped cases not shown)")
        return "\n".join(lines)


def _fit(s: str, w: int) -> str:
    return s.ljust(w) if len(s) <= w else s[: w - 1] + "~"


def _short_case(key: Key) -> str:
    prefix = key.kernel + "/"
    return key.case[len(prefix) :] if key.case.startswith(prefix) else key.case


def _row_order(c: Change) -> tuple:
    return (c.key.machine, c.key.kernel, natural_key(c.key.case), c.key.backend)


def natural_key(s: str) -> tuple:
    """Sort key that orders embedded numbers by value (T=2 before T=128)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", s))


def format_stat(s: Stat | None) -> str:
    """`12.3 us ±2.1%` (half the spread, relative to the median) or the status."""
    if s is None:
        return "-"
    if s.status != "ok" or s.value is None:
        return s.status
    v = format_number(s.value)
    unit = "" if s.unit == "us" else f" {s.unit}"
    if s.lo is not None and s.hi is not None and s.value:
        return f"{v}{unit} ±{(s.hi - s.lo) / 2 / abs(s.value):.1%}"
    return f"{v}{unit}"


def format_number(x: float) -> str:
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


# -- the rule ----------------------------------------------------------------------------------------------


def judge(old: Stat | None, new: Stat | None, threshold: float = 0.05) -> tuple[str, float | None, str]:
    """(verdict, relative change, note) for one case; see the module docstring for the rule."""
    if old is None and new is None:
        raise ValueError("nothing to judge")
    if old is None:
        return "added", None, ""
    if new is None:
        return "missing", None, "not in the new results"
    failing = ("wrong", "error")
    if old.status == "ok" and new.status in failing:
        return "broke", None, f"{new.status}: {new.reason}"[:200]
    if old.status in failing and new.status == "ok":
        return "fixed", None, f"was {old.status}"
    if old.status in failing and new.status in failing:
        return "still failing", None, f"{new.status}: {new.reason}"[:200]
    if old.status == "ok" and new.status == "skipped":
        return "now skipped", None, new.reason[:200]
    if old.status == "skipped" and new.status in failing:
        return "now failing", None, f"{new.status}: {new.reason}"[:200]
    if old.status == "skipped" and new.status == "ok":
        return "now measured", None, ""
    if new.status != "ok" or old.status != "ok" or not old.value or new.value is None:
        return "skipped", None, ""
    change = new.value / old.value - 1.0
    worse = -change if new.higher_is_better else change
    notes = []
    if new.throttled or old.throttled:
        notes.append("throttled " + ("new" if new.throttled else "old") + " run")
    if abs(worse) <= threshold:
        return "same", change, "; ".join(notes)
    direction = "slower" if worse > 0 else "faster"
    sig, how = significant(old, new)
    if how:
        notes.insert(0, how)
    verdict = direction if sig else "~" + direction
    return verdict, change, "; ".join(notes)


def significant(old: Stat, new: Stat) -> tuple[bool, str]:
    """Whether the two measurements differ beyond their noise, and why (empty when clear-cut)."""
    have_spread = None not in (old.lo, old.hi, new.lo, new.hi)
    if have_spread and (new.lo > old.hi or new.hi < old.lo):  # type: ignore[operator]
        return True, ""
    if len(old.samples) >= MIN_SAMPLES and len(new.samples) >= MIN_SAMPLES:
        p = mann_whitney_p(old.samples, new.samples)
        if p < P_THRESHOLD:
            return True, f"spreads overlap; U test p={p:.1g}"
        return False, f"within noise (U test p={p:.2g})"
    if not have_spread:
        return True, "no spread recorded"
    return False, f"within noise ({new.spread or 'spreads'} overlap)"


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation with tie correction)."""
    a, b = _thin(a), _thin(b)
    n1, n2 = len(a), len(b)
    pooled = sorted([(x, 0) for x in a] + [(x, 1) for x in b])
    rank_sum_a = 0.0
    tie_term = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        avg_rank = (i + j) / 2 + 1
        t = j - i + 1
        tie_term += t**3 - t
        rank_sum_a += avg_rank * sum(1 for k in range(i, j + 1) if pooled[k][1] == 0)
        i = j + 1
    u = rank_sum_a - n1 * (n1 + 1) / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(var)
    return math.erfc(max(z, 0.0) / math.sqrt(2))


def _thin(xs: Sequence[float]) -> list[float]:
    s = sorted(float(x) for x in xs if x == x)
    if len(s) <= MAX_TEST_SAMPLES:
        return s
    step = (len(s) - 1) / (MAX_TEST_SAMPLES - 1)
    return [s[round(i * step)] for i in range(MAX_TEST_SAMPLES)]


# -- inputs ------------------------------------------------------------------------------------------------


def stats_from_runs(runs: Iterable[Run]) -> dict[Key, Stat]:
    """(device, case, backend) -> the latest result for it, runs taken in order of creation."""
    out: dict[Key, Stat] = {}
    for run in sorted(runs, key=lambda r: str(r.environment.get("created", ""))):
        machine = device_name(run.environment)
        commit = str((run.environment.get("git") or {}).get("commit") or "")
        for rec in run.results:
            key = Key(machine, rec["kernel"], rec.get("case_id") or rec["kernel"], rec["backend"]["name"])
            out[key] = stat_from_record(rec, commit)
    return out


def device_name(env: Mapping[str, Any]) -> str:
    dev = env.get("device") or {}
    return str(dev.get("name") or dev.get("kind") or "unknown")


def stat_from_record(rec: Mapping[str, Any], commit: str = "") -> Stat:
    t = rec.get("timing") or {}
    clocks = rec.get("clocks") or {}
    return Stat(
        status=rec["status"],
        value=t.get("median_us"),
        lo=t.get("p10_us"),
        hi=t.get("p90_us"),
        spread="p10-p90",
        samples=tuple(t.get("samples_us") or ()),
        reason=str(rec.get("reason") or ""),
        throttled=bool(clocks.get("throttled")),
        commit=commit,
    )


def compare(
    old_runs: Sequence[Run] | Mapping[Key, Stat],
    new_runs: Sequence[Run] | Mapping[Key, Stat],
    threshold: float = 0.05,
) -> Comparison:
    """Match old and new by (machine, case, backend) and judge each pair."""
    old = old_runs if isinstance(old_runs, Mapping) else stats_from_runs(old_runs)
    new = new_runs if isinstance(new_runs, Mapping) else stats_from_runs(new_runs)
    out = Comparison(threshold)
    for key in sorted(
        set(old) | set(new), key=lambda k: (k.machine, k.kernel, natural_key(k.case), k.backend)
    ):
        verdict, change, note = judge(old.get(key), new.get(key), threshold)
        out.changes.append(Change(key, old.get(key), new.get(key), verdict, change, note))
    return out


# -- asv results -------------------------------------------------------------------------------------------


def is_asv_results(data: Any) -> bool:
    return isinstance(data, dict) and "result_columns" in data and "results" in data


def stats_from_asv(
    path: Path, data: dict[str, Any], meta: Mapping[str, Any] | None = None
) -> dict[Key, Stat]:
    """One asv results file (api_version 2) -> Stats; times become microseconds.

    ``meta`` is asv's benchmarks.json (units and parameter names); without it times are recognised by
    the ``time_`` prefix and parameters are shown by position.
    """
    cols = data["result_columns"]
    if "result" not in cols or "params" not in cols:
        raise ResultsError(f"{path}: asv results without result/params columns")
    machine = str((data.get("params") or {}).get("machine") or path.parent.name)
    env_name = str(data.get("env_name") or "")
    commit = str(data.get("commit_hash") or "")
    out: dict[Key, Stat] = {}
    for name, row in (data.get("results") or {}).items():
        if not isinstance(row, list) or len(row) > len(cols):
            raise ResultsError(f"{path}: malformed asv result row for {name}")
        col = dict(zip(cols, row + [None] * (len(cols) - len(row)), strict=True))
        params = col["params"] or []
        combos = list(product(*params)) if params else [()]
        info = (meta or {}).get(name) or {}
        names = list(info.get("param_names") or [f"p{i}" for i in range(len(params))])
        unit = str(info.get("unit") or ("seconds" if name.rsplit(".", 1)[-1].startswith("time_") else "unit"))
        results = col["result"]
        parts = name.split(".")
        kernel = parts[-2] if len(parts) >= 2 else parts[0]
        for i, combo in enumerate(combos):
            values = {n: _unrepr(v) for n, v in zip(names, combo, strict=False)}
            backend = values.pop("backend", None) or env_name or "asv"
            case = name + (f"({', '.join(f'{k}={v}' for k, v in values.items())})" if values else "")
            value = results[i] if isinstance(results, list) and i < len(results) else None
            stats = _at(col.get("stats_q_25"), i), _at(col.get("stats_q_75"), i)
            ci = _at(col.get("stats_ci_99_a"), i), _at(col.get("stats_ci_99_b"), i)
            samples = _at(col.get("samples"), i) or ()
            key = Key(machine, kernel, case, backend)
            out[key] = _asv_stat(value, stats, ci, samples, unit, commit)
    return out


def _at(column: Any, i: int) -> Any:
    if isinstance(column, list) and i < len(column):
        return column[i]
    return None


def _unrepr(v: Any) -> str:
    s = str(v)
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return s


def _asv_stat(value: Any, q: tuple, ci: tuple, samples: Any, unit: str, commit: str) -> Stat:
    if value is None:
        return Stat(status="error", reason="asv: benchmark failed", commit=commit)
    value = float(value)
    if math.isnan(value):
        return Stat(status="skipped", reason="asv: n/a (skipped)", commit=commit)
    scale, shown = (1e6, "us") if unit == "seconds" else (1.0, unit)
    if q[0] is not None and q[1] is not None:
        lo, hi, spread = q[0] * scale, q[1] * scale, "q25-q75"
    elif ci[0] is not None and ci[1] is not None:
        lo, hi, spread = ci[0] * scale, ci[1] * scale, "ci99"
    else:
        lo = hi = None
        spread = ""
    return Stat(
        value=value * scale,
        lo=lo,
        hi=hi,
        spread=spread,
        samples=tuple(float(x) * scale for x in (samples or ()) if x is not None),
        unit=shown,
        higher_is_better=shown.endswith("/s"),
        commit=commit,
    )


# -- loading either format -------------------------------------------------------------------------------


def load_stats(specs: Iterable[str | Path]) -> dict[Key, Stat]:
    """Results named by files or folders (ours: JSON lines; asv: results JSON), merged.

    A folder is searched recursively. asv folders usually hold many commits: select one with
    ``FOLDER@COMMIT`` (a prefix of the hash); asking for a folder of several commits without one fails.
    """
    ours: list[Path] = []
    asv_files: list[tuple[Path, dict[str, Any]]] = []
    for spec in specs:
        path, rev = _split_rev(str(spec))
        if not path.exists():
            raise ResultsError(f"{path}: no such file or folder")
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        chosen: list[tuple[Path, dict[str, Any]]] = []
        for f in files:
            if is_results_file(f):
                if not rev:
                    ours.append(f)
                continue
            if f.suffix != ".json" or f.name in ("benchmarks.json", "machine.json"):
                if f == path:
                    ours.append(f)  # a file named explicitly: let the results reader judge it
                continue
            data = _load_json(f)
            if is_asv_results(data):
                if not rev or str(data.get("commit_hash", "")).startswith(rev):
                    chosen.append((f, data))
            elif f == path:
                ours.append(f)
        commits = {str(d.get("commit_hash", "")) for _, d in chosen}
        if len(commits) > 1:
            short = ", ".join(sorted(c[:8] for c in commits))
            raise ResultsError(
                f"{spec}: asv results of several commits ({short}); pick one with {path}@COMMIT"
            )
        if rev and not chosen:
            raise ResultsError(f"{spec}: no asv results for commit {rev}")
        asv_files.extend(chosen)
    out: dict[Key, Stat] = stats_from_runs(read_runs(ours)) if ours else {}
    for f, data in asv_files:
        out.update(stats_from_asv(f, data, _asv_meta(f)))
    return out


def _split_rev(spec: str) -> tuple[Path, str]:
    if "@" in spec and not Path(spec).exists():
        head, _, rev = spec.rpartition("@")
        if Path(head).exists():
            return Path(head), rev
    return Path(spec), ""


def _load_json(path: Path) -> Any:
    try:
        with path.open(encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, json.JSONDecodeError):
        return None


def _asv_meta(results_file: Path) -> dict[str, Any] | None:
    """benchmarks.json of an asv results tree: results/benchmarks.json next to results/<machine>/."""
    for d in (results_file.parent.parent, results_file.parent):
        data = _load_json(d / "benchmarks.json") if (d / "benchmarks.json").is_file() else None
        if isinstance(data, dict):
            return data
    return None


def cli_compare(
    old_paths: Sequence[str | Path],
    new_paths: Sequence[str | Path],
    threshold: float = 0.05,
    fail_on_regression: bool = True,
    verbose: bool = False,
) -> int:
    """Print the comparison; 1 when something regressed (and that should fail), 2 on bad input."""
    if not 0 <= threshold < 10:
        print(f"dskbench compare: threshold {threshold} is not a fraction (5% is 0.05)", file=sys.stderr)
        return 2
    try:
        old, new = load_stats(old_paths), load_stats(new_paths)
    except ResultsError as e:
        print(f"dskbench compare: {e}", file=sys.stderr)
        return 2
    if not old or not new:
        side = "old" if not old else "new"
        print(f"dskbench compare: no results in the {side} input", file=sys.stderr)
        return 2
    common = set(old) & set(new)
    if not common:
        machines = sorted({k.machine for k in old}), sorted({k.machine for k in new})
        print(
            "dskbench compare: no case in common (old machines: "
            f"{', '.join(machines[0])}; new: {', '.join(machines[1])})",
            file=sys.stderr,
        )
        return 2
    result = compare(old, new, threshold)
    print(result.format_table(verbose=verbose))
    print(result.summary())
    bad = result.regressions
    if bad:
        print(f"{len(bad)} regression(s)", file=sys.stderr)
        return 1 if fail_on_regression else 0
    return 0
