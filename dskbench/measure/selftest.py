"""GPU self-test of dskbench.measure: its numbers next to the profiler's (CUPTI) kernel durations and
Triton's timers, on plain torch ops, in cold and hot mode.

    dskbench selftest OUT.json [--quick] [--no-ceilings] [--only NAME ...]

The reference is torch.profiler's (CUPTI) span per launch (first activity start -> last end, kernels
and memcpys, the flush left out), from an eager loop of [flush, op] (cold) or [op] (hot). The launch
gap is calibrated first (calibrate_launch_gap) and subtracted by measure(); the table shows the raw and
the corrected medians, and the target is checked on both: within 3% of CUPTI for ops of 5 us or more,
within 0.3 us below that. Each cuda-graph case is measured twice, so the run-to-run spread is visible
next to the error. Prints the calibration and a table last; writes everything (measurements without
raw samples, clocks, calibration, ceilings) to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from dskbench.measure import (
    MeasureSettings,
    datasheet_peaks,
    gpu_identity,
    measure,
    measure_ceilings,
    read_clocks,
)
from dskbench.measure.calibrate import (
    ProfileJob,
    calibrate_launch_gap,
    profile_launches,
    settings_with_gap,
    span_summary,
)
from dskbench.measure.cuda import flush_buffer, l2_bytes
from dskbench.measure.stats import within_target


def make_ops(dev: torch.device) -> dict[str, tuple[list[Callable[[], Any]], str, int]]:
    """name -> (launchers, description, profiler iterations). Random data, never zeros."""
    g = torch.Generator(device=dev)
    g.manual_seed(1234)

    def rnd(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=dtype, generator=g)

    ops: dict[str, tuple[list[Callable[[], Any]], str, int]] = {}

    # ~1-2 us elementwise op, 4 rotated input sets (all fit in L2, so cold vs hot matters)
    small = [
        (rnd(1, 7168), rnd(1, 7168), torch.empty(1, 7168, device=dev, dtype=torch.bfloat16)) for _ in range(4)
    ]
    ops["add_1x7168_bf16"] = (
        [lambda s=s: torch.add(s[0], s[1], out=s[2]) for s in small],
        "torch.add out=, 4 sets",
        400,
    )

    mid = [
        (rnd(64, 4096), rnd(64, 4096), torch.empty(64, 4096, device=dev, dtype=torch.bfloat16))
        for _ in range(4)
    ]
    ops["mul_64x4096_bf16"] = (
        [lambda s=s: torch.mul(s[0], s[1], out=s[2]) for s in mid],
        "torch.mul out=, 4 sets",
        400,
    )

    # a large device-to-device copy (memcpy node in graphs)
    src = rnd(64 << 20, dtype=torch.float32)
    dst = torch.empty_like(src)
    ops["copy_256MiB_fp32"] = ([lambda: dst.copy_(src)], "Tensor.copy_ 256 MiB", 40)

    # small GEMM like dsv3_fused_a_gemm (weight 30 MB: L2-resident when hot), and a large one
    a, w = rnd(8, 7168), rnd(7168, 2112)
    c = torch.empty(8, 2112, device=dev, dtype=torch.bfloat16)
    ops["mm_8x7168x2112_bf16"] = ([lambda: torch.mm(a, w, out=c)], "torch.mm [8,7168]x[7168,2112]", 300)
    A, B = rnd(4096, 4096), rnd(4096, 4096)
    C = torch.empty(4096, 4096, device=dev, dtype=torch.bfloat16)
    ops["mm_4096_bf16"] = ([lambda: torch.mm(A, B, out=C)], "torch.mm 4096^3", 60)
    return ops


def cupti_us(
    launchers: list[Callable[[], Any]], cold: bool, flush: torch.Tensor, iters: int
) -> dict[str, Any]:
    """Median per-launch CUPTI span (first activity start -> last end; the flush left out) from an eager
    loop under torch.profiler, launches told apart by record_function annotations (calibrate.py)."""
    spans, grouping = profile_launches([ProfileJob(launchers, cold, iters)], flush)
    ref = span_summary(spans[0])
    return {**ref, "grouping": grouping}


def triton_us(launchers: list[Callable[[], Any]]) -> dict[str, float | None]:
    """Triton's do_bench_cudagraph (hot, no flush) and do_bench (eager, flushes 256 MB), medians."""
    try:
        from triton.testing import do_bench, do_bench_cudagraph
    except Exception:
        return {"do_bench_cudagraph_us": None, "do_bench_us": None}
    i = [0]

    def fn() -> None:
        launchers[i[0] % len(launchers)]()
        i[0] += 1

    out: dict[str, float | None] = {}
    try:
        with torch.cuda.stream(torch.cuda.Stream()):
            out["do_bench_cudagraph_us"] = do_bench_cudagraph(fn, rep=100, return_mode="median") * 1000.0
    except Exception as e:
        print(f"  do_bench_cudagraph failed: {type(e).__name__}: {e}")
        out["do_bench_cudagraph_us"] = None
    try:
        out["do_bench_us"] = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1000.0
    except Exception as e:
        print(f"  do_bench failed: {type(e).__name__}: {e}")
        out["do_bench_us"] = None
    return out


