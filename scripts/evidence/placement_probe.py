"""Does a case's reading depend on where its buffers sit in GPU memory? (GPU, one process)

    python3 scripts/evidence/placement_probe.py [--seeds-from RESULTS.jsonl[.gz]] > placement.log

Each case (CASES) is prepared again and again, as a sweep prepares it (inputs, bound outputs, reference
check), each time after a padding allocation of another size, so that its tensors land at other
addresses; each placement is timed by the batched timer alone and by the per-case timer. One line per
placement: the padding, the lowest address bits of each input tensor, and the two readings. Every case
uses its seed in RESULTS (`--seeds-from`) or 7.
"""

from __future__ import annotations

import argparse
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


def addresses(inputs: dict) -> str:
    """Each tensor input's address modulo 2 MiB, in KiB (where it sits within a large page)."""
    import torch

    got = [
        f"{k}@{(v.data_ptr() % (2 << 20)) // 1024}K" for k, v in inputs.items() if isinstance(v, torch.Tensor)
    ]
    return " ".join(got)[:60]


def show(m) -> str:
    return f"{m[:40]:>8s}" if isinstance(m, str) else f"{m.median_us:8.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds-from", type=Path, help="results file whose records give each case's seed")
    args = ap.parse_args()

    import torch
    from probe_setup import setup

    from dskbench import measure as core
    from dskbench.measure import batch

    probe = setup("placement_probe.py", args.seeds_from)
    if probe is None:
        return 2
    settings = probe.settings
    for spec in CASES:
        print(
            f"== {spec[0]} {spec[2]} {spec[3]} · {spec[-1]}: padding | inputs (address mod 2 MiB) | batched | per-case"
        )
        for kb in PADDINGS_KB:
            pad = torch.empty(kb * 1024, dtype=torch.uint8, device="cuda") if kb else None
            case_id, prep = probe.prepare(spec)
            if prep is None:
                print(case_id)
                break
            alone = batch.measure_batch([[prep.launch]], device="cuda", settings=settings)[0]
            per_case = core.measure(
                [prep.launch], device="cuda", mode="cold", capturable=True, settings=settings
            )
            print(
                f"{kb:7d} KiB | {addresses(prep.inputs):60s} | {show(alone)} | {show(per_case)}",
                flush=True,
            )
            del prep, pad
            torch.cuda.synchronize()
    _, first = probe.prepare(CASES[0])
    if first is None:
        return 0

    def both() -> str:
        alone = batch.measure_batch([[first.launch]], device="cuda", settings=settings)[0]
        per_case = core.measure(
            [first.launch], device="cuda", mode="cold", capturable=True, settings=settings
        )
        return f"{show(alone)} | {show(per_case)}"

    print(f"== {CASES[0][0]} {CASES[0][2]} {CASES[0][3]}: batched | per-case")
    print(f"alone                              {both()}", flush=True)
    held = [probe.prepare(spec)[1] for spec in BESIDE]
    print(f"beside {sum(p is not None for p in held):3d} cases prepared and held   {both()}", flush=True)
    del held
    torch.cuda.synchronize()
    print(f"alone again                        {both()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
