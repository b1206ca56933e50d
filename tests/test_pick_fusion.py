"""Shared-expert fusion in `dskbench pick`: a path with `fuses` is priced with the fused MoE op and the rows
it fuses count 0 in the step ("fused into the routed MoE"); its unfused siblings are priced with those rows'
winners added; a step whose fusing path lacks the fused op is incomplete and names it; the NextN draft fuses
exactly when the target does; the deployment file's keys are checked at load."""

from __future__ import annotations

import pytest

from dskbench.pick.choose import Picker, ResultIndex, pick
from dskbench.pick.deployment import DeploymentError, load_deployment
from dskbench.pick.markdown import render_markdown
from dskbench.pick.tables import total_text
from dskbench.shapes.cases import default_shapes
from tests.test_pick import rec, run_of

DEPLOYMENT = """
server_flags:
  --moe-runner-backend: {field: moe_runner_backend, choices: [auto, marlin, flashinfer_trtllm]}
  --fp4-gemm-backend: {field: fp4_gemm_runner_backend, choices: [auto, marlin, flashinfer_cutlass]}
path_sets:
  moe:
    - name: fused
      flags: {--moe-runner-backend: marlin}
      fuses: ["shared_experts:gate_up", "shared_experts:act"]
      parts:
        - {op: topk, kernel: gatek}
        - {op: experts_fused_shared, kernel: moek}
    - name: split
      flags: {--moe-runner-backend: flashinfer_trtllm}
      parts: [{op: experts, kernel: trtk}]
    - name: fused (unfused)
      flags: {--moe-runner-backend: marlin}
      what_if: the runner fuses the shared expert unless told not to
      parts:
        - {op: topk, kernel: gatek}
        - {op: experts, kernel: moek}
  lin:
    - name: m
      flags: {--fp4-gemm-backend: marlin}
      parts: [{kernel: gk, backends: [m]}]
    - name: f
      flags: {--fp4-gemm-backend: flashinfer_cutlass}
      parts: [{kernel: gk, backends: [f]}]
phases:
  decode:
    - {op: o_proj, paths: lin}
    - {name: MoE, op: topk, ops: [topk, experts], paths: moe}
    - {op: shared_experts, variant: gate_up, paths: lin}
    - {name: "shared_experts:act", op: shared_experts, kernels: [actk]}
estimate:
  kv_len: 4096
  layers: {dense: first_k_dense, moe: L_moe}
"""
SHARED = ("shared_experts:gate_up", "shared_experts:act")


def records(split: float = 11.0, fused: bool = True) -> list[dict]:
    """The fused MoE 1 + 12 us; the shared expert 2 (flashinfer_cutlass GEMM, marlin 4) + 1 us."""
    out = [
        rec("gatek", "topk", "g", 1, 1.0),
        rec("moek", "experts", "m", 1, 10.0),
        rec("trtk", "experts", "t", 1, split),
        rec("gk", "o_proj", "m", 1, 5.0),
        rec("gk", "o_proj", "f", 1, 6.0),
        rec("gk", "shared_experts", "m", 1, 4.0, variant="gate_up"),
        rec("gk", "shared_experts", "f", 1, 2.0, variant="gate_up"),
        rec("actk", "shared_experts", "a", 1, 1.0),
    ]
    if fused:
        out.append(rec("moek", "experts_fused_shared", "m", 1, 12.0))
    return out


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    p = tmp_path_factory.mktemp("fusion") / "deployment.yaml"
    p.write_text(DEPLOYMENT)
    return load_deployment(default_shapes(), p)


def decode(dep, recs):
    return pick([run_of(recs)], "NVIDIA H200", phases=["decode"], batches=[1], dep=dep).phases[0]


def cells(ph):
    return {rp.row.name: rp.cells[1] for rp in ph.rows}


# -- pricing ----------------------------------------------------------------------------------------------


