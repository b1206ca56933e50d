"""The static report: content, per-machine grouping, marks, history, size; no browser needed."""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from fake_results import (
    CATEGORIES,
    COMMIT_A,
    _bad,
    _case,
    _ok,
    big_run,
    ceilings_for,
    environment,
    fake_runs,
    make_run,
)

from dskbench.report import svg, write_report
from dskbench.report.model import CPU_NOTE, history, machines, panels, pct_of_peak
from dskbench.report.tables import ceiling_facts, fmt_num, overview, problems
from dskbench.results.io import Run, result_record
from dskbench.results.records import STATUSES

SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[str, str]:
    out = tmp_path_factory.mktemp("report")
    paths = write_report(fake_runs(), out, categories=CATEGORIES)
    assert [p.name for p in paths] == ["index.html", "report.md"]
    return paths[0].read_text(encoding="utf-8"), paths[1].read_text(encoding="utf-8")


def kernel_section(page: str, anchor: str) -> str:
    m = re.search(rf'<details class="kernel" id="{re.escape(anchor)}".*?</div></details>', page, re.S)
    assert m, f"no section {anchor}"
    return m.group(0)


def charts(section: str) -> list[ET.Element]:
    return [ET.fromstring(s) for s in re.findall(r"<svg class=\"chart\".*?</svg>", section, re.S)]


def chart_titled(section: str, title: str, index: int = 0) -> ET.Element:
    found = [c for c in charts(section) if c.find(f"{SVG_NS}title").text == title]
    return found[index]


def markers(chart: ET.Element, color: str | None = None) -> list[ET.Element]:
    groups = [g for g in chart.iter(f"{SVG_NS}g") if color is None or g.get("color") == color]
    return [c for g in groups for c in g.iter(f"{SVG_NS}circle") if c.get("class") != "thr"]


def test_page_is_self_contained_and_labelled(report):
    page, _ = report
    assert page.startswith("<!doctype html>")
    assert not re.search(r"(src|href)=\"(https?:)?//", page), "the page must not fetch anything"
    for name in ("NVIDIA H200", "NVIDIA B200", "cpu"):
        assert f"<h2>{name}</h2>" in page
    assert page.count(CPU_NOTE) == 3  # in the machine card, above its overview and above its kernels
    assert "580.95.05" in page and "sglang-kernel 0.4.5" in page and "flashinfer-python 0.6.14" in page
    assert "measured ceilings" in page and "3,870 GB/s (Tensor.copy_ fp32)" in page
    # one collapsible section per measured kernel per machine; the unmeasured ones folded into one list
    assert page.count('<details class="kernel"') == 4 + 5 + 2
    assert page.count('<details class="unmeasured"') == 3


def test_summary_counts_match_latest_results(report):
    page, _ = report
    h200 = next(m for m in machines(fake_runs()) if m.name == "NVIDIA H200")
    recs = list(h200.latest.values())
    expected = [sum(1 for r in recs if r["status"] == s) for s in STATUSES]
    card = page[page.index('id="m-nvidia-h200"') :]
    total = re.search(r'<tr class="total">(.*?)</tr>', card).group(1)
    cells = [int(x) for x in re.findall(r"<td class=\"n[^\"]*\">(\d+)</td>", total)]
    assert cells[-len(STATUSES) :] == expected
    assert expected[1] > 0 and expected[2] > 0 and expected[3] > 0
    assert ">gemm<" in card and ">attention<" in card  # per category


def test_wrong_results_are_not_plotted_and_are_listed(report):
    page, _ = report
    sec = kernel_section(page, "nvidia-h200--fp8-blockwise-scaled-mm")
    lat = chart_titled(sec, "latency")
    triton = svg.color_map(sorted({"flashinfer", "sgl_kernel", "sglang_jit", "sglang_triton", "torch-ref"}))[
        "sglang_triton"
    ]
    assert len(markers(lat, triton)) == 14 - 2  # T=1 and T=8 were wrong
    assert "(wrong at T=1, T=8)" in sec
    assert "relative error 0.31 &gt; tolerance 0.02" in sec
    assert "q_b_proj · decode · T=1, T=8" in sec


