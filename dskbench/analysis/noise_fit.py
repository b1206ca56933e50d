"""Fit dskbench's band prior (dskbench/analysis/noise_prior.json) from committed pairs of unchanged runs.

    dskbench noise-prior                       # the committed pairs -> dskbench/analysis/noise_prior.json
    dskbench noise-prior --pair NAME A B ... --out FILE

Each pair is two back-to-back runs of the same code on one machine. For every case measured ok in both
(``shared_with`` copies left out: one measurement counts once) the run-to-run change of the median and
of the p10 is taken before the launch gap was subtracted; per latency band the prior's floor is the
0.999 quantile of |change| (dskbench.analysis.noise.fit_prior). The default pairs are the committed ones measured
with the default settings (cold, L2 flush written); results/h200x4-2026-11-21/r2r-read-* used the
experimental read flush and are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dskbench import paths
from dskbench.analysis.compare_inputs import Key, Settings, Side, device_name, load_side
from dskbench.analysis.noise import PairChanges, fit_prior, pair_changes
from dskbench.results.io import read_runs

ROOT = paths.CHECKOUT  # the committed pairs are files of the checkout's results/

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


def fit(
    pairs_given: Sequence[tuple[str, str | Path, str | Path]], quantile: float, custom: bool
) -> dict[str, Any]:
    """The prior document fitted from (name, A, B) pairs: bands, the settings measured with, the pairs."""
    fitted = [pair(n, a, b) for n, a, b in pairs_given]
    pairs = [pc for pc, _ in fitted]
    settings = {s for _, ss in fitted for s in ss}
    doc = fit_prior(pairs, quantile)
    doc["settings"] = {
        "mode": sorted({s.mode or "unrecorded" for s in settings}),
        "flush": sorted({s.flush or "unrecorded" for s in settings}),
    }
    doc["pairs"] = [
        {"name": n, "a": _rel(a), "b": _rel(b), "cases": len(pc.rows)}
        for (n, a, b), pc in zip(pairs_given, pairs, strict=True)
    ]
    doc["generated_by"] = "dskbench noise-prior" + (" (custom pairs)" if custom else "")
    return doc


def default_pairs() -> list[tuple[str, str, str]]:
    """The committed pairs, as paths in the checkout."""
    return [(n, str(ROOT / a), str(ROOT / b)) for n, a, b in DEFAULT_PAIRS]


def report_lines(doc: dict[str, Any]) -> list[str]:
    """The fitted bands as printed."""
    lines = []
    for b in doc["bands"]:
        hi = "inf" if b["hi_us"] is None else f"{b['hi_us']:g}"
        src = f" (from {b['from_band']})" if b["from_band"] else ""
        lines.append(
            f"  {b['lo_us']:g}-{hi} us: {b['cases']:5} cases, median floor {b['median_floor']:.1%}, "
            f"p10 floor {b['p10_floor']:.1%}, spread factors {b['median_spread_factor']:g}/"
            f"{b['p10_spread_factor']:g}{src}"
        )
    return lines


def _rel(p: str | Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(ROOT))
    except ValueError:
        return str(p)