def raw(m: Any) -> float:
    """The median before the launch gap was subtracted (the median itself when nothing was)."""
    return m.raw_median_us if m.raw_median_us is not None else m.median_us


def brief(m: Any) -> dict[str, Any]:
    d = m.to_dict()
    d.pop("samples_us")
    return d


def run(args: argparse.Namespace) -> int:
    """The self-test: args.out (JSON), args.quick, args.no_ceilings, args.only (op names or None)."""
    if not torch.cuda.is_available():
        print("dskbench selftest: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    base = MeasureSettings.quick() if args.quick else MeasureSettings()
    print("launch gap calibration ...", flush=True)
    try:
        cal: dict[str, Any] = calibrate_launch_gap(dev.index)
    except Exception as e:
        cal = {"error": f"{type(e).__name__}: {e}"}
    settings = settings_with_gap(base, {"launch_gap": cal})
    ident = gpu_identity(dev.index)
    name = torch.cuda.get_device_name(dev)
    report: dict[str, Any] = {
        "gpu": ident,
        "torch_gpu_name": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "l2_bytes": l2_bytes(dev.index),
        "clocks_start": read_clocks(dev.index),
        "settings": settings.__dict__,
        "peaks": datasheet_peaks(name),
        "launch_gap": cal,
        "rows": [],
    }
    flush = flush_buffer(dev.index, 2 * l2_bytes(dev.index))
    ops = make_ops(dev)
    rows = []
    t0 = time.perf_counter()
    for op_name, (launchers, desc, iters) in ops.items():
        if args.only and op_name not in args.only:
            continue
        trit = triton_us(launchers)
        variants = [("cold", settings, op_name), ("hot", settings, op_name)]
        if op_name == "mm_4096_bf16":  # how much the cooldown matters for a power-hungry GEMM
            variants.append(("hot", settings.with_(cooldown=0.0), op_name + ",cool=0"))
        for mode, s, label in variants:
            print(f"{label} {mode} ...", flush=True)
            ref = cupti_us(launchers, mode == "cold", flush, iters)
            g1 = measure(launchers, mode=mode, settings=s)
            g2 = measure(launchers, mode=mode, settings=s)
            eg = measure(launchers, mode=mode, capturable=False, settings=s)
            row = {
                "op": label,
                "desc": desc,
                "mode": mode,
                "cooldown": s.cooldown,
                "cupti": ref,
                "graph": brief(g1),
                "graph_repeat": brief(g2),
                "eager": brief(eg),
                **trit,
                "graph_within_target": within_target(g1.median_us, ref["median_us"]),
                "graph_raw_within_target": within_target(raw(g1), ref["median_us"]),
                "eager_within_target": within_target(eg.median_us, ref["median_us"]),
            }
            rows.append(row)
    report["rows"] = rows
    report["measure_wall_s"] = time.perf_counter() - t0
    if not args.no_ceilings:
        print("ceilings ...", flush=True)
        report["ceilings"] = measure_ceilings(str(dev))
    report["clocks_end"] = read_clocks(dev.index)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str))

    print()
    print(f"GPU {name}  torch {torch.__version__}  L2 {report['l2_bytes'] >> 20} MiB  -> {args.out}")
    hdr = (
        f"{'op':22} {'mode':4} {'cupti':>8} {'k':>2} {'raw':>8} {'err%':>6} {'ok':>2} {'graph':>8} {'err%':>6} "
        f"{'ok':>2} {'repeat':>8} {'eagraw':>8} {'eager':>8} {'err%':>6} {'dbcg':>8} {'dobench':>8} "
        f"{'flush':>6} {'lps':>5} {'n':>5} {'noise%':>6} thr {'smMHz':>9} {'maxW':>4}"
    )

    def f(x: float | None, w: int = 8, p: int = 2) -> str:
        return f"{x:{w}.{p}f}" if isinstance(x, (int, float)) and math.isfinite(x) else f"{'-':>{w}}"

    def pct(x: float | None, c: float) -> float:
        return 100.0 * (x - c) / c if isinstance(x, (int, float)) and c else math.nan

    def yn(b: bool) -> str:
        return f"{'Y' if b else 'N':>2}"

    def thr(t: bool | None) -> str:
        return "-" if t is None else ("Y" if t else "N")

    def clk(d: dict[str, Any] | None) -> str:
        if not d or d.get("sm_mhz_min") is None:
            return f"{'-':>9} {'-':>4}"
        w = d.get("power_w_max")
        return f"{d['sm_mhz_min']:>4}-{d['sm_mhz_max']:<4} {w if w is None else round(w):>4}"

    if "error" in cal:
        print(f"launch gap calibration failed: {cal['error']} (nothing corrected)")
    else:
        print(
            f"launch gap ({cal['grouping']}, {cal['wall_s']:.1f} s): graph hot {f(cal['hot_us'], 0, 3)} "
            f"cold {f(cal['cold_us'], 0, 3)} us, eager hot {f(cal['eager_hot_us'], 0, 3)} "
            f"cold {f(cal['eager_cold_us'], 0, 3)} us; applied {settings.launch_gap_us}"
        )
        for o in cal["ops"]:
            print(
                f"  {o['op']:22} {o['mode']:4} cupti {f(o['cupti_median_us'])} (busy {f(o['cupti_busy_us'])}, "
                f"{o['cupti_launches']} launches) graph {f(o['graph_us'])} gap {f(o['gap_us'], 6, 3)}  "
                f"eager {f(o['eager_us'])} gap {f(o['eager_gap_us'], 6, 3)}"
            )
        for w in cal["warnings"]:
            print(f"  warning: {w}")
    print(hdr)
    n_ok = n_raw_ok = 0
    for r in rows:
        c, g, g2, e = r["cupti"]["median_us"], r["graph"], r["graph_repeat"], r["eager"]
        g_raw = g["raw_median_us"] if g["raw_median_us"] is not None else g["median_us"]
        e_raw = e["raw_median_us"] if e["raw_median_us"] is not None else e["median_us"]
        n_ok += r["graph_within_target"]
        n_raw_ok += r["graph_raw_within_target"]
        dbcg = r["do_bench_cudagraph_us"] if r["mode"] == "hot" else None
        dob = r["do_bench_us"] if r["mode"] == "cold" else None
        print(
            f"{r['op']:22} {r['mode']:4} {f(c)} {r['cupti']['per_launch']:>2} {f(g_raw)} "
            f"{f(pct(g_raw, c), 6, 1)} {yn(r['graph_raw_within_target'])} {f(g['median_us'])} "
            f"{f(pct(g['median_us'], c), 6, 1)} {yn(r['graph_within_target'])} {f(g2['median_us'])} "
            f"{f(e_raw)} {f(e['median_us'])} {f(pct(e['median_us'], c), 6, 1)} {f(dbcg)} {f(dob)} "
            f"{f(g['flush_us'], 6, 1)} {g['launches_per_sample']:5d} {g['n_samples']:5d} "
            f"{f(100 * g['noise'], 6, 2)} {thr(g['throttled']):>3} {clk(g['clocks_during'])}"
        )
    ceil = report.get("ceilings")
    if ceil:
        peaks = report["peaks"] or {}
        print(
            f"ceilings: copy {f(ceil.get('bandwidth_gbps'), 0, 0)} GB/s (sheet {peaks.get('hbm_gbps', '-')}), "
            f"bf16 {f(ceil.get('bf16_tflops'), 0, 0)} TFLOP/s (sheet {peaks.get('bf16_tflops', '-')}), "
            f"fp8 {f(ceil.get('fp8_tflops'), 0, 0)} TFLOP/s (sheet {peaks.get('fp8_tflops', '-')})"
        )
        lg = ceil.get("launch_gap") or {}
        again = ", ".join(
            f"{k} {f(lg.get(k + '_us'), 0, 3)}" for k in ("hot", "cold", "eager_hot", "eager_cold")
        )
        print(f"launch gap again (measure_ceilings): {lg.get('error') or again} us")
    print(
        f"graph within target (3% >= 5 us, 0.3 us below): corrected {n_ok}/{len(rows)}, raw {n_raw_ok}/{len(rows)}"
    )
    return 0
