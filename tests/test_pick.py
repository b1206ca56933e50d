"""dskbench pick on synthetic results: ties, missing and failing backends, path sums, the step estimate,
server flags and the three outputs (the real deployment file and results: test_pick_real.py)."""

from __future__ import annotations

import json
import re

import pytest

from dskbench import paths
from dskbench.analysis.compare import format_number
from dskbench.analysis.verdict import Stat, judge, mann_whitney_p
from dskbench.pick.choose import Picker, ResultIndex, Total, combine, load_runs, pick
from dskbench.pick.command import cli_pick
from dskbench.pick.deployment import load_deployment
from dskbench.pick.json_out import render_json
from dskbench.pick.markdown import render_markdown
from dskbench.pick.page import render_html
from dskbench.pick.tables import total_text
from dskbench.results.io import Run, environment_record, result_record
from dskbench.shapes.cases import default_shapes

H200 = paths.REPO_ROOT / "results" / "h200-2026-11-21"

# -- a small synthetic deployment and results -------------------------------------------------------------

DEPLOYMENT = """
server_flags:
  --moe-runner-backend: {field: moe_runner_backend, choices: [auto, marlin, triton]}
  --sampling-backend: {field: sampling_backend, choices: [flashinfer, pytorch]}
backend_flags:
  samp/flashinfer: {--sampling-backend: flashinfer}
path_sets:
  moe:
    - name: fused
      flags: {--moe-runner-backend: marlin}
      parts:
        - {op: topk, kernel: gatek}
        - {op: experts, kernel: moek, backends: [m1, m2]}
    - name: split
      flags: {--moe-runner-backend: triton}
      parts:
        - {op: topk, kernel: gatek}
        - {op: experts, kernel: alignk}
        - {op: experts, kernel: gemmk}
phases:
  decode:
    - {op: input_layernorm, kernels: [normk], what_if: {normx: cheaper but not this model's}}
    - {op: q_b_proj, kernels: []}
    - {name: attn, op: attn_mqa, kernels: [attk]}
    - {op: act_fn, kernels: [actk, ghost]}
    - {name: MoE, op: topk, ops: [topk, experts], paths: moe}
    - {op: all_reduce, kernels: [ark], min_tp: 2}
    - {op: sampler.forward, scope: step, kernels: [samp]}
    - {op: enorm, scope: nextn, kernels: [normk]}
estimate:
  kv_len: 4096
  layers: {dense: first_k_dense, moe: L_moe}
  speculative: {target_tokens: num_draft_tokens, draft_forwards: num_steps, draft_layer: moe}
"""


def timing(median: float, spread: float = 0.01, n: int = 20) -> dict:
    """Evenly spaced samples median*(1 +- spread): p10/p90 at +-0.8*spread."""
    samples = [median * (1 + spread * (2 * i / (n - 1) - 1)) for i in range(n)]
    return {
        "median_us": median,
        "p10_us": median * (1 - 0.8 * spread),
        "p90_us": median * (1 + 0.8 * spread),
        "samples_us": samples,
        "n_samples": n,
    }


def rec(kernel, op, backend, batch, median=None, *, variant=None, status="ok", reason=None, var="T", kv=None,
        tp=None, phase="decode", run="r1", **tkw) -> dict:  # fmt: skip
    point = {var: batch}
    if kv is not None:
        point["kv_len"] = kv
    if tp is not None:
        point["tp"] = tp
    opv = f"{op}:{variant}" if variant else op
    fields = {
        "case_id": f"{kernel}/{opv}/{phase}/" + ",".join(f"{k}={v}" for k, v in point.items()),
        "kernel": kernel,
        "op": op,
        "variant": variant,
        "phase": phase,
        "point": point,
        "dims": {},
        "backend": {"name": backend, "label": f"{backend} label"},
    }
    if status == "ok":
        fields["timing"] = timing(median, **tkw)
    else:
        fields["reason"] = reason
    return result_record(run, status, **fields)


