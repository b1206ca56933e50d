"""The trace parser on the real documents (both kernel-trace layouts, op tables, NVFP4 shape tables),
on fixtures with new kernels, and on malformed documents."""

from __future__ import annotations

from pathlib import Path

import pytest

from dskbench import paths
from dskbench.registry.trace_cells import kernels_in_cell, op_labels_in_cell, sites_in_cell, split_top
from dskbench.registry.trace_model import TraceError
from dskbench.registry.traces import parse_trace

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
NEW = "deepseek_kernel_traces.md"
LEGACY = "kernel_traces_2026-01-18.md"
OPS = "deepseek_op_traces.md"
NVFP4 = "deepseek_r1_nvfp4_execution_ops.md"
PROCEDURE = "kernel_tracing_procedure.md"


@pytest.fixture(scope="module")
def docs():
    return {p.name: parse_trace(p) for p in sorted(paths.TRACES_DIR.glob("*.md"))}


def _lines_of(doc, text: str) -> list[int]:
    return [i for i, ln in enumerate(doc.text.splitlines(), start=1) if text in ln]


def test_format_detected_from_content(docs):
    assert docs[NEW].format == "kernel-traces"
    assert docs[LEGACY].format == "kernel-traces-legacy+triton-files"  # its "Triton JIT" file rows
    assert docs[OPS].format == "op-traces"
    assert docs[NVFP4].format == "execution-ops"
    assert docs[PROCEDURE].format == "procedure" and docs[PROCEDURE].kernels == {}


def test_kernel_counts_per_document(docs):
    # The new-format document and the op document both say "60 kernels".
    assert len(docs[NEW].kernels) == 60
    assert len(docs[OPS].kernels) == 60
    assert "concat_mla_mha_k" in docs[NVFP4].kernels  # the alias is merged later, not by the parser


def test_new_format_summary_chain_and_breakdown(docs):
    doc = docs[NEW]
    f = doc.kernels["cutlass_mla_decode"]
    assert {v.value for v in f.sources if v.level == 1} == {"sgl-kernel"}
    assert "Attention" in {v.value for v in f.categories if v.level == 1}
    sites = {(s.site, s.kind) for s in f.call_sites}
    assert ("cutlass_mla_backend.py:274", "kernel") in sites  # Summary Table
    assert (
        "sglang/python/sglang/srt/layers/attention/cutlass_mla_backend.py:274",
        "kernel",
    ) in sites  # chain
    assert ("deepseek_v2.py:1576", "op") in sites  # "Op Call Sites (deepseek_v2.py)" column ":1576"
    assert [d.site for d in f.definitions] == ["sglang/sgl-kernel/python/sgl_kernel/attention.py"]
    assert [o.label for o in f.ops] == ["attn_mqa"]
    chain = f.chains[0]
    assert chain[0].fn == "cutlass_mla_decode()" and chain[0].parent == -1
    attn = next(i for i, fr in enumerate(chain) if fr.fn == "self.attn_mqa()")
    assert chain[attn].self_call and chain[attn].site.endswith("deepseek_v2.py:1576")
    assert chain[attn + 1].parent == attn  # self.forward_absorb_core() is its caller


def test_new_format_branching_chain(docs):
    """topk_softmax's chain puts `self.topk()` at the same column as `select_experts()`: siblings."""
    chain = docs[NEW].kernels["topk_softmax"].chains[0]
    by_fn = {fr.fn: i for i, fr in enumerate(chain)}
    fused = by_fn["fused_topk()"]
    assert chain[by_fn["select_experts()"]].parent == fused
    assert [chain[i].parent for i, fr in enumerate(chain) if fr.fn == "self.topk()"] == [fused, fused]
    # four paths in bmm_fp8's section, one chain per "Path N" root
    assert len(docs[NEW].kernels["bmm_fp8"].chains) == 4


def test_new_format_notes_and_free_text_ops(docs):
    f = docs[NEW].kernels["sgl_per_token_quant_fp8"]
    assert [fr.fn for fr in f.chains[0]] == [
        "sgl_per_token_quant_fp8()"
    ]  # "**(called during ...)**" is no frame
    assert [o.label for o in f.ops] == ["input quantization (FP8)"]
    assert [o.label for o in docs[NEW].kernels["fp8_scaled_mm"].ops] == ["Linear layers (FP8 path)"]
    assert [o.label for o in docs[NEW].kernels["prepare_moe_input"].ops] == ["experts (cutlass MoE path)"]


