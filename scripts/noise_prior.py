"""Fit dskbench's band prior (dskbench/analysis/noise_prior.json) from committed pairs of unchanged runs.

    python scripts/noise_prior.py                       # the committed pairs -> dskbench/analysis/noise_prior.json
    python scripts/noise_prior.py --pair NAME A B ... --out FILE

Each pair is two back-to-back runs of the same code on one machine. For every case measured ok in both
(``shared_with`` copies left out: one measurement counts once) the run-to-run change of the median and
of the p10 is taken before the launch gap was subtracted; per latency band the prior's floor is the
0.999 quantile of |change| (dskbench.analysis.noise.fit_prior). The default pairs are the committed ones measured
with the default settings (cold, L2 flush written); results/h200x4-2026-11-21/r2r-read-* used the
experimental read flush and are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dskbench.analysis.compare_inputs import Key, Settings, Side, device_name, load_side  # noqa: E402
from dskbench.analysis.noise import PRIOR_FILE, QUANTILE, PairChanges, fit_prior, pair_changes  # noqa: E402
from dskbench.results.io import read_runs  # noqa: E402

DEFAULT_PAIRS = (
    ("h200 r2r", "results/h200-2026-11-21/r2r-1.jsonl.gz", "results/h200-2026-11-21/r2r-2.jsonl.gz"),
    ("h200x2 r2r", "results/h200x2-2026-11-21/r2r-1.jsonl.gz", "results/h200x2-2026-11-21/r2r-2.jsonl.gz"),
    (
        "h200x4 r2r-write",
        "results/h200x4-2026-11-21/r2r-write-1.jsonl.gz",
        "results/h200x4-2026-11-21/r2r-write-2.jsonl.gz",
    ),
    (
        "h200x4 sweep",
        "results/h200x4-2026-11-21/sweep-a.jsonl.gz",
        "results/h200x4-2026-11-21/sweep-b.jsonl.gz",
    ),
)


def measured(side: Side) -> dict[Key, object]:
    """The side's Stats of measured cases (twins left out)."""
    twins = side.twins()
    return {k: s for k, s in side.stats().items() if k not in twins}


def pair(name: str, a: str | Path, b: str | Path) -> tuple[PairChanges, set[Settings]]:
    """The pair's changes, and the settings its runs were measured with."""
    sa, sb = load_side([a]), load_side([b])
    settings = {r.settings for r in (*sa.runs.values(), *sb.runs.values())}
    return pair_changes(name, measured(sa), measured(sb), launches_per_sample(a)), settings


def launches_per_sample(path: str | Path) -> dict[Key, int]:
    out = {}
    for run in read_runs([path]):
        machine = device_name(run.environment)
        for rec in run.results:
            n = (rec.get("timing") or {}).get("launches_per_sample")
            if isinstance(n, int) and n > 0:
                out[
                    Key(machine, rec["kernel"], rec.get("case_id") or rec["kernel"], rec["backend"]["name"])
                ] = n
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", nargs=3, action="append", metavar=("NAME", "A", "B"), help="an unchanged pair")
    p.add_argument("--out", type=Path, default=PRIOR_FILE, help=f"default {PRIOR_FILE.relative_to(ROOT)}")
    p.add_argument("--quantile", type=float, default=QUANTILE)
    args = p.parse_args(argv)
    pairs_given = args.pair or [(n, str(ROOT / a), str(ROOT / b)) for n, a, b in DEFAULT_PAIRS]
    fitted = [pair(n, a, b) for n, a, b in pairs_given]
    pairs = [pc for pc, _ in fitted]
    settings = {s for _, ss in fitted for s in ss}
    doc = fit_prior(pairs, args.quantile)
    doc["settings"] = {
        "mode": sorted({s.mode or "unrecorded" for s in settings}),
        "flush": sorted({s.flush or "unrecorded" for s in settings}),
    }
    doc["pairs"] = [
        {"name": n, "a": _rel(a), "b": _rel(b), "cases": len(pc.rows)}
        for (n, a, b), pc in zip(pairs_given, pairs, strict=True)
    ]
    doc["generated_by"] = "python scripts/noise_prior.py" + (" (custom pairs)" if args.pair else "")
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"{args.out}: {sum(len(pc.rows) for pc in pairs)} cases from {len(pairs)} pairs")
    for b in doc["bands"]:
        hi = "inf" if b["hi_us"] is None else f"{b['hi_us']:g}"
        src = f" (from {b['from_band']})" if b["from_band"] else ""
        print(
            f"  {b['lo_us']:g}-{hi} us: {b['cases']:5} cases, median floor {b['median_floor']:.1%}, "
            f"p10 floor {b['p10_floor']:.1%}, spread factors {b['median_spread_factor']:g}/"
            f"{b['p10_spread_factor']:g}{src}"
        )
    return 0


def _rel(p: str | Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


if __name__ == "__main__":
    sys.exit(main())