def run_of(
    records: list[dict], run_id: str = "r1", device: str = "NVIDIA H200", created: str = "2026-01-01"
) -> Run:
    env = environment_record(run_id, created=created, device={"kind": "cuda", "name": device}, versions={})
    return Run(env, [dict(r, run_id=run_id) for r in records])


def scenario() -> list[dict]:
    out = []
    for b, (norm, tie_b) in {1: (2.0, 2.01), 16: (2.0, 3.0)}.items():
        out += [
            rec("normk", "input_layernorm", "b_ok", b, norm),
            rec("normk", "input_layernorm", "b_tie", b, tie_b),
            rec(
                "normk",
                "input_layernorm",
                "b_fast",
                b,
                status="wrong",
                reason="relative error 0.3 > tolerance 0.02",
            ),
            rec("normx", "input_layernorm", "x", b, 1.0),
            rec("actk", "act_fn", "a1", b, 3.0, tp=1),
            rec("gatek", "topk", "g", b, 1.0),
            rec("moek", "experts", "m1", b, 10.0),
            rec("moek", "experts", "m2", b, 12.0),
            rec("alignk", "experts", "al", b, 2.0),
            rec("samp", "sampler.forward", "flashinfer", b, 5.0, var="B"),
            rec("normk", "enorm", "b_ok", b, 4.0),
            rec("attk", "attn_mqa", "fa", b, 10.0, var="B", kv=4096),
            rec("attk", "attn_mqa", "fa", b, 40.0, var="B", kv=32768),
            rec("actk", "act_fn", "a1", b, 99.0, tp=8),  # another tp: ignored at tp=1
        ]
    out.append(rec("gemmk", "experts", "gm", 1, status="error", reason="RuntimeError: boom"))
    out.append(rec("gemmk", "experts", "gm", 16, 1.0))
    # T = 4 (the target model's verify batch at B = 1 with 4 draft tokens)
    out += [
        rec("normk", "input_layernorm", "b_ok", 4, 2.5),
        rec("actk", "act_fn", "a1", 4, 3.5),
        rec("gatek", "topk", "g", 4, 1.5),
        rec("moek", "experts", "m1", 4, 20.0),
        rec("attk", "attn_mqa", "fa", 4, 12.0, var="B", kv=4096),
    ]
    return out


def deployed() -> list[dict]:
    """Records of a candidate of the real deployment file's rows, which the command line's picks read
    (scenario's kernels are the synthetic deployment's only)."""
    return [rec("fused_add_rmsnorm", "input_layernorm", "sgl_kernel", b, 2.0) for b in (1, 4, 16)]


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    p = tmp_path_factory.mktemp("dep") / "deployment.yaml"
    p.write_text(DEPLOYMENT)
    return load_deployment(default_shapes(), p)


@pytest.fixture(scope="module")
def picker(dep):
    return Picker(ResultIndex([run_of(scenario())], "decode", 1), dep, "decode", 1)


def row(picker, name):
    return next(r for r in picker.rows if r.name == name)


# -- ranking ---------------------------------------------------------------------------------------------


def test_wrong_backend_is_excluded_with_its_reason_even_when_fastest(picker):
    c = picker.cell(row(picker, "input_layernorm"), 1, None)
    assert c.winner.name == "b_ok"
    assert [o.name for o in c.excluded] == ["b_fast"]
    assert c.excluded[0].status == "wrong" and "relative error 0.3" in c.excluded[0].reason


def test_tie_inside_the_noise_and_clear_win_outside(picker):
    r = row(picker, "input_layernorm")
    tie = picker.cell(r, 1, None)
    assert tie.runner_up.name == "b_tie" and tie.tie
    assert tie.margin == pytest.approx(0.005)
    clear = picker.cell(r, 16, None)
    assert not clear.tie and clear.margin == pytest.approx(0.5)


