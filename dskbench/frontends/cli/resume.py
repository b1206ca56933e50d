"""`dskbench run --out FILE [--resume]`: the results file checked before anything runs, and with
--resume the cases it already holds left out."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any


def open_out(out: Path, args: argparse.Namespace, opts: Any, items: list, skips: list) -> tuple[list, list]:
    """Check --out before anything runs (ours or new; an unfinished last line cut off) and, with
    --resume, drop the cases it already holds. Raises ResultsError with a one-line reason."""
    from dskbench.results.io import (
        RETRIED,
        ResultsError,
        deferred,
        finished_cases,
        latest_by_case,
        prepare_append,
        read_runs,
        settings_differences,
    )

    dropped = prepare_append(out, repair=not args.dry_run)
    if dropped and args.dry_run:
        print(f"{out}: its unfinished last line ({dropped} bytes) would be cut off", file=sys.stderr)
    if not args.resume:
        return items, skips
    if not out.exists():
        print(f"resuming {out}: no such file yet, starting it", file=sys.stderr)
        return items, skips
    try:
        runs = read_runs([out])
    except ResultsError as e:
        raise ResultsError(f"cannot resume: {e}") from None
    differ = "; ".join(settings_differences(runs, dataclasses.asdict(opts)))
    if differ and not args.allow_mixed_settings:
        raise ResultsError(
            f"cannot resume {out}: it was measured with other settings ({differ}); "
            "pass --allow-mixed-settings to add to it anyway"
        )
    if differ:
        print(f"resuming {out} with other settings than its earlier runs ({differ})", file=sys.stderr)
    done = finished_cases(runs, args.retry_errors)
    latest = latest_by_case(runs)
    before = len(items)
    kept = [i for i in items if (i.case_id, i.backend) not in done]
    statuses = [latest.get((i.case_id, i.backend), {}).get("status") for i in items]
    errors = sum(1 for s in statuses if s in RETRIED)
    waited = sum(1 for i in items if deferred(latest.get((i.case_id, i.backend), {})))
    what = " or ".join(_plural(s) for s in RETRIED if s in statuses)  # errors, unstable, errors or unstable
    items = [dataclasses.replace(i, index=n) for n, i in enumerate(kept)]
    skips = [s for s in skips if (s["case_id"], "-") not in done]
    if args.retry_errors:
        note = f", {errors} {what} to run again" if errors else ""
    else:
        note = f" ({errors} of them {what}, kept: --retry-errors runs them again)" if errors else ""
    if waited:
        note += f"; {waited} whose build was deferred to run now"
    print(f"resuming {out}: {before - len(items)} cases already done{note}", file=sys.stderr)
    return items, skips


def _plural(status: str) -> str:
    return {"error": "errors"}.get(status, status)
