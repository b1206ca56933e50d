"""Helpers of the main command (scripts/run.sh): the expected time printed before the sweep, and the
wall time of each stage at the end.

    python -m dskbench run --dry-run --quick ... | python -m dskbench.setup.mainjob eta
    python -m dskbench.setup.mainjob times --status N [--out FILE] setup=S measure=S report=S

The estimate: with a sharded plan (`--gpus`), the longest shard of the cost model that cuts the shards
(dskbench/execution/cost.py); otherwise each case costs that model's fixed per-case overhead plus the
quick sweep's typical sampling. It is a model, not a measurement: a case's input set-up beyond that
overhead comes on top, and on a fresh box the longest JIT build (they run beside the measuring) can
take longer than the measuring: there `eta` adds a line naming the longest build the run keeps.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The main job's stages, in order, with their names in the summary line.
STAGES = {"setup": "set-up", "measure": "measuring", "report": "report"}


def per_case_s() -> float:
    """The simple per-case estimate: the cost model's overhead plus the quick sweep's sampling (its budget
    or the typical sampling time, the smaller)."""
    from dskbench.execution.cost import CASE_OVERHEAD_S, TYPICAL_SAMPLING_S
    from dskbench.measure.settings import MeasureSettings

    return CASE_OVERHEAD_S + min(MeasureSettings.quick().max_time_s, TYPICAL_SAMPLING_S)


def estimate(dry_run: str, case_s: float) -> str | None:
    """One line with the expected sweep time, from `dskbench run --dry-run`'s output; None when it
    has no plan line."""
    m = re.search(r"^(\d+) cases to run", dry_run, re.M)
    if not m:
        return None
    cases = int(m.group(1))
    shards = [
        float(s) for s in re.findall(r"^GPU \d+: \d+ cases, ~(\d+(?:\.\d+)?) s estimated", dry_run, re.M)
    ]
    if shards:
        secs, how = max(shards), f"the longest of {len(shards)} GPU shards by the cost model"
    else:
        secs, how = cases * case_s, f"{case_s:.2g} s per case by the cost model"
    return (
        f"expected: about {_minutes(secs)} to measure {cases} cases ({how}; "
        "on a fresh box the longest JIT build may take longer)"
    )


def fresh_box_note(dry_run: str, defer_s: float | None, build_s: dict[tuple[str, str], float]) -> str:
    """For a box whose JIT caches are empty: its builds, beside the measuring, set the first run's length,
    so name the longest the plan keeps (recorded build seconds; those at `defer_s` or more are deferred)."""
    from dskbench.execution.build_times import deferred_by

    pairs = set(re.findall(r"^([^/\s]+)/\S*\s+(\S+)$", dry_run, re.M))
    kept = {p: s for p, s in build_s.items() if p in pairs and not deferred_by(s, defer_s)}
    if not kept:
        return "this box's JIT caches are empty: its builds run beside the measuring"
    (kernel, backend), secs = max(kept.items(), key=lambda kv: kv[1])
    return (
        f"this box's JIT caches are empty: its builds, beside the measuring, set the length; the longest, "
        f"{kernel} · {backend}, took {_minutes(secs)} where recorded"
    )


def _minutes(secs: float) -> str:
    return f"{secs:.0f} s" if secs < 90 else f"{secs / 60:.0f} min"


def stage_times(pairs: Sequence[str]) -> dict[str, int]:
    """Whole seconds per stage from `stage=S` arguments; a stage not given (not run) counts 0."""
    got: dict[str, int] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in STAGES or not value.isdigit():
            raise ValueError(f"expected STAGE=SECONDS with STAGE one of {', '.join(STAGES)}, got {pair!r}")
        got[name] = int(value)
    return {name: got.get(name, 0) for name in STAGES}


def times_record(
    seconds: dict[str, int], status: int, box: dict[str, object] | None = None
) -> dict[str, object]:
    """What main_job.json holds: seconds per stage, their total, the main job's exit status, and the box
    it ran on (box_facts, read at its start)."""
    return {"seconds": dict(seconds), "total_s": sum(seconds.values()), "exit_status": status, **(box or {})}


def gpu_names(run: Any = subprocess.run) -> list[str]:
    """The GPUs nvidia-smi lists (in CUDA_VISIBLE_DEVICES' order when it is set), or none."""
    try:
        p = run(
            ["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if p.returncode != 0:
        return []
    names = dict(line.split(", ", 1) for line in p.stdout.splitlines() if ", " in line)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    order = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else list(names)
    return [names[i] for i in order if i in names]


def box_facts() -> dict[str, object]:
    """Whether the JIT caches were empty when the main job began (a fresh box compiles everything), its
    GPUs and its CPU cores: what its times depend on."""
    from dskbench.device.info import usable_cores
    from dskbench.setup.jit_cache import is_fresh

    return {"fresh": is_fresh(), "gpus": gpu_names(), "cores": usable_cores()}


def times_line(seconds: dict[str, int], status: int) -> str:
    """The one line the main job ends with, e.g. `main job: set-up 40 s, measuring 290 s, ...`."""
    parts = ", ".join(f"{STAGES[k]} {v} s" for k, v in seconds.items())
    return f"main job: {parts}; total {sum(seconds.values())} s; exit status {status}"


def _times(args: list[str]) -> int:
    status, out, box, pairs = 0, None, None, []
    i = 0
    while i < len(args):
        if args[i] in ("--status", "--out", "--box") and i + 1 < len(args):
            if args[i] == "--status":
                status = int(args[i + 1])
            elif args[i] == "--box":
                box = _read_box(Path(args[i + 1]))
            else:
                out = Path(args[i + 1])
            i += 2
        else:
            pairs.append(args[i])
            i += 1
    seconds = stage_times(pairs)
    print(times_line(seconds, status), file=sys.stderr)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(times_record(seconds, status, box), indent=2) + "\n")
    return 0


def _read_box(path: Path) -> dict[str, object] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # the facts are a courtesy: their loss never fails the main job


def _fresh() -> bool:
    from dskbench.setup.jit_cache import is_fresh

    return is_fresh()


def _defer_s(args: list[str]) -> float | None:
    """`--defer-builds-over S` among eta's arguments (what the sweep will be given), else None."""
    if "--defer-builds-over" in args[:-1]:
        try:
            return float(args[args.index("--defer-builds-over") + 1])
        except ValueError:
            return None
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["eta"]:
        plan = sys.stdin.read()
        line = estimate(plan, per_case_s())
        print(line or "expected: unknown (no plan from dskbench run --dry-run)")
        if line and _fresh():
            from dskbench.execution.build_times import packaged_build_times

            print(fresh_box_note(plan, _defer_s(args[1:]), packaged_build_times()))
        return 0
    if args[:1] == ["box"]:
        print(json.dumps(box_facts()))
        return 0
    if args[:1] == ["times"]:
        try:
            return _times(args[1:])
        except ValueError as e:
            print(f"dskbench.setup.mainjob: {e}", file=sys.stderr)
            return 2
    print("dskbench.setup.mainjob: expected eta, box or times", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
