"""What `dskbench compare` reads: our results files and asv results, as runs of cases.

Cases match by (machine, case, backend): for our results the machine is ``device.name`` (two GPU models
are never compared with each other), the case ``case_id`` and the backend its name; for asv the machine
is the asv machine, and the case and backend come from the suite's ``case_id|backend`` parameter (other
asv suites: the benchmark name with its parameters, and the ``backend`` parameter or the environment).

A side is every run in the files and folders named for it. Runs of one case at the same commit are
repeats: the side's value is their run-level median, and their spread is that case's own noise. Runs of
older commits in the same side give way to the latest commit's. A record copied from another op's (or
another kernel's) measurement (``shared_with``, and asv rows with identical samples or derived from the
same case's latency) is a twin: shown, never counted as a second change.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import product
from pathlib import Path
from typing import Any

from dskbench.analysis.verdict import Stat
from dskbench.measure.batch_spans import early_starts
from dskbench.results.access import part_of
from dskbench.results.io import ResultsError, Run, is_results_file, read_runs
from dskbench.results.records import Timing

LATENCY_METRICS = ("track_latency",)


@dataclass(frozen=True, order=True)
class Key:
    machine: str
    kernel: str
    case: str
    backend: str


@dataclass(frozen=True)
class Settings:
    """Sweep settings that change what a timing means; '' when the run did not record them."""

    mode: str = ""
    flush: str = ""
    seeds: str = ""
    # "batched" (cold cases sampled together, read from CUPTI) or "per-case" (event timer): the two
    # differ by a few tenths of a microsecond on some kernels, so a comparison across them says so
    timer: str = ""

    def describe(self) -> str:
        parts = [f"mode {self.mode or 'unrecorded'}", f"flush {self.flush or 'unrecorded'}"]
        timer = f", timer {self.timer}" if self.timer else ""
        return ", ".join(parts) + f", inputs {self.seeds or 'unrecorded'}" + timer


@dataclass(frozen=True)
class Obs:
    """One run's result for one case."""

    key: Key
    stat: Stat
    run: str  # run id (ours) or results file (asv)
    created: str  # ISO-8601 UTC
    settings: Settings
    twin_of: Key | None = None


@dataclass(frozen=True)
class RunInfo:
    run: str
    machine: str
    commit: str
    created: str
    settings: Settings
    source: str
    gpu: str = ""  # the GPU model (for asv: its machine's "gpu" parameter when recorded)


@dataclass
class Side:
    """Every run read for one side of a comparison (or for --history)."""

    obs: dict[Key, list[Obs]] = field(default_factory=lambda: defaultdict(list))
    runs: dict[str, RunInfo] = field(default_factory=dict)

    def add(self, o: Obs, info: RunInfo) -> None:
        self.obs[o.key].append(o)
        self.runs.setdefault(info.run, info)

    def __bool__(self) -> bool:
        return bool(self.obs)

    def chosen(self, key: Key) -> list[Obs]:
        """The runs that make this side's value: those of the latest commit that measured the case."""
        rows = sorted(self.obs[key], key=lambda o: o.created)
        commit = rows[-1].stat.commit
        return [o for o in rows if o.stat.commit == commit]

    def stats(self) -> dict[Key, Stat]:
        return {k: aggregate([o.stat for o in self.chosen(k)]) for k in self.obs}

    def timers(self, key: Key) -> set[str]:
        """The timers of the runs that make this side's value ('' where unrecorded or not a GPU cold run)."""
        return {o.settings.timer for o in self.chosen(key)}

    def kernel_stat(self, key: Key) -> Stat:
        """This side's Stat in kernel times: each run's launch gap left subtracted rather than added back.
        What a raw time holds besides the kernel differs between the timers (graph-node boundaries in the
        event timer's, none in a CUPTI span) and each timer's gap is calibrated for its own, so sides of
        two timers meet on their kernel times."""
        return aggregate_kernel_times([o.stat for o in self.chosen(key)])

    def twins(self) -> dict[Key, Key]:
        out = {}
        for k in self.obs:
            primary = next((o.twin_of for o in self.chosen(k) if o.twin_of is not None), None)
            if primary is not None and primary != k and primary in self.obs:
                out[k] = primary
        return out

    def history(self, key: Key, exclude_runs: Iterable[str] = ()) -> list[Stat]:
        """Every run of the case, oldest first (for --history), leaving out the named runs."""
        skip = set(exclude_runs)
        return [o.stat for o in sorted(self.obs.get(key, ()), key=lambda o: o.created) if o.run not in skip]

    def machines(self) -> list[str]:
        return sorted({k.machine for k in self.obs})

    def runs_on(self, machine: str) -> list[RunInfo]:
        return sorted((r for r in self.runs.values() if r.machine == machine), key=lambda r: r.created)


