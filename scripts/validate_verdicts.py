"""CPU validation of dskbench compare's verdicts on two committed runs of unchanged code.

    python scripts/validate_verdicts.py --out results/verdicts-2026-11-24

Takes the two back-to-back full sweeps of one commit (results/h200x4-2026-11-21/sweep-a and sweep-b)
and reports:

1. false flags on the unchanged pair (target: 0 regressions, exit status 0);
2. known slowdowns injected into a seeded random half of side b's measured cases (+2% ... +50%, on the
   samples and on every summary number; a case's ``shared_with`` twins get the same), then the rate at
   which compare calls them ``slower``, by latency band and effect size, the smallest effect caught
   reliably per band, and any non-injected case flagged.

Each check runs with three band priors, to keep the validation honest about circularity:
``held-out`` is fitted (dskbench.analysis.noise.fit_prior) from the three committed pairs that are NOT the
validation pair (h200 r2r, h200x2 r2r, h200x4 r2r-write); ``h200-only`` from the single-GPU H200 pair
alone; ``shipped`` is dskbench/analysis/noise_prior.json, which includes the validation pair itself (in-sample:
shown for reference, not as evidence). The targets are judged on ``held-out``.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from noise_prior import DEFAULT_PAIRS, pair  # noqa: E402

from dskbench.analysis.compare import Comparison, compare  # noqa: E402
from dskbench.analysis.compare_inputs import Key, Side, add_runs, device_name  # noqa: E402
from dskbench.analysis.noise import BAND_EDGES_US, PRIOR_FILE, Prior, band_index, fit_prior, load_prior  # noqa: E402
from dskbench.results.io import Run, read_runs  # noqa: E402

A = ROOT / "results/h200x4-2026-11-21/sweep-a.jsonl.gz"
B = ROOT / "results/h200x4-2026-11-21/sweep-b.jsonl.gz"
EFFECTS = (0.02, 0.03, 0.05, 0.07, 0.10, 0.15, 0.20, 0.30, 0.50)
THRESHOLDS = (0.05, 0.0)
TIME_KEYS = ("median_us", "p10_us", "p90_us", "mean_us", "min_us", "max_us")
TARGETS = (("+10% on cases >= 5 us", 0.10, False, 0.95), ("+30% on cases < 5 us", 0.30, True, 0.90))


def band_label(i: int) -> str:
    lo, hi = BAND_EDGES_US[i], BAND_EDGES_US[i + 1]
    return f">={lo:g} us" if hi == float("inf") else f"{lo:g}-{hi:g} us"


def priors(tmp: Path) -> dict[str, Prior]:
    """The three priors (see the module docstring); fitted ones are written next to the output."""
    held = [p for p in DEFAULT_PAIRS if "sweep" not in p[0]]
    out = {}
    for name, pairs in (("held-out", held), ("h200-only", held[:1])):
        fitted = [pair(n, ROOT / a, ROOT / b)[0] for n, a, b in pairs]
        doc = fit_prior(fitted)
        doc["pairs"] = [
            {"name": n, "a": a, "b": b, "cases": len(f.rows)}
            for (n, a, b), f in zip(pairs, fitted, strict=True)
        ]
        path = tmp / f"prior-{name}.json"
        path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        out[name] = load_prior(path)
    out["shipped"] = load_prior(PRIOR_FILE)
    return out


def measured_keys(run: Run) -> list[Key]:
    """Keys of side b's measured (not twin) ok cases with a time: the injection candidates."""
    machine = device_name(run.environment)
    return [
        Key(machine, r["kernel"], r["case_id"], r["backend"]["name"])
        for r in run.results
        if r["status"] == "ok" and not r.get("shared_with") and (r.get("timing") or {}).get("median_us")
    ]


def inject(run: Run, chosen: set[tuple[str, str]], effect: float) -> Run:
    """A copy of `run` whose chosen (case_id, backend)s and their twins are `effect` slower."""
    out = Run(run.environment, [])
    for r in run.results:
        case = r.get("shared_with") or r.get("case_id")
        if r["status"] != "ok" or (case, r["backend"]["name"]) not in chosen:
            out.results.append(r)
            continue
        r = copy.copy(r)
        t = dict(r["timing"])
        for k in TIME_KEYS:
            if isinstance(t.get(k), int | float):
                t[k] = t[k] * (1 + effect)
        t["samples_us"] = [x * (1 + effect) for x in t.get("samples_us") or ()]
        if t.get("raw_median_us") is not None:
            t["raw_median_us"] = t["median_us"] + float(t.get("launch_gap_us") or 0.0)
        r["timing"] = t
        out.results.append(r)
    return out


def side(run: Run) -> Side:
    s = Side()
    add_runs(s, [run])
    return s


def tally(c: Comparison, injected: set[Key], latency: dict[Key, float]) -> dict[str, Any]:
    """Detection of the injected measurements by band; flags on the others."""
    hit: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    other: Counter = Counter()
    flagged_others = []
    for ch in c.measured:
        if ch.key in injected:
            b = band_index(latency[ch.key])
            hit[b][1] += 1
            hit[b][0] += ch.verdict == "slower"
        elif ch.verdict in ("slower", "faster", "broke", "fixed"):
            other[ch.verdict] += 1
            flagged_others.append(f"{ch.verdict} {ch.change:+.1%} {ch.key.case} · {ch.key.backend}")
    small = [sum(hit[b][i] for b in hit if BAND_EDGES_US[b] < 5) for i in (0, 1)]
    large = [sum(hit[b][i] for b in hit if BAND_EDGES_US[b] >= 5) for i in (0, 1)]
    return {
        "bands": {band_label(b): {"caught": h[0], "injected": h[1]} for b, h in sorted(hit.items())},
        "below_5us": {"caught": small[0], "injected": small[1]},
        "from_5us": {"caught": large[0], "injected": large[1]},
        "other_flags": dict(other),
        "other_flagged": flagged_others[:20],
    }


