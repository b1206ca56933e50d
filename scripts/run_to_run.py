"""Run-to-run spread of two sweeps of the same cases: median, p90 and max of |delta| of the medians.

    python3 scripts/run_to_run.py A.jsonl[.gz] B.jsonl[.gz] [--json OUT]

Pairs every (case, backend) measured `ok` in both (twin records copied from another op's measurement,
`shared_with`, are left out: they would count one measurement twice), and prints the spread over all
pairs and by latency band (the small cold kernels are where it is widest), plus the pairs that moved
most. The target: median |delta| under 2% between two back-to-back sweeps on one machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dskbench.measure.stats import quantile  # noqa: E402
from dskbench.results.io import read_runs  # noqa: E402

BANDS = ((0.0, 5.0), (5.0, 20.0), (20.0, 100.0), (100.0, 1000.0), (1000.0, float("inf")))


def medians(path: Path) -> dict[tuple[str, str], float]:
    out = {}
    for run in read_runs([path]):
        for r in run.results:
            if r.get("status") == "ok" and not r.get("shared_with") and "timing" in r:
                out[(r["case_id"], r["backend"]["name"])] = float(r["timing"]["median_us"])
    return out


def spread(deltas: list[float]) -> dict[str, float]:
    a = [abs(d) for d in deltas]
    return {
        "pairs": len(a),
        "median_abs_pct": round(100 * statistics.median(a), 2),
        "p90_abs_pct": round(100 * quantile(sorted(a), 0.9), 2),
        "max_abs_pct": round(100 * max(a), 2),
        "mean_signed_pct": round(100 * statistics.fmean(deltas), 2),
    }


def compare(a: dict, b: dict) -> dict:
    pairs = [(k, a[k], b[k]) for k in sorted(a.keys() & b.keys()) if a[k] > 0]
    if not pairs:
        raise SystemExit("run_to_run: no (case, backend) measured ok in both files")
    deltas = [(k, x, y, y / x - 1) for k, x, y in pairs]
    doc = {"all": spread([d for *_, d in deltas]), "bands": {}, "largest": []}
    for lo, hi in BANDS:
        band = [d for _, x, _, d in deltas if lo <= x < hi]
        if band:
            doc["bands"][f"{lo:g}-{hi:g} us"] = spread(band)
    for (case, backend), x, y, d in sorted(deltas, key=lambda t: -abs(t[3]))[:15]:
        doc["largest"].append(
            {"case": case, "backend": backend, "a_us": x, "b_us": y, "delta_pct": round(100 * d, 2)}
        )
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument(
        "--only-common",
        type=Path,
        nargs="+",
        default=[],
        help="pair only (case, backend)s measured ok in these files too (an A/B on the same cases)",
    )
    args = p.parse_args(argv)
    a, b = medians(args.a), medians(args.b)
    for other in args.only_common:
        keep = medians(other).keys()
        a = {k: v for k, v in a.items() if k in keep}
    doc = compare(a, b)
    doc["files"] = [str(args.a), str(args.b)]
    doc["only_common"] = [str(x) for x in args.only_common]
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    s = doc["all"]
    print(
        f"{s['pairs']} pairs: median |delta| {s['median_abs_pct']}%, p90 {s['p90_abs_pct']}%, "
        f"max {s['max_abs_pct']}%, mean signed {s['mean_signed_pct']}%"
    )
    for band, b in doc["bands"].items():
        print(f"  {band:>14}: {b['pairs']:5} pairs, median {b['median_abs_pct']}%, p90 {b['p90_abs_pct']}%")
    print("largest:")
    for x in doc["largest"][:8]:
        print(
            f"  {x['delta_pct']:+7.2f}%  {x['a_us']:10.2f} -> {x['b_us']:10.2f} us  {x['case']} · {x['backend']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