def test_throttled_and_unconverged_points_are_marked(report):
    page, _ = report
    sec = kernel_section(page, "nvidia-h200--rmsnorm")
    lat, bw = chart_titled(sec, "latency"), chart_titled(sec, "bandwidth")
    for c in (lat, bw):
        assert len([x for x in c.iter(f"{SVG_NS}circle") if x.get("class") == "thr"]) == 1
        assert len([x for x in c.iter(f"{SVG_NS}circle") if x.get("class") == "h"]) == 1
    assert "throttled (hw_thermal_slowdown)" in sec
    assert "not converged (cv 12.0%)" in sec
    # error bars: one vertical segment per plotted point
    err = [p for p in lat.iter(f"{SVG_NS}path") if p.get("class") == "err"]
    assert sum(p.get("d").count("V") for p in err) == len(markers(lat)) == 42


def test_machines_are_never_mixed(report):
    page, _ = report
    b200 = kernel_section(page, "nvidia-b200--cutlass-scaled-fp4-mm")
    assert len(markers(chart_titled(b200, "latency"))) == 14
    h200 = re.search(r'<tr id="nvidia-h200--cutlass-scaled-fp4-mm">.*?</tr>', page).group(0)
    assert "needs sm100/sm103 (found sm90)" in h200  # nothing measured on sm90: in the folded list
    for m in machines(fake_runs()):
        devices = {r.environment["device"]["name"] for r in m.runs}
        assert devices == {m.name}


def test_history_and_regression_dashboard(report):
    page, md = report
    rms = kernel_section(page, "nvidia-h200--rmsnorm")
    assert "History across 2 points (aaaaaaa1 → bbbbbbb1)" in rms
    assert "14 regressions vs aaaaaaa1" in rms
    hist = chart_titled(rms, "latency per point (commit or release), relative to the first point measured")
    assert [t.text for t in hist.iter(f"{SVG_NS}text") if t.get("class") == "xt"] == ["aaaaaaa1", "bbbbbbb1"]
    assert "History" not in kernel_section(page, "nvidia-b200--rmsnorm")  # one commit only
    dash = page[page.index("Changes on NVIDIA H200") :]
    row = re.search(r'<a href="#nvidia-h200--silu-and-mul">.*?</tr>', dash).group(0)
    assert re.findall(r">(\d+)</td>", row)[:3] == ["42", "14", "14"]  # series, slower/broke, faster/fixed
    assert "Changes aaaaaaa1 → bbbbbbb1" in md
    assert "| rmsnorm | input_layernorm/decode/T=1 | sgl_kernel |" in md


def test_markdown_has_the_tables(report):
    _, md = report
    assert md.startswith("# dskbench report")
    assert f"> **{CPU_NOTE}**" in md
    assert "| category | kernels | cases | backends | ok | wrong | skipped | error |" in md
    assert "#### attn_mqa:absorbed · decode · kv_len=1024" in md
    assert "- **error** · sglang_triton · out of memory" in md
    assert "⚠ throttled (hw_thermal_slowdown)" in md
    assert "**flashinfer** ★" in md


def test_report_of_3000_results_stays_small_and_fast(tmp_path: Path):
    run = big_run(3000)
    t0 = time.monotonic()
    page, md = write_report([run], tmp_path, categories={})
    elapsed = time.monotonic() - t0
    size = page.stat().st_size
    n_kernels = len({r["kernel"] for r in run.results})
    assert page.read_text().count('<details class="kernel"') == n_kernels
    assert size < 3000 * 1000, f"{size / 1e6:.1f} MB for 3000 results"
    assert md.stat().st_size < 500_000
    assert elapsed < 10


