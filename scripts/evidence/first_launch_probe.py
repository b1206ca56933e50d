"""What a first launch costs, case by case, in a fresh process on warm JIT caches (GPU).

    python3 scripts/evidence/first_launch_probe.py [--no-start] [--profile]

Prepares a few cases (edit `CASES`; the defaults are a quick sweep's first Triton cases, in its order, and a
cuBLAS BF16 batched GEMM at two shapes) as a sweep does, and prints each one's resolve, bind and first-launch
seconds. `--no-start` leaves out the start of each backend kind's runtime before its first case
(dskbench/execution/runtimes.py), so its cost falls in the kernel's first launch, as it did before that
start existed; `--profile` prints the Python profile of each Triton case, Triton's and the driver's calls.
Run it with the HOME (JIT caches) of the run it explains.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

CASES = [  # (kernel, op[:variant], phase, point, backend)
    ("BatchPrefillWithPagedKVCacheWrapper", "attn_mha", "prefill", {"T": 2048, "tp": 1}, "flashinfer"),
    (
        "_gather_dequant_requant_fp8_paged_kernel",
        "nsa_backend.forward_extend:prefix_4k",
        "prefill",
        {"T": 2048},
        "triton",
    ),
    ("_quantize_k_cache_fast_kernel", "dsa_kv_cache_store", "decode", {"T": 1}, "triton"),
    ("bmm_fp8", "forward_absorb_prepare:q_nope_w_kc", "decode", {"T": 1, "tp": 1}, "torch.bmm.bf16"),
    ("bmm_fp8", "forward_absorb_prepare:q_nope_w_kc", "decode", {"T": 16, "tp": 1}, "torch.bmm.bf16"),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-start", action="store_true", help="no runtime start before a kind's first case")
    ap.add_argument("--profile", action="store_true", help="profile each Triton case's preparation")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    from dskbench.device.info import DeviceInfo
    from dskbench.execution import runtimes
    from dskbench.execution.case import prepare_case
    from dskbench.execution.fidelity import find_case
    from dskbench.registry.load import load_registry
    from dskbench.shapes.cases import default_shapes

    device = DeviceInfo.detect("cuda")
    if device.kind != "cuda":
        print("first_launch_probe.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.no_start:
        runtimes.STARTERS = {}
    shapes, registry = default_shapes(), load_registry()
    print(f"imports {time.perf_counter() - t0:.2f}s start={'off' if args.no_start else 'on'}", flush=True)
    for kernel, op, phase, point, backend in CASES:
        case, why = find_case(shapes, registry, kernel, op, phase, point, backend)
        if case is None:
            print(kernel, why)
            continue
        prof = cProfile.Profile() if args.profile and backend == "triton" else None
        t = time.perf_counter()
        if prof:
            prof.enable()
        fields, prep = prepare_case(kernel, case, backend, device, seed=7)
        if prof:
            prof.disable()
        st = fields.get("stages", {})
        print(
            f"{case.id} · {backend}: {fields.get('status', 'ok')} {time.perf_counter() - t:.3f}s resolve "
            f"{st.get('resolve_s')} bind {st.get('bind_s')} first_launch {st.get('first_launch_s')}",
            flush=True,
        )
        if prof:
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats("triton|driver|cuda|load", 30)
            print(out.getvalue()[-7000:])
        del prep
    return 0


if __name__ == "__main__":
    sys.exit(main())
