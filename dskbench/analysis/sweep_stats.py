"""How a sweep went: case counts by status, error reasons, wall time per GPU, that time without
first-time JIT compilation (the figure the sweep-speed target is about), and where the item time went,
stage by stage (inputs, reference, check, warm-up, capture, sampling, ...), in all and for the kernels
that took longest, and how far its ok records can be trusted: the highest share of a datasheet peak, and
how many the second timer flagged (which kernels most).

    dskbench stats RESULTS.jsonl[.gz]... [--top N] [--json OUT]

Wall time per GPU runs from the run's first record to its GPU's last one (records carry `finished`);
JIT time is the `first_launch_s` stage of items whose first launch took over JIT_S seconds (a warm
first launch takes milliseconds). Resumed files hold several runs: each run is counted on its own.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import fields
from datetime import datetime
from typing import Any

from dskbench.results.records import Stages

JIT_S = 1.0
STAGES = tuple(f.name for f in fields(Stages) if f.name != "extra")  # in the order a case runs them


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
    stage_sum: Counter[str] = Counter()
    by_kernel: dict[str, Counter[str]] = defaultdict(Counter)
    per_gpu: dict[int, dict[str, float]] = defaultdict(
        lambda: {"cases": 0, "last": 0.0, "jit_s": 0.0, "item_s": 0.0}
    )
    for r in recs:
        g = per_gpu[int(r.get("gpu_index", 0))]
        g["cases"] += 1
        g["last"] = max(g["last"], float(r.get("finished") or 0.0))
        st = r.get("stages") or {}
        if st and "other_s" not in st:  # written before other_s was recorded
            st = Stages.from_json(st).with_other().to_json()
        if not r.get("shared_with"):  # a copy carries the measured record's stages: counted once
            for k, v in st.items():
                stage_sum[k] += v
                by_kernel[r["kernel"]][k] += v
            by_kernel[r["kernel"]]["cases"] += 1
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
        "stages": {
            k: round(stage_sum[k], 1)
            for k in (*STAGES, *sorted(set(stage_sum) - set(STAGES)))
            if k in stage_sum
        },
        "kernels": {
            k: {s: round(v, 1) for s, v in c.items()}
            for k, c in sorted(by_kernel.items(), key=lambda kv: -kv[1].get("item_s", 0.0))
        },
        "errors": dict(errors.most_common()),
        "wrong": dict(wrong.most_common()),
        "trust": trust(recs),
    }


PEAK_SHARES = (("pct_bw_datasheet", "bandwidth"), ("pct_compute_datasheet", "compute"))


def trust(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Of the ok records (a copy counted once): the highest share of each datasheet peak and its case,
    how many read over 100% of one (impossible), and how many the second timer read outside its band."""
    ok = [r for r in recs if r["status"] == "ok" and not r.get("shared_with")]
    top: dict[str, Any] = {}
    over = 0
    for r in ok:
        metrics = r.get("metrics") or {}
        shares = [(key, metrics.get(key)) for key, _ in PEAK_SHARES]
        over += any(isinstance(v, int | float) and v > 100.0 for _, v in shares)
        for key, v in shares:
            if isinstance(v, int | float) and v > (top.get(key) or {}).get("pct", -1.0):
                top[key] = {
                    "pct": round(float(v), 1),
                    "case": f"{r.get('case_id')} · {r['backend'].get('name')}",
                }
    checks = [((r.get("timing") or {}).get("cross_check") or {}).get("agrees") for r in ok]
    flagged = Counter(
        f"{r['kernel']} · {r['backend'].get('name')}"
        for r, agrees in zip(ok, checks, strict=True)
        if agrees is False
    )
    return {
        "ok": len(ok),
        "highest": top,
        "over_100": over,
        "cross_checked": sum(a is not None for a in checks),
        "flagged": sum(flagged.values()),
        "flagged_by": dict(flagged.most_common()),
    }


def _split(st: dict[str, float]) -> str:
    total = st.get("item_s") or 0.0
    split = any(k in st for k in Stages.IN_MEASURE)  # else measure_s stands for its three stages
    skip = {"item_s", "measure_s" if split else ""}
    parts = [(k, st[k]) for k in STAGES if k in st and k not in skip and st[k] >= 0.05]
    return ", ".join(f"{k[:-2]} {v:.1f} s ({100 * v / total:.0f}%)" for k, v in parts) if total else ""


def stage_lines(s: dict[str, Any], top: int) -> list[str]:
    """The stage table of a run: the sum over its measured cases (copies counted once), then per kernel."""
    st = s["stages"]
    if not st.get("item_s"):
        return []
    lines = [f"  item time {st['item_s']:.1f} s: {_split(st)}"]
    for name, k in list(s["kernels"].items())[:top]:
        lines.append(f"    {name} ({int(k.get('cases', 0))} cases) {k.get('item_s', 0.0):.1f} s: {_split(k)}")
    return lines


def report_lines(s: dict[str, Any], top: int) -> list[str]:
    """A run's summary as printed: counts, each GPU's wall time, the stage table, errors and wrongs."""
    c = s["counts"]
    lines = [
        f"run {s['run_id']} on {s['device']}: {s['records']} records — ok {c.get('ok', 0)}, wrong {c.get('wrong', 0)}, "
        f"skipped {c.get('skipped', 0)}, error {c.get('error', 0)}; wall {s['wall_s']} s"
    ]
    for idx, g in s["gpus"].items():
        lines.append(
            f"  gpu {idx}: {g['cases']} cases, wall {g['wall_s']} s, JIT {g['jit_s']} s, without JIT {g['wall_without_jit_s']} s"
        )
    lines += stage_lines(s, top)
    lines += trust_lines(s.get("trust") or {})
    for what in ("errors", "wrong"):
        for k, n in s[what].items():
            lines.append(f"  {what[:-1] if what == 'errors' else what} x{n}: {k}")
    return lines


def trust_lines(t: dict[str, Any], most: int = 5) -> list[str]:
    """The trust figures as printed: peaks reached, impossible shares, the second timer's flags."""
    if not t.get("ok"):
        return []
    highest = [
        f"{t['highest'][key]['pct']}% of datasheet {name} ({t['highest'][key]['case']})"
        for key, name in PEAK_SHARES
        if key in t["highest"]
    ]
    lines = [f"  trust: at most {', '.join(highest) or 'no datasheet share'}; {t['over_100']} over 100%"]
    flagged = ", ".join(f"{k} {n}" for k, n in list(t["flagged_by"].items())[:most])
    lines.append(
        f"  second timer: {t['flagged']} of {t['cross_checked']} cross-checked ok records flagged"
        + (f" (most: {flagged})" if flagged else "")
    )
    return lines
