"""Timer fidelity: our measurement core against CUPTI kernel durations and do_bench_cudagraph.

For each selected kernel case (same inputs, same process): our median in cold and hot mode (cold also by
the batched timer a sweep's cold cases use, the case in a batch of its own, where CUPTI is there), the
PyTorch profiler's (CUPTI) kernel time in the same condition (L2 flushed before each launch / back to
back; for ops that launch several kernels, the span from the first kernel's start to the last one's
end), and triton's do_bench_cudagraph. CUPTI profiles the op replayed from a CUDA graph where it can be
captured (as our samples are; no host gaps inside a multi-kernel op) and launched eagerly otherwise;
the eager span is kept as `cupti_<mode>_eager_us`. Prints a table and writes JSON (GPU only).

    dskbench fidelity --out results/fidelity.json [--iters N] [--min-time S]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dskbench.measure import stats

# kernel, op[:variant], phase, point, backend — chosen to span ~1 µs to ~1 ms
DEFAULT_CASES = [
    ("rmsnorm", "input_layernorm", "decode", {"T": 1}, "sgl_kernel"),
    ("rmsnorm", "input_layernorm", "decode", {"T": 64}, "flashinfer"),
    ("silu_and_mul", "shared_experts", "decode", {"T": 64, "tp": 1}, "sgl_kernel"),
    ("fused_add_rmsnorm", "post_attention_layernorm", "decode", {"T": 256}, "sgl_kernel"),
    ("apply_rope_with_cos_sin_cache_inplace", "rotary_emb", "decode", {"T": 64, "tp": 1}, "sglang_jit"),
    ("moe_align_block_size", "experts", "decode", {"T": 64, "tp": 1}, "sgl_kernel"),
    ("moe_fused_gate", "topk", "decode", {"T": 64}, "flashinfer"),
    ("dsv3_fused_a_gemm", "fused_qkv_a_proj_with_mqa", "decode", {"T": 8}, "sglang_jit"),
    (
        "sgl_per_token_group_quant_fp8",
        "per_token_group_quant_fp8:K7168",
        "prefill",
        {"T": 2048},
        "sgl_kernel",
    ),
    ("merge_state_v2", "attn_mha", "prefill", {"T": 4096, "tp": 1}, "sgl_kernel"),
    ("bmm_fp8", "forward_absorb_prepare:q_nope_w_kc", "decode", {"T": 64, "tp": 1}, "sgl_kernel"),
    ("fp8_scaled_mm", "q_b_proj", "prefill", {"T": 4096, "tp": 1}, "sgl_kernel"),
    ("decode_attention_kernel", "attn_mqa", "decode", {"B": 64, "kv_len": 4096, "tp": 1}, "sglang_triton"),
    ("fused_moe_kernel", "experts:gate_up.bf16", "decode", {"T": 64, "tp": 1}, "sglang_triton"),
    ("top_k_renorm_prob", "sampler.forward", "decode", {"B": 64}, "flashinfer"),
]


def find_case(shapes, registry, kernel: str, op_spec: str, phase: str, point: dict[str, int], backend: str):
    from dskbench.adapters import get_adapter

    adapter = get_adapter(kernel)
    if adapter is None:
        return None, f"no adapter for {kernel}"
    op, _, variant = op_spec.partition(":")
    for case in shapes.cases(kernel, [op], adapter.role, phase, "full", [point.get("tp", 1)]):
        if (variant or None) == case.variant and all(case.point.get(k) == v for k, v in point.items()):
            return case, None
    return None, f"no case {op_spec} {phase} {point} for role {adapter.role}"


def prepare_named(
    shapes, registry, spec: tuple, device: Any, seeds: dict[str, int] | None = None, seed: int = 7
) -> tuple[str, Any]:
    """A case named as (kernel, op[:variant], phase, point, backend), prepared as a sweep prepares it with
    its seed in `seeds` (by case id; else `seed`): (its id, its Prepared), or (a line saying why not, None)."""
    from dskbench.execution.case import prepare_case

    kernel, op_spec, phase, point, backend = spec
    case, why = find_case(shapes, registry, kernel, op_spec, phase, point, backend)
    if case is None:
        return f"{kernel}: no case ({why})", None
    fields, prep = prepare_case(kernel, case, backend, device, seed=(seeds or {}).get(case.id, seed))
    if prep is None:
        return f"{case.id}: {fields.get('status')}: {fields.get('reason')}", None
    return case.id, prep


def profiler_spans(launch, flush, iters: int, cold: bool) -> list[float]:
    """Per-launch GPU span (µs) from CUPTI: kernels launched inside each annotated iteration."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            if cold:
                flush()
            with record_function(f"fid_iter_{i}"):
                launch()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    ranges = [
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X"
        and str(e.get("name", "")).startswith("fid_iter_")
        and e.get("cat") == "user_annotation"
    ]
    launches = {}  # correlation -> cpu ts of the runtime launch call
    for e in events:
        # aten ops launch through the runtime API, Triton through the driver API (cuLaunchKernel)
        if (
            e.get("ph") == "X"
            and e.get("cat") in ("cuda_runtime", "cuda_driver")
            and "correlation" in e.get("args", {})
        ):
            launches[e["args"]["correlation"]] = e["ts"]
    kernels = [
        e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    spans = []
    for lo, hi in sorted(ranges):
        mine = [k for k in kernels if lo <= launches.get(k.get("args", {}).get("correlation"), -1) <= hi]
        if mine:
            spans.append(max(k["ts"] + k["dur"] for k in mine) - min(k["ts"] for k in mine))
    return spans


def graph_replay(launch):
    """launch() captured in a CUDA graph, as a callable that replays it; None if it cannot be captured.

    Why: our samples are graph replays, and an op of several kernels launched eagerly under the profiler
    shows the host's gaps between its kernels in the CUPTI span (for an op of several short kernels,
    tens of percent against the graph replay). Profiling the same graph compares like with like; the
    eager span is kept next to it."""
    import torch

    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            launch()  # warm-up off the capture (lazy init, workspace allocation)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            launch()
        g.replay()
        torch.cuda.synchronize()
        return g.replay
    except Exception:  # noqa: BLE001 - not capturable: the eager span is all there is
        torch.cuda.synchronize()
        return None


# which timer is compared with which CUPTI reading: (name, our field, CUPTI's field)
TIMERS = (
    ("cold", "ours_cold_us", "cupti_cold_us"),  # the per-case event timer, L2 flushed
    ("batched", "batched_cold_us", "cupti_cold_us"),  # the batched timer a sweep's cold cases use
    ("hot", "ours_hot_us", "cupti_hot_us"),
)


def judge(rows: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Each ok row's delta to CUPTI per timer (`<timer>_delta_us`, `_delta_pct`, `_within_target`);
    returns, per timer, (comparisons within target, comparisons made)."""
    counts = {name: (0, 0) for name, _, _ in TIMERS}
    for r in rows:
        if r.get("status") != "ok":
            continue
        for name, ours_key, ref_key in TIMERS:
            ours, ref = r.get(ours_key), r.get(ref_key)
            if not ours or not ref:
                continue
            r[f"{name}_delta_us"] = ours - ref
            r[f"{name}_delta_pct"] = 100 * (ours - ref) / ref
            r[f"{name}_within_target"] = stats.within_target(ours, ref)
            within, made = counts[name]
            counts[name] = (within + r[f"{name}_within_target"], made + 1)
    return counts


def table(rows: list[dict[str, Any]], counts: dict[str, tuple[int, int]]) -> str:
    """The printed comparison: per case our timers, CUPTI's and do_bench's; the counts last."""

    def f(r: dict, k: str) -> str:
        v = r.get(k)
        return f"{v:8.2f}" if isinstance(v, float) else f"{'-':>8}"

    def d(r: dict, k: str) -> str:
        v = r.get(k)
        return f"{v:+6.1f}" if isinstance(v, float) else f"{'-':>6}"

    lines = [
        f"{'case':58} {'cold':>8} {'batched':>8} {'cupti':>8} {'d%':>6} {'d%b':>6} | {'hot':>8} {'cupti':>8} "
        f"{'d%':>6} | {'dbcg':>8} {'dbe':>8}"
    ]
    for r in rows:
        name = (r.get("case_id") or f"{r['kernel']}/{r['op']}") + " " + r["backend"]
        if r.get("status") != "ok":
            lines.append(f"{name[:58]:58} {r.get('status')}"[:160])
            continue
        lines.append(
            f"{name[:58]:58} {f(r, 'ours_cold_us')} {f(r, 'batched_cold_us')} {f(r, 'cupti_cold_us')} "
            f"{d(r, 'cold_delta_pct')} {d(r, 'batched_delta_pct')} | {f(r, 'ours_hot_us')} {f(r, 'cupti_hot_us')} "
            f"{d(r, 'hot_delta_pct')} | {f(r, 'do_bench_cudagraph_us')} {f(r, 'do_bench_eager_us')}"
        )
    ok = sum(1 for r in rows if r.get("status") == "ok")
    (cw, cn), (bw, bn), (hw, hn) = counts["cold"], counts["batched"], counts["hot"]
    lines.append(
        f"{ok} cases measured; {cw + hw}/{cn + hn} mode comparisons within target (3% >= 5 us, 0.3 us below); "
        f"the batched cold timer: {bw}/{bn}"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Time DEFAULT_CASES with our core, CUPTI and do_bench_cudagraph; the table printed, the JSON written
    to args.out (args.iters profiler iterations, args.min_time our sampling floor or None)."""
    import torch
    import triton.testing

    from dskbench import measure as core
    from dskbench.device.info import DeviceInfo
    from dskbench.execution.runner import prepare_case
    from dskbench.measure import batch
    from dskbench.registry.load import load_registry
    from dskbench.shapes.cases import default_shapes

    device = DeviceInfo.detect("cuda")
    if device.kind != "cuda":
        print("dskbench fidelity: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    shapes, registry = default_shapes(), load_registry()
    gap = core.calibrate_launch_gap()
    our_settings = core.MeasureSettings()
    if args.min_time is not None:
        our_settings = our_settings.with_(min_time_s=args.min_time)
    settings = core.settings_with_gap(our_settings, {"launch_gap": gap})
    print(f"launch gap: hot {gap.get('hot_us')} us, cold {gap.get('cold_us')} us", file=sys.stderr)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush_buf = torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")

    def flush() -> None:
        flush_buf.fill_(1)

    rows: list[dict[str, Any]] = []
    for kernel, op_spec, phase, point, backend in DEFAULT_CASES:
        row: dict[str, Any] = {
            "kernel": kernel,
            "op": op_spec,
            "phase": phase,
            "point": point,
            "backend": backend,
        }
        rows.append(row)
        try:
            case, why = find_case(shapes, registry, kernel, op_spec, phase, point, backend)
            if case is None:
                row["status"] = f"skipped: {why}"
                continue
            base, prep = prepare_case(kernel, case, backend, device, seed=1234)
            if prep is None:
                row["status"] = f"{base['status']}: {base.get('reason')}"
                continue
            row["case_id"] = case.id
            replay = graph_replay(prep.launch) if prep.backend.capturable else None
            row["cupti_via"] = "graph replay" if replay else "eager launches"
            if prep.backend.capturable and batch.cupti_available():
                # the timer a sweep times cold cases with: the case in a batch of its own
                b = batch.measure_batch([[prep.launch]], device="cuda", settings=settings)[0]
                row["batched_cold_us"] = None if isinstance(b, str) else b.median_us
            for mode in ("cold", "hot"):
                m = core.measure(
                    [prep.launch],
                    device="cuda",
                    mode=mode,
                    capturable=prep.backend.capturable,
                    settings=settings,
                )
                row[f"ours_{mode}_us"] = m.median_us
                row[f"ours_{mode}_raw_us"] = m.raw_median_us
                row[f"ours_{mode}_cv"] = m.cv
                row[f"ours_{mode}_method"] = m.method
                spans = profiler_spans(prep.launch, flush, args.iters, cold=(mode == "cold"))
                row[f"cupti_{mode}_eager_us"] = statistics.median(spans) if spans else None
                if replay is not None:
                    spans = profiler_spans(replay, flush, args.iters, cold=(mode == "cold")) or spans
                row[f"cupti_{mode}_us"] = statistics.median(spans) if spans else None
            row["do_bench_cudagraph_us"] = 1000 * triton.testing.do_bench_cudagraph(
                prep.launch, rep=100, return_mode="median"
            )
            row["do_bench_eager_us"] = 1000 * triton.testing.do_bench(
                prep.launch, rep=100, return_mode="median"
            )
            row["status"] = "ok"
        except Exception as e:  # noqa: BLE001 - one broken case must not end the comparison
            row["status"] = f"error: {type(e).__name__}: {e}"[:300]
        finally:
            torch.cuda.empty_cache()
        time.sleep(0.05)

    counts = judge(rows)
    from dskbench.results.environment import environment

    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "environment": environment(device),
        "settings": {"min_time_s": our_settings.min_time_s},
        "launch_gap": gap,
        "rows": rows,
    }
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    print(table(rows, counts))
    return 0
