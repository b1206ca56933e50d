"""How a sweep went: case counts by status, error reasons, wall time per GPU, and that time without
first-time JIT compilation (the figure the sweep-speed target is about).

    python3 scripts/sweep_stats.py RESULTS.jsonl[.gz]... [--json OUT]

Wall time per GPU runs from the run's first record to its GPU's last one (records carry `finished`);
JIT time is the `first_launch_s` stage of items whose first launch took over JIT_S seconds (a warm
first launch takes milliseconds). Resumed files hold several runs: each run is counted on its own.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dskbench.results.io import read_runs  # noqa: E402

JIT_S = 1.0


def _created(env: dict[str, Any]) -> float | None:
    try:
        return datetime.fromisoformat(str(env.get("created"))).timestamp()
    except ValueError:
        return None


def run_stats(run: Any) -> dict[str, Any]:
    recs = run.results
    counts = Counter(r["status"] for r in recs)
    errors = Counter(
        f"{r['kernel']} · {r['backend'].get('name')}: {r.get('reason', '')[:120]}"
        for r in recs
        if r["status"] == "error"
    )
    wrong = Counter(f"{r['kernel']} · {r['backend'].get('name')}" for r in recs if r["status"] == "wrong")
    start = _created(run.environment)
    per_gpu: dict[int, dict[str, float]] = defaultdict(
        lambda: {"cases": 0, "last": 0.0, "jit_s": 0.0, "item_s": 0.0}
    )
    for r in recs:
        g = per_gpu[int(r.get("gpu_index", 0))]
        g["cases"] += 1
        g["last"] = max(g["last"], float(r.get("finished") or 0.0))
        st = r.get("stages") or {}
        if st.get("first_launch_s", 0.0) > JIT_S:
            g["jit_s"] += st["first_launch_s"]
        g["item_s"] += st.get("item_s", 0.0)
    gpus = {}
    for idx, g in sorted(per_gpu.items()):
        wall = g["last"] - start if start and g["last"] else None
        gpus[idx] = {
            "cases": int(g["cases"]),
            "wall_s": round(wall, 1) if wall else None,
            "jit_s": round(g["jit_s"], 1),
            "wall_without_jit_s": round(wall - g["jit_s"], 1) if wall else None,
            "sum_item_s": round(g["item_s"], 1),
        }
    walls = [g["wall_s"] for g in gpus.values() if g["wall_s"]]
    return {
        "run_id": run.run_id,
        "device": (run.environment.get("device") or {}).get("name"),
        "records": len(recs),
        "counts": dict(counts),
        "gpus": gpus,
        "wall_s": max(walls) if walls else None,
        "gpu_seconds_without_jit": round(sum(g["wall_without_jit_s"] or 0 for g in gpus.values()), 1),
        "errors": dict(errors.most_common()),
        "wrong": dict(wrong.most_common()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    stats = [run_stats(r) for r in read_runs(args.results)]
    for s in stats:
        c = s["counts"]
        print(
            f"run {s['run_id']} on {s['device']}: {s['records']} records — ok {c.get('ok', 0)}, wrong {c.get('wrong', 0)}, "
            f"skipped {c.get('skipped', 0)}, error {c.get('error', 0)}; wall {s['wall_s']} s"
        )
        for idx, g in s["gpus"].items():
            print(
                f"  gpu {idx}: {g['cases']} cases, wall {g['wall_s']} s, JIT {g['jit_s']} s, without JIT {g['wall_without_jit_s']} s"
            )
        for what in ("errors", "wrong"):
            for k, n in s[what].items():
                print(f"  {what[:-1] if what == 'errors' else what} x{n}: {k}")
    if args.json:
        args.json.write_text(json.dumps(stats, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