def test_tie_needs_the_noise_floor_not_only_the_rank_test():
    """40 samples a side separate a 3% margin at 2 us (the U test alone would call it a win), but
    unchanged code moves more than that between runs: a tie, by the rule compare uses. A 30% margin
    is beyond the noise floor: a win."""
    from dskbench.pick.choose import Outcome, judge_cell
    from dskbench.pick.deployment import PathSpec

    def stat(v: float) -> Stat:
        xs = tuple(v + 0.1 * (2 * i / 39 - 1) for i in range(40))
        return Stat(value=v, lo=v - 0.08, hi=v + 0.08, p10=v - 0.08, p90=v + 0.08, samples=xs)

    a, b, c = stat(2.0), stat(2.06), stat(2.6)
    assert mann_whitney_p(a.samples, b.samples) < 0.001  # the samples alone separate them
    cell = judge_cell([Outcome(PathSpec("a", ()), "ok", a), Outcome(PathSpec("b", ()), "ok", b)], 1, None)
    assert cell.tie and "inside the noise floor" in cell.how and "U test" in cell.how
    assert cell.tie == (judge(a, b, 0.0).verdict != "slower")
    win = judge_cell([Outcome(PathSpec("a", ()), "ok", a), Outcome(PathSpec("c", ()), "ok", c)], 1, None)
    assert not win.tie and "beyond the noise floor" in win.how


def test_what_if_is_shown_never_picked(picker):
    c = picker.cell(row(picker, "input_layernorm"), 1, None)
    assert [o.name for o in c.what_if] == ["normx/x"]
    assert c.what_if[0].median < c.winner.median
    assert c.what_if[0].path.what_if == "cheaper but not this model's"


def test_missing_backend_and_missing_op_are_reported(picker):
    c = picker.cell(row(picker, "act_fn"), 1, None)
    assert c.winner.name == "a1" and c.winner.median == 3.0  # the tp=8 record is not read at tp=1
    assert [o.name for o in c.missing] == ["ghost"] and c.missing[0].status == "missing"
    none = picker.cell(row(picker, "q_b_proj"), 1, None)
    assert none.winner is None and not none.excluded


def test_min_tp_rows_only_with_tensor_parallelism(dep, picker):
    assert "all_reduce" not in [r.name for r in picker.rows]
    tp8 = Picker(ResultIndex([run_of(scenario())], "decode", 8), dep, "decode", 8)
    assert "all_reduce" in [r.name for r in tp8.rows]
    assert tp8.cell(row(tp8, "act_fn"), 1, None).winner.median == 99.0


# -- paths -----------------------------------------------------------------------------------------------


def test_path_sums_its_parts_and_takes_the_fastest_backend_of_a_part(picker):
    c = picker.cell(row(picker, "MoE"), 1, None)
    w = c.winner
    assert w.name == "fused" and w.median == pytest.approx(1.0 + 10.0)
    assert [p.chosen.backend for p in w.parts] == ["g", "m1"]
    # the split path has a failing part at B=1: excluded, with the part's reason
    assert [o.name for o in c.excluded] == ["split"] and "RuntimeError: boom" in c.excluded[0].reason
    c16 = picker.cell(row(picker, "MoE"), 16, None)
    assert [o.name for o in c16.ranked] == ["split", "fused"]
    assert c16.winner.median == pytest.approx(1.0 + 2.0 + 1.0)


def test_combined_spread_adds_half_widths_in_quadrature():
    s = combine([Stat(value=10, lo=9, hi=12), Stat(value=5, lo=2, hi=9, samples=(1.0,) * 9)])
    assert s.value == 15
    assert s.lo == pytest.approx(15 - (1**2 + 3**2) ** 0.5)
    assert s.hi == pytest.approx(15 + (2**2 + 4**2) ** 0.5)
    assert s.samples == ()  # a sum has no raw samples
    one = combine([Stat(value=5, lo=4, hi=6, samples=(5.0,) * 9)])
    assert one.samples == (5.0,) * 9 and (one.lo, one.hi) == (4, 6)


