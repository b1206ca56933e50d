"""The registry generator: merging, ops and symbolic shapes, disagreements, statuses, determinism,
--check, new kernels from new documents, and the partial evaluator it writes shapes with."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dskbench import paths
from dskbench.registry.command import cli_generate
from dskbench.registry.generate import (
    check_registry,
    default_trace_files,
    generate,
    render,
    write_registry,
)
from dskbench.registry.load import load_registry
from dskbench.registry.model import STATUSES, RegistryError
from dskbench.shapes.cases import load_shapes
from dskbench.shapes.exprs import ExprError, evaluate, simplify

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
NVFP4 = "deepseek_r1_nvfp4_execution_ops.md"
DOCS = [p.name for p in default_trace_files()]


@pytest.fixture(scope="module")
def shapes():
    return load_shapes()


@pytest.fixture(scope="module")
def entries(shapes):
    return generate(default_trace_files(), shapes)


def _op(entry: dict, name: str) -> dict:
    return next(o for o in entry["ops"] if o["name"] == name)


def test_union_and_every_entry_well_formed(entries):
    # the union of the documents (88 named kernels) and the 38 Triton kernels of the files they name
    assert 110 <= len(entries) <= 140
    for name, e in entries.items():
        assert e["name"] == name
        assert e["status"] in STATUSES
        assert e["status_reason"]
        assert e["traces"], name


def test_statuses(entries):
    assert entries["cutlass_mla_get_workspace_size"]["status"] == "host-only"
    assert entries["weak_ref_tensor"]["status"] == "utility"
    assert entries["custom_all_reduce"]["status"] == "needs-multi-gpu"
    assert entries["flashinfer_communication_fusion"]["status"] == "needs-multi-gpu"
    had = entries["hadamard_transform"]  # at an op only DeepSeek-V3.2 runs (models: [deepseek-v3.2])
    assert had["status"] == "benchmark"
    assert had["status_reason"] == (
        "GPU kernel at 1 DeepSeek-V3.2 op(s) DeepSeek-R1 does not run: nsa_indexer.forward"
    )
    assert entries["fast_topk_v2"]["status"] == "benchmark"  # a DeepSeek-V3.2 NSA op
    assert entries["act_quant"]["status"] == "benchmark"  # nsa_triton_kernel, at nsa_indexer.forward (V3.2)
    assert entries["fp8_quantize"]["status"] == "benchmark"  # sglang.jit_kernel has it: not absent
    assert entries["cutlass_mla_decode"]["status"] == "benchmark"
    assert entries["int8_scaled_mm"]["status"] == "benchmark"  # q_proj is not run, q_b_proj is
    absent = entries["load_fp8_kv_cache"]
    assert absent["status"] == "absent" and "not in any pinned package" in absent["status_reason"]


def test_same_definition_line_spellings_merge(entries):
    dec = entries["decode_attention_kernel"]
    assert {"decode_attention_fwd_kernel", "decode_attention_fwd_kernel_mqa"} <= set(dec["aliases"])
    assert "decode_attention_fwd_kernel" not in entries and "_fwd_kernel" not in entries


def test_category_and_source_votes(entries):
    # The older document calls the FP8 GEMM "Quantization"; two documents say GEMM.
    assert entries["fp8_scaled_mm"]["category"] == "gemm"
    assert entries["topk_softmax"]["category"] == "moe-gating"  # "MoE Gating" / "MoE TopK"
    assert entries["apply_rope_with_cos_sin_cache_inplace"]["category"] == "rope"  # "RoPE" / "Rotary"
    assert entries["rmsnorm"]["source"] == "sgl-kernel"  # despite the flashinfer norm.py breakdown row
    assert entries["trtllm_ragged_attention_deepseek"]["source"] == "flashinfer"
    assert entries["fused_moe_kernel"]["source"] == "triton"


def test_definitions_and_call_sites_with_their_document(entries):
    e = entries["cutlass_mla_decode"]
    assert {
        "site": "sglang/sgl-kernel/python/sgl_kernel/attention.py:48",
        "doc": "kernel_traces_2026-01-18.md:12",
    } in e["definition"]
    sites = {(c["site"], c["kind"], c["doc"].split(":")[0]) for c in e["call_sites"]}
    assert ("cutlass_mla_backend.py:274", "kernel", "deepseek_kernel_traces.md") in sites
    assert ("sglang/python/sglang/srt/models/deepseek_v2.py:1576", "op", "deepseek_kernel_traces.md") in sites


def test_alias_merge(entries):
    assert "concat_mla_mha_k" not in entries
    e = entries["concat_mla_k"]
    assert e["aliases"] == ["concat_mla_mha_k"]
    assert any(t.get("as") == "concat_mla_mha_k" and t["doc"].startswith(NVFP4) for t in e["traces"])
    assert [o["name"] for o in e["ops"]] == ["_concat_and_cast_mha_k"]
    assert e["trace_shapes"][0]["output"] == "[B*S, Nh, Dn + Dr]"


def test_ops_come_from_the_nearest_model_op(entries):
    # the chain goes attn_mqa <- forward_absorb_core; only attn_mqa is the kernel's op
    assert [o["name"] for o in entries["cutlass_mla_decode"]["ops"]] == ["attn_mqa"]
    assert [o["name"] for o in entries["bmm_fp8"]["ops"]] == ["forward_absorb_prepare", "forward_absorb_core"]
    assert entries["bmm_fp8"]["unmatched_ops"] == []  # "bmm_fp8()" as an op is the kernel itself


def test_symbolic_op_shapes(entries):
    q_b = _op(entries["cutlass_scaled_fp4_mm"], "q_b_proj")
    assert q_b["shapes"]["gemm"] == [{"M": "T", "K": 1536, "N": "24576/tp", "weight": "bf16"}]
    assert q_b["weight"] == "bf16" and q_b["executed"] is True
    assert q_b["symbols"]["T"] == "tokens in the step: B in decode, B*S in prefill"
    shared = _op(entries["silu_and_mul"], "experts")
    assert shared["shapes"]["act"] == [{"T": "T*8", "D": "2048/tp"}]
    assert shared["layers"] == "moe"
    mqa = _op(entries["cutlass_mla_decode"], "attn_mqa")
    assert mqa["shapes"]["mla_decode"] == [
        {"B": "B", "Nh": "128/tp", "Lkv": 512, "Dr": 64, "kv_len": "kv_len"}
    ]
    assert mqa["phases"] == ["decode"] and "kv_len" in mqa["symbols"]


def test_free_text_labels_resolve_through_groups_and_aliases(entries):
    fp8 = entries["fp8_scaled_mm"]
    assert "o_proj" in [o["name"] for o in fp8["ops"]]
    assert "Linear layers (FP8 path)" in _op(fp8, "o_proj")["trace_names"]
    assert [o["name"] for o in entries["min_p_sampling_from_probs"]["ops"]] == ["sampler.forward"]
    assert "eagle_worker.forward" in [o["name"] for o in entries["fast_topk"]["ops"]]
    assert "experts" in [o["name"] for o in entries["trtllm_fp4_block_scale_moe"]["ops"]]  # "Fused MoE"


def test_not_executed_ops_listed_with_reason(entries):
    q_proj = _op(entries["int8_scaled_mm"], "q_proj")
    assert q_proj["executed"] is False and "q_lora_rank" in q_proj["reason"]
    assert "shapes" not in q_proj


def test_ops_of_another_model_say_which(entries):
    indexer = _op(entries["hadamard_transform"], "nsa_indexer.forward")
    assert indexer["executed"] is True and indexer["models"] == ["deepseek-v3.2"]
    assert indexer["shapes"]["hadamard"] == [
        {"variant": "q", "T": "T", "heads": 64, "D": 128},
        {"variant": "k", "T": "T", "heads": 1, "D": 128},
    ]
    assert "models" not in _op(entries["rmsnorm"], "input_layernorm")  # DeepSeek-R1's, as every op unmarked


def test_gate_up_disagreement_recorded(entries):
    dis = entries["cutlass_scaled_fp4_mm"]["disagreements"]
    gate_up = [d for d in dis if d["op"] == "gate_up_proj" and d["kind"] == "shape"]
    assert gate_up, dis
    d = gate_up[0]
    assert d["values"] == {"trace": "[1, 7168] -> [1, 4096]", "config": "[1, 7168] -> [1, 36864]"}
    assert d["resolution"] == "config wins" and d["doc"] == f"{NVFP4}:162"
    assert "[B*S, 2 * I] = [B*S, 4096]" in d["trace"]
    # act_fn carries the same root cause on silu_and_mul
    assert any(d["op"] == "act_fn" for d in entries["silu_and_mul"]["disagreements"])
    # ops whose traced shapes match the config raise nothing
    assert not any(d["op"] in ("q_b_proj", "o_proj") and d["kind"] == "shape" for d in dis)


def test_weight_format_disagreement(entries):
    dis = {(d["op"], d["kind"]) for d in entries["cutlass_scaled_fp4_mm"]["disagreements"]}
    assert {("q_b_proj", "weight-format"), ("kv_b_proj", "weight-format"), ("gate", "weight-format")} <= dis
    assert ("o_proj", "weight-format") not in dis  # NVFP4 in this checkpoint too
    # only a document about this checkpoint assigns formats: the generic FP8 traces raise nothing
    assert entries["fp8_scaled_mm"]["disagreements"] == []


def test_unmatched_ops_kept_visible_and_new_kernel_from_fixture(shapes):
    files = [*default_trace_files(), FIXTURES / "new_kernel_traces.md", FIXTURES / "legacy_new_kernel.md"]
    entries = generate(files, shapes)
    e = entries["fused_qk_norm_demo"]
    assert [o["name"] for o in e["ops"]] == ["q_a_layernorm"]
    assert e["unmatched_ops"] == [{"name": "brand_new_op", "traces": ["new_kernel_traces.md:15"]}]
    assert {"site": "layernorm.py:140", "kind": "kernel", "doc": "new_kernel_traces.md:9"} in e["call_sites"]
    assert (e["category"], e["source"], e["status"]) == ("normalization", "sgl-kernel", "benchmark")
    router = entries["demo_triton_router"]
    assert (router["category"], router["source"]) == ("moe-gating", "triton")
    assert entries["demo_ring_exchange"]["status"] == "needs-multi-gpu"
    assert "rmsnorm" in entries  # the real documents still merge in


def test_generation_is_deterministic(entries, shapes, tmp_path):
    again = generate(default_trace_files(), shapes)
    assert [render(e) for e in entries.values()] == [render(e) for e in again.values()]
    a, b = tmp_path / "a", tmp_path / "b"
    write_registry(entries, a, DOCS)
    write_registry(again, b, DOCS)
    for p in sorted(a.iterdir()):
        assert p.read_bytes() == (b / p.name).read_bytes()
    again_a = write_registry(again, a, DOCS)
    assert (again_a.added, again_a.changed, again_a.removed) == ([], [], [])  # nothing to rewrite
    assert len(again_a.unchanged) == len(entries)
    text = (a / "rmsnorm.yaml").read_text()
    assert text.startswith("# Generated by `dskbench registry generate`") and "Do not edit by hand" in text


def test_check_passes_on_committed_registry(capsys):
    assert cli_generate(None, None, check=True) == 0
    assert "up to date" in capsys.readouterr().out


def test_check_fails_naming_the_changed_kernel(entries, tmp_path, capsys):
    reg = tmp_path / "reg"
    shutil.copytree(paths.REGISTRY_DIR, reg)
    assert check_registry(entries, reg) == []
    p = reg / "rmsnorm.yaml"
    p.write_text(p.read_text().replace("category: normalization", "category: gemm"))
    (reg / "no_such_kernel.yaml").write_text("name: no_such_kernel\n")
    (reg / "silu_and_mul.yaml").unlink()
    assert check_registry(entries, reg) == ["no_such_kernel", "rmsnorm", "silu_and_mul"]
    assert cli_generate(None, reg, check=True) == 1
    out = capsys.readouterr().out
    assert "out of date for: no_such_kernel, rmsnorm, silu_and_mul" in out
    assert "holds files generate did not write: no_such_kernel.yaml" in out  # not in the manifest
    with pytest.raises(RegistryError, match="no_such_kernel.yaml"):  # generate would not remove it
        write_registry(entries, reg, DOCS)
    (reg / "no_such_kernel.yaml").unlink()
    w = write_registry(entries, reg, DOCS)
    assert (w.added, w.changed, w.removed) == (["silu_and_mul"], ["rmsnorm"], [])
    assert check_registry(entries, reg) == [] and cli_generate(None, reg, check=True) == 0


def test_cli_bad_input_exit_2(capsys):
    rc = cli_generate([FIXTURES / "bad_row.md"], None, check=True)
    assert rc == 2
    assert "bad_row.md:8:" in capsys.readouterr().err


def test_load_registry_entries():
    reg = load_registry()
    e = reg["rmsnorm"]
    assert (e.category, e.source, e.status) == ("normalization", "sgl-kernel", "benchmark")
    assert "input_layernorm" in e.op_names and "q_a_layernorm" in e.op_names
    assert reg["concat_mla_k"].aliases == ("concat_mla_mha_k",)
    assert reg["int8_scaled_mm"].op_names.count("q_proj") == 0  # executed ops only
    assert reg["hadamard_transform"].op_names == ("nsa_indexer.forward",)  # run, though not by R1
    assert reg["fast_topk_v2"].op_names == ("nsa_backend.forward_decode",)


def test_entries_are_typed_records_of_their_file():
    e = load_registry()["rmsnorm"]
    op = e.ops[0]
    assert (op.name, op.executed, op.phases, op.layers, op.weight) == (
        "input_layernorm",
        True,
        ("decode", "prefill"),
        "all",
        None,
    )
    assert tuple(o.name for o in e.ops if o.executed) == e.op_names
    site = e.call_sites[0]
    assert (site.site, site.kind, site.via, site.doc) == (
        "layernorm.py:102",
        "kernel",
        None,
        "deepseek_kernel_traces.md:20",
    )
    assert any(s.kind == "op" and s.via == "input_layernorm" for s in e.call_sites)
    skipped = [o for o in load_registry()["int8_scaled_mm"].ops if not o.executed]
    assert skipped and all(o.reason for o in skipped)


def test_generate_with_no_trace_documents_refuses_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """An installed package has no traces/: generating from none would empty its registry."""
    monkeypatch.setattr(paths, "TRACES_DIR", tmp_path / "no_traces")
    out = tmp_path / "reg"
    assert cli_generate(None, out, check=False) == 2
    err = capsys.readouterr().err
    assert err.startswith("dskbench: no trace documents in ") and "--traces" in err
    assert not out.exists()


# -- the partial evaluator (dskbench.shapes.exprs.simplify) -------------------------------------------------

ENV = {"Nh": 128, "Dq": 192, "Dn": 128, "Dv": 128, "I": 2048, "K": 8, "Lq": 1536, "Lkv": 512, "Dr": 64}


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("Nh * Dq / tp", "24576/tp"),
        ("Nh * (Dn + Dv) / tp", "32768/tp"),
        ("Lq + Lkv + Dr", 2112),
        ("T * K", "T*8"),
        ("T", "T"),
        (7, 7),
        ("a - (b - c)", "a - (b - c)"),
        ("a / (b * c)", "a/(b*c)"),
        ("-(a + Dr)", "-(a + 64)"),
    ],
)
def test_simplify(expr, want):
    assert simplify(expr, ENV) == want


@pytest.mark.parametrize(
    "expr", ["Nh * Dq / tp", "T * K + Dr", "a - (b - c)", "(T + Dn) // tp", "Nh / tp * Dv"]
)
def test_simplify_agrees_with_evaluate(expr):
    free = {"T": 48, "tp": 4, "a": 9, "b": 5, "c": 3}
    assert evaluate(simplify(expr, ENV), free) == evaluate(expr, {**ENV, **free})


def test_simplify_keeps_exact_division():
    with pytest.raises(ExprError, match="not exact"):
        simplify("Dr / 3 + T", ENV)
