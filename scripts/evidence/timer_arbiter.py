"""Where the two cold timers disagree, which one does CUPTI side with? (any machine)

    python3 scripts/evidence/timer_arbiter.py PER-CASE... -- BATCHED...

For each case that `dskbench compare PER-CASE -- BATCHED` calls slower or faster (the same rule and
noise floors), the kernel times (launch gap subtracted, the mean over each side's runs) of:

  per-case       the per-case event timer: n [flush, launch] pairs in one graph, less a graph of flushes
  its CUPTI      the per-case record's cross-check: CUPTI's kernel activities in that same graph
  batched        the batched timer: CUPTI's activities of one [flush, launch] graph per sample
  its events     the batched record's cross-check: events around that one-pair graph, less the flush

and which timer the per-case graph's own CUPTI reading is nearer. Where CUPTI in the per-case graph reads
what the batched timer reads, the per-case timer's subtraction is what differs. Where it reads what the
per-case timer reads while the batched record's events read what the batched timer reads, the kernel ran
differently in the two runs and no timer is wrong.
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

Key = tuple[str, str, str]


def kernel_times(paths: list[str]) -> dict[Key, list[tuple[float, float | None]]]:
    """(kernel time, cross-check kernel time) of each ok cold record, per (kernel, case, backend)."""
    from dskbench.results.io import iter_records, results_files

    out: dict[Key, list[tuple[float, float | None]]] = {}
    for path in results_files(paths):
        for r in iter_records(path):
            t = r.get("timing") or {}
            if r.get("record") != "result" or r.get("status") != "ok" or t.get("mode") != "cold":
                continue
            gap = t.get("launch_gap_us") or 0.0
            cross = (t.get("cross_check") or {}).get("median_us")
            key = (r["kernel"], r["case_id"], r["backend"]["name"])
            out.setdefault(key, []).append((t["median_us"], None if cross is None else cross - gap))
    return out


def _mean(xs: list[float | None]) -> float | None:
    got = [x for x in xs if x is not None]
    return statistics.mean(got) if got else None


def _us(x: float | None) -> str:
    return f"{x:10.2f}" if x is not None else f"{'-':>10s}"


def arbitrate(old: list[str], new: list[str]) -> int:
    from dskbench.analysis.compare import compare
    from dskbench.analysis.compare_inputs import load_side
    from dskbench.analysis.verdict import DEFAULT_THRESHOLD, default_prior

    result = compare(load_side(old), load_side(new), DEFAULT_THRESHOLD, default_prior(), None)
    per_case, batched = kernel_times(old), kernel_times(new)
    sides: Counter[str] = Counter()
    kernels: dict[str, Counter[str]] = {}
    print(f"{'case':74s} {'per-case':>10s} {'its CUPTI':>10s} {'batched':>10s} {'its events':>10s}  nearer")
    for c in result.measured:
        if c.verdict not in ("slower", "faster"):
            continue
        key = (c.key.kernel, c.key.case, c.key.backend)
        if key not in per_case or key not in batched:
            continue
        pc, pc_cupti = _mean([v for v, _ in per_case[key]]), _mean([x for _, x in per_case[key]])
        bt, bt_events = _mean([v for v, _ in batched[key]]), _mean([x for _, x in batched[key]])
        side = "-"
        if pc is not None and bt is not None and pc_cupti is not None:
            side = "batched" if abs(bt - pc_cupti) < abs(pc - pc_cupti) else "per-case"
        sides[side] += 1
        kernels.setdefault(c.key.kernel, Counter())[side] += 1
        name = f"{c.key.kernel} {c.key.case.split('/', 1)[-1]} · {c.key.backend}"
        print(f"{name[:74]:74s} {_us(pc)} {_us(pc_cupti)} {_us(bt)} {_us(bt_events)}  {side}")
    print(
        f"{sum(sides.values())} slower/faster cases; the per-case graph's CUPTI nearer: "
        + ", ".join(f"{k} {v}" for k, v in sides.most_common())
    )
    for kernel, n in sorted(kernels.items()):
        print(f"  {kernel}: " + ", ".join(f"{k} {v}" for k, v in n.most_common()))
    return 0


def main(argv: list[str]) -> int:
    from dskbench.results.io import ResultsError

    if "--" not in argv or argv.index("--") == 0 or argv.index("--") == len(argv) - 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    i = argv.index("--")
    try:
        return arbitrate(argv[:i], argv[i + 1 :])
    except (OSError, ValueError, ResultsError) as e:  # a missing or malformed file: one line, no trace
        print(f"timer_arbiter.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