def test_kv_dependent_rows_split_by_kv_len(picker):
    r = row(picker, "attn")
    assert picker.kv_values(r) == [4096, 32768]
    assert picker.cell(r, 1, 32768).winner.median == 40.0


# -- the step estimate -----------------------------------------------------------------------------------


def test_step_estimate_layer_mix_and_speculative(dep):
    p = pick([run_of(scenario())], "NVIDIA H200", phases=["decode"], batches=[1], dep=dep)
    e = p.phases[0].estimates[0]
    assert dep.layer_counts == {"dense": 3, "moe": 58}
    # dense layer: norm 2 + attention 10 (kv_len 4096) + act 3; MoE layer: norm 2 + attention 10 + MoE path 11
    assert e.dense_layer.us == pytest.approx(15.0)
    assert e.moe_layer.us == pytest.approx(23.0)
    assert e.per_step.us == pytest.approx(5.0)
    assert e.step.us == pytest.approx(3 * 15 + 58 * 23 + 5)
    assert e.step.missing == ["q_b_proj"]  # no measurement: counted as lacking, adds nothing
    assert e.contributions["MoE"] == pytest.approx(58 * 11.0)
    assert e.contributions["input_layernorm"] == pytest.approx(61 * 2.0)
    assert sum(e.contributions.values()) == pytest.approx(e.step.us)
    # speculative: target layers at T = 4 (B x 4 draft tokens), 3 NextN forwards (MoE layer + enorm) at T = 1
    target = 3 * (2.5 + 12 + 3.5) + 58 * (2.5 + 12 + 1.5 + 20)
    assert e.spec_step.us == pytest.approx(target + 3 * (23 + 4))
    assert e.spec_step.missing == ["q_b_proj", "q_b_proj @T=4"]  # lacking in the draft and the target


def test_flags_follow_the_per_step_total(dep):
    p = pick([run_of(scenario())], "NVIDIA H200", phases=["decode"], batches=[1, 16], dep=dep)
    flags = {b: {f.flag: f for f in fs} for b, fs in p.phases[0].flags.items()}
    assert flags[1]["--moe-runner-backend"].value == "marlin"  # split has an error at B=1
    assert flags[16]["--moe-runner-backend"].value == "triton"
    assert flags[16]["--moe-runner-backend"].totals["marlin"][0] == pytest.approx(58 * 11.0)
    assert flags[1]["--sampling-backend"].value == "flashinfer"


# -- outputs ---------------------------------------------------------------------------------------------


def test_markdown_html_json(dep):
    p = pick(
        [run_of(scenario())], "NVIDIA H200", phases=["decode"], batches=[1, 16], dep=dep, inputs=["x.jsonl"]
    )
    md = render_markdown(p)
    assert md.startswith("# Backend pick: NVIDIA H200, tp=1")
    table = md.split("### Fastest correct backend per op")[1].split("\n\n")[1].splitlines()
    assert table[0] == "| op | B=1 | B=16 |"
    ln = next(line for line in table if line.startswith("| input_layernorm"))
    assert "**b_ok** 2.00 ≈ b_tie +0.5% tie" in ln and "› b_tie +50.0%" in ln
    assert "| q_b_proj | no measurement | no measurement |" in md
    assert "b_fast: wrong at every point — normk/b_fast: relative error 0.3" in md
    assert "ghost: no measurement at every point" in md
    step = next(line for line in md.splitlines() if line.startswith("| **step** (3 dense + 58 MoE layers"))
    total = 3 * 15 + 58 * 23 + 5  # the measured rows only: q_b_proj lacks a measurement
    assert f"**≥ {format_number(total)} (incomplete: lacks 1 op: q_b_proj)**" in step
    assert not re.search(r"\| \*\*[\d,.]+\*\* ", step)  # no bare number as the step's total
    assert '<td class="incomplete">' in render_html(p)
    html = render_html(p)
    assert html.count("<table>") == md.count("### ") - 1 and "**" not in html  # all but the details list
    d = json.loads(json.dumps(render_json(p)))
    assert d["schema"] == "dskbench.pick/1" and d["device"] == "NVIDIA H200"
    moe = next(r for r in d["phases"]["decode"]["rows"] if r["row"] == "MoE")
    p1 = moe["picks"]["1"]
    assert p1["backend"] == "fused" and p1["flags"] == {"--moe-runner-backend": "marlin"}
    assert [(x["kernel"], x["backend"]) for x in p1["parts"]] == [("gatek", "g"), ("moek", "m1")]
    assert p1["excluded"][0]["backend"] == "split"
    norm = next(r for r in d["phases"]["decode"]["rows"] if r["row"] == "input_layernorm")["picks"]["1"]
    assert norm["tie"] is True and norm["runner_up"]["backend"] == "b_tie"
    assert d["phases"]["decode"]["estimate"]["1"]["step"]["missing"] == ["q_b_proj"]
    assert d["phases"]["decode"]["estimate"]["1"]["step"]["complete"] is False


