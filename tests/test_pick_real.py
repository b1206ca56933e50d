"""dskbench pick on the real deployment file and the real H200 results: the launch command with speculative
decoding, a candidate a Hopper sweep measures for every row, tp 8, the what-ifs."""

from __future__ import annotations

import json
import re

import pytest

from dskbench import paths
from dskbench.pick.choose import Picker, ResultIndex, load_runs, pick
from dskbench.pick.command import cli_pick
from dskbench.pick.deployment import DeploymentError, load_deployment
from dskbench.pick.json_out import render_json
from dskbench.pick.markdown import render_markdown
from dskbench.pick.page import render_html
from dskbench.shapes.cases import default_shapes
from tests import test_pick
from tests.test_pick import DEPLOYMENT, H200, deployed, rec, row, run_of, scenario

dep, picker = test_pick.dep, test_pick.picker  # its fixtures, used here too

# -- the real deployment file and results ----------------------------------------------------------------


def test_real_deployment_file_is_consistent():
    shapes = default_shapes()
    dep = load_deployment(shapes)
    registry = {p.stem for p in paths.REGISTRY_DIR.glob("*.yaml")}
    for phase, rows in dep.rows.items():
        assert rows, phase
        for r in rows:
            assert r.op in shapes.ops or not (r.kernels or r.paths), (
                f"{r.name}: op {r.op} not in the shapes file"
            )
            named = [p.split("/")[0] for p in r.kernels] + [p.split("/")[0] for p, _ in r.what_if]
            named += [k for p in r.paths for part in p.parts for k in part.kernels]
            for k in named:
                assert "*" in k or k in registry, f"{phase} {r.name}: kernel {k} not in the registry"
            for p in r.paths:
                for part in p.parts:
                    assert part.op in shapes.ops, f"{r.name} path {p.name}: op {part.op}"
    moe = next(r for r in dep.rows["decode"] if r.name.startswith("MoE"))
    assert moe.layers == "moe" and {p.name for p in moe.paths} >= {"marlin", "flashinfer_trtllm"}
    assert dep.layer_counts == {"dense": 3, "moe": 58}


def test_unknown_flag_value_is_refused(tmp_path):
    p = tmp_path / "d.yaml"
    p.write_text(DEPLOYMENT.replace("{--moe-runner-backend: triton}", "{--moe-runner-backend: warp}"))
    with pytest.raises(DeploymentError, match="'warp' is not an accepted value"):
        load_deployment(default_shapes(), p)


@pytest.mark.skipif(not (H200 / "sweep-quick.jsonl.gz").exists(), reason="no H200 evidence in this checkout")
def test_real_h200_results():
    files = [H200 / n for n in ("sweep-quick.jsonl.gz", "r2r-1.jsonl.gz", "r2r-2.jsonl.gz")]
    runs, dev = load_runs(files)
    p = pick(runs, dev)
    dec = p.phases[0]
    assert dev == "NVIDIA H200" and dec.batches == [1, 16, 64, 256]
    by = {rp.label: rp for rp in dec.rows}
    # measured before the fused MoE op existed: SGLang's Marlin MoE fuses the shared expert, so the MoE
    # row has no pick (its unfused Marlin sum is a what-if only) and the step says which op it lacks
    moe = by["MoE (topk + experts)"].cells[1]
    assert moe.winner is None and [o.name for o in moe.what_if] == ["marlin (shared expert unfused)"]
    assert "MoE (topk + experts) (no experts_fused_shared measured)" in dec.estimates[0].step.missing
    assert not dec.estimates[0].step.complete
    assert by["o_proj"].cells[64].winner.name == "marlin"
    md = render_markdown(p)
    assert re.search(r"\| `--moe-runner-backend` \| no value measured for every row \|", md)
    assert "0 (priced with MoE (topk + experts))" in md


def test_insitu_layer_sequence_follows_the_picks(picker):
    """`dskbench insitu` runs the chosen kernels of one layer in execution order (CPU: the plan only)."""
    from dskbench.analysis.insitu import layer_kernels

    steps, missing = layer_kernels(picker, 1, 4096, "moe")
    assert [(row, m.kernel, m.backend) for row, m in steps] == [
        ("input_layernorm", "normk", "b_ok"),
        ("attn", "attk", "fa"),
        ("MoE", "gatek", "g"),
        ("MoE", "moek", "m1"),
    ]
    assert missing == ["q_b_proj"]
    assert steps[1][1].record["point"] == {"B": 1, "kv_len": 4096}  # the exact case the adapter rebuilds


