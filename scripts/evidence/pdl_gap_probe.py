"""The per-case cold timer's launch gap on kernels launched with programmatic dependent launch (GPU).

    python3 scripts/evidence/pdl_gap_probe.py [--seeds-from RESULTS.jsonl[.gz]] > pdl-gap.log

Each case (CASES: kernels that follow the flush over a programmatic edge, from sgl-kernel, FlashInfer
and SGLang's JIT kernels) is timed twice by the per-case timer and by the batched timer alone. One line
each: the per-case reading, its raw value (before the launch gap), the gap it subtracted (measured for
such a case: dskbench/measure/pdl_gap.py) and its note, then the batched reading. Where the gap is right,
the per-case and batched readings agree within the fidelity target (3%, or 0.3 us under 5 us).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_setup, beside this script

CASES = [
    ("apply_rope_with_cos_sin_cache_inplace", "rotary_emb", "decode", {"T": 64, "tp": 1}, "sglang_jit"),
    ("rmsnorm", "input_layernorm", "decode", {"T": 1}, "sgl_kernel"),
    ("fused_add_rmsnorm", "post_attention_layernorm", "decode", {"T": 256}, "sgl_kernel"),
    ("rmsnorm", "input_layernorm", "decode", {"T": 64}, "flashinfer"),
    ("flash_mla_with_kvcache", "attn_mqa", "decode", {"B": 1, "kv_len": 4096, "tp": 1}, "sgl_kernel"),
    ("moe_fused_gate", "topk", "decode", {"T": 64}, "flashinfer"),
]
PASSES = 2


def line(case_id: str, backend: str, per_case, batched) -> str:
    """One case's readings; a reason in place of a Measurement where one did not time."""
    if isinstance(per_case, str) or isinstance(batched, str):
        return f"{case_id[:50]:50s} {backend:10s} {per_case if isinstance(per_case, str) else batched}"
    note = next((n for n in per_case.notes if "programmatic" in n), "no programmatic edge")
    return (
        f"{case_id[:50]:50s} {backend:10s} per-case {per_case.median_us:7.2f} raw {per_case.raw_median_us:7.2f}"
        f" gap {per_case.launch_gap_us:.3f} | batched {batched.median_us:7.2f} | {note}"
    )


def main() -> int:
    from probe_setup import setup_from_argv

    probe = setup_from_argv("pdl_gap_probe.py", __doc__)
    if probe is None:
        return 2
    print(f"calibrated launch gap: per-case cold {probe.gap.get('cold_us')} us", flush=True)
    for spec in CASES:
        case_id, prep = probe.prepare(spec)
        if prep is None:
            print(case_id, flush=True)
            continue
        for _ in range(PASSES):
            print(line(case_id, spec[-1], probe.per_case(prep), probe.batched([prep])[0]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