def test_total_text_marks_a_partial_sum_and_names_what_it_lacks():
    assert total_text(Total(1234.5)) == format_number(1234.5)
    one = total_text(Total(8667.0, ["q_b_proj"]))
    assert one == f"≥ {format_number(8667.0)} (incomplete: lacks 1 op: q_b_proj)"
    many = total_text(Total(10.0, ["a", "b", "c", "d", "e"]))
    assert many == f"≥ {format_number(10.0)} (incomplete: lacks 5 ops: a, b, c, …)"
    assert total_text(Total(0.0, ["a"])) == "– (incomplete: lacks 1 op: a)"
    assert Total(1.0).complete and not Total(1.0, ["a"]).complete


def test_complete_step_is_a_bare_total(tmp_path):
    """With every row measured (q_b_proj added) the step is a plain number, with no mark."""
    recs = scenario() + [rec("qk", "q_b_proj", "cublas", 1, 7.0)]
    f = tmp_path / "deployment.yaml"
    f.write_text(DEPLOYMENT.replace("{op: q_b_proj, kernels: []}", "{op: q_b_proj, kernels: [qk]}"))
    d2 = load_deployment(default_shapes(), f)
    p = pick([run_of(recs)], "NVIDIA H200", phases=["decode"], batches=[1], dep=d2)
    e = p.phases[0].estimates[0]
    assert e.step.complete and e.step.us == pytest.approx(3 * 22 + 58 * 30 + 5)
    md = render_markdown(p)
    step = next(line for line in md.splitlines() if line.startswith("| **step**"))
    assert step.endswith(f"| **{format_number(e.step.us)}** |") and "incomplete" not in step


def test_cli_pick_writes_files_and_rejects_bad_input(tmp_path, capsys):
    from tests.fake_results import write_runs

    f = write_runs([run_of(scenario() + deployed())], tmp_path / "r.jsonl")
    out = tmp_path / "out"
    assert cli_pick([f], "decode", [1, 16], 1, out) == 0
    summary = capsys.readouterr().out
    assert "### " not in summary and "| op |" not in summary  # a summary, not the whole Markdown
    assert {p.name for p in out.iterdir()} == {"pick.md", "pick.html", "pick.json"}
    assert json.loads((out / "pick.json").read_text())["phases"]["decode"]["batches"] == [1, 16]
    assert cli_pick([tmp_path / "nope.jsonl"], None, None, 1, None) == 2
    assert cli_pick([f], "verify", None, 1, None) == 2
    two = write_runs([run_of(scenario()), run_of(scenario(), "r2", "NVIDIA B200")], tmp_path / "two.jsonl")
    assert cli_pick([two], None, None, 1, None) == 2
    assert "several devices" in capsys.readouterr().err
    assert load_runs([two], device="NVIDIA B200")[1] == "NVIDIA B200"