def test_panels_pick_the_sweep_axis_and_split_fixed_variables():
    run = make_run("x", "h200", COMMIT_A, "2026-01-01T00:00:00+00:00")
    mla = [r for r in run.results if r["kernel"] == "BatchMLAPagedAttentionWrapper"]
    ps = panels(mla)
    assert [(p.x_var, p.fixed) for p in ps] == [("B", {"kv_len": k}) for k in (1024, 4096, 16384)]
    assert ps[-1].ok.keys() == {"flashinfer", "sglang_triton"}
    assert len(ps[-1].ok["sglang_triton"]) == 3  # B=128 ran out of memory
    rms = [r for r in run.results if r["kernel"] == "rmsnorm"]
    (p,) = panels(rms)  # decode and prefill cover different T: one chart
    assert p.phases == ["decode", "prefill"] and p.x_var == "T"
    dup = rms + [{**r, "phase": "decode_graph"} for r in rms if r["phase"] == "decode"]
    assert [q.phases for q in panels(dup)] == [["decode"], ["prefill"], ["decode_graph"]]


def test_history_needs_two_commits_and_keeps_broken_series():
    runs = fake_runs()
    h200 = next(m for m in machines(runs) if m.name == "NVIDIA H200")
    h = history(h200, "silu_and_mul")
    assert [c[1] for c in h.commits] == ["aaaaaaa1", "bbbbbbb1"]
    verdicts = {(case, b): v for case, b, v, *_ in h.changes()}
    assert verdicts[("silu_and_mul/mlp.act_fn/decode/T=1", "sglang_jit")] == "broke"
    assert verdicts[("silu_and_mul/mlp.act_fn/decode/T=1", "flashinfer")] == "faster"
    b200 = next(m for m in machines(runs) if m.name == "NVIDIA B200")
    assert history(b200, "rmsnorm") is None


def test_problems_are_grouped_by_reason():
    run = make_run("x", "h200", COMMIT_A, "2026-01-01T00:00:00+00:00")
    probs = problems([r for r in run.results if r["kernel"] == "cutlass_scaled_fp4_mm"])
    assert len(probs) == 1 and len(probs[0].cases) == 14
    assert probs[0].where(limit=3).startswith("o_proj · decode · T=1, T=2, T=4, … (9 cases)")


def test_text_is_escaped(tmp_path: Path):
    run = make_run("x", "h200", COMMIT_A, "2026-01-01T00:00:00+00:00")
    bad = next(r for r in run.results if r["status"] == "error")
    bad["reason"] = "<script>alert(1)</script>"
    page = write_report([run], tmp_path, categories={})[0].read_text()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_pct_of_peak_is_of_the_datasheet():
    from dskbench.measure.metrics import metrics

    usable = {"converged": True, "throttled": False}
    ceil = {"bandwidth_gbps": 5000.0, "bf16_tflops": 1600.0, "copy": usable, "bf16_matmul": usable}
    m = metrics(10.0, 40_000_000, 8e9, ceil, {"hbm_gbps": 8000.0, "bf16_tflops": 2250.0})
    assert pct_of_peak(m) == (pytest.approx(50.0), pytest.approx(100.0 * 800 / 2250))
    no_sheet = metrics(10.0, 40_000_000, None, ceil, None)  # measured alone is not a % of peak
    assert no_sheet["pct_bw_measured"] == pytest.approx(80.0) and pct_of_peak(no_sheet) == (None, None)
    assert pct_of_peak({"pct_bw_datasheet": 70.0, "pct_bw_measured": 75.0}) == (70.0, None)
    assert pct_of_peak({"pct_dram_measured": 75.0}) == (None, None)  # one key per quantity, no guessing
    assert pct_of_peak(None) == (None, None)


