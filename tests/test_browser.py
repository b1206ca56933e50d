"""The report in a real headless Chromium: charts rendered, no console errors, nothing fetched.

Served from http.server on 127.0.0.1 and driven over the DevTools protocol (tests/browser_check.py,
standard library only). Screenshots go to tests/artifacts/ (git-ignored) for a person to look at.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from fake_results import CATEGORIES, fake_runs

from dskbench.report import write_report
from tests import browser_check as bc

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


CHROMIUM = bc.find_chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install -y chromium)"
)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@needs_chromium
def test_report_renders_in_chromium(tmp_path: Path):
    site = tmp_path / "site"
    write_report(fake_runs(), site, categories=CATEGORIES)
    with bc.serve(site) as base:
        facts = bc.check_report(
            base + "index.html", ARTIFACTS, kernel_id="nvidia-h200--rmsnorm", executable=CHROMIUM
        )
    assert facts["console_errors"] == []
    assert facts["requests"] == [base + "index.html"], "the page fetched something besides itself"
    assert facts["title"] == "dskbench report"
    assert facts["kernels"] == 11  # measured kernels; the unmeasured ones are rows of a folded list
    assert facts["charts"] >= 30 and facts["charts_with_data"] == facts["charts"]
    assert facts["data_paths"] >= 2 * facts["charts"]  # several backends per chart, each a drawn line
    assert (
        facts["throttle_rings"] == 4
    )  # one throttled case on H200 and one on B200, each in latency and GB/s
    assert facts["rings_drawn_as_rings"] and facts["hollow_points"] >= 4  # CSS really applies the marks
    assert facts["error_bars"] > 0 and facts["cpu_banners"] == 3
    assert facts["width"] <= 1400, "the page scrolls sideways"
    top, kernel = (Path(p) for p in facts["shots"])
    w, h = png_size(top)  # the whole page, kernels collapsed
    assert w >= 1200 and h >= 1000
    w, h = png_size(kernel)
    assert w > 1000 and h > 600 and kernel.stat().st_size > 20_000


@needs_chromium
def test_checker_reports_console_errors_and_fetches(tmp_path: Path):
    """The browser check itself can fail: a broken page is caught."""
    site = tmp_path / "bad"
    site.mkdir()
    (site / "index.html").write_text(
        "<!doctype html><html><head><title>bad</title><link rel=icon href='data:,'></head><body>"
        "<img src='missing.png'><script>console.error('boom');throw new Error('kaboom')</script></body></html>"
    )
    with bc.serve(site) as base:
        facts = bc.check_report(base + "index.html", None, executable=CHROMIUM)
    errors = " | ".join(facts["console_errors"])
    assert "boom" in errors and "kaboom" in errors and "404" in errors
    assert base + "missing.png" in facts["requests"]
    assert facts["charts"] == 0