def test_cli_pick_with_no_candidate_measured_says_so_in_one_line(tmp_path, capsys):
    """CPU reference timings (torch-ref only), or results of no candidate at the asked points: one line,
    exit 2, no table and no launch command, nothing written."""
    from tests.fake_results import write_runs

    env = environment_record(
        "c1", created="2026-01-01", device={"kind": "cpu", "name": "CPU box"}, versions={}
    )
    cpu = [rec("fused_add_rmsnorm", "input_layernorm", "torch-ref", b, 90.0) for b in (1, 16)]
    cpu_file = write_runs([Run(env, [dict(r, run_id="c1") for r in cpu])], tmp_path / "cpu.jsonl")
    fakes = write_runs([run_of(scenario())], tmp_path / "fakes.jsonl")
    real = write_runs([run_of(deployed())], tmp_path / "real.jsonl")
    for f, batch, says in (
        (cpu_file, None, "torch reference timings only (a CPU run)"),
        (
            fakes,
            [1],
            "no candidate backend of the deployment is measured in the results (tp 1, decode, batch 1)",
        ),
        (real, [2], "(tp 1, decode, batch 2)"),
    ):
        out = tmp_path / f"out-{f.stem}"
        assert cli_pick([f], "decode", batch, 1, out) == 2
        cap = capsys.readouterr()
        assert cap.out == "" and not out.exists()
        assert cap.err.count("\n") == 1 and cap.err.startswith("dskbench pick: ") and says in cap.err, cap.err
    assert cli_pick([real], "decode", [1], 1, None) == 0  # a candidate measured: the pick and its command
    assert "python -m sglang.launch_server" in capsys.readouterr().out


LAUNCH = "python -m sglang.launch_server --model-path nvidia/DeepSeek-R1-NVFP4-v2"


def test_launch_command_from_the_flag_choices(dep):
    one = pick([run_of(scenario())], "NVIDIA H200", phases=["decode"], batches=[1], tp=1, dep=dep).launch
    assert one.command == f"{LAUNCH} --tp 1 --moe-runner-backend marlin --sampling-backend flashinfer"
    assert one.varies == [] and one.unset == []
    # marlin wins at B=1, triton at B=16: one vote each, the larger batch breaks the tie; the split is said
    two = pick([run_of(scenario())], "NVIDIA H200", phases=["decode"], batches=[1, 16], dep=dep).launch
    assert two.argv[-4:] == ["--moe-runner-backend", "triton", "--sampling-backend", "flashinfer"]
    assert two.varies == ["--moe-runner-backend triton (decode B=1: marlin; decode B=16: triton)"]
    # at tp 8 the command says so
    tp8 = pick([run_of(scenario())], "NVIDIA H200", phases=["decode"], batches=[1], tp=8, dep=dep).launch
    assert tp8.argv[5:7] == ["--tp", "8"]


def test_launch_command_leaves_out_a_flag_without_a_complete_value(dep):
    recs = [r for r in scenario() if r["kernel"] != "gatek"]  # every MoE path lacks its routing part
    lc = pick([run_of(recs)], "NVIDIA H200", phases=["decode"], batches=[1], dep=dep).launch
    assert "--moe-runner-backend" not in lc.argv and lc.unset == ["--moe-runner-backend"]


def test_launch_command_in_every_output(dep):
    p = pick([run_of(scenario())], "NVIDIA H200", phases=["decode"], batches=[1, 16], dep=dep)
    cmd = p.launch.command
    md = render_markdown(p)
    assert f"## Launch command\n\n```sh\n{cmd}\n```" in md
    assert "`dskbench pick --batch N` picks for one load" in md
    assert f"<pre>{cmd}</pre>" in render_html(p)
    assert render_json(p)["launch"]["command"] == cmd