def test_ceilings_are_shown_with_their_method():
    facts = dict(ceiling_facts(ceilings_for("h200")))
    assert facts["copy bandwidth"] == "3,870 GB/s (Tensor.copy_ fp32)"
    assert facts["fp8 matmul"] == "1,386 TFLOP/s (torch._scaled_mm fp8; ⚠ throttled)"
    failed = dict(
        ceiling_facts({"bandwidth_gbps": 100.0, "fp8_tflops": None, "fp8_matmul": {"error": "needs sm89+"}})
    )
    assert failed == {"copy bandwidth": "100 GB/s", "fp8 matmul": "not measured: needs sm89+"}
    assert ceiling_facts(None) == []


def test_svg_chart_is_valid_and_scaled():
    s = [
        svg.Series(
            "a", "#000", [svg.Point(x, 10.0 * x, 9.0 * x, 11.0 * x, tip="<a>") for x in (1, 4, 16, 64)]
        ),
        svg.Series("b", "#111", [svg.Point(1, 0.0)]),  # a zero cannot go on a log axis: dropped
    ]
    root = ET.fromstring(svg.line_chart(s, "t", svg.Axis("T", log=True), svg.Axis("us", log=True)))
    assert root.get("data-points") == "4"
    path = next(p for p in root.iter(f"{SVG_NS}path") if p.get("class") == "series")
    xs = [float(v) for v in re.findall(r"[ML]([\d.]+) ", path.get("d"))]
    gaps = [b - a for a, b in zip(xs, xs[1:], strict=False)]
    assert max(gaps) - min(gaps) < 0.2  # powers of 4 are evenly spaced on a log axis
    # a wild p90 (a noisy CPU sample) widens the range by at most 3x and is clipped at the plot's edge
    wild = [svg.Series("a", "#000", [svg.Point(1, 10.0, 9.0, 20_000.0), svg.Point(2, 20.0, 19.0, 21.0)])]
    root = ET.fromstring(svg.line_chart(wild, "t", svg.Axis("T"), svg.Axis("us")))
    ticks = [float(t.text) for t in root.iter(f"{SVG_NS}text") if t.get("class") == "yt"]
    assert max(ticks) <= 60
    bar = next(p for p in root.iter(f"{SVG_NS}path") if p.get("class") == "err").get("d")
    plot = next(root.iter(f"{SVG_NS}rect"))
    top = float(plot.get("y"))
    assert min(float(v) for v in re.findall(r"V([\d.]+)", bar)) >= top
    empty = svg.line_chart([], "t", svg.Axis("T"), svg.Axis("us"))
    assert "no data" in empty
    ET.fromstring(empty)


def test_ticks_and_numbers():
    assert svg.nice_ticks(0, 87) == [0, 20, 40, 60, 80, 100]
    assert svg.nice_ticks(0, 80) == [0, 20, 40, 60, 80]
    assert svg.nice_ticks(0.95, 1.26) == [0.9, 1.0, 1.1, 1.2, 1.3]
    assert svg.log_ticks(16, 11000) == [10, 100, 1000, 10000]
    assert svg.fmt_tick(8192) == "8k" and svg.fmt_tick(0.5) == "0.5" and svg.fmt_tick(1000) == "1k"
    assert [fmt_num(x) for x in (0.01234, 2.345, 12.34, 1234.5, None)] == [
        "0.0123",
        "2.35",
        "12.3",
        "1,234",
        "–",
    ]


def test_minimal_records_render(tmp_path: Path):
    """Records as a crashed worker or a bare run leaves them: no op, point, metrics, clocks or git."""
    from dskbench.results.io import Run, environment_record, result_record

    env = environment_record(
        "m", created="2026-01-01T00:00:00+00:00", device={"kind": "cuda", "name": "GPU X"}, versions={}
    )
    recs = [
        result_record("m", "error", case_id="k/op/decode/T=1", kernel="k", backend={"name": "b"}, reason="worker died"),
        result_record("m", "ok", case_id="k/op/decode/T=2", kernel="k", op="op", phase="decode", point={"T": 2},
                      backend={"name": "b"}, timing={"median_us": 3.0}),
    ]  # fmt: skip
    page, md = write_report([Run(env, recs)], tmp_path, categories={})
    text = page.read_text()
    assert "worker died" in text and "GPU X" in text and 'data-points="1"' in text
    assert "| 2 | b | 3.00 | – |" in md.read_text()


