"""`dskbench compare`: which cases got slower, judged against run-to-run noise; printed, with an exit code.

    dskbench compare OLD NEW
    dskbench compare OLD1 OLD2 ... -- NEW1 NEW2 ...      (several runs per side; folders work too)

The comparison is dskbench.analysis.compare's. Each measurement counts once: a ``shared_with`` twin is
listed under its measured case (``-v``), never as a second change.
Exit status: 1 when a measurement regressed (slower, or broke), 2 on bad input, else 0.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from dskbench.analysis.compare import DISAGREE_MARK, Comparison, compare, own_prior
from dskbench.analysis.compare_inputs import Side, load_side
from dskbench.analysis.noise import Prior, PriorError, load_prior
from dskbench.analysis.verdict import DEFAULT_THRESHOLD, default_prior
from dskbench.frontends.cli.common import EXIT_USAGE
from dskbench.results.io import ResultsError


def add_parser(sub: argparse._SubParsersAction) -> None:
    cmp_ = sub.add_parser(
        "compare",
        help="which cases got slower, judged against run-to-run noise (ours or asv results)",
        description="dskbench compare OLD NEW, or OLD1 OLD2 ... -- NEW1 NEW2 ... (files, folders, "
        "asv results, ASV_RESULTS_DIR@COMMIT); exit 1 when a measurement regressed",
    )
    cmp_.add_argument("paths", nargs="*", type=Path, help="OLD NEW, or the old side's runs before --")
    cmp_.add_argument("--new-side", nargs="+", type=Path, default=None, help=argparse.SUPPRESS)
    cmp_.add_argument(
        "--threshold",
        type=float,
        default=0.05,
        help="relative change of the median that counts (default 0.05)",
    )
    cmp_.add_argument(
        "--history",
        action="append",
        type=Path,
        default=[],
        help="earlier runs of the same GPU model (file or folder, repeatable): each case's own noise floor",
    )
    cmp_.add_argument(
        "--prior", type=Path, help="noise prior JSON (default: dskbench's, see `dskbench noise-prior`)"
    )
    cmp_.add_argument("--no-fail", action="store_true", help="exit 0 even when something regressed")
    cmp_.add_argument("-v", "--verbose", action="store_true", help="list unchanged cases and twins too")


def split_sides(argv: list[str]) -> list[str]:
    """`compare A1 A2 -- B1 B2`: argparse drops the `--`, so what follows it is passed as --new-side."""
    if argv[:1] == ["compare"] and "--" in argv:
        i = argv.index("--")
        return [*argv[:i], "--new-side", *argv[i + 1 :]] if i + 1 < len(argv) else argv[:i] + ["--new-side"]
    return argv


def command(args: argparse.Namespace) -> int:
    if args.new_side is not None:
        old_side, new_side = list(args.paths), list(args.new_side)
    elif len(args.paths) == 2:
        old_side, new_side = [args.paths[0]], [args.paths[1]]
    else:
        print("dskbench compare: give OLD NEW, or OLD1 OLD2 ... -- NEW1 NEW2 ...", file=sys.stderr)
        return EXIT_USAGE
    if not old_side:
        print("dskbench compare: no old results before --", file=sys.stderr)
        return EXIT_USAGE
    return cli_compare(
        old_side,
        new_side,
        args.threshold,
        not args.no_fail,
        args.verbose,
        history_paths=args.history,
        prior_path=args.prior,
    )


def describe_side(name: str, side: Side, machines: Sequence[str]) -> list[str]:
    lines = []
    for m in machines:
        runs = side.runs_on(m)
        if not runs:
            continue
        commits = sorted({r.commit[:8] or "unknown" for r in runs})
        settings = sorted({r.settings.describe() for r in runs})
        lines.append(
            f"{name}: {len(runs)} run{'s' if len(runs) != 1 else ''} on {m} "
            f"(commit {', '.join(commits)}; {' | '.join(settings)})"
        )
    return lines


def notes(old: Side, new: Side, machines: Sequence[str], prior: Prior, history: Side | None) -> list[str]:
    """What the reader must know to trust the verdicts: settings that differ, where floors come from."""
    out = []
    for m in machines:
        a = {r.settings for r in old.runs_on(m)}
        b = {r.settings for r in new.runs_on(m)}
        diff = _settings_diff(a, b)
        if diff:
            timers = " (the two timers' cases are compared on kernel times, launch gaps subtracted)"
            out.append(
                f"note: on {m} the sides were measured with different settings ({diff}): not like for like"
                + (timers if "timer " in diff else "")
            )
        for name, s in (("old", a), ("new", b)):
            inner = _settings_diff({next(iter(s))}, s) if len(s) > 1 else ""
            if inner:
                out.append(f"note: the {name} side's runs on {m} differ in settings ({inner})")
    covered = [m for m in machines if own_prior(prior, old, new, m)]
    if covered:
        out += _floor_notes(old, new, covered, prior, history)
    for m in machines:
        if m not in covered:
            out.append(_foreign_note(old, new, m, prior, history))
    return out


def _runs_and_history(old: Side, new: Side, machines: Sequence[str], history: Side | None) -> tuple:
    n_old = max((len(old.runs_on(m)) for m in machines), default=1)
    n_new = max((len(new.runs_on(m)) for m in machines), default=1)
    hist = history is not None and any(history.runs_on(m) for m in machines)
    return n_old, n_new, hist


def _floor_notes(
    old: Side, new: Side, machines: Sequence[str], prior: Prior, history: Side | None
) -> list[str]:
    """Where the floors of the devices the band prior was measured on come from."""
    out = []
    n_old, n_new, hist = _runs_and_history(old, new, machines, history)
    if n_old < 2 and n_new < 2 and not hist:
        out.append(
            f"noise floors: one run per side, so each case's floor is the band prior ({prior.describe()}); "
            "give two or more runs per side (OLD1 OLD2 -- NEW1 NEW2) or --history for each case's own"
        )
    else:
        what = []
        if n_old > 1 or n_new > 1:
            what.append(f"{n_old} old and {n_new} new runs: verdicts use run-level medians")
        if hist:
            what.append("--history runs")
        out.append(
            "noise floors: each case's own run-to-run spread (" + "; ".join(what) + "), blended with the "
            f"band prior ({prior.describe()}) where it has few runs"
        )
    runs = [r for side in (old, new) for m in machines for r in side.runs_on(m)]
    for setting in ("mode", "flush"):
        odd = sorted(
            {
                getattr(r.settings, setting)
                for r in runs
                if prior.unmeasured(setting, getattr(r.settings, setting))
            }
        )
        if odd:
            out.append(
                f"note: the band prior was measured with {setting} {_known(prior.measured_with[setting])}, "
                f"these runs used {setting} {'/'.join(odd)}: its floors may be too narrow for them; "
                "several runs per side or --history give each case's own"
            )
    return out


def _foreign_note(old: Side, new: Side, machine: str, prior: Prior, history: Side | None) -> str:
    """A device the band prior was not measured on: it is not used; what the floors need instead."""
    n_old, n_new, hist = _runs_and_history(old, new, [machine], history)
    head = (
        f"noise floors on {machine}: the band prior was measured on {', '.join(prior.measured_on)}, "
        "not on this device, so it is not used"
    )
    if n_old < 2 and n_new < 2 and not hist:
        return (
            f"{head}; with one run per side no case has a floor of its own, so a change beyond the threshold "
            "is 'not judged': give two or more runs per side (OLD1 OLD2 -- NEW1 NEW2) or --history (earlier "
            "runs on this device), or --prior a prior fitted on it"
        )
    return f"{head}: each case's floor is its own run-to-run spread ('not judged' where it has too few runs)"


def _known(values: Sequence[str]) -> str:
    return "/".join(v for v in values if v != "unrecorded") or "unrecorded"


def median_only_note(result: Comparison) -> str:
    """Say when cases could only be judged on medians (no p10: asv results saved without samples)."""
    n = sum(1 for c in result.measured if c.judged.statistic == "median" and c.judged.floor is not None)
    if not n:
        return ""
    return (
        f"note: {n} measurements judged on medians alone, whose floors are wide below 5 us (the results "
        "hold no p10: asv keeps samples with `asv run --record-samples`)"
    )


def _settings_diff(a: set, b: set) -> str:
    parts = []
    for f in ("mode", "flush", "seeds", "timer"):
        va = sorted({getattr(s, f) or "unrecorded" for s in a})
        vb = sorted({getattr(s, f) or "unrecorded" for s in b})
        if va != vb:
            label = "inputs" if f == "seeds" else f
            parts.append(f"{label} {'/'.join(va)} vs {'/'.join(vb)}")
    return "; ".join(parts)


def cli_compare(
    old_paths: Sequence[str | Path],
    new_paths: Sequence[str | Path],
    threshold: float = DEFAULT_THRESHOLD,
    fail_on_regression: bool = True,
    verbose: bool = False,
    history_paths: Sequence[str | Path] = (),
    prior_path: str | Path | None = None,
) -> int:
    """Print the comparison; 1 when something regressed (and that should fail), 2 on bad input."""
    if not 0 <= threshold < 10:
        print(f"dskbench compare: threshold {threshold} is not a fraction (5% is 0.05)", file=sys.stderr)
        return 2
    try:
        prior = load_prior(prior_path) if prior_path is not None else default_prior()
        old, new = load_side(old_paths), load_side(new_paths)
        history = load_side(history_paths, every_commit=True) if history_paths else None
    except (ResultsError, PriorError) as e:
        print(f"dskbench compare: {e}", file=sys.stderr)
        return 2
    if not old or not new:
        side = "old" if not old else "new"
        print(f"dskbench compare: no results in the {side} input", file=sys.stderr)
        return 2
    machines = sorted(set(old.machines()) & set(new.machines()))
    if not machines:
        print(
            "dskbench compare: the sides were measured on different machines (old: "
            f"{', '.join(old.machines())}; new: {', '.join(new.machines())}); timings of two GPU models "
            "are never compared",
            file=sys.stderr,
        )
        return 2
    if not set(old.obs) & set(new.obs):
        print(f"dskbench compare: no case in common on {', '.join(machines)}", file=sys.stderr)
        return 2
    result = compare(old, new, threshold, prior, history)
    for line in describe_side("old", old, machines) + describe_side("new", new, machines):
        print(line)
    for line in notes(old, new, machines, prior, history):
        print(line)
    if median_only_note(result):
        print(median_only_note(result))
    print(result.format_table(verbose=verbose))
    lines = result.by_kernel()
    if lines:
        print("by kernel (each measurement once):")
        print("\n".join(lines))
    lines = result.disagreements()
    if lines:
        print(
            f"timers disagree ({len(lines)}, marked {DISAGREE_MARK}: a second timer read the case outside "
            "the normal band; verdicts still use the recorded numbers):"
        )
        print("\n".join(lines[:40] + ([f"  ... and {len(lines) - 40} more"] if len(lines) > 40 else [])))
    floors = result.floors()
    if floors:
        print("noise floors used: " + ", ".join(f"{k} {n}" for k, n in floors.most_common()))
    print(result.summary())
    bad = result.regressions
    if bad:
        print(f"{len(bad)} regression(s)", file=sys.stderr)
        return 1 if fail_on_regression else 0
    return 0
