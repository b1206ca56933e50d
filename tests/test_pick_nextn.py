"""The NextN draft layer in the step estimate: SGLang loads the draft model in BF16, so the deployment file's
NextN rows replace the MoE layer's NVFP4 rows (o_proj, the MoE, the shared experts) for it. Synthetic
results on the real deployment file: the draft's forwards read the BF16 rows, the target's the NVFP4 ones."""

from __future__ import annotations

import pytest

from dskbench.pick.choose import pick
from dskbench.pick.deployment import DeploymentError, load_deployment
from dskbench.shapes.cases import default_shapes
from tests.test_pick import DEPLOYMENT, rec, run_of

MOE_ROW = "MoE (topk + experts)"
BF16_MOE_ROW = "MoE (topk + experts) (NextN, BF16)"


def test_real_deployment_replaces_the_draft_layers_nvfp4_rows_with_bf16_ones():
    dep = load_deployment(default_shapes())
    rows = {r.name: r for r in dep.rows["decode"]}
    replaced = {r.replaces: r for r in rows.values() if r.replaces}
    assert set(replaced) == {"o_proj", MOE_ROW, "shared_experts:gate_up", "shared_experts:down"}
    for name, r in replaced.items():
        assert r.scope == "nextn" and rows[name].scope == "layer"
    for name in ("o_proj", "shared_experts:gate_up", "shared_experts:down"):
        assert replaced[name].kernels == ("fp8_scaled_mm/torch.mm.bf16",)  # cuBLAS BF16
        assert (replaced[name].op, replaced[name].variant) == (rows[name].op, rows[name].variant)
    # the BF16 Triton MoE with the shared expert fused in (what SGLang runs when the target fuses it) and
    # without (when the target's runner turns the fusion off)
    fused, unfused = replaced[MOE_ROW].paths
    for path, op in ((fused, "experts_fused_shared"), (unfused, "experts")):
        assert path.what_if is None and not path.flags
        assert [(p.op, p.kernels[0], p.variant) for p in path.parts] == [
            ("topk", "moe_fused_gate", None),
            (op, "moe_align_block_size", None),
            (op, "fused_moe_kernel", "gate_up.bf16"),
            (op, "silu_and_mul", None),
            (op, "fused_moe_kernel", "down.bf16"),
            (op, "moe_sum_reduce", None),
        ]
    assert fused.fuses == (
        "shared_experts:gate_up (NextN, BF16)",
        "shared_experts:act",
        "shared_experts:down (NextN, BF16)",
    )
    assert not unfused.fuses
    assert "prefill" not in {p for p, rs in dep.rows.items() if any(r.replaces for r in rs)}


def _records(op: str = "experts_fused_shared") -> list[dict]:
    """o_proj and the MoE (at `op`: with the shared expert fused, as SGLang's Marlin runner runs it) at T = 1
    (draft forwards at B = 1) and T = 4 (the target verifying 4 tokens)."""
    out = []
    for t, k in ((1, 1.0), (4, 1.5)):
        out += [
            rec("cutlass_scaled_fp4_mm", "o_proj", "sglang_jit.marlin", t, 5.0 * k),  # NVFP4 (Marlin)
            rec("fp8_scaled_mm", "o_proj", "torch.mm.bf16", t, 7.0 * k),  # BF16 cuBLAS
            rec("moe_fused_gate", "topk", "sgl_kernel", t, 1.0 * k),
            rec("cutlass_fp4_group_mm", op, "sglang.fused_marlin_moe", t, 30.0 * k),
            rec("moe_align_block_size", op, "sgl_kernel", t, 2.0 * k),
            rec("fused_moe_kernel", op, "sglang_triton", t, 20.0 * k, variant="gate_up.bf16"),
            rec("silu_and_mul", op, "sgl_kernel", t, 3.0 * k),
            rec("fused_moe_kernel", op, "sglang_triton", t, 20.0 * k, variant="down.bf16"),
            rec("moe_sum_reduce", op, "sgl_kernel", t, 2.0 * k),
        ]
    return out


def test_the_draft_forwards_read_the_bf16_rows_and_the_target_the_nvfp4_ones():
    dep = load_deployment(default_shapes())
    p = pick([run_of(_records())], "NVIDIA H200", phases=["decode"], batches=[1], dep=dep)
    ph = p.phases[0]
    cells = {rp.row.name: rp.cells[1] for rp in ph.rows}
    assert cells[MOE_ROW].winner.path.name == "marlin"  # the target: NVFP4 (the BF16 Triton path a what-if)
    assert cells[BF16_MOE_ROW].winner.path.name == "triton (BF16, shared expert fused)"  # as the target
    assert cells[BF16_MOE_ROW].winner.median == pytest.approx(1 + 2 + 20 + 3 + 20 + 2)
    assert cells["o_proj (NextN, BF16)"].winner.median == pytest.approx(7.0)
    e = ph.estimates[0]
    counts = dep.layer_counts
    n_layers, n_moe = counts["dense"] + counts["moe"], counts["moe"]
    # without speculative decoding: every layer's o_proj by Marlin, the MoE layers' experts by Marlin
    assert e.step.us == pytest.approx(n_layers * 5.0 + n_moe * 31.0)
    # with it: the target at T = 4 (NVFP4 rows), then 3 draft forwards at T = 1 of the BF16 rows only
    steps = dep.speculative["draft_forwards"]
    assert dep.speculative["target_tokens"] == 4
    target = n_layers * 7.5 + n_moe * 1.5 * 31.0
    assert e.spec_step.us == pytest.approx(target + steps * (7.0 + 48.0))
    assert "o_proj, MoE (topk + experts), shared_experts:gate_up, shared_experts:down" in e.spec_note
    # the draft lacks neither the NVFP4 rows it does not run nor the shared-expert rows its MoE fuses
    assert not {"o_proj", MOE_ROW} & set(e.spec_step.missing)
    assert not any(m.startswith(("o_proj", "MoE", "shared_experts")) for m in e.spec_step.missing)


def test_replaces_names_a_layer_row_and_only_nextn_rows_replace(tmp_path):
    f = tmp_path / "d.yaml"
    row = "    - {name: moe bf16, op: topk, scope: nextn, replaces: MoE, kernels: [gatek]}\n"
    f.write_text(DEPLOYMENT.replace("    - {op: enorm", row + "    - {op: enorm"))
    ok = load_deployment(default_shapes(), f)
    assert next(r for r in ok.rows["decode"] if r.name == "moe bf16").replaces == "MoE"
    f.write_text(DEPLOYMENT.replace("    - {op: enorm", row.replace("MoE", "nope") + "    - {op: enorm"))
    with pytest.raises(DeploymentError, match="replaces 'nope', which is no layer row"):
        load_deployment(default_shapes(), f)
    f.write_text(DEPLOYMENT.replace("{op: act_fn, kernels", "{op: act_fn, replaces: MoE, kernels"))
    with pytest.raises(DeploymentError, match="replaces is for scope nextn rows, not layer"):
        load_deployment(default_shapes(), f)
