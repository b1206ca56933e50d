"""Does a case's batched reading depend on the cases it shares a batch with? (GPU, one process)

    python3 scripts/evidence/neighbor_probe.py > neighbors.log

Each light case (LIGHT) is timed by the per-case timer, by the batched timer alone, in a batch of the light
cases, and in a batch with the heavy cases (HEAVY: prefill GEMMs of about a millisecond, which draw the
GPU towards its power limit), twice over; each reading with the lowest SM clock NVML saw while it was
sampled. Every case with seed 7.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_setup, beside this script

LIGHT = [
    ("flash_mla_with_kvcache", "attn_mqa", "decode", {"B": 1, "kv_len": 4096, "tp": 1}, "sgl_kernel"),
    ("moe_align_block_size", "experts", "prefill", {"T": 8192, "tp": 8}, "sgl_kernel"),
    ("bmm_fp8", "forward_absorb_prepare:q_nope_w_kc", "decode", {"T": 64, "tp": 8}, "sgl_kernel"),
    ("rmsnorm", "input_layernorm", "decode", {"T": 64}, "sgl_kernel"),
]
HEAVY = [
    ("fp8_scaled_mm", "o_proj", "prefill", {"T": 8192, "tp": 1}, "sgl_kernel"),
    ("int8_scaled_mm", "gate_up_proj", "prefill", {"T": 8192, "tp": 1}, "sgl_kernel"),
]


def show(m) -> str:
    if isinstance(m, str):
        return f"{m[:40]:>24s}"
    clock = (m.clocks_during or {}).get("sm_mhz_min")
    return f"{m.median_us:9.2f} ({clock or '?':>4} MHz)"


def main() -> int:
    from probe_setup import setup

    probe = setup("neighbor_probe.py")
    if probe is None:
        return 2
    light, heavy = probe.prepare_all(LIGHT), probe.prepare_all(HEAVY)
    for n in (1, 2):
        print(f"== pass {n}: per-case | batched alone | with the light cases | with the heavy cases")
        lights = probe.batched([p for _, p in light])
        for (case_id, p), with_light in zip(light, lights, strict=True):
            per_case, alone = probe.per_case(p), probe.batched([p])[0]
            with_heavy = probe.batched([p] + [h for _, h in heavy])[0]
            print(
                f"{case_id[:56]:56s} {show(per_case)} | {show(alone)} | {show(with_light)} | {show(with_heavy)}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