def aggregate_kernel_times(stats: Sequence[Stat]) -> Stat:
    """aggregate() in kernel times: each run's launch gap left subtracted rather than added back (how
    sides of two different timers meet)."""
    return aggregate([replace(s, gap_us=0.0) for s in stats])


def aggregate(stats: Sequence[Stat]) -> Stat:
    """One side's Stat from its runs of one case: run-level medians; samples pooled for the rank test."""
    if len(stats) == 1:
        return stats[0]
    ok = [s for s in stats if s.status == "ok" and s.value is not None]
    if not ok:
        return stats[-1]
    gap = statistics.median(s.gap_us for s in ok)

    def med(attr: str) -> float | None:
        vals = [getattr(s, attr) + s.gap_us for s in ok if getattr(s, attr) is not None]
        return statistics.median(vals) - gap if vals else None

    runs = tuple(
        (float(s.value) + s.gap_us, None if s.p10 is None else s.p10 + s.gap_us)  # type: ignore[arg-type]
        for s in ok
    )
    samples = tuple(x + s.gap_us - gap for s in ok for x in s.samples)
    failed = [s for s in stats if s.status != "ok"]
    reason = f"{len(failed)} of {len(stats)} runs {failed[-1].status}: {failed[-1].reason}" if failed else ""
    return replace(
        ok[-1],
        value=med("value"),
        lo=med("lo"),
        hi=med("hi"),
        p10=med("p10") if all(s.p10 is not None for s in ok) else None,
        p90=med("p90") if all(s.p90 is not None for s in ok) else None,
        samples=samples,
        gap_us=gap,
        throttled=any(s.throttled for s in ok),
        runs=runs,
        reason=reason[:200],
        disagree=next((s.disagree for s in reversed(ok) if s.disagree), ""),
        early=sum(s.early for s in ok),
    )


# -- our results -----------------------------------------------------------------------------------------


def device_name(env: Mapping[str, Any]) -> str:
    dev = env.get("device") or {}
    return str(dev.get("name") or dev.get("kind") or "unknown")


def settings_of(env: Mapping[str, Any]) -> Settings:
    s = env.get("settings") or {}
    if "seed" in s:
        seeds = "fresh each run" if s["seed"] is None else f"seed {s['seed']}"
    else:
        seeds = ""
    timer = ""
    if s.get("device") == "cuda" and (s.get("mode") or "cold") == "cold":
        timer = "batched" if s.get("batch") else "per-case"  # files before batching: per-case
    return Settings(str(s.get("mode") or ""), str(s.get("flush") or ""), seeds, timer)


def stat_from_record(rec: Mapping[str, Any], commit: str = "") -> Stat:
    """The record as a comparison's side. Only an ok record has numbers: an unstable one's timing is
    impossible (dskbench.measure.validity), so it is a status with its reason, like wrong or error."""
    timed = part_of(rec, "timing") if rec["status"] == "ok" else None
    t = timed or Timing(median_us=None)  # not timed, or not validly: every figure unknown
    clocks = part_of(rec, "clocks")
    gap = t.launch_gap_us if t.raw_median_us is not None else None
    cc = t.cross_check
    return Stat(
        disagree=(cc.note or "timers disagree") if cc is not None and cc.flagged else "",
        status=rec["status"],
        value=t.median_us,
        lo=t.p10_us,
        hi=t.p90_us,
        spread="p10-p90",
        samples=tuple(t.samples_us or ()),
        reason=str(rec.get("reason") or ""),
        throttled=bool(clocks and clocks.throttled),
        commit=commit,
        p10=t.p10_us,
        p90=t.p90_us,
        gap_us=float(gap) if isinstance(gap, int | float) and math.isfinite(gap) else 0.0,
        early=early_starts(t.notes or ()),
    )


