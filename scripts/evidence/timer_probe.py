"""The two cold timers on a few cases in one process (GPU): where do they disagree, and is it the timer?

    python3 scripts/evidence/timer_probe.py [--seeds-from RESULTS.jsonl[.gz]] > probe.log

For each case: the per-case event timer (`dskbench.measure.measure`, 16 [flush, launch] pairs to a CUDA
graph), the batched CUPTI timer with the case alone (a batch of one) and in a batch of all the cases, twice
over; then the device activities CUPTI sees in three replays of one [flush, launch] graph (what the batched
timer replays) and in one graph of four pairs (like the per-case timer's). `--seeds-from` takes each case's
seed from a results file's records (the same inputs as that sweep); without it every case uses seed 7.
Edit CASES to probe others (kernel, op[:variant], phase, point, backend).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_setup, beside this script

CASES = [
    ("flash_mla_with_kvcache", "attn_mqa", "decode", {"B": 1, "kv_len": 4096, "tp": 1}, "sgl_kernel"),
    ("prepare_moe_input", "experts", "decode", {"T": 1, "tp": 1}, "sgl_kernel"),
    ("moe_align_block_size", "experts", "prefill", {"T": 8192, "tp": 8}, "sgl_kernel"),
    ("fused_add_rmsnorm", "input_layernorm", "decode", {"T": 1}, "sgl_kernel"),
    ("rmsnorm", "input_layernorm", "decode", {"T": 64}, "sgl_kernel"),
    ("int8_scaled_mm", "o_proj", "decode", {"T": 16, "tp": 1}, "sgl_kernel"),
]


def show(m) -> str:
    if isinstance(m, str):
        return m
    return f"{m.median_us:8.2f} raw {m.raw_median_us:8.2f}"


def activities(graph, replays: int, flush_marker: str) -> list[str]:
    """One line per device activity, its start measured from the end of the flush before it."""
    from dskbench.measure import batch
    from dskbench.measure.batch_spans import device_activities

    lines, flush_end = [], None
    for name, start, end in device_activities(
        batch._profile(lambda: [graph.replay() for _ in range(replays)])
    ):
        if flush_marker in name:
            flush_end = end
            lines.append(f"   flush {(end - start) / 1e3:8.2f} us")
        else:
            at = (start - flush_end) / 1e3 if flush_end is not None else 0.0
            lines.append(f"   {at:8.2f} +{(end - start) / 1e3:8.2f} us  {name[:90]}")
    return lines


def main() -> int:
    import torch
    from probe_setup import setup_from_argv

    from dskbench.measure import batch

    probe = setup_from_argv("timer_probe.py", __doc__)
    if probe is None:
        return 2
    gap = probe.gap
    print(f"launch gap: per-case cold {gap.get('cold_us')} us, batched cold {gap.get('batch_cold_us')} us")
    preps = []
    for spec in CASES:
        case_id, prep = probe.prepare(spec)
        if prep is None:
            print(case_id)
            continue
        preps.append((case_id, prep))
        print(f"{case_id} · {spec[-1]}: seed {probe.seeds.get(case_id, 7)}")
    for n in (1, 2):
        print(f"== pass {n}: per-case | batched alone | in a batch of {len(preps)}")
        together = probe.batched([p for _, p in preps])
        for (case_id, p), in_batch in zip(preps, together, strict=True):
            per_case, alone = probe.per_case(p), probe.batched([p])[0]
            print(f"{case_id[:60]:60s} {show(per_case)} | {show(alone)} | {show(in_batch)}")
    buf = batch.flush_buffer(0, 2 * torch.cuda.get_device_properties(0).L2_cache_size)

    def flush() -> None:
        buf.zero_()

    for case_id, p in preps:
        print(f"-- {case_id}: three replays of one [flush, launch] graph")
        print("\n".join(activities(batch._capture(p.launch, flush), 3, batch.MARKER)))
        print("   one graph of four [flush, launch] pairs")
        four = torch.cuda.CUDAGraph()
        with torch.cuda.graph(four):
            for _ in range(4):
                flush()
                p.launch()
        four.replay()
        torch.cuda.synchronize()
        print("\n".join(activities(four, 1, batch.MARKER)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
