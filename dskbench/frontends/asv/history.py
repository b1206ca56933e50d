"""dskbench results as an asv history: one point per value of a version, such as a library's releases.

asv draws a kernel's latency along a repository's commits. Runs of dskbench at two releases of
FlashInfer (scripts/evidence/versions.sh) have no such commits, so this writes, into one folder:

- `repo/`: a git repository with one empty commit per point, oldest first, tagged with the point (asv
  shows tags on its graphs) and dated by the point's first run;
- `results/`: asv's results, one file per point: every ok case of every run at that point, its samples
  pooled across those runs, under the names and params of the asv suite in benchmarks/
  (`bench_kernels.<kernel>.track_latency`, param `'<case_id>|<backend>'`), so a kernel's graph reads
  the same as one `asv run` wrote; `benchmarks.json` and the machine entry beside them;
- `asv.conf.json`, so that `asv publish --config OUT/asv.conf.json` builds the site in `html/`.

A point is named by a key of the runs' `versions` (`flashinfer-python` gives one point per FlashInfer
release); points are ordered by version where every name parses as one, else by their first run.
"""

from __future__ import annotations

import ast
import datetime
import json
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dskbench.frontends.asv.benchmarks import class_name
from dskbench.frontends.asv.machine import machine_name

MARKER = ".dskbench-asv-history"  # names a folder this module wrote (and may write again)
BENCHMARK_VERSION = "dskbench-history-1"


class HistoryError(ValueError):
    """Runs that cannot make a history, or a folder it must not write into (the message says which)."""


@dataclass
class Point:
    """One point of the history: the runs measured at one value of the key."""

    name: str
    runs: list[Any] = field(default_factory=list)

    @property
    def created(self) -> str:
        return min(str(r.environment.get("created", "")) for r in self.runs)


def points(runs: Sequence[Any], key: str) -> list[Point]:
    """The runs grouped by `versions[key]`, oldest version first (by_version)."""
    by: dict[str, Point] = {}
    for run in runs:
        value = (run.environment.get("versions") or {}).get(key)
        if value in (None, ""):
            have = ", ".join(sorted(run.environment.get("versions") or {})) or "none"
            raise HistoryError(f"run {run.run_id} records no version of {key!r} (it records: {have})")
        by.setdefault(str(value), Point(str(value))).runs.append(run)
    if len(by) < 1:
        raise HistoryError("no runs in the files given")
    return by_version(sorted(by.values(), key=lambda p: p.created))


def by_version(pts: list[Point]) -> list[Point]:
    """The points ordered by version where every name parses as one (packaging's rules, which asv's
    install brings); as given (by first run) otherwise."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return pts
    try:
        return sorted(pts, key=lambda p: Version(p.name))
    except InvalidVersion:
        return pts


def latencies(point: Point) -> dict[str, dict[str, list[float]]]:
    """kernel -> param -> samples in seconds, pooled over the point's runs (ok cases; a copy of another
    case's measurement counts once, under its own case)."""
    out: dict[str, dict[str, list[float]]] = {}
    for run in point.runs:
        for r in run.results:
            timing = r.get("timing") or {}
            if r.get("status") != "ok" or not isinstance(timing.get("median_us"), int | float):
                continue
            samples = timing.get("samples_us") or [timing["median_us"]]
            backend = (r.get("backend") or {}).get("name", "")
            param = f"{r.get('case_id')}|{backend}"
            out.setdefault(str(r["kernel"]), {}).setdefault(param, []).extend(s * 1e-6 for s in samples)
    return out


def benchmarks(per_point: Sequence[dict[str, dict[str, list[float]]]]) -> dict[str, dict[str, Any]]:
    """asv's description of each kernel's latency benchmark, its params every case any point measured."""
    params: dict[str, set[str]] = {}
    for lat in per_point:
        for kernel, cases in lat.items():
            params.setdefault(kernel, set()).update(cases)
    out = {}
    taken: set[str] = set()
    for kernel in sorted(params):
        name = f"bench_kernels.{class_name(kernel, taken)}.track_latency"
        out[name] = {
            "name": name,
            "kernel": kernel,
            "code": f"# dskbench results of {kernel}, imported by dskbench asv-history",
            "param_names": ["case"],
            "params": [[repr(p) for p in sorted(params[kernel])]],
            "timeout": 120.0,
            "type": "track",
            "unit": "seconds",
            "version": BENCHMARK_VERSION,
        }
    return out


