"""The plan from an on-disk cache, else made by a planner subprocess: the front end's own process (an asv
benchmark process, pytest's) never imports torch or a kernel library to plan."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from dskbench.execution.config import RunConfig
from dskbench.frontends.suite.config import SuiteError
from dskbench.frontends.suite.plan import Plan


def load_plan(config: RunConfig, cache_dir: Path | None = None) -> Plan:
    """The plan from the on-disk cache, else made in a subprocess (this process never imports torch).

    The cache key covers the configuration, every dskbench source file, the registry, the shapes file
    and any DSKBENCH_EXTRA_ADAPTERS module, so an edit to any of them makes a new plan.
    """
    folder = cache_dir or plan_cache_dir()
    path = folder / f"plan-{plan_fingerprint(config)[:20]}.json"
    if path.is_file():
        try:
            return Plan.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError, SuiteError):
            pass  # damaged or stale format: plan again
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # the planner writes here (its stdout is not ours)
    proc = subprocess.run(
        [sys.executable, "-m", "dskbench.frontends.suite", "plan", str(tmp)],
        input=json.dumps(config.to_json()),
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


def plan_fingerprint(config: RunConfig) -> str:
    import dskbench
    from dskbench import paths

    h = hashlib.sha256()
    h.update(json.dumps(config.to_json(), sort_keys=True).encode())
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
def child_pythonpath() -> Iterator[None]:
    """This process's PYTHONPATH as child_env's while the block runs (the sweep's workers inherit it)."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = child_env()["PYTHONPATH"]
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
