"""`dskbench pick`: read the results, pick, and print the Markdown, or write pick.md, pick.html and
pick.json and print a short summary. The model is dskbench.pick.choose; the renderers are beside this."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from dskbench.pick.choose import PHASES, REFERENCE, PickError, check_tp, load_runs, pick
from dskbench.pick.deployment import DeploymentError
from dskbench.pick.json_out import render_json
from dskbench.pick.markdown import render_markdown, render_summary
from dskbench.pick.page import render_html
from dskbench.results.io import ResultsError, Run
from dskbench.shapes.cases import ShapeError


def nothing_measured(runs: Sequence[Run], phase: str | None, batch: list[int] | None, tp: int) -> str:
    """Why a pick has nothing to pick from, in one line: CPU reference timings only, or no record of
    any candidate at the asked points."""
    held = {r["backend"]["name"] for run in runs for r in run.results} - {"-"}
    if held <= {REFERENCE}:
        return (
            "no candidate backend is measured: the results hold torch reference timings only (a CPU run), "
            "which are never picked; measure the kernels with `dskbench run` on a GPU"
        )
    where = (
        f"tp {tp}"
        + (f", {phase}" if phase else "")
        + (f", batch {','.join(map(str, batch))}" if batch else "")
    )
    return (
        f"no candidate backend of the deployment is measured in the results ({where}): nothing to pick; "
        "measure its kernels with `dskbench run`"
    )


def cli_pick(
    paths: list[Path],
    phase: str | None,
    batch: list[int] | None,
    tp: int,
    out: Path | None,
    kv_len: int | None = None,
    device: str | None = None,
) -> int:
    """Print the pick as Markdown; or, with `out`, write pick.md, pick.html and pick.json there and print
    a short summary (the launch command, the step estimate per batch, the files).

    0 on success, 2 on bad input (unreadable results, several devices, a bad deployment file, no
    candidate measured: then no launch command either).
    """
    if phase is not None and phase not in PHASES:
        print(f"dskbench pick: phase {phase!r} is not one of {', '.join(PHASES)}", file=sys.stderr)
        return 2
    try:
        runs, dev = load_runs(paths, device)
        check_tp(runs, tp, [phase] if phase else PHASES)
        result = pick(
            runs,
            dev,
            phases=[phase] if phase else PHASES,
            batches=batch,
            tp=tp,
            kv_len=kv_len,
            inputs=[str(p) for p in paths],
        )
    except (ResultsError, PickError, DeploymentError, ShapeError) as e:
        print(f"dskbench pick: {e}", file=sys.stderr)
        return 2
    if not result.measured():
        print(f"dskbench pick: {nothing_measured(runs, phase, batch, tp)}", file=sys.stderr)
        return 2
    md = render_markdown(result)
    if out is None:
        print(md, end="")
        return 0
    files = {
        "pick.md": md,
        "pick.html": render_html(result),
        "pick.json": json.dumps(render_json(result), indent=1) + "\n",
    }
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text, encoding="utf-8")
    except OSError as e:
        print(f"dskbench pick: cannot write into {out}: {e.strerror}", file=sys.stderr)
        return 2
    print(render_summary(result, [str(out / name) for name in files]), end="")
    return 0
