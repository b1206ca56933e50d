"""What the asv and pytest-benchmark front ends share: which cases to run, and their measurements as
plain dicts.

Neither front end times anything. Both ask this module for a plan (kernel -> work items, computed
once and cached on disk so that asv's many short-lived processes never import torch or a kernel
library), then for a kernel's measurements: ``run_sweep`` in an isolated worker (a crashing kernel
costs one case), results to a JSON-lines file (a copy is kept), read back and flattened.

A case is addressed by its key ``"<case_id>|<backend>"`` (asv expands ``params`` as a Cartesian
product; the valid (case, backend) pairs are sparse, so they are flattened into one string param).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Bump when what a sample means changes: asv then drops older results of the benchmark
# (their `version` differs) instead of drawing a false step in the graphs.
SUITE_VERSION = "1"
SWEEPS = ("decode", "prefill", "decode_graph")
MODES = ("cold", "hot", "rotate")
DEVICES = ("cuda", "cpu")
KEY_SEP = "|"

# The asv suite reads its selection from these (asv has no way to pass options to a benchmark).
ASV_ENV = {
    "device": "DSKBENCH_DEVICE",  # cuda | cpu | auto (default auto: cuda when NVML sees a GPU)
    "kernels": "DSKBENCH_ASV_KERNELS",  # comma-separated kernel names or aliases (default: all)
    "backends": "DSKBENCH_ASV_BACKENDS",  # comma-separated backend names (default: the runner's)
    "sweep": "DSKBENCH_ASV_SWEEP",  # decode, prefill, decode_graph or all (default decode,prefill)
    "quick": "DSKBENCH_ASV_QUICK",  # 1: the quick sweep points and time budget
    "tp": "DSKBENCH_ASV_TP",  # comma-separated tensor-parallel degrees (default 1)
    "mode": "DSKBENCH_ASV_MODE",  # cold | hot | rotate (default cold)
    "budget": "DSKBENCH_ASV_BUDGET",  # time budget per case, seconds
}


class SuiteError(RuntimeError):
    """A selection that cannot be planned, or a plan that cannot be made (the message says why)."""


# -- selection -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which cases a front end runs, and how (the knobs of `dskbench run`)."""

    device: str = "cuda"
    kernels: tuple[str, ...] = ()  # empty: every kernel
    backends: tuple[str, ...] = ()  # empty: the runner's default (all but torch-ref; torch-ref on CPU)
    phases: tuple[str, ...] = ("decode", "prefill")
    quick: bool = False
    tp: tuple[int, ...] = (1,)
    mode: str = "cold"
    budget_s: float | None = None
    # Plan every backend of each kernel even where it cannot run (pytest: a CPU run lists the GPU
    # backends as skipped tests with the reason, so nothing disappears silently).
    all_backends: bool = False

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise SuiteError(f"device {self.device!r}: choose from {', '.join(DEVICES)} or auto")
        bad = [p for p in self.phases if p not in SWEEPS]
        if bad or not self.phases:
            raise SuiteError(f"sweep {','.join(bad) or '(none)'}: choose from {', '.join(SWEEPS)} or all")
        if self.mode not in MODES:
            raise SuiteError(f"mode {self.mode!r}: choose from {', '.join(MODES)}")

    @classmethod
    def parse(
        cls,
        *,
        device: str | None = None,
        kernels: str | list[str] | None = None,
        backends: str | list[str] | None = None,
        sweep: str | list[str] | None = None,
        quick: str | bool | None = None,
        tp: str | list[int] | None = None,
        mode: str | None = None,
        budget: str | float | None = None,
        all_backends: bool = False,
    ) -> Selection:
        """A selection from strings as environment variables or command lines give them."""
        dev = (device or "auto").strip().lower()
        if dev == "auto":
            dev = detect_device()
        phases = _words(sweep) or ["decode", "prefill"]
        if "all" in phases:
            phases = list(SWEEPS)
        try:
            tps = tuple(int(x) for x in _words(tp)) or (1,)
        except ValueError:
            raise SuiteError(f"tp {tp!r}: expected comma-separated integers") from None
        try:
            budget_s = float(budget) if budget not in (None, "") else None
        except ValueError:
            raise SuiteError(f"budget {budget!r}: expected seconds") from None
        if budget_s is None and dev == "cpu":
            budget_s = 0.2  # as `dskbench run` on a CPU: the sweep ends in minutes
        return cls(
            device=dev,
            kernels=tuple(_words(kernels)),
            backends=tuple(_words(backends)),
            phases=tuple(dict.fromkeys(phases)),
            quick=_truthy(quick),
            tp=tps,
            mode=(mode or "cold").strip(),
            budget_s=budget_s,
            all_backends=all_backends,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Selection:
        env = os.environ if environ is None else environ
        return cls.parse(**{k: env.get(v) for k, v in ASV_ENV.items()})

    @property
    def profile(self) -> str:
        return "cpu" if self.device == "cpu" else ("quick" if self.quick else "full")

    def label(self) -> str:
        """How a reader should take the numbers (CPU runs time the torch reference, not a GPU kernel)."""
        if self.device == "cpu":
            return "CPU: torch reference timed on the host (plumbing check, not GPU kernel timings)"
        return f"GPU: {self.profile} sweep, {self.mode} L2"

    def options(self):
        from dskbench.execution.runner import SweepOptions

        return SweepOptions(
            device=self.device,
            phases=self.phases,
            profile=self.profile,
            tp=self.tp,
            mode=self.mode,
            isolate=True,
            budget_s=self.budget_s,
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Selection:
        d = dict(d)
        for k in ("kernels", "backends", "phases", "tp"):
            d[k] = tuple(d[k])
        return cls(**d)


def _words(x: str | list | tuple | None) -> list[str]:
    if x is None:
        return []
    items = x.split(",") if isinstance(x, str) else [str(i) for i in x]
    return [s.strip() for s in items if s.strip()]


def _truthy(x: str | bool | None) -> bool:
    if isinstance(x, bool):
        return x
    return (x or "").strip().lower() in ("1", "true", "yes", "on")


def detect_device() -> str:
    """cuda when NVML sees a GPU, else cpu. NVML, not torch: asv processes must stay import-light."""
    from dskbench.frontends.asv_machine import read_gpus

    try:
        return "cuda" if read_gpus() else "cpu"
    except Exception:  # no NVML library, no driver
        return "cpu"


# -- the plan --------------------------------------------------------------------------------------------


@dataclass
class Plan:
    """kernel -> its work items (the runner's WorkItem fields but the index), in a stable order."""

    selection: Selection
    kernels: dict[str, list[dict[str, Any]]]
    skipped: list[dict[str, Any]]  # kernels the runner skipped at planning, with the reason

    def keys(self, kernel: str) -> list[str]:
        return [item_key(it) for it in self.kernels[kernel]]

    def items(self, kernel: str, keys: set[str] | None = None) -> list[dict[str, Any]]:
        return [it for it in self.kernels[kernel] if keys is None or item_key(it) in keys]

    def kernel_of(self) -> dict[str, str]:
        return {item_key(it): k for k, its in self.kernels.items() for it in its}

    def to_json(self) -> dict[str, Any]:
        return {"selection": self.selection.to_json(), "kernels": self.kernels, "skipped": self.skipped}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Plan:
        return cls(Selection.from_json(d["selection"]), d["kernels"], d["skipped"])


def case_key(case_id: str, backend: str) -> str:
    return f"{case_id}{KEY_SEP}{backend}"


def item_key(item: dict[str, Any]) -> str:
    from dskbench.shapes.cases import Case

    return case_key(Case.from_json(item["case"]).id, item["backend"])


def make_plan(sel: Selection) -> Plan:
    """Plan in this process: imports the registry and the adapters (and so torch)."""
    from dskbench import paths
    from dskbench.adapters import get_adapter
    from dskbench.execution.runner import PlanError, plan_sweep, select_kernels
    from dskbench.registry.load import load_registry
    from dskbench.shapes.cases import default_shapes

    registry = load_registry(paths.REGISTRY_DIR)
    shapes = default_shapes()
    opts = sel.options()
    try:
        names = select_kernels(registry, list(sel.kernels) or None)
        if sel.all_backends and not sel.backends:
            items, skips = [], []
            for name in names:
                adapter = get_adapter(name)
                wanted = [b.name for b in adapter.all_backends()] if adapter else None
                more, more_skips = plan_sweep(registry, shapes, [name], wanted, opts)
                items += more
                skips += more_skips
        else:
            items, skips = plan_sweep(registry, shapes, names, list(sel.backends) or None, opts)
    except PlanError as e:
        raise SuiteError(str(e)) from None
    kernels: dict[str, list[dict[str, Any]]] = {}
    seen: set[str] = set()
    for it in items:
        d = {k: v for k, v in dataclasses.asdict(it).items() if k != "index"}  # every WorkItem field
        key = item_key(d)
        if key not in seen:  # asv params must be unique
            seen.add(key)
            kernels.setdefault(it.kernel, []).append(d)
    return Plan(sel, dict(sorted(kernels.items())), skips)


def load_plan(sel: Selection, cache_dir: Path | None = None) -> Plan:
    """The plan from the on-disk cache, else made in a subprocess (this process never imports torch).

    The cache key covers the selection, every dskbench source file, the registry, the shapes file and
    any DSKBENCH_EXTRA_ADAPTERS module, so an edit to any of them makes a new plan.
    """
    folder = cache_dir or plan_cache_dir()
    path = folder / f"plan-{plan_fingerprint(sel)[:20]}.json"
    if path.is_file():
        try:
            return Plan.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError, SuiteError):
            pass  # damaged or stale format: plan again
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # the planner writes here (its stdout is not ours)
    proc = subprocess.run(
        [sys.executable, "-m", "dskbench.frontends.suite", "plan", str(tmp)],
        input=json.dumps(sel.to_json()),
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=600,
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SuiteError(f"planning failed (exit {proc.returncode}):\n{proc.stderr.strip()[-3000:]}")
    data = json.loads(tmp.read_text())
    os.replace(tmp, path)
    return Plan.from_json(data)


def plan_cache_dir() -> Path:
    if os.environ.get("DSKBENCH_CACHE_DIR"):
        return Path(os.environ["DSKBENCH_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dskbench" / "plans"


def plan_fingerprint(sel: Selection) -> str:
    import dskbench
    from dskbench import paths

    h = hashlib.sha256()
    h.update(json.dumps(sel.to_json(), sort_keys=True).encode())
    h.update(sys.executable.encode())
    pkg = Path(dskbench.__file__).resolve().parent
    files = sorted(pkg.rglob("*.py"))
    if paths.REGISTRY_DIR.is_dir():
        files += sorted(p for p in paths.REGISTRY_DIR.rglob("*") if p.is_file())
    files.append(paths.SHAPES_FILE)
    extra = os.environ.get("DSKBENCH_EXTRA_ADAPTERS", "")
    h.update(extra.encode())
    for mod in (m.strip() for m in extra.split(",") if m.strip()):
        spec = importlib.util.find_spec(mod)
        if spec and spec.origin and os.path.isfile(spec.origin):
            files.append(Path(spec.origin))
    for f in files:
        h.update(str(f).encode())
        h.update(f.read_bytes() if f.is_file() else b"<missing>")
    return h.hexdigest()


def child_env() -> dict[str, str]:
    """os.environ with the directory this dskbench was imported from first on PYTHONPATH, so that
    subprocesses (planner, sweep workers) import the same dskbench even where it is not installed."""
    import dskbench

    root = str(Path(dskbench.__file__).resolve().parent.parent)
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        parts.insert(0, root)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


@contextlib.contextmanager
def _child_pythonpath() -> Iterator[None]:
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = child_env()["PYTHONPATH"]
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


# -- measuring -------------------------------------------------------------------------------------------


def measure_kernel(
    kernel: str,
    items: list[dict[str, Any]],
    sel: Selection,
    keep_dir: Path | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Measure `items` (one kernel's cases) through the runner in one isolated worker; plain dict out.

    Returns ``{"kernel", "jsonl", "summary", "environment", "cases": {key: case}}`` where each case is
    ``{"status", "reason", "samples_s", "median_s", "gbps", "tflops", "bytes", "flops", ...}`` (see
    `case_result`). The run's JSON lines are copied to `keep_dir` when given: they hold the reasons of
    every skipped, wrong or failed case, which the front ends can only show as n/a or a skip.
    """
    from dskbench.execution.runner import WorkItem, run_sweep
    from dskbench.results.io import read_runs

    work = [WorkItem(index=i, **it) for i, it in enumerate(items)]
    with tempfile.TemporaryDirectory(prefix="dskbench-suite-") as tmp, _child_pythonpath():
        out = Path(tmp) / "results.jsonl"
        summary = run_sweep(work, [], sel.options(), out, progress=progress)
        kept = None
        if keep_dir is not None:
            keep_dir.mkdir(parents=True, exist_ok=True)
            kept = keep_dir / f"{_stamp()}-{_slug(kernel)}.jsonl"
            shutil.copyfile(out, kept)
        runs = read_runs([out])
    env = runs[-1].environment if runs else {}
    cases: dict[str, dict[str, Any]] = {}
    for run in runs:
        for rec in run.results:
            cases[case_key(rec.get("case_id", rec["kernel"]), rec["backend"]["name"])] = case_result(rec)
    return {
        "kernel": kernel,
        "jsonl": str(kept) if kept else None,
        "summary": summary.line(),
        "environment": {k: env.get(k) for k in ("run_id", "host", "device", "versions", "git")},
        "selection": sel.to_json(),
        "cases": cases,
    }


def case_result(rec: dict[str, Any]) -> dict[str, Any]:
    """One result record as the front ends need it: samples in seconds, bandwidth, FLOPs, why not ok."""
    from dskbench.results.records import part_of, rate

    timing = dict(rec.get("timing") or {})
    traffic, clocks = part_of(rec, "traffic"), part_of(rec, "clocks")
    samples_us = timing.pop("samples_us", None) or []
    median_us = timing.get("median_us")
    if not samples_us and median_us is not None:
        samples_us = [median_us]
    median_s = median_us * 1e-6 if median_us else None
    for k in ("clocks_before", "clocks_after", "clocks_during"):
        timing.pop(k, None)
    return {
        "status": rec["status"],
        "reason": rec.get("reason"),
        "backend": rec.get("backend", {}),
        "samples_s": [x * 1e-6 for x in samples_us],
        "median_s": median_s,
        "gbps": rate(rec, "gbps"),
        "tflops": rate(rec, "tflops"),
        "bytes": traffic.bytes if traffic else None,
        "flops": traffic.flops if traffic else None,
        "metrics": rec.get("metrics") or {},
        "timing": timing,
        "check": rec.get("check"),
        "throttled": clocks.throttled if clocks else None,
    }


def setup_cache_timeout(n_items: int, sel: Selection) -> float:
    """asv's limit on one kernel's setup_cache: generous, since first calls JIT-compile (20 s seen)."""
    per = 5.0 if sel.device == "cpu" else (15.0 if sel.quick else 40.0)
    if sel.budget_s is not None:
        per = max(per, 3 * sel.budget_s + 5)
    return 180.0 + per * n_items


def asv_jsonl_dir(checkout: Path) -> Path:
    """Where the asv suite keeps each setup_cache's JSON lines: <root>/results/asv-jsonl/<host>/, next
    to asv's results/asv. <root> is ASV_CONF_DIR (the folder asv ran from; asv sets it for managed
    environments only), else `checkout`, the folder holding benchmarks/; DSKBENCH_ASV_JSONL_DIR wins."""
    if os.environ.get("DSKBENCH_ASV_JSONL_DIR"):
        return Path(os.environ["DSKBENCH_ASV_JSONL_DIR"])
    root = Path(os.environ.get("ASV_CONF_DIR") or checkout)
    return root / "results" / "asv-jsonl" / _slug(socket.gethostname())


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"


def _slug(s: str) -> str:
    out = "".join(c if c.isalnum() or c in "._-" else "_" for c in s)
    return out.strip("._") or "x"


# -- pytest-benchmark ------------------------------------------------------------------------------------


class ReplayClock:
    """A pytest-benchmark timer that reports pre-measured GPU samples instead of host time.

    pytest-benchmark times a round as ``start = timer(); target(); end = timer()`` and stores
    ``end - start`` (fixture.py `_make_runner`; `benchmark.pedantic` with iterations=1 does exactly
    this once per round). With this clock as the timer and `step` as the target, the clock reads 0.0
    at the start of a round and the next sample at its end, so round i stores sample i exactly; every
    pytest-benchmark statistic, `--benchmark-compare(-fail)` included, is then computed from the
    measurement core's samples. Use through `replay`.
    """

    def __init__(self) -> None:
        self.__name__ = "dskbench_gpu_replay_clock"  # what pytest-benchmark prints as the timer
        self._samples: list[float] = []
        self._next = 0
        self._pending: float | None = None

    def load(self, samples_s: list[float]) -> None:
        self._samples, self._next, self._pending = [float(s) for s in samples_s], 0, None

    def step(self) -> None:
        if self._next >= len(self._samples):
            raise RuntimeError("ReplayClock: more rounds than samples")
        self._pending = self._samples[self._next]
        self._next += 1

    def __call__(self) -> float:
        value, self._pending = self._pending, None
        return 0.0 if value is None else value


REPLAY_CLOCK = ReplayClock()


def replay(benchmark: Any, samples_s: list[float], clock: ReplayClock = REPLAY_CLOCK) -> None:
    """Feed `samples_s` into pytest-benchmark's statistics, one round per sample.

    The test must carry ``@pytest.mark.benchmark(timer=clock)`` (the fixture takes its timer from the
    marker when it is created).
    """
    if not samples_s:
        raise ValueError("no samples to replay")
    timer = getattr(benchmark, "_timer", clock)
    if timer is not clock:
        raise RuntimeError("the test needs @pytest.mark.benchmark(timer=REPLAY_CLOCK)")
    clock.load(samples_s)
    benchmark.pedantic(clock.step, rounds=len(samples_s), warmup_rounds=0, iterations=1)


# -- command line (the planner subprocess) ---------------------------------------------------------------


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "plan":
        sel = Selection.from_json(json.loads(sys.stdin.read()))
        try:
            plan = make_plan(sel)
        except SuiteError as e:
            print(f"dskbench.frontends.suite: {e}", file=sys.stderr)
            return 2
        Path(argv[1]).write_text(json.dumps(plan.to_json()))
        return 0
    print("usage: python -m dskbench.frontends.suite plan OUT.json < selection.json", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