def test_a_fusing_winner_prices_the_fused_op_and_the_fused_rows_count_0(dep):
    p = Picker(ResultIndex([run_of(records())], "decode", 1), dep, "decode", 1)
    assert p.fused_rows(next(r for r in p.rows if r.name == "MoE")) == SHARED
    ph = decode(dep, records())
    moe = cells(ph)["MoE"]
    # the fused path (1 + 12) against the split runner with the shared expert it runs apart (11 + 2 + 1):
    # alone the split runner (11) would look faster than the fused one (13)
    assert moe.winner.name == "fused" and moe.winner.median == pytest.approx(13.0) and not moe.winner.separate
    assert moe.runner_up.name == "split" and moe.runner_up.median == pytest.approx(14.0)
    assert moe.runner_up.separate == SHARED
    e = ph.estimates[0]
    n_dense, n_moe = dep.layer_counts["dense"], dep.layer_counts["moe"]
    assert e.moe_layer.us == pytest.approx(5.0 + 13.0) and e.moe_layer.complete
    assert e.step.us == pytest.approx(n_dense * 5.0 + n_moe * 18.0)
    assert e.folded == {n: "fused into the routed MoE (fused)" for n in SHARED}
    assert all(e.contributions[n] == 0.0 for n in SHARED)
    # the FP4 GEMM flag no longer pays for the fused shared expert: o_proj alone decides it (marlin 5 < 6;
    # with the shared gate_up counted, flashinfer_cutlass would win 8 to 9)
    (fp4,) = [f for f in ph.flags[1] if f.flag == "--fp4-gemm-backend"]
    assert fp4.value == "marlin" and fp4.totals["marlin"][0] == pytest.approx(n_dense * 5 + n_moe * 5)
    md = render_markdown(pick([run_of(records())], "NVIDIA H200", phases=["decode"], batches=[1], dep=dep))
    assert "| shared_experts:act | 0 (fused into the routed MoE (fused)) |" in md
    assert "**fused** 13.00 › split (+2 rows) +7.7%" in md


@pytest.mark.parametrize("split", [11.0, 8.0])
def test_the_insitu_layer_runs_the_shared_expert_only_when_unfused(dep, split):
    from dskbench.analysis.insitu import layer_kernels

    p = Picker(ResultIndex([run_of(records(split))], "decode", 1), dep, "decode", 1)
    steps, missing = layer_kernels(p, 1, 4096, "moe")
    got = [(row, m.kernel, m.op) for row, m in steps]
    shared = [
        ("shared_experts:gate_up", "gk", "shared_experts"),
        ("shared_experts:act", "actk", "shared_experts"),
    ]
    if split == 11.0:  # the fused path: its kernels, then no shared-expert rows
        assert got == [
            ("o_proj", "gk", "o_proj"),
            ("MoE", "gatek", "topk"),
            ("MoE", "moek", "experts_fused_shared"),
        ]
    else:
        assert got == [("o_proj", "gk", "o_proj"), ("MoE", "trtk", "experts"), *shared]
    assert not missing


def test_an_unfused_winner_carries_the_shared_rows_once(dep):
    ph = decode(dep, records(split=8.0))
    moe = cells(ph)["MoE"]
    assert moe.winner.name == "split" and moe.winner.median == pytest.approx(8.0 + 2.0 + 1.0)
    e = ph.estimates[0]
    assert e.moe_layer.us == pytest.approx(5.0 + 11.0)  # the shared rows are in the MoE row, not again
    assert e.folded == {n: "in MoE: split runs it separately" for n in SHARED}
    (fp4,) = [f for f in ph.flags[1] if f.flag == "--fp4-gemm-backend"]
    assert fp4.value == "flashinfer_cutlass"  # the shared gate_up runs, so it counts: 6 + 2 < 5 + 4


def test_results_without_the_fused_op_leave_the_step_incomplete_naming_it(dep):
    recs = [r for r in records(fused=False) if r["kernel"] != "trtk"]
    ph = decode(dep, recs)
    moe = cells(ph)["MoE"]
    # the unfused Marlin sum is shown, never picked
    assert moe.winner is None
    assert [(o.name, o.median) for o in moe.what_if] == [("fused (unfused)", pytest.approx(1 + 10 + 2 + 1))]
    e = ph.estimates[0]
    assert "MoE (no experts_fused_shared measured)" in e.step.missing and not e.step.complete
    assert total_text(e.moe_layer).startswith("≥ 5.00 (incomplete: lacks 1 op: MoE (no experts_fused_shared")
    assert e.folded == {n: "priced with MoE" for n in SHARED}


# -- the NextN draft follows the target ---------------------------------------------------------------------

MOE_ROW = "MoE (topk + experts)"
DRAFT_ROW = "MoE (topk + experts) (NextN, BF16)"