def test_cli_pick_with_out_prints_a_short_summary(tmp_path, capsys):
    from tests.fake_results import write_runs

    f = write_runs([run_of(scenario() + deployed())], tmp_path / "r.jsonl")
    out = tmp_path / "out"
    assert cli_pick([f], "decode", [1, 16], 1, out) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Backend pick: NVIDIA H200, tp=1"
    recs = scenario() + deployed()
    expect = pick([run_of(recs)], "NVIDIA H200", phases=["decode"], batches=[1, 16])  # the real file
    assert lines[2:4] == ["Launch command:", f"  {expect.launch.command}"]
    assert expect.launch.command.startswith(f"{LAUNCH} --tp 1")
    assert "Step estimate, decode (µs; 3 dense + 58 MoE layers + per step):" in lines
    b1 = next(x for x in lines if x.startswith("  B=1 "))
    assert b1 == "  B=1   " + total_text(expect.phases[0].estimates[0].step)
    assert "(incomplete: lacks " in b1  # the fake results lack most of the real rows
    assert any(x.startswith("  B=16 ") for x in lines)
    assert lines[-1] == "Wrote " + ", ".join(str(out / n) for n in ("pick.md", "pick.html", "pick.json"))
    assert len(lines) < 20
    assert (out / "pick.md").read_text().startswith("# Backend pick")
    # without --out: the whole Markdown
    assert cli_pick([f], "decode", [1], 1, None) == 0
    assert capsys.readouterr().out.startswith("# Backend pick: NVIDIA H200, tp=1")


def test_cli_pick_refuses_a_tp_the_results_do_not_hold(tmp_path, capsys):
    from tests.fake_results import write_runs

    f = write_runs([run_of(scenario() + deployed())], tmp_path / "r.jsonl")
    assert cli_pick([f], "decode", [1], 4, None) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    err = cap.err.strip().splitlines()
    assert err == ["dskbench pick: --tp 4: no measurement at tp 4 in the results (they hold tp 1, 8); "
                   "measure it with `dskbench run --tp 4`"]  # fmt: skip
    assert cli_pick([f], "decode", [1], 8, None) == 0  # tp 8 is held (act_fn)
    only_tp_free = write_runs([run_of(deployed()[:1])], tmp_path / "n.jsonl")
    assert cli_pick([only_tp_free], "decode", [1], 8, None) == 0  # nothing depends on tp: no refusal


def test_a_later_skip_does_not_hide_an_earlier_measurement():
    """A full sweep on one GPU records the all-reduce cases `skipped` (needs 4 GPUs) after `dskbench comm`
    measured them: pick keeps the measurement; a later measurement still wins over it."""
    comm = run_of([rec("ar", "all_reduce", "nccl", 1, 9.0, tp=4)], "r0", created="2025-01-01")
    sweep = run_of([rec("ar", "all_reduce", "nccl", 1, status="skipped", reason="needs 4 GPUs", tp=4)], "r1",
                   created="2026-01-01")  # fmt: skip
    idx = ResultIndex([sweep, comm], "decode", 4)
    assert idx.get("all_reduce", None, "ar", "nccl", 1, None).stat.value == 9.0
    again = run_of([rec("ar", "all_reduce", "nccl", 1, 7.0, tp=4)], "r2", created="2026-02-01")
    idx = ResultIndex([sweep, comm, again], "decode", 4)
    assert idx.get("all_reduce", None, "ar", "nccl", 1, None).stat.value == 7.0


def test_latest_run_wins_for_the_same_case():
    old = run_of([rec("normk", "input_layernorm", "b_ok", 1, 9.0)], "r0", created="2025-01-01")
    new = run_of([rec("normk", "input_layernorm", "b_ok", 1, 2.0)], "r1", created="2026-01-01")
    idx = ResultIndex([new, old], "decode", 1)
    assert idx.get("input_layernorm", None, "normk", "b_ok", 1, None).stat.value == 2.0