def test_the_html_page_escapes_reasons_and_shares_the_report_stylesheet(dep):
    from dskbench.report.templating import TEMPLATES

    runs = [run_of(scenario())]
    bad = next(r for r in runs[0].results if r["status"] == "wrong")
    bad["reason"] = "<script>alert(1)</script>"
    html = render_html(pick(runs, "NVIDIA H200", phases=["decode"], batches=[1], dep=dep))
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert re.search(r"<style>(.*?)</style>", html, re.S).group(1) == (TEMPLATES / "style.css").read_text()
    assert '<body class="pick">' in html


def test_the_pick_model_never_imports_the_renderers():
    """analysis -> report is the one direction: the model is usable (and testable) without any page."""
    import ast
    from pathlib import Path

    analysis = Path(__file__).resolve().parents[1] / "dskbench" / "analysis"
    reach = []
    for f in sorted(analysis.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            mods = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            reach += [
                f"{f.name}: {m}" for m in mods if m.startswith(("dskbench.report", "dskbench.frontends"))
            ]
    assert reach == []


# -- speculative decoding in the launch command, Hopper candidates, tp 8 ----------------------------------

SPEC_FLAGS = """
  --speculative-algorithm: {field: speculative_algorithm, choices: [EAGLE, NEXTN]}
  --speculative-num-steps: {field: speculative_num_steps, type: int}
  --speculative-num-draft-tokens: {field: speculative_num_draft_tokens, type: int}
backend_flags:"""


def _spec_dep(tmp_path, flags: str):
    text = DEPLOYMENT.replace("\nbackend_flags:", SPEC_FLAGS, 1).replace(
        "draft_layer: moe}", "draft_layer: moe,\n    flags: {" + flags + "}}"
    )
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    return load_deployment(default_shapes(), p)


def test_launch_command_turns_on_speculative_decoding_when_its_rows_are_picked(tmp_path):
    d = _spec_dep(
        tmp_path,
        "--speculative-algorithm: EAGLE, --speculative-num-steps: num_steps, "
        "--speculative-num-draft-tokens: num_draft_tokens",
    )
    assert d.speculative_flags == {
        "--speculative-algorithm": "EAGLE",
        "--speculative-num-steps": "3",  # the shapes file's SGLang defaults, evaluated
        "--speculative-num-draft-tokens": "4",
    }
    lc = pick([run_of(scenario())], "NVIDIA H200", phases=["decode"], batches=[1], dep=d).launch
    assert lc.argv[-6:] == [
        "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"
    ]  # fmt: skip
    assert lc.speculative == [
        "--speculative-algorithm",
        "--speculative-num-steps",
        "--speculative-num-draft-tokens",
    ]
    p = pick([run_of(scenario())], "NVIDIA H200", phases=["decode"], batches=[1], dep=d)
    assert "Speculative decoding (NextN draft layer, EAGLE)" in render_markdown(p)
    assert render_json(p)["launch"]["speculative"] == lc.speculative
    # no NextN/EAGLE row measured (enorm is the only one here): no speculative flags
    plain = [r for r in scenario() if r["op"] != "enorm"]
    lc2 = pick([run_of(plain)], "NVIDIA H200", phases=["decode"], batches=[1], dep=d).launch
    assert not any(a.startswith("--speculative") for a in lc2.argv) and lc2.speculative == []
    # a prefill-only pick never turns it on
    pre = pick([run_of(scenario())], "NVIDIA H200", phases=["prefill"], batches=[1], dep=d).launch
    assert not any(a.startswith("--speculative") for a in pre.argv)


def test_speculative_flag_values_are_checked(tmp_path):
    with pytest.raises(DeploymentError, match="--speculative-algorithm 'MEDUSA' is not an accepted value"):
        _spec_dep(tmp_path, "--speculative-algorithm: MEDUSA")
    with pytest.raises(DeploymentError, match="--speculative-num-steps '-1' is not a positive whole number"):
        _spec_dep(tmp_path, "--speculative-num-steps: num_steps - 4")


def test_real_deployment_turns_on_eagle_with_sglangs_flag_names():
    d = load_deployment(default_shapes())
    assert d.speculative_flags == {
        "--speculative-algorithm": "EAGLE",
        "--speculative-num-steps": "3",
        "--speculative-eagle-topk": "1",
        "--speculative-num-draft-tokens": "4",
    }
    # every flag is a field of sglang 0.5.16's ServerArgs (`--` + the field name, dashes for underscores)
    for flag in d.speculative_flags:
        assert d.server_flags[flag]["field"] == flag[2:].replace("-", "_")


def _part_runs_on_hopper(shapes, reg, phase, op, kernels, variant, backends) -> bool:
    """Whether a sweep plans a case of one of `kernels` at `op` with one of `backends` allowed on sm90
    (the planner's rule: the registry's ops with the adapter's role, else the adapter's own ops)."""
    from dskbench.adapters import get_adapter

    for k in kernels:
        entry, ad = reg.get(k), get_adapter(k)
        if entry is None or ad is None:
            continue
        ops = [o for o in entry.op_names if shapes.ops.get(o) and shapes.ops[o].roles.get(ad.role)]
        if op not in (ops or list(ad.ops)):
            continue
        cases = shapes.cases(k, [op], ad.role, phase, tp=[1, 4, 8])
        if not [c for c in cases if variant is None or c.variant == variant]:
            continue
        if any((backends is None or b.name in backends) and b.requires.allows(90) for b in ad.all_backends()):
            return True
    return False


def test_every_row_of_the_real_deployment_has_a_candidate_a_hopper_sweep_measures():
    """q_b_proj / kv_b_proj (BF16 in this checkpoint) and eh_proj (the NextN projection, a BF16 nn.Linear)
    read cuBLAS BF16 (fp8_scaled_mm's torch.mm.bf16 backend): every row names something the default sweep
    measures on an H100/H200."""
    from dskbench.registry.load import load_registry

    shapes, reg = default_shapes(), load_registry()
    d = load_deployment(shapes)
    lacking = []
    for phase, rows in d.rows.items():
        for r in rows:
            cands = []
            for pat in r.kernels:
                k, _, b = pat.partition("/")
                cands.append([(r.op, (k,), r.variant, (b,) if b else None)])
            cands += [
                [(p.op, p.kernels, p.variant, p.backends) for p in c.parts] for c in r.paths if not c.what_if
            ]
            if not any(all(_part_runs_on_hopper(shapes, reg, phase, *part) for part in c) for c in cands):
                lacking.append(f"{phase} {r.name}")
    assert lacking == []
    eh = next(r for r in d.rows["decode"] if r.name == "eh_proj")
    assert eh.scope == "nextn" and eh.kernels == ("fp8_scaled_mm/torch.mm.bf16",)
    assert shapes.weight_format("eh_proj") == "bf16"


def test_pick_at_tp_8_on_results_with_tp_8_data(tmp_path, capsys):
    """Per-rank shapes measured at tp 8 (the default sweep's tp 1,4,8): `pick --tp 8` reads the tp 8 records
    of the tp-dependent rows and the tp-free rows alike."""
    from tests.fake_results import write_runs

    recs = [r for r in scenario() + deployed() if not (r["op"] == "act_fn" and r["point"].get("tp") == 1)]
    recs += [rec("ark", "all_reduce", "custom", b, 6.0, tp=8) for b in (1, 16)]
    f = write_runs([run_of(recs)], tmp_path / "tp8.jsonl")
    assert cli_pick([f], "decode", [1], 8, tmp_path / "out") == 0
    out = capsys.readouterr().out
    assert out.startswith("Backend pick: NVIDIA H200, tp=8") and re.search(r" --tp 8( |$)", out, re.M)
    assert json.loads((tmp_path / "out" / "pick.json").read_text())["tp"] == 8
    fake = tmp_path / "dep.yaml"
    fake.write_text(DEPLOYMENT)
    dep8 = load_deployment(default_shapes(), fake)
    pk = pick([run_of(recs)], "NVIDIA H200", phases=["decode"], batches=[1], tp=8, dep=dep8)
    by = {rp.row.name: rp for rp in pk.phases[0].rows}
    assert by["act_fn"].cells[1].winner.median == pytest.approx(99.0)  # the tp 8 record
    assert by["all_reduce"].cells[1].winner.median == pytest.approx(6.0)  # min_tp 2: a row at tp 8
    assert by["input_layernorm"].cells[1].winner is not None  # tp-free rows read at any tp
    assert pk.launch.argv[5:7] == ["--tp", "8"]
    assert cli_pick([f], "decode", [1], 1, None) == 2  # no tp 1 record left for act_fn: refused


def test_real_deployment_shows_flashinfer_cutlass_fp8_and_bf16_moe_as_what_ifs():
    """cutlass_fused_moe's FP8 block-scale and BF16 rows (flashinfer_cutlass runner, routing by moe_fused_gate)
    are what-if paths of the real MoE row: shown with their sums, never picked, even when faster."""
    from dskbench.adapters import get_adapter

    dep = load_deployment(default_shapes())
    moe = next(r for r in dep.rows["decode"] if r.name.startswith("MoE"))
    by_name = {p.name: p for p in moe.paths}
    ad = get_adapter("cutlass_fused_moe")
    variants = {v["variant"] for v in default_shapes().ops["experts"].roles[ad.role]}
    for name, variant, backend in [
        ("flashinfer_cutlass (FP8-block weights)", "fp8", "flashinfer.fp8_block"),
        ("flashinfer_cutlass (BF16 weights)", "bf16", "flashinfer.bf16"),
    ]:
        p = by_name[name]
        assert p.what_if and p.flags == {"--moe-runner-backend": "flashinfer_cutlass"}
        assert [(x.op, x.kernels, x.variant, x.backends) for x in p.parts] == [
            ("topk", ("moe_fused_gate",), None, None),
            ("experts", ("cutlass_fused_moe",), variant, (backend,)),
        ]
        assert variant in variants and backend in {b.name for b in ad.all_backends()}
        assert ad.ops == ("experts",)
    recs = []
    for b in (1, 16):
        recs += [
            rec("moe_fused_gate", "topk", "flashinfer", b, 1.0),
            rec("cutlass_fp4_group_mm", "experts_fused_shared", "sglang.fused_marlin_moe", b, 30.0, tp=1),
            # the shared expert (2 + 0.5 + 1 us): the unfused what-ifs run it on their own
            rec(
                "cutlass_scaled_fp4_mm",
                "shared_experts",
                "sglang_jit.marlin",
                b,
                2.0,
                variant="gate_up",
                tp=1,
            ),
            rec("silu_and_mul", "shared_experts", "sgl_kernel", b, 0.5, tp=1),
            rec("cutlass_scaled_fp4_mm", "shared_experts", "sglang_jit.marlin", b, 1.0, variant="down", tp=1),
            rec("cutlass_fused_moe", "experts", "flashinfer.fp8_block", b, 5.0, variant="fp8", tp=1),
            rec("cutlass_fused_moe", "experts", "flashinfer.bf16", b, 8.0, variant="bf16", tp=1),
            rec(
                "cutlass_fused_moe",
                "experts",
                "flashinfer.nvfp4",
                b,
                variant="nvfp4",
                tp=1,
                status="skipped",
                reason="needs sm100",
            ),  # fmt: skip
        ]
    picker = Picker(ResultIndex([run_of(recs)], "decode", 1), dep, "decode", 1)
    cell = picker.cell(row(picker, moe.name), 1, None)
    assert cell.winner.name == "marlin" and cell.winner.median == pytest.approx(31.0)
    shown = {o.name: o.median for o in cell.what_if}
    assert shown["flashinfer_cutlass (FP8-block weights)"] == pytest.approx(6.0 + 3.5)
    assert shown["flashinfer_cutlass (BF16 weights)"] == pytest.approx(9.0 + 3.5)
    p = pick([run_of(recs)], "NVIDIA H200", phases=["decode"], batches=[1], dep=dep)
    assert (
        "what-if faster than the pick: B=1: flashinfer_cutlass (FP8-block weights) (+3 rows) 9.50"
        in render_markdown(p)
    )
    text = json.dumps(render_json(p))
    assert "flashinfer_cutlass (FP8-block weights)" in text and "flashinfer_cutlass (BF16 weights)" in text
    assert p.launch.argv[p.launch.argv.index("--moe-runner-backend") + 1] == "marlin"