def _real_records(target: str) -> list[dict]:
    """The target's MoE by Marlin (fused) or flashinfer_trtllm (unfused), the draft's BF16 Triton MoE at both
    ops, and the shared-expert rows the unfused paths add."""
    out = [
        rec("moe_fused_gate", "topk", "sgl_kernel", 1, 1.0),
        rec("cutlass_scaled_fp4_mm", "shared_experts", "sglang_jit.marlin", 1, 2.0, variant="gate_up"),
        rec("cutlass_scaled_fp4_mm", "shared_experts", "sglang_jit.marlin", 1, 1.0, variant="down"),
        rec("silu_and_mul", "shared_experts", "sgl_kernel", 1, 0.5),
        rec("fp8_scaled_mm", "shared_experts", "torch.mm.bf16", 1, 3.0, variant="gate_up"),
        rec("fp8_scaled_mm", "shared_experts", "torch.mm.bf16", 1, 1.5, variant="down"),
    ]
    if target == "marlin":
        out.append(rec("cutlass_fp4_group_mm", "experts_fused_shared", "sglang.fused_marlin_moe", 1, 30.0))
    else:
        out.append(rec("trtllm_fp4_block_scale_moe", "experts", "flashinfer", 1, 20.0))
    for op, k in (("experts", 1.0), ("experts_fused_shared", 1.1)):
        out += [
            rec("moe_align_block_size", op, "sgl_kernel", 1, 2.0 * k),
            rec("fused_moe_kernel", op, "sglang_triton", 1, 20.0 * k, variant="gate_up.bf16"),
            rec("silu_and_mul", op, "sgl_kernel", 1, 3.0 * k),
            rec("fused_moe_kernel", op, "sglang_triton", 1, 20.0 * k, variant="down.bf16"),
            rec("moe_sum_reduce", op, "sgl_kernel", 1, 2.0 * k),
        ]
    return out


@pytest.mark.parametrize("target", ["marlin", "flashinfer_trtllm"])
def test_the_draft_fuses_its_shared_expert_exactly_when_the_target_does(target):
    real = load_deployment(default_shapes())
    c = cells(decode(real, _real_records(target)))
    assert c[MOE_ROW].winner.name == target
    fused = target == "marlin"
    draft = c[DRAFT_ROW]
    triton = 1 + 2 + 20 + 3 + 20 + 2
    if fused:
        assert draft.winner.name == "triton (BF16, shared expert fused)"
        assert draft.winner.median == pytest.approx(1 + 1.1 * (triton - 1))
    else:
        # faster alone, the fused draft is not what SGLang runs beside an unfused target: a what-if
        assert draft.winner.name == "triton (BF16)"
        assert draft.winner.median == pytest.approx(triton + 3.0 + 0.5 + 1.5)  # + its BF16 shared expert
        assert [o.name for o in draft.what_if] == ["triton (BF16, shared expert fused)"]
        assert "does not fuse the shared expert" in draft.what_if[0].path.what_if
        assert c[MOE_ROW].winner.median == pytest.approx(20.0 + 2.0 + 0.5 + 1.0)  # + the NVFP4 shared expert


# -- the deployment file ---------------------------------------------------------------------------------


def test_the_real_deployment_fuses_the_shared_expert_where_sglang_does():
    real = load_deployment(default_shapes())
    for phase in ("decode", "prefill"):
        moe = next(r for r in real.rows[phase] if r.name == MOE_ROW)
        by = {p.name: p for p in moe.paths}
        for name in ("marlin", "flashinfer_cutlass"):
            assert by[name].fuses == ("shared_experts:gate_up", "shared_experts:act", "shared_experts:down")
            assert by[name].parts[-1].op == "experts_fused_shared" and not by[name].what_if
            unfused = by[f"{name} (shared expert unfused)"]
            assert unfused.what_if and unfused.parts[-1].op == "experts" and not unfused.fuses
        assert not by["flashinfer_trtllm"].fuses  # SGLang turns the fusion off for the TRT-LLM runners


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("      fuses: [", "      fuse: [", "path_sets.moe[0]: unknown key 'fuse'"),
        ("{op: experts_fused_shared, kernel: moek}", "{op: experts_fused_shared, kernels: moek}",
         "path_sets.moe[0] parts[1]: unknown key 'kernels'"),
        ("{op: o_proj, paths: lin}", "{op: o_proj, path: lin}", "phases.decode[0]: unknown key 'path'"),
        ('"shared_experts:act"]', '"shared_experts:nope"]',
         "row MoE path fused: fuses 'shared_experts:nope', which is no other row of this phase"),
    ],
)  # fmt: skip
def test_bad_keys_and_fused_rows_are_one_line_errors_naming_the_file(tmp_path, old, new, message):
    f = tmp_path / "d.yaml"
    assert old in DEPLOYMENT
    f.write_text(DEPLOYMENT.replace(old, new, 1))
    with pytest.raises(DeploymentError) as err:
        load_deployment(default_shapes(), f)
    text = str(err.value)
    assert text.startswith(str(f)) and message in text and "\n" not in text


def test_fuses_names_a_row_of_its_own_scope(tmp_path):
    f = tmp_path / "d.yaml"
    step_row = "    - {op: sampler.forward, scope: step, kernels: [samp]}\n"
    text = DEPLOYMENT.replace('"shared_experts:act"]', '"sampler.forward"]')
    f.write_text(text.replace("estimate:", step_row + "estimate:"))
    with pytest.raises(DeploymentError, match="fuses 'sampler.forward', a step row"):
        load_deployment(default_shapes(), f)
