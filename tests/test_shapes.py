"""Shape derivations of DeepSeek-R1-NVFP4 ops, sweeps, TP, and the loader's errors."""

from __future__ import annotations

import pytest

from dskbench import paths
from dskbench.shapes.cases import ShapeError, canonical_op_name, default_shapes, load_shapes
from dskbench.shapes.exprs import ExprError, evaluate
from dskbench.shapes.schema import ROLES

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
    bad.write_text("model: {config: {H: 1}}\nsweeps: a: b\n")
    with pytest.raises(ShapeError, match=r"bad.yaml:2: not valid YAML: mapping values are not allowed here$"):
        load_shapes(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ShapeError, match="expected a mapping at the top level"):
        load_shapes(bad)
    bad.write_text("model: {config: {H: 1}}\n")
    with pytest.raises(ShapeError, match="bad.yaml: missing key 'sweeps'"):
        load_shapes(bad)


# -- the schema: an edited shapes file fails at load with one line naming the key ------------------

# (text in the committed file, its replacement, the whole message after "FILE: ")
BAD_EDITS = [
    # a typo'd key would drop the op from every sweep
    (
        "  q_b_proj:\n    phases:",
        "  q_b_proj:\n    phase:",
        "ops.q_b_proj.phase: unknown key; did you mean 'phases'?",
    ),
    (
        "  sampler.forward:\n    aliases:",
        "  sampler.forward:\n    alias:",
        "ops.\"sampler.forward\".alias: unknown key; did you mean 'aliases'?",
    ),
    ("\nsweeps:\n", "\nsweep:\n", "sweep: unknown key; did you mean 'sweeps'?"),
    (
        "    num_steps: 3",
        "    num_step: 3",
        "model.speculative.num_step: unknown key; did you mean 'num_steps'?",
    ),
    # a typo'd CPU cap would run the full list on a CPU
    (
        "cpu:\n  decode_tokens: [1, 16]",
        "cpu:\n  decode_token: [1, 16]",
        "cpu.decode_token: unknown sweep list; did you mean 'decode_tokens'?",
    ),
    (
        "  kv_lens: [1024]\n  tp: [1]\n",
        "  tp: [1]\n",
        "cpu: missing 'kv_lens' (the CPU cap names every sweep list)",
    ),
    # sweep values are positive integers, each once
    (
        "  decode_tokens: [1, 2, 4,",
        "  decode_tokens: [1, 1.5, 4,",
        "sweeps.decode_tokens[1]: expected a positive integer, got 1.5",
    ),
    (
        "  decode_tokens: [1, 2, 4,",
        "  decode_tokens: [-1, 2, 4,",
        "sweeps.decode_tokens[0]: expected a positive integer, got -1",
    ),
    (
        "  decode_tokens: [1, 2, 4,",
        "  decode_tokens: [1, '2', 4,",
        "sweeps.decode_tokens[1]: expected a positive integer, got '2'",
    ),
    ("  decode_tokens: [1, 2, 4,", "  decode_tokens: [1, 1, 4,", "sweeps.decode_tokens: 1 appears twice"),
    ("  attn_batch: [1, 4]", "  attn_batch: []", "cpu.attn_batch: expected a non-empty list"),
    # a tp the model's heads do not divide by
    (
        "  tp: [1, 4, 8]",
        "  tp: [1, 3, 8]",
        "ops.kv_b_proj.roles.gemm[0].N: 'Nh * (Dn + Dv) / tp': 32768 / 3 is not exact at T=512, tp=3 "
        "(prefill sweep, full profile)",
    ),
    # model symbols
    (
        "    Dv: 128            # v_head_dim\n",
        "",
        "model.config: missing 'Dv' (a model symbol dskbench reads)",
    ),
    (
        "    Dq: Dn + Dr",
        "    Dq: Dnn + Dr",
        "model.derived.Dq: unknown name 'Dnn' in 'Dnn + Dr' (not a model symbol); did you mean 'Dn'?",
    ),
    ("    H: 7168  ", "    H: true  ", "model.config.H: expected a positive number, got True"),
    ("    H: 7168  ", "    T: 7168  ", "model.config.T: 'T' is a sweep variable, not a model symbol"),
    # known ops, phases, roles, sweep lists and variables
    (
        "      norm: [{T: T, D: H}]",
        "      nrom: [{T: T, D: H}]",
        "ops.input_layernorm.roles.nrom: unknown role; did you mean 'norm'?",
    ),
    (
        "  linear: [fused_qkv_a_proj_with_mqa, q_b_proj,",
        "  linear: [fused_qkv_a_proj_with_mqa, q_b_prj,",
        "op_groups.linear[1]: unknown op 'q_b_prj'; did you mean 'q_b_proj'?",
    ),
    ("  linear: [", "  lineer: [", "op_groups.lineer: unknown op group; did you mean 'linear'?"),
    (
        "  prefill: {T: prefill_tokens}",
        "  prefil: {T: prefill_tokens}",
        "phases.prefil: unknown phase; did you mean 'prefill'?",
    ),
    (
        "  prefill: {T: prefill_tokens}",
        "  prefill: {T: prefill_token}",
        "phases.prefill.T: unknown sweep list 'prefill_token'; did you mean 'prefill_tokens'?",
    ),
    (
        "  prefill: {T: prefill_tokens}",
        "  prefill: {X: prefill_tokens}",
        "phases.prefill.X: unknown sweep variable (expected one of: B, T, kv_len, tp)",
    ),
    (
        "    phases: [decode]\n    vars:\n      decode: {B: attn_batch, kv_len: kv_lens}",
        "    phases: [decoding]\n    vars:\n      decode: {B: attn_batch, kv_len: kv_lens}",
        "ops.attn_mqa.phases[0]: unknown phase 'decoding'; did you mean 'decode'?",
    ),
    (
        "      decode: {B: attn_batch, kv_len: kv_lens}",
        "      decode: {B: attn_batch, kv_len: kv_len}",
        "ops.attn_mqa.vars.decode.kv_len: unknown sweep list 'kv_len'; did you mean 'kv_lens'?",
    ),
    # types of op fields
    (
        "    layers: dense\n    phases: [decode, prefill]\n    in: [T, H]\n    out: [T, 2 * Id]",
        "    layers: dens\n    phases: [decode, prefill]\n    in: [T, H]\n    out: [T, 2 * Id]",
        "ops.gate_up_proj.layers: expected 'dense' or 'moe', got 'dens'",
    ),
    (
        "    executed: false\n    reason: only when q_lora_rank is null (",
        "    executed: nope\n    reason: only when q_lora_rank is null (",
        "ops.q_proj.executed: expected true or false, got 'nope'",
    ),
    (
        "    models: [deepseek-v3.2]",
        "    models: [deepseek-v32]",
        "ops.\"nsa_indexer.forward\".models[0]: unknown model 'deepseek-v32'; did you mean 'deepseek-v3.2'?",
    ),
    (
        "    models: [deepseek-v3.2]",
        "    models: deepseek-v3.2",
        "ops.\"nsa_indexer.forward\".models: expected a list, got 'deepseek-v3.2'",
    ),
    (
        "  weak_ref_tensors:\n    phases: [decode]\n    roles: {}",
        "  weak_ref_tensors:",
        "ops.weak_ref_tensors: expected a mapping, got nothing",
    ),
    (
        "      sampling: [{B: B, V: V}]",
        "      sampling: [{B: B, V: V}, {B: B, V: V}]",
        "ops.\"sampler.forward\".roles.sampling[0]: missing key 'variant' (a role with several variants names each)",
    ),
    # expressions and evaluated dimensions
    (
        "      norm: [{T: T, D: H}]",
        "      norm: [{T: T, D: Hh}]",
        "ops.input_layernorm.roles.norm[0].D: unknown name 'Hh' in 'Hh' (not a model symbol or sweep variable); "
        "did you mean 'H'?",
    ),
    (
        "      norm: [{T: T, D: H}]",
        "      norm: [{T: T, D: H / 3}]",
        "ops.input_layernorm.roles.norm[0].D: 'H / 3': 7168 / 3 is not exact at T=1 (decode sweep, full profile)",
    ),
    (
        "      norm: [{T: T, D: H}]",
        "      norm: [{T: T, D: T - 2}]",
        "ops.input_layernorm.roles.norm[0].D: 'T - 2' is -1 at T=1 (decode sweep, full profile); "
        "expected a positive integer",
    ),
    (
        "      norm: [{T: T, D: H}]",
        "      norm: [{T: T, D: H * 0.5}]",
        "ops.input_layernorm.roles.norm[0].D: 'H * 0.5' is 3584.0 at T=1 (decode sweep, full profile); "
        "expected a positive integer",
    ),
    (
        "      norm: [{T: T, D: H}]",
        "      norm: [{T: T, D: kv_len}]",
        "ops.input_layernorm.roles.norm[0].D: 'kv_len' uses 'kv_len', which this op's sweep does not have "
        "(it has T, B, tp)",
    ),
    (
        "    in: [T, H]\n    out: [T, H]\n    roles:\n      norm: [{T: T, D: H}]\n  post",
        "    in: [T, Hx]\n    out: [T, H]\n    roles:\n      norm: [{T: T, D: H}]\n  post",
        "ops.input_layernorm.in[1]: unknown name 'Hx' in 'Hx' (not a model symbol or sweep variable); did you mean 'H'?",
    ),
    # sweep-point bounds
    (
        "    at_most: {B * kv_len: max_kv_tokens}\n",
        "    at_most: {B * kv_len: max_kv_token}\n",
        "ops.attn_mqa.at_most.\"B * kv_len\": unknown name 'max_kv_token' in 'max_kv_token' (not a model symbol, "
        "limit or sweep variable); did you mean 'max_kv_tokens'?",
    ),
    (
        "    at_most: {B * kv_len: max_kv_tokens}\n",
        "    at_most: {B / 0: max_kv_tokens}\n",
        "ops.attn_mqa.at_most.\"B / 0\": division by zero in 'B / 0' at B=1, kv_len=1024, tp=1",
    ),
    (
        "  max_kv_tokens: 33554432\n",
        "  max_kv_tokens: -1\n",
        "limits.max_kv_tokens: expected a positive number, got -1",
    ),
]