def rate(d: dict[str, int]) -> float:
    return d["caught"] / d["injected"] if d["injected"] else float("nan")


def run_checks(prior: Prior, a: Run, b: Run, seed: int) -> dict[str, Any]:
    sa, sb = side(a), side(b)
    base = compare(sa, sb, 0.05, prior)
    n = base.counts()
    doc: dict[str, Any] = {
        "unchanged": {
            "regressions": len(base.regressions),
            "improvements": len(base.improvements),
            "exit_status": 1 if base.regressions else 0,
            "verdicts": dict(n),
            "flagged": [
                f"{c.verdict} {c.change:+.1%} {c.key.case} · {c.key.backend} ({c.note})"
                for c in base.measured
                if c.verdict in ("slower", "faster", "broke", "fixed")
            ],
        },
        "injected": {},
    }
    keys = measured_keys(b)
    rng = random.Random(seed)
    chosen = set(rng.sample(keys, len(keys) // 2))
    latency = {k: float(s.value) for k, s in sb.stats().items() if k in chosen and s.value}
    pairs = {(k.case, k.backend) for k in chosen}
    doc["injected_cases"] = len(chosen)
    for threshold in THRESHOLDS:
        per = {}
        for e in EFFECTS:
            c = compare(sa, side(inject(b, pairs, e)), threshold, prior)
            per[f"+{e:.0%}"] = tally(c, chosen, latency)
        doc["injected"][f"threshold {threshold:.0%}"] = per
    return doc


def smallest_reliable(per: dict[str, Any], band: str, need: float) -> str:
    for name, t in per.items():
        d = t["bands"].get(band)
        if d and d["injected"] and rate(d) >= need:
            return name
    return "none tried"


def render(docs: dict[str, Any]) -> str:
    lines = []
    for name, doc in docs["priors"].items():
        u = doc["unchanged"]
        circ = " (in-sample: this prior includes the validation pair)" if name == "shipped" else ""
        lines.append(f"== prior {name}{circ}")
        lines.append(
            f"unchanged pair: {u['regressions']} regressions, {u['improvements']} improvements, "
            f"exit status {u['exit_status']}; verdicts {json.dumps(u['verdicts'], sort_keys=True)}"
        )
        for f in u["flagged"]:
            lines.append(f"  flagged: {f}")
        for thr, per in doc["injected"].items():
            lines.append(f"-- injected slowdowns, {doc['injected_cases']} measurements of side b, {thr}")
            bands = list(next(iter(per.values()))["bands"])
            head = f"{'band':>12} {'cases':>6} " + " ".join(f"{e:>6}" for e in per) + "  reliable(95%)"
            lines.append(head)
            for band in bands:
                n = next(iter(per.values()))["bands"][band]["injected"]
                cells = " ".join(f"{rate(per[e]['bands'][band]):6.1%}" for e in per)
                lines.append(f"{band:>12} {n:6d} {cells}  {smallest_reliable(per, band, 0.95)}")
            for label, key in (("< 5 us", "below_5us"), (">= 5 us", "from_5us")):
                n = next(iter(per.values()))[key]["injected"]
                cells = " ".join(f"{rate(per[e][key]):6.1%}" for e in per)
                lines.append(f"{label:>12} {n:6d} {cells}")
            others = {e: t["other_flags"] for e, t in per.items() if t["other_flags"]}
            lines.append(f"  non-injected cases flagged: {json.dumps(others) if others else 'none'}")
        lines.append("")
    lines.append("== targets (prior held-out, default threshold 5%)")
    for line in docs["targets"]:
        lines.append("  " + line)
    return "\n".join(lines) + "\n"


def targets(doc: dict[str, Any]) -> list[str]:
    out = []
    u = doc["unchanged"]
    ok = u["regressions"] == 0 and u["exit_status"] == 0
    out.append(
        f"identical runs: {u['regressions']} regressions, exit {u['exit_status']} "
        f"(target 0, exit 0): {'met' if ok else 'NOT met'}"
    )
    per = doc["injected"]["threshold 5%"]
    for label, e, small, need in TARGETS:
        d = per[f"+{e:.0%}"]["below_5us" if small else "from_5us"]
        r = rate(d)
        out.append(
            f"{label}: {d['caught']}/{d['injected']} caught = {r:.1%} (target >= {need:.0%}): "
            f"{'met' if r >= need else 'NOT met'}"
        )
    return out


def _rel(p: str | Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for validation.json/.txt and the priors")
    p.add_argument("--seed", type=int, default=1, help="which half of the cases gets the slowdowns")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (a,), (b,) = read_runs([A]), read_runs([B])
    docs: dict[str, Any] = {
        "validation_pair": [str(A.relative_to(ROOT)), str(B.relative_to(ROOT))],
        "effects": list(EFFECTS),
        "seed": args.seed,
        "priors": {},
    }
    for name, prior in priors(args.out).items():
        docs["priors"][name] = run_checks(prior, a, b, args.seed)
        docs["priors"][name]["prior_file"] = _rel(prior.source)
    docs["targets"] = targets(docs["priors"]["held-out"])
    (args.out / "validation.json").write_text(json.dumps(docs, indent=1) + "\n", encoding="utf-8")
    text = render(docs)
    (args.out / "validation.txt").write_text(text, encoding="utf-8")
    print(text, end="")
    return 0 if all("NOT met" not in t for t in docs["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