def add_runs(side: Side, runs: Iterable[Run], source: str = "") -> None:
    for run in runs:
        env = run.environment
        machine = device_name(env)
        commit = str((env.get("git") or {}).get("commit") or "")
        created = str(env.get("created", ""))
        info = RunInfo(run.run_id, machine, commit, created, settings_of(env), source, machine)
        # a copy may come from another kernel's case (dskbench.execution.twins): the measured record says which
        kernel_of = {r.get("case_id"): r["kernel"] for r in run.results}
        for rec in run.results:
            key = Key(machine, rec["kernel"], rec.get("case_id") or rec["kernel"], rec["backend"]["name"])
            twin = rec.get("shared_with")
            twin_of = Key(machine, kernel_of.get(twin, key.kernel), str(twin), key.backend) if twin else None
            side.add(
                Obs(key, stat_from_record(rec, commit), run.run_id, created, info.settings, twin_of), info
            )


def stats_from_runs(runs: Iterable[Run]) -> dict[Key, Stat]:
    """(device, case, backend) -> that side's Stat (run-level medians over the latest commit's runs)."""
    side = Side()
    add_runs(side, runs)
    return side.stats()


# -- asv results -------------------------------------------------------------------------------------------


def is_asv_results(data: Any) -> bool:
    return isinstance(data, dict) and "result_columns" in data and "results" in data


def add_asv(side: Side, path: Path, data: dict[str, Any], meta: Mapping[str, Any] | None = None) -> None:
    """One asv results file (api_version 2) as one run; times become microseconds.

    ``meta`` is asv's benchmarks.json (units and parameter names); without it times are recognised by
    the ``time_``/``track_latency`` name and parameters are shown by position.
    """
    cols = data["result_columns"]
    if "result" not in cols or "params" not in cols:
        raise ResultsError(f"{path}: asv results without result/params columns")
    machine = str((data.get("params") or {}).get("machine") or path.parent.name)
    env_name = str(data.get("env_name") or "")
    commit = str(data.get("commit_hash") or "")
    created = _asv_date(data.get("date"))
    run_id = str(path)
    rows: list[tuple[Key, Stat, str, str]] = []  # key, stat, metric, case id
    mode = ""
    for name, row in (data.get("results") or {}).items():
        if not isinstance(row, list) or len(row) > len(cols):
            raise ResultsError(f"{path}: malformed asv result row for {name}")
        col = dict(zip(cols, row + [None] * (len(cols) - len(row)), strict=True))
        m = re.fullmatch(r"dskbench-.*-(cold|hot|rotate)", str(col.get("version") or ""))
        mode = mode or (m.group(1) if m else "")
        params = col["params"] or []
        combos = list(product(*params)) if params else [()]
        info = (meta or {}).get(name) or {}
        names = list(info.get("param_names") or [f"p{i}" for i in range(len(params))])
        metric = name.rsplit(".", 1)[-1]
        is_time = metric.startswith("time_") or metric in LATENCY_METRICS
        unit = str(info.get("unit") or ("seconds" if is_time else "unit"))
        parts = name.split(".")
        kernel = parts[-2] if len(parts) >= 2 else parts[0]
        for i, combo in enumerate(combos):
            values = {n: _unrepr(v) for n, v in zip(names, combo, strict=False)}
            suite_case = values.get("case", "")
            if len(values) == 1 and "|" in suite_case:  # dskbench's suite: "case_id|backend"
                case_id, _, backend = suite_case.rpartition("|")
                case = case_id if metric in LATENCY_METRICS else f"{case_id} [{metric}]"
            else:
                backend = values.pop("backend", None) or env_name or "asv"
                case_id = ""
                case = name + (f"({', '.join(f'{k}={v}' for k, v in values.items())})" if values else "")
            stat = _asv_stat(
                _at(col["result"], i),
                (_at(col.get("stats_q_25"), i), _at(col.get("stats_q_75"), i)),
                (_at(col.get("stats_ci_99_a"), i), _at(col.get("stats_ci_99_b"), i)),
                _at(col.get("samples"), i) or (),
                unit,
                commit,
            )
            rows.append((Key(machine, kernel, case, backend), stat, metric, case_id))
    settings = Settings(mode, "", "")
    gpu = str((data.get("params") or {}).get("gpu") or machine)
    info_run = RunInfo(run_id, machine, commit, created, settings, str(path), gpu)
    for key, twin_of, stat in _asv_twins(rows):
        side.add(Obs(key, stat, run_id, created, settings, twin_of), info_run)


