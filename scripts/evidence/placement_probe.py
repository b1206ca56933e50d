"""Does a case's reading depend on where its buffers sit in GPU memory? (GPU, one process)

    python3 scripts/evidence/placement_probe.py [--seeds-from RESULTS.jsonl[.gz]] > placement.log

Each case (CASES) is prepared again and again, as a sweep prepares it (inputs, bound outputs, reference
check): first after a padding allocation of another size (PADDINGS_KB: paddings under 2 MiB move its
tensors within one 2 MiB segment of torch's caching allocator), then while 1 MiB fillers are held
(SEGMENT_FILLS: its tensors land in other segments, other physical memory). Each placement is timed by
the batched timer alone and by the per-case timer. One line per placement: the padding or the fillers,
each input tensor's 2 MiB segment (counted from the first seen) and offset in it, and the two readings.
Every case uses its seed in RESULTS (`--seeds-from`) or 7.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_setup, beside this script

CASES = [
    ("moe_align_block_size", "experts", "prefill", {"T": 8192, "tp": 8}, "sgl_kernel"),
    ("moe_align_block_size", "experts", "decode", {"T": 64, "tp": 8}, "sgl_kernel"),
    ("prepare_moe_input", "experts", "decode", {"T": 16, "tp": 8}, "sgl_kernel"),
]
PADDINGS_KB = [0, 1, 2, 4, 8, 16, 64, 256, 1024, 2048, 3072, 4096, 32768]
SEGMENT_FILLS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]  # 1 MiB tensors held (two fill a segment)
# ...then the first case timed alone, beside these cases prepared and held (their inputs and bound
# buffers alive, as a batch holds its cases), and alone again once they are freed
BESIDE = [
    spec
    for op in ("experts", "experts_fused_shared")
    for phase, ts in (("decode", (1, 16, 64, 256)), ("prefill", (2048, 8192)))
    for t in ts
    for tp in (1, 8)
    if (spec := ("moe_align_block_size", op, phase, {"T": t, "tp": tp}, "sgl_kernel")) != CASES[0]
]


_FIRST_SEGMENT: list[int] = []


def addresses(inputs: dict) -> str:
    """Each tensor input's 2 MiB segment (counted from the first one seen) and its offset in it, in KiB."""
    import torch

    got = []
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor):
            segment, offset = divmod(v.data_ptr(), 2 << 20)
            _FIRST_SEGMENT[:] = _FIRST_SEGMENT or [segment]
            got.append(f"{k}@{segment - _FIRST_SEGMENT[0]}:{offset // 1024}K")
    return " ".join(got)[:60]


def show(m) -> str:
    return f"{m[:40]:>8s}" if isinstance(m, str) else f"{m.median_us:8.2f}"


def main() -> int:
    import torch
    from probe_setup import setup_from_argv

    probe = setup_from_argv("placement_probe.py", __doc__)
    if probe is None:
        return 2

    def both(prep) -> str:
        """The case timed by the batched timer alone, then by the per-case timer."""
        return f"{show(probe.batched([prep])[0])} | {show(probe.per_case(prep))}"

    for spec in CASES:
        print(
            f"== {spec[0]} {spec[2]} {spec[3]} · {spec[-1]}: placement | inputs (segment:offset) | batched | per-case"
        )
        mib = 1 << 20
        placements = [(f"pad {kb:5d} KiB", [kb * 1024] if kb else []) for kb in PADDINGS_KB]
        placements += [(f"hold {n:3d} x 1 MiB", [mib] * n) for n in SEGMENT_FILLS]
        for label, sizes in placements:
            held = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
            case_id, prep = probe.prepare(spec)
            if prep is None:
                print(case_id)
                break
            print(f"{label:18s} | {addresses(prep.inputs):40s} | {both(prep)}", flush=True)
            del prep, held
            torch.cuda.synchronize()
    _, first = probe.prepare(CASES[0])
    if first is None:
        return 0

    print(f"== {CASES[0][0]} {CASES[0][2]} {CASES[0][3]}: batched | per-case")
    print(f"alone                              {both(first)}", flush=True)
    held = [probe.prepare(spec)[1] for spec in BESIDE]
    print(f"beside {sum(p is not None for p in held):3d} cases prepared and held   {both(first)}", flush=True)
    del held
    torch.cuda.synchronize()
    print(f"alone again                        {both(first)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
