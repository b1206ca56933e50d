"""Static reports of results: one self-contained HTML page (inline SVG charts) and a Markdown file.

``write_report(runs, out_dir)`` writes ``index.html`` and ``report.md`` and returns their paths.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path

from dskbench.report import html, markdown
from dskbench.report.model import machines, registry_categories
from dskbench.results.io import Run

__all__ = ["write_report"]


def write_report(
    runs: list[Run],
    out_dir: str | Path,
    categories: Mapping[str, str] | None = None,
    threshold: float = 0.05,
    csv_href: str | None = None,
) -> list[Path]:
    """Write index.html and report.md for the runs into out_dir.

    categories: kernel -> category for the summary; by default read from the kernel registry (a result
    record's own ``category`` field wins when present). threshold: the relative change the history
    section calls a regression (with the noise rule of dskbench compare, dskbench.analysis.verdict). csv_href: the
    CSV of the same results, relative to index.html, linked from the top of the page.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cats = dict(categories) if categories is not None else registry_categories()
    ms = machines(list(runs))
    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    page = out / "index.html"
    page.write_text(html.render(ms, cats, generated, threshold, csv_href), encoding="utf-8")
    md = out / "report.md"
    md.write_text(markdown.render(ms, cats, generated, threshold), encoding="utf-8")
    return [page, md]