def _asv_twins(rows: list[tuple[Key, Stat, str, str]]) -> list[tuple[Key, Key | None, Stat]]:
    """Each row with the row it repeats: the latency row of the same case for a derived metric (GB/s
    from the same samples), or the first row of the kernel and metric with the very same numbers (a
    case dskbench measured once for several ops: median, quartiles and samples identical to the bit)."""
    keys = {r[0] for r in rows}
    first: dict[tuple, Key] = {}
    out = []
    for key, stat, metric, case_id in rows:
        twin = None
        if case_id and metric not in LATENCY_METRICS:
            cand = Key(key.machine, key.kernel, case_id, key.backend)
            twin = cand if cand in keys else None
        elif stat.status == "ok" and stat.lo is not None:
            ident = (key.kernel, key.backend, metric, stat.value, stat.lo, stat.hi, stat.samples)
            twin = first.setdefault(ident, key)
            twin = None if twin == key else twin
        out.append((key, twin, stat))
    return out


def _asv_date(ms: Any) -> str:
    if isinstance(ms, int | float):
        return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat(timespec="seconds")
    return ""


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
    xs = sorted(float(x) * scale for x in (samples or ()) if x is not None)
    p10 = _quantile(xs, 0.1) if len(xs) >= 2 else None
    p90 = _quantile(xs, 0.9) if len(xs) >= 2 else None
    return Stat(
        value=value * scale,
        lo=lo,
        hi=hi,
        spread=spread,
        samples=tuple(xs),
        unit=shown,
        higher_is_better=shown.endswith("/s"),
        commit=commit,
        p10=p10,
        p90=p90,
    )


def _quantile(s: Sequence[float], q: float) -> float:
    h = (len(s) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (h - lo)


# -- loading either format -------------------------------------------------------------------------------


def load_side(specs: Iterable[str | Path], every_commit: bool = False) -> Side:
    """Results named by files or folders (ours: JSON lines; asv: results JSON), as one side.

    A folder is searched recursively. asv folders usually hold many commits: select one with
    ``FOLDER@COMMIT`` (a prefix of the hash); a folder of several commits without one fails, unless
    `every_commit` (history: every commit is an earlier run).
    """
    side = Side()
    for spec in specs:
        path, rev = _split_rev(str(spec))
        if not path.exists():
            raise ResultsError(f"{path}: no such file or folder")
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        ours: list[Path] = []
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
        if len(commits) > 1 and not every_commit:
            short = ", ".join(sorted(c[:8] for c in commits))
            raise ResultsError(
                f"{spec}: asv results of several commits ({short}); pick one with {path}@COMMIT"
            )
        if rev and not chosen:
            raise ResultsError(f"{spec}: no asv results for commit {rev}")
        for f in ours:
            add_runs(side, read_runs([f]), str(f))
        for f, data in chosen:
            add_asv(side, f, data, _asv_meta(f))
    return side


def load_stats(specs: Iterable[str | Path]) -> dict[Key, Stat]:
    """One side's Stats from files or folders (see load_side)."""
    return load_side(specs).stats()


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
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def _asv_meta(results_file: Path) -> dict[str, Any] | None:
    """benchmarks.json of an asv results tree: results/benchmarks.json next to results/<machine>/."""
    for d in (results_file.parent.parent, results_file.parent):
        data = _load_json(d / "benchmarks.json") if (d / "benchmarks.json").is_file() else None
        if isinstance(data, dict):
            return data
    return None
