"""What sets `moe_align_block_size`'s level at prefill T=8192, tp 8? (GPU, one process)

    python3 scripts/evidence/moe_align_probe.py [--seeds-from RESULTS.jsonl[.gz]] > moe-align.log

In sweeps the case read about 38 us or about 46 us, whichever timer read it. One process times it again
and again, per case and batched alone, each time with CUPTI's durations of its two kernels (the one-block
align kernel and count_and_sort_expert_tokens_kernel, whose global atomics make the difference), in
these states:

- history: at the start; after its 23 sibling cases (BESIDE) are prepared and held; after one batch of
  all of them with it, first and last; after batches of it with each of six siblings; after the siblings
  are freed; prepared again.
- footprint: prepared again while 1-96 GiB are held in one block, then while 512-16384 1 MiB blocks are.
- flush: both timers' flush buffers (2 x L2 each, allocated once per process) dropped and allocated
  again behind a padding of 0-4096 MiB, so that they sit elsewhere in memory. The flush leaves L2 full of
  its dirty lines, and which L2 sets those fill follows where the buffer sits: a level that moves here is
  set by where the flush's buffer is, which each process, and each timer, places on its own. Each
  placement is also read per case with the read flush, which leaves L2's lines clean.

A state that moves the level names its cause; one that does not rules it out.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_setup, beside this script

HELD_GIB = [1, 4, 16, 48, 96]
HELD_MIB_BLOCKS = [512, 4096, 16384]
FLUSH_PADDING_MIB = [0, 2, 64, 512, 4096, 0]
PAIRED = 6  # siblings batched in turn with the case


def kernel_durations(lines: list[str]) -> str:
    """The last replay's kernels from timer_probe.activities' lines: 'name duration' pairs, shortened."""
    got = []
    for ln in lines[-2:]:
        if "+" in ln and "us" in ln:
            duration, name = ln.split("+", 1)[1].split("us", 1)
            got.append(f"{name.strip().removeprefix('void ')[:24]} {float(duration):.2f}")
    return ", ".join(got)


def main() -> int:
    import torch
    from placement_probe import BESIDE, CASES
    from probe_setup import setup_from_argv
    from timer_probe import activities

    from dskbench import measure as core
    from dskbench.measure import batch, cuda_timer

    probe = setup_from_argv("moe_align_probe.py", __doc__)
    if probe is None:
        return 2
    spec = CASES[0]
    case_id, case = probe.prepare(spec)
    if case is None:
        print(case_id)
        return 0
    print(f"{case_id} · {spec[-1]}: seed {probe.seeds.get(case_id, 7)}")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size

    def state(label: str) -> None:
        per_case, alone = probe.per_case(case), probe.batched([case])[0]
        buf = batch.flush_buffer(0, 2 * l2)  # the batched timer's, as its own flush graph uses it
        kernels = kernel_durations(activities(batch._capture(case.launch, buf.zero_), 2, batch.MARKER))
        print(f"{label:36s} per-case {show(per_case)} batched {show(alone)} | {kernels}", flush=True)

    print("== history")
    state("start")
    siblings = [p for _, p in probe.prepare_all(BESIDE)]
    state(f"{len(siblings)} siblings prepared and held")
    first = probe.batched([case, *siblings])[0]
    print(f"{'in a batch with them, first':36s} batched {show(first)}", flush=True)
    last = probe.batched([*siblings, case])[-1]
    print(f"{'in a batch with them, last':36s} batched {show(last)}", flush=True)
    state("alone after those batches")
    for sibling in siblings[:PAIRED]:
        mine, theirs = probe.batched([case, sibling])
        print(f"{'batched with a sibling':36s} batched {show(mine)} (the sibling {show(theirs)})", flush=True)
    state("alone after the pairs")
    del siblings
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    state("siblings freed")
    case_id, case = probe.prepare(spec)
    state("prepared again")

    print("== footprint")
    for gib in HELD_GIB:
        del case
        torch.cuda.empty_cache()
        held = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
        _, case = probe.prepare(spec)
        state(f"{gib} GiB held")
        del held
    for n in HELD_MIB_BLOCKS:
        del case
        torch.cuda.empty_cache()
        blocks = [torch.empty(1 << 20, dtype=torch.uint8, device="cuda") for _ in range(n)]
        _, case = probe.prepare(spec)
        state(f"{n} x 1 MiB held")
        del blocks

    print("== flush")
    read_flush = probe.settings.with_(flush_kind="read")
    for mib in FLUSH_PADDING_MIB:
        batch._flush.clear()
        cuda_timer._flush_buffers.clear()
        torch.cuda.empty_cache()
        padding = torch.empty(mib << 20, dtype=torch.uint8, device="cuda") if mib else None
        state(f"flush buffers anew after {mib} MiB")  # each timer allocates its buffer at first use
        where = [
            f"{b.data_ptr() >> 20} MiB" for b in (*batch._flush.values(), *cuda_timer._flush_buffers.values())
        ]
        print(f"{'':36s} flush buffers at {', '.join(where)} (batched, per-case)", flush=True)
        read = core.measure([case.launch], device="cuda", mode="cold", capturable=True, settings=read_flush)
        print(f"{'':36s} per-case with the read flush (clean lines) {show(read)}", flush=True)
        del padding
    return 0


def show(m) -> str:
    return f"{m[:30]:>7s}" if isinstance(m, str) else f"{m.median_us:7.2f}"


if __name__ == "__main__":
    sys.exit(main())