def test_legacy_summary_and_chains(docs):
    doc = docs[LEGACY]
    f = doc.kernels["cutlass_mla_decode"]
    assert {d.site for d in f.definitions} == {"sglang/sgl-kernel/python/sgl_kernel/attention.py:48"}
    assert {v.value for v in f.sources if v.level == 1} == {"sgl-kernel"}
    assert ("sglang/python/sglang/srt/layers/attention/cutlass_mla_backend.py:27", "CutlassMLABackend") in {
        (s.site, s.via) for s in f.call_sites
    }
    # a triton leaf: "@triton.jit" dropped, the definition line kept
    t = doc.kernels["decode_attention_fwd_kernel_mqa"]
    assert [d.site for d in t.definitions] == [
        "sglang/python/sglang/srt/layers/attention/triton_ops/decode_attention.py:244"
    ]
    assert {v.value for v in t.sources if v.level == 1} == {"triton"}
    # a leaf with no parentheses (a class) is a kernel too
    assert "BatchMLAPagedAttentionWrapper" in doc.kernels
    # the section-level "**Definition File:**" never lends one kernel's line to another
    assert {d.site for d in doc.kernels["_fwd_kernel_q_inner"].definitions} == {
        "sglang/python/sglang/srt/layers/attention/triton_ops/extend_attention.py:206"
    }


def test_legacy_file_only_leaf_and_list_items(docs):
    doc = docs[LEGACY]
    ar = doc.kernels["custom_all_reduce"]  # "#### Custom All-Reduce", leaf names only allreduce.py
    assert [d.site for d in ar.definitions] == ["sglang/sgl-kernel/python/sgl_kernel/allreduce.py"]
    assert "flashinfer_communication_fusion" in doc.kernels
    for name in ("load_fp8_kv_cache", "store_fp8_kv_cache", "load_int8_kv_cache", "store_int8_kv_cache"):
        assert [d.site for d in doc.kernels[name].definitions] == [
            "sglang/sgl-kernel/python/sgl_kernel/kvcacheio.py"
        ]


def test_legacy_breakdown_identifiers_only(docs):
    names = set(docs[LEGACY].kernels)
    assert {"xqa_batch_decode_with_kv_cache_mla", "cutlass_fused_moe", "BatchAttention"} <= names
    for phrase_word in ("custom_ar", "custom_ar_operations", "batch_decode", "rope", "communication"):
        assert phrase_word not in names


def test_op_tables(docs):
    doc = docs[OPS]
    experts_row = _lines_of(doc, "| `self.experts()` |")[0]
    at_row = [k for k, f in doc.kernels.items() if any(o.line == experts_row for o in f.ops)]
    assert len(at_row) == 15 and "trtllm_fp4_block_scale_moe" in at_row
    assert [o.label for o in doc.kernels["hadamard_transform"].ops] == ["nsa_indexer.forward()"]
    assert [o.label for o in doc.kernels["weak_ref_tensor"].ops] == ["weak_ref_tensors()"]
    assert "GEMM (BMM)" in {v.value for v in doc.kernels["bmm_fp8"].categories}
    # Direct Model Kernels: links become call sites
    assert "sglang/python/sglang/srt/models/deepseek_v2.py:1296" in {
        s.site for s in doc.kernels["dsv3_fused_a_gemm"].call_sites
    }
    # count columns that disagree with the list are reported, not fatal
    assert any("Attention says 7 kernels, lists 8" in w for w in doc.warnings)


def test_nvfp4_shape_tables(docs):
    doc = docs[NVFP4]
    fa = doc.kernels["dsv3_fused_a_gemm"]
    row = next(r for r in fa.shapes if r.op_label == "self.fused_qkv_a_proj_with_mqa()")
    assert (row.input, row.remark) == ("[B, H]", "B<=16")
    assert row.output == "[B, Lq + Lkv + Dr] = [B, 2112]"
    # "`rmsnorm` / `fused_add_rmsnorm`" names two kernels
    line = _lines_of(doc, "| `self.input_layernorm()` | [B*S, H]")[0]
    assert {k for k, f in doc.kernels.items() if any(r.line == line for r in f.shapes)} == {
        "rmsnorm",
        "fused_add_rmsnorm",
    }
    # "flashinfer/trtllm prefill" and "(varies by backend)" are descriptions, not kernels
    mha = _lines_of(doc, "| `self.attn_mha()` |")[0]
    assert not any(r.line == mha for f in doc.kernels.values() for r in f.shapes)
    assert not {"flashinfer", "prefill", "flashinfer_trtllm_prefill"} & set(doc.kernels)
    # MoE backend tables: the Op column is the kernel itself, remarks kept
    assert [r.op_label for r in doc.kernels["cutlass_fp4_group_mm"].shapes] == [
        "cutlass_fp4_group_mm (gate_up)",
        "cutlass_fp4_group_mm (down)",
    ]
    # Kernel Summary: "a / b / c" kernels share the ops; commas inside "(...)" do not split
    for k in ("topk_softmax", "topk_sigmoid", "moe_fused_gate"):
        assert "topk" in [o.label for o in doc.kernels[k].ops]
    assert "fused_qkv_a_proj_with_mqa (low-latency, B<=16)" in [o.label for o in fa.ops]