# -- landing overview, folded skips, merged twins, CSV link, peak lines ------------------------------------


def _landing_run() -> Run:
    """rmsnorm measured for input_layernorm, enorm/hnorm recorded as its copies; a GEMM whose faster
    backend is wrong at T=2; a GEMM on the prefill only; two kernels skipped at planning."""
    import random

    rng = random.Random(3)
    recs = []
    for t in (1, 2, 4):
        src = _case("rmsnorm", "input_layernorm", "decode", {"T": t}, {"T": t, "D": 7168})
        for b, base in (("sgl_kernel", 3.0), ("flashinfer", 2.0)):
            rec = _ok(rng, "h200", src, b, 2 * t * 7168 * 2, 0, base, 0.8)
            recs.append(rec)
            for twin in ("enorm", "hnorm"):
                copy = {**rec, **_case("rmsnorm", twin, "decode", {"T": t}, {"T": t, "D": 7168})}
                recs.append({**copy, "shared_with": src["case_id"]})
        q = _case("rmsnorm", "q_a_layernorm", "decode", {"T": t}, {"T": t, "D": 1536})
        recs.append(_ok(rng, "h200", q, "sgl_kernel", 2 * t * 1536 * 2, 0, 1.0, 0.8))
        n, k = 24576, 1536
        g = _case("fp8_blockwise_scaled_mm", "q_b_proj", "decode", {"T": t}, {"M": t, "N": n, "K": k})
        nbytes, flops = t * k + n * k + t * n * 2, 2 * t * n * k
        if t == 2:
            recs.append(_bad(g, "sglang_triton", "wrong", "relative error 0.31 > tolerance 0.02"))
            late = _case("fp8_blockwise_scaled_mm", "q_b_proj", "decode", {"T": 8}, {"M": 8, "N": n, "K": k})
            recs.append(_bad(late, "sglang_triton", "wrong", "relative error 0.5 > tolerance 0.02"))
            recs.append(_bad(late, "sgl_kernel", "error", "RuntimeError: CUDA error"))
        else:
            recs.append(_ok(rng, "h200", g, "sglang_triton", nbytes, flops, 1.0, 0.9))
        recs.append(_ok(rng, "h200", g, "sgl_kernel", nbytes, flops, 30.0, 0.7))
    pre = _case("fp8_blockwise_scaled_mm", "o_proj", "prefill", {"T": 512}, {"M": 512, "N": 7168, "K": 16384})
    recs.append(_ok(rng, "h200", pre, "sgl_kernel", 10**8, 2 * 512 * 7168 * 16384, 30.0, 0.7))
    for name, why in (
        ("nsa_indexer", "not-in-model: DeepSeek-V3.2 only"),
        ("kv_io", "no adapter for this kernel yet"),
    ):
        recs.append(
            {"kernel": name, "case_id": name, "backend": {"name": "-"}, "status": "skipped", "reason": why}
        )
    env = environment("land", "h200", COMMIT_A, "2026-01-11T00:00:00+00:00")
    return Run(env, [result_record("land", r.pop("status"), **r) for r in recs])