@pytest.mark.parametrize(("old", "new", "message"), BAD_EDITS, ids=[m.split(":")[0] for _, _, m in BAD_EDITS])
def test_an_edited_shapes_file_fails_with_one_line_naming_the_key(tmp_path, old, new, message):
    text = paths.SHAPES_FILE.read_text()
    assert old in text, old
    edited = tmp_path / "deepseek_r1_nvfp4.yaml"
    edited.write_text(text.replace(old, new, 1))
    with pytest.raises(ShapeError) as e:
        load_shapes(edited)
    assert str(e.value) == f"{edited}: {message}"
    assert "\n" not in str(e.value)


def test_the_committed_file_passes_the_schema(monkeypatch):
    monkeypatch.chdir(paths.REPO_ROOT)
    shapes = load_shapes(paths.SHAPES_FILE)
    assert shapes.source == "shapes/deepseek_r1_nvfp4.yaml"  # as the user would type it
    assert set(shapes.ops) == set(S.ops) and shapes.config == S.config


def test_every_role_an_adapter_reads_is_a_known_role():
    from dskbench.adapters import adapters

    assert {a.role for a in adapters().values()} <= ROLES
    used = {role for op in S.ops.values() for role in op.roles}
    assert used <= ROLES


def test_a_bound_leaves_out_the_points_beyond_it():
    """attn_mqa keeps B x kv_len within limits.max_kv_tokens: 512 requests stop at 65,536 tokens each, and
    every smaller batch keeps every KV length."""
    shapes = default_shapes()
    op = shapes.ops["attn_mqa"]
    points = shapes.points(op, op.roles["mla_decode"], "decode", "full")
    cap = shapes.limits["max_kv_tokens"]
    assert points and all(p["B"] * p["kv_len"] <= cap for p in points)
    longest = {b: max(p["kv_len"] for p in points if p["B"] == b) for b in {p["B"] for p in points}}
    assert longest[512] == 65536 and longest[256] == max(shapes.sweeps["kv_lens"]) == 131072
    assert shapes.within(op, {"B": 512, "kv_len": 65536, "tp": 1})
    assert not shapes.within(op, {"B": 512, "kv_len": 131072, "tp": 1})


def test_every_decode_batch_a_step_is_priced_at_has_attention_and_sampler_points():
    """`pick` prices a decode step at each decode token count; the step is complete only where MLA
    attention, its q merge and the sampler are swept at that batch (attention at the deployment's KV
    length, 4096 by default)."""
    shapes = default_shapes()
    batches = set(shapes.sweeps["decode_tokens"])
    for op_name, role in [
        ("attn_mqa", "mla_decode"),
        ("_merge_q", "concat_q"),
        ("sampler.forward", "sampling"),
    ]:
        op = shapes.ops[op_name]
        points = shapes.points(op, op.roles[role], "decode", "full")
        have = {p["B"] for p in points if p.get("kv_len", 4096) == 4096}
        assert batches <= have, (op_name, sorted(batches - have))