def test_cell_helpers():
    assert kernels_in_cell("`dsv3_router_gemm` (B<=16) / `cutlass_scaled_fp4_mm`", False) == [
        ("dsv3_router_gemm", "B<=16"),
        ("cutlass_scaled_fp4_mm", None),
    ]
    assert kernels_in_cell("custom_ar operations", True) == []
    assert kernels_in_cell("rmsnorm, fused_add_rmsnorm", True) == [
        ("rmsnorm", None),
        ("fused_add_rmsnorm", None),
    ]
    assert kernels_in_cell("flashinfer/trtllm prefill", False) == []
    assert kernels_in_cell("`fused_moe_kernel[grid]()`", False) == [("fused_moe_kernel", None)]
    assert op_labels_in_cell("`experts` (cutlass MoE path)") == ["experts (cutlass MoE path)"]
    assert op_labels_in_cell("attn_mqa (decode, trtllm backend), topk") == [
        "attn_mqa (decode, trtllm backend)",
        "topk",
    ]
    assert sites_in_cell(":1300, :1340", "deepseek_v2.py") == ["deepseek_v2.py:1300", "deepseek_v2.py:1340"]
    assert sites_in_cell(":1215 (trtllm_mla_backend.py)", "deepseek_v2.py") == ["trtllm_mla_backend.py:1215"]
    assert sites_in_cell("(same as fp8_blockwise_scaled_mm)", "deepseek_v2.py") == []
    assert sites_in_cell("[L1296](../sglang/python/x.py#L1296)", None) == ["sglang/python/x.py:1296"]
    assert split_top("a (b, c), d") == ["a (b, c)", "d"]


def test_fixture_new_kernel_in_both_layouts():
    new = parse_trace(FIXTURES / "new_kernel_traces.md")
    f = new.kernels["fused_qk_norm_demo"]
    assert [o.label for o in f.ops] == ["q_a_layernorm", "self.brand_new_op()"]
    assert f.chains[0][1].fn == "self.q_a_layernorm()"
    legacy = parse_trace(FIXTURES / "legacy_new_kernel.md")
    assert legacy.format == "kernel-traces-legacy"
    r = legacy.kernels["demo_triton_router"]
    assert {d.site for d in r.definitions} == {"sglang/python/sglang/srt/layers/moe/demo_router.py:12"}
    assert "demo_ring_exchange" in legacy.kernels  # a file-only leaf: named from its heading
    assert "demo_ring_operations" not in legacy.kernels and "demo" not in legacy.kernels


@pytest.mark.parametrize(
    ("name", "line", "words"),
    [
        ("bad_row.md", 8, "5 cells, its header has 4"),
        ("bad_heading.md", 13, "no kernel name"),
        ("unknown_format.md", 1, "no known trace format"),
    ],
)
def test_malformed_fixture_names_file_and_line(name, line, words):
    with pytest.raises(TraceError) as e:
        parse_trace(FIXTURES / name)
    assert str(e.value).startswith(f"{FIXTURES / name}:{line}: ")
    assert words in str(e.value)
    assert e.value.line == line


def test_heading_with_nothing_after_hashes(tmp_path):
    p = tmp_path / "empty_heading.md"
    p.write_text("# Doc\n\n## Detailed Call Chains\n\n####\n")
    with pytest.raises(TraceError, match=r"empty_heading.md:5: #### heading with no name"):
        parse_trace(p)


def test_unclosed_fence_names_its_line(tmp_path):
    p = tmp_path / "fence.md"
    p.write_text("# Doc\n\n#### Custom Thing\n\n```\nx.py:1\n  └─> sgl-kernel: y.py f()\n")
    with pytest.raises(TraceError, match=r"fence.md:5: code fence"):
        parse_trace(p)


def test_bad_utf8_names_the_line(tmp_path):
    p = tmp_path / "binary.md"
    p.write_bytes(b"# Doc\n\n| Kernel | Source |\n|---|---|\n| `rmsnorm` | sgl\xff-kernel |\n")
    with pytest.raises(TraceError, match=r"binary.md:5: not valid UTF-8"):
        parse_trace(p)