def machine(runs: Sequence[Any]) -> dict[str, str]:
    """asv's machine fields from the first run's environment."""
    env = runs[0].environment
    dev = env.get("device") or {}
    gpu = dev.get("name") if dev.get("kind") == "cuda" else None
    return {
        "machine": machine_name(gpu, str(env.get("host") or "host")),
        "os": str(env.get("platform") or ""),
        "gpu": str(gpu or "none"),
        "gpu_count": str(dev.get("count", "")),
        "gpu_memory_gb": str(dev.get("memory_total_gb", "")),
        "driver": str(dev.get("driver_version", "")),
        "cuda": str(dev.get("cuda_driver_version", "")),
    }


def _prepare(out: Path) -> None:
    """`out` new or empty, or a history this module wrote (rewritten); anything else is left alone."""
    if out.exists() and not out.is_dir():
        raise HistoryError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise HistoryError(f"{out}: a folder with other files in it; give a new or empty folder")
    import shutil

    for sub in ("repo", "results", "html", "asv.conf.json"):
        target = out / sub
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by dskbench asv-history; it rewrites this folder\n")


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    base = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    try:
        p = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            check=True,
            env={**base, **(env or {})},
        )
    except FileNotFoundError:
        raise HistoryError("git is not installed: asv's history needs a repository") from None
    except subprocess.CalledProcessError as e:
        raise HistoryError(f"git {' '.join(args)}: {e.stderr.strip() or e}") from None
    return p.stdout.strip()


def _tag(name: str) -> str:
    """A git tag for a point's name (git refuses some characters)."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", name).strip(".-") or "point"


def write_history(runs: Sequence[Any], key: str, out: Path) -> list[tuple[Point, str]]:
    """The history folder (see the module's docstring); returns each point with its commit."""
    try:
        from asv import util
        from asv.results import Results
        from asv.runner import BenchmarkResult
    except ImportError:
        raise HistoryError(
            "asv is not installed (pip install asv==0.6.6): its results format is written through it"
        ) from None

    pts = points(runs, key)
    _prepare(out)
    repo, results_dir = out / "repo", out / "results"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    per_point = [latencies(p) for p in pts]
    benches = benchmarks(per_point)
    info = machine(runs)
    mdir = results_dir / info["machine"]
    mdir.mkdir(parents=True)
    util.write_json(str(mdir / "machine.json"), {**info, "version": 1}, api_version=1)
    util.write_json(str(results_dir / "benchmarks.json"), benches, api_version=2)
    made = []
    for point, lat in zip(pts, per_point, strict=True):
        when = point.created or datetime.datetime.now(datetime.timezone.utc).isoformat()
        dated = {"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
        ident = ["-c", "user.name=dskbench", "-c", "user.email=dskbench@localhost"]
        _git(repo, *ident, "commit", "-q", "--allow-empty", "-m", f"{key} {point.name}", env=dated)
        _git(repo, "tag", _tag(point.name))
        commit = _git(repo, "rev-parse", "HEAD")
        stamp = datetime.datetime.fromisoformat(when.replace("Z", "+00:00"))
        versions = point.runs[0].environment.get("versions") or {}
        res = Results(
            {**info, "python": str(versions.get("python", ""))},
            {key: point.name},
            commit,
            util.datetime_to_js_timestamp(stamp),
            str(versions.get("python", "")),
            f"dskbench-{_tag(key)}",
            {},
        )
        for bench in benches.values():
            cases = lat.get(bench["kernel"], {})
            samples = [cases.get(ast.literal_eval(p)) for p in bench["params"][0]]
            result = BenchmarkResult(
                result=[sorted(s)[len(s) // 2] if s else None for s in samples],
                samples=samples,
                number=[1 if s else None for s in samples],
                errcode=0,
                stderr="",
                profile=None,
            )
            res.add_result(bench, result, started_at=stamp, record_samples=True)
        res.save(str(results_dir))
        made.append((point, commit))
    conf = {
        "version": 1,
        "project": f"DeepSeek kernels by {key}",
        "project_url": "#",
        "show_commit_url": "#",
        "repo": "repo",
        "dvcs": "git",
        "branches": ["main"],
        "environment_type": "existing",
        "results_dir": "results",
        "html_dir": "html",
    }
    (out / "asv.conf.json").write_text(json.dumps(conf, indent=1) + "\n")
    return made
