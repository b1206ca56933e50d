"""Shape derivations of DeepSeek-R1-NVFP4 ops, sweeps, TP, and the loader's errors."""

from __future__ import annotations

import pytest

from dskbench.exprs import ExprError, evaluate
from dskbench.shapes import ShapeError, canonical_op_name, default_shapes, load_shapes

S = default_shapes()


def gemm(op: str, t: int = 64, tp: int = 1, variant: str | None = None) -> tuple[int, int, int]:
    (v,) = [x for x in S.ops[op].roles["gemm"] if x.get("variant") == variant]
    d = S.eval_role(v, {"T": t, "tp": tp})
    return d["M"], d["K"], d["N"]


@pytest.mark.parametrize(
    ("op", "k", "n"),
    [
        ("fused_qkv_a_proj_with_mqa", 7168, 2112),
        ("q_b_proj", 1536, 24576),
        ("kv_b_proj", 512, 32768),
        ("o_proj", 16384, 7168),
        ("gate", 7168, 256),
        ("gate_up_proj", 7168, 36864),  # config wins: dense intermediate 18432 (the NVFP4 doc says 4096)
        ("down_proj", 18432, 7168),
    ],
)
def test_gemm_derivations_match_the_nvfp4_doc(op, k, n):
    assert gemm(op) == (64, k, n)


def test_shared_expert_and_moe_shapes():
    assert gemm("shared_experts", variant="gate_up") == (64, 7168, 4096)
    assert gemm("shared_experts", variant="down") == (64, 2048, 7168)
    (moe,) = S.ops["experts"].roles["moe"]
    assert S.eval_role(moe, {"T": 8}) == {"T": 8, "H": 7168, "I": 2048, "E": 256, "K": 8, "weight": "nvfp4"}


def test_absorbed_mla_bmm_shapes():
    (kc,) = S.ops["forward_absorb_prepare"].roles["bmm"]
    (vc,) = S.ops["forward_absorb_core"].roles["bmm"]
    # [128, B, 128] x [128, 128, 512] and [128, B, 512] x [128, 512, 128]
    assert {k: v for k, v in S.eval_role(kc, {"T": 32}).items() if k != "variant"} == {
        "b": 128,
        "M": 32,
        "K": 128,
        "N": 512,
    }
    assert {k: v for k, v in S.eval_role(vc, {"T": 32}).items() if k != "variant"} == {
        "b": 128,
        "M": 32,
        "K": 512,
        "N": 128,
    }


def test_tensor_parallel_changes_heads_and_column_parallel_n():
    assert gemm("q_b_proj", tp=8) == (64, 1536, 3072)
    assert gemm("o_proj", tp=4) == (64, 4096, 7168)
    assert gemm("fused_qkv_a_proj_with_mqa", tp=8) == (64, 7168, 2112)  # replicated
    cases = S.cases("k", ["attn_mqa"], "mla_decode", "decode", "quick")
    assert {c.point["tp"] for c in cases} == {1, 8} and {c.dims["Nh"] for c in cases} == {128, 16}
    # ops whose shapes do not depend on tp get no tp variable
    assert all("tp" not in c.point for c in S.cases("k", ["input_layernorm"], "norm", "decode", "quick"))


def test_model_config_and_derived():
    c = S.config
    assert (c["H"], c["Lq"], c["Lkv"], c["Nh"], c["Dn"], c["Dr"], c["Dv"]) == (
        7168,
        1536,
        512,
        128,
        128,
        64,
        128,
    )
    assert (c["I"], c["Id"], c["E"], c["K"], c["n_group"], c["topk_group"]) == (2048, 18432, 256, 8, 8, 4)
    assert c["routed_scaling_factor"] == 2.5 and c["V"] == 129280 and c["L"] == 61 and c["first_k_dense"] == 3
    assert c["Dq"] == 192 and c["Dkv"] == 576 and c["L_moe"] == 58
    assert S.weight_format("o_proj") == "nvfp4" and S.weight_format("q_b_proj") == "bf16"


def test_sweeps():
    assert S.values("decode_tokens") == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert S.values("prefill_tokens")[0] == 512 and S.values("prefill_tokens")[-1] == 16384
    graph = S.values("decode_graph_tokens")
    assert {1, 2, 4, 8, 12, 16, 24, 256, 272, 496, 512} <= set(graph) and graph == sorted(graph)
    assert S.values("kv_lens")[0] == 1024 and S.values("kv_lens")[-1] == 131072
    assert S.values("tp") == [1, 4, 8]
    assert max(S.values("decode_tokens", "cpu")) <= 64
    with pytest.raises(ShapeError, match="unknown profile"):
        S.values("decode_tokens", "huge")
    with pytest.raises(ShapeError, match="unknown sweep"):
        S.cases("k", ["q_b_proj"], "gemm", "nonsense")


def test_cases_are_concrete_and_named():
    cases = S.cases("fp8_scaled_mm", ["q_b_proj"], "gemm", "prefill", "quick", tp=[1])
    assert [c.point["T"] for c in cases] == [2048, 8192]
    assert cases[0].id == "fp8_scaled_mm/q_b_proj/prefill/T=2048,tp=1"
    assert cases[0].dims == {"M": 2048, "K": 1536, "N": 24576, "weight": "bf16"}
    assert S.cases("k", ["q_proj"], "gemm", "decode") == []  # not executed by DeepSeek-R1


def test_op_names_as_traces_write_them():
    assert canonical_op_name("self.input_layernorm()") == "input_layernorm"
    assert canonical_op_name("`experts` (cutlass MoE path)") == "experts"
    assert S.resolve_op("gate (ReplicatedLinear)") == "gate"
    assert S.resolve_op("_forward_fused_qkv_a_proj_with_mqa") == "fused_qkv_a_proj_with_mqa"
    assert S.resolve_op("no_such_op") is None
    assert S.resolve_group("Linear layers (FP8 path)") == S.op_groups["linear"]


def test_expressions_are_exact():
    assert evaluate("Nh * (Dn + Dv) / tp", {"Nh": 128, "Dn": 128, "Dv": 128, "tp": 8}) == 4096
    with pytest.raises(ExprError, match="not exact"):
        evaluate("Nh / tp", {"Nh": 128, "tp": 3})
    with pytest.raises(ExprError, match="unknown name"):
        evaluate("H * X", {"H": 1})
    with pytest.raises(ExprError, match="unsupported"):
        evaluate("__import__('os')", {})


def test_loader_errors(tmp_path):
    with pytest.raises(ShapeError, match="cannot read"):
        load_shapes(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    with pytest.raises(ShapeError, match="not valid YAML"):
        load_shapes(bad)
    bad.write_text("model: {config: {H: 1}}\n")
    with pytest.raises(ShapeError, match="malformed shapes file"):
        load_shapes(bad)