@pytest.fixture(scope="module")
def landing(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("landing")
    return write_report([_landing_run()], out, categories={}, csv_href="results.csv")[0].read_text()


def test_overview_names_the_fastest_correct_backend(landing):
    (t,) = overview(machines([_landing_run()])[0], {})
    assert t.x_var == "T" and t.xs == [1, 2, 4, 8]
    rows = {(r.kernel, r.names): r for r in t.rows}
    assert set(rows) == {
        ("rmsnorm", "input_layernorm / enorm / hnorm"),
        ("rmsnorm", "q_a_layernorm"),
        ("fp8_blockwise_scaled_mm", "q_b_proj"),
    }  # the prefill-only o_proj has no decode row
    gemm = rows[("fp8_blockwise_scaled_mm", "q_b_proj")].cells
    assert [gemm[x].backend for x in (1, 2, 4)] == ["sglang_triton", "sgl_kernel", "sglang_triton"]
    assert gemm[1].others[0][0] == "sgl_kernel" and gemm[1].pct is not None
    assert 8 not in gemm and rows[("fp8_blockwise_scaled_mm", "q_b_proj")].failed == {8: "wrong/error"}
    norm = rows[("rmsnorm", "input_layernorm / enorm / hnorm")].cells
    assert {c.backend for c in norm.values()} == {"flashinfer"}
    # in the page: the table sits above the kernel sections, its cells link to the panels' ids
    ov = landing[landing.index('<div class="card overview"') : landing.index('<details class="kernel"')]
    row = re.search(r"<tr[^>]*><td class=\"op\">q_b_proj</td>.*?</tr>", ov).group(0)
    winners = re.findall(r"</i>([\w.\-]+)<br>", row)
    assert winners == ["sglang_triton", "sgl_kernel", "sglang_triton"]
    assert "no correct result<br>wrong/error" in row
    for target in re.findall(r'href="#([^"]+)"', ov):
        assert f'id="{target}"' in landing, target


def test_kernels_skipped_at_planning_are_folded(landing):
    assert landing.count('<details class="kernel"') == 2  # rmsnorm and the GEMM
    folded = re.search(r'<details class="unmeasured".*?</details>', landing, re.S).group(0)
    assert "2 kernels not measured (skipped)" in folded
    assert "nsa_indexer" in folded and "DeepSeek-V3.2 only" in folded and "no adapter" in folded
    assert landing.index('<details class="unmeasured"') > landing.rindex('<details class="kernel"')


def test_identical_shape_panels_are_merged(landing):
    sec = kernel_section(landing, "nvidia-h200--rmsnorm")
    heads = re.findall(r"<h4>(.*?)</h4>", sec)
    assert len(heads) == 2  # input_layernorm (with its twins) and q_a_layernorm: different shapes
    assert heads[0].startswith("input_layernorm / enorm / hnorm · decode")
    assert "same shapes, measured once" in heads[0]
    assert "q_a_layernorm" in heads[1] and "same shapes" not in heads[1]
    # without dims nothing is called the same
    recs = [dict(r) for r in machines([_landing_run()])[0].records("rmsnorm")]
    for r in recs:
        r.pop("dims", None)
    assert len(panels(recs)) == 4


def test_csv_link_and_peak_lines(landing, tmp_path: Path):
    assert '<a class="csv" href="results.csv">' in landing
    sec = kernel_section(landing, "nvidia-h200--fp8-blockwise-scaled-mm")
    compute = chart_titled(sec, "compute")
    assert compute.find(f"{SVG_NS}path[@class='ref']") is not None
    label = compute.find(f"{SVG_NS}text[@class='refl']").text
    assert label.startswith("datasheet ") and label.endswith(" TFLOP/s")
    page = write_report([_landing_run()], tmp_path, categories={})[0].read_text()
    assert 'class="csv"' not in page  # linked only where one is written


def test_markdown_has_the_overview_and_the_folded_list(tmp_path: Path):
    md = write_report([_landing_run()], tmp_path, categories={})[1].read_text()
    row = next(line for line in md.splitlines() if line.startswith("| q_b_proj |"))
    cells = [c.strip().split(" ")[0] for c in row.strip("|").split("|")][2:]
    assert cells == ["sglang_triton", "sgl_kernel", "sglang_triton", "no"]
    assert row.rstrip(" |").endswith("no correct result (wrong/error)")
    assert "### Not measured (2 kernels, skipped)" in md and "- **kv_io** — no adapter" in md
    assert "### kv_io" not in md and "#### input_layernorm / enorm / hnorm · decode" in md


# -- the templates ----------------------------------------------------------------------------------------


def _style(page: str) -> str:
    return re.search(r"<style>(.*?)</style>", page, re.S).group(1)


def test_the_page_inlines_the_one_shared_stylesheet_and_stays_compact(report):
    from dskbench.report.templating import TEMPLATES

    page, _ = report
    assert _style(page) == (TEMPLATES / "style.css").read_text()
    assert "svg.chart .s circle.thr" in _style(page)  # the charts' styles are in it too
    markup = re.sub(r"<(style|script)>.*?</\1>", "", page, flags=re.S)
    assert markup.count("\n") == 1 and markup.endswith("</html>\n")  # template indentation is dropped


def test_templates_ship_as_package_data():
    from fnmatch import fnmatch

    from dskbench.report.templating import TEMPLATES

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((TEMPLATES.parents[2] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["dskbench.report"]
    files = [f.relative_to(TEMPLATES.parent).as_posix() for f in TEMPLATES.rglob("*") if f.is_file()]
    assert {"templates/base.html.j2", "templates/style.css", "templates/pick.html.j2"} <= set(files)
    assert [f for f in files if not any(fnmatch(f, p) for p in patterns)] == []
    assert any(d.startswith("jinja2") for d in pyproject["project"]["dependencies"])


# -- the command: its default folder and its one-line refusals -------------------------------------------


def test_report_command_defaults_to_the_main_jobs_folder_name(tmp_path: Path, monkeypatch, capsys):
    """`dskbench report results/run-STAMP.jsonl` writes out/report-STAMP, the folder the main job writes
    for that file; another name keeps its stem."""
    from fake_results import write_runs

    from dskbench.frontends import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    src = write_runs(fake_runs()[:1], tmp_path / "results" / "run-20270101T000000Z.jsonl")
    assert cli.main(["report", str(src)]) == 0
    written = capsys.readouterr().out.split()
    assert written == [f"out/report-20270101T000000Z/{n}" for n in ("index.html", "report.md", "results.csv")]
    assert all((tmp_path / p).is_file() for p in written)
    other = write_runs(fake_runs()[:1], tmp_path / "sweep-a.jsonl")
    assert cli.main(["report", str(other)]) == 0
    assert capsys.readouterr().out.split()[0] == "out/report-sweep-a/index.html"


def test_report_command_refuses_empty_input_and_a_file_as_out(tmp_path: Path, capsys):
    from fake_results import write_runs

    from dskbench.frontends import cli
    from dskbench.results.io import environment_record

    def one_line(argv: list[str], *parts: str) -> None:
        assert cli.main(argv) == 2
        captured = capsys.readouterr()
        err = captured.err
        assert err.count("\n") == 1 and err.startswith("dskbench report: ") and "Traceback" not in err, err
        assert all(p in err for p in parts), err
        assert captured.out == ""

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    one_line(["report", str(empty), "--out", str(tmp_path / "r1")], "no result records in", "empty.jsonl")
    env_only = tmp_path / "env-only.jsonl"
    env = environment_record("r0", created="2027-01-01T00:00:00+00:00", device={"kind": "cpu"}, versions={})
    write_runs([Run(env)], env_only)
    one_line(["report", str(env_only), "--out", str(tmp_path / "r2")], "no result records in")
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()
    src = write_runs(fake_runs()[:1], tmp_path / "a.jsonl")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me\n")
    one_line(["report", str(src), "--out", str(a_file)], f"--out {a_file}: is a file")
    assert a_file.read_text() == "keep me\n"
    one_line(["report", str(src), "--out", str(a_file / "sub")], "cannot write the report into")
    one_line(["report", str(tmp_path / "nope.jsonl")], "nope.jsonl")
