"""Synthetic results for the report and compare tests: realistic records without a GPU.

The scenario: two H200 runs at two commits (rmsnorm/sgl_kernel 25% slower in the second, silu_and_mul
/flashinfer 15% faster, silu_and_mul/sglang_jit broken), one B200 run, one CPU reference run; every
status (ok, wrong, skipped, error), a throttled case, a non-converged case and a planning-time skip.
Records go through dskbench.results.io so they satisfy the real schema.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dskbench.measure.metrics import metrics
from dskbench.measure.peaks import datasheet_peaks
from dskbench.results.io import Run, environment_record, result_record, validate_record

H = 7168  # hidden size
I_TP = 2048  # MoE intermediate per expert (shared expert, TP 1)
COMMIT_A = "a" * 7 + "1234567890abcdef1234567890abcdef1"
COMMIT_B = "b" * 7 + "1234567890abcdef1234567890abcdef1"
DECODE_T = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL_T = (512, 1024, 2048, 4096, 8192)
CATEGORIES = {
    "rmsnorm": "norm",
    "silu_and_mul": "activation",
    "fp8_blockwise_scaled_mm": "gemm",
    "cutlass_scaled_fp4_mm": "gemm",
    "BatchMLAPagedAttentionWrapper": "attention",
    "cutlass_mla_get_workspace_size": "attention",
}

DEVICES = {
    "h200": {"kind": "cuda", "name": "NVIDIA H200", "sm": 90, "count": 1, "memory_gib": 139.8,
             "multiprocessors": 132, "driver_version": "580.95.05", "cuda_driver_version": "13.0"},
    "b200": {"kind": "cuda", "name": "NVIDIA B200", "sm": 100, "count": 1, "memory_gib": 178.4,
             "multiprocessors": 148, "driver_version": "580.95.05", "cuda_driver_version": "13.0"},
    "cpu": {"kind": "cpu", "name": "cpu", "sm": 0, "count": 0, "cpu": "x86_64", "cores": 2},
}  # fmt: skip
PEAK = {"h200": (4300.0, 990.0), "b200": (7200.0, 2250.0), "cpu": (40.0, 1.0)}  # GB/s, dense bf16 TFLOP/s


def ceilings_for(device: str) -> dict[str, Any] | None:
    """Measured ceilings in the layout of dskbench.measure.ceilings.measure_ceilings."""
    if device == "cpu":
        return None
    bw, tf = PEAK[device]
    detail = {"method": "cuda-graph", "mode": "hot", "n_samples": 50, "noise": 0.002, "converged": True}
    return {
        "gpu": DEVICES[device]["name"],
        "sm": DEVICES[device]["sm"],
        "bandwidth_gbps": round(bw * 0.9, 1),
        "bf16_tflops": round(tf * 0.75, 1),
        "fp8_tflops": round(tf * 1.4, 1),
        "copy": {**detail, "gbps": round(bw * 0.9, 1), "op": "Tensor.copy_ fp32", "throttled": False},
        "bf16_matmul": {**detail, "tflops": round(tf * 0.75, 1), "op": "torch.mm bf16", "throttled": False},
        "fp8_matmul": {
            **detail,
            "tflops": round(tf * 1.4, 1),
            "op": "torch._scaled_mm fp8",
            "throttled": True,
        },
    }


def environment(run_id: str, device: str, commit: str, created: str) -> dict[str, Any]:
    ceilings = ceilings_for(device)
    return environment_record(
        run_id,
        created=created,
        host="bench-1",
        platform="Linux-6.8-x86_64",
        device=dict(DEVICES[device]),
        versions={
            "torch": "2.11.0+cu130" if device != "cpu" else "2.13.0+cpu",
            "sglang-kernel": "0.4.5",
            "flashinfer-python": "0.6.14",
            "sglang": "0.5.16",
            "triton": "3.5.0",
            "python": "3.11.7",
            "cuda_runtime": "13.0" if device != "cpu" else None,
        },
        git={"commit": commit, "dirty": False},
        ceilings=ceilings,
        settings={"profile": "full" if device != "cpu" else "cpu", "mode": "cold"},
    )


def _timing(rng: random.Random, median: float, n: int = 40, cv: float = 0.02, **extra: Any) -> dict[str, Any]:
    samples = sorted(median * (1 + rng.gauss(0, cv)) for _ in range(n))
    med = samples[n // 2]
    shift = median / med  # keep the requested median exactly
    samples = [round(s * shift, 4) for s in samples]
    t = {
        "median_us": round(median, 4),
        "p10_us": samples[n // 10],
        "p90_us": samples[(9 * n) // 10],
        "mean_us": round(sum(samples) / n, 4),
        "min_us": samples[0],
        "max_us": samples[-1],
        "cv": cv,
        "noise": cv / 4,
        "n_samples": n,
        "launches_per_sample": 20,
        "converged": True,
        "method": "cuda-graph",
        "mode": "cold",
        "device": "cuda",
        "n_sets": 1,
        "samples_us": samples,
    }
    t.update(extra)
    return t


def _backend(name: str, kernel: str) -> dict[str, Any]:
    pkg = {"sgl_kernel": "sglang-kernel", "flashinfer": "flashinfer-python", "torch-ref": "torch"}.get(
        name, "sglang"
    )
    kind = {"sgl_kernel": "aot", "flashinfer": "jit", "torch-ref": "torch", "sglang_triton": "triton"}.get(
        name, "jit"
    )
    return {
        "name": name,
        "kind": kind,
        "target": f"{pkg.replace('-', '_')}:{kernel}",
        "resolved_target": f"{pkg.replace('-', '_')}:{kernel}",
        "package": pkg,
        "version": {"sglang-kernel": "0.4.5", "flashinfer-python": "0.6.14", "torch": "2.11.0"}.get(
            pkg, "0.5.16"
        ),
        "label": name,
        "dispatches_to": "flashinfer" if name == "sgl_kernel" and kernel == "rmsnorm" else None,
        "capturable": True,
    }


def _case(
    kernel: str, op: str, phase: str, point: dict[str, int], dims: dict[str, Any], variant: str | None = None
):
    opv = f"{op}:{variant}" if variant else op
    pt = ",".join(f"{k}={v}" for k, v in point.items())
    return {
        "case_id": f"{kernel}/{opv}/{phase}/{pt}",
        "kernel": kernel,
        "op": op,
        "variant": variant,
        "phase": phase,
        "point": dict(point),
        "dims": dict(dims),
    }


def _ok(rng, device, case, backend, nbytes, flops, base_us, eff, **timing_extra) -> dict[str, Any]:
    bw, tf = PEAK[device]
    t_mem = nbytes / (bw * eff * 1e3)  # us
    t_cmp = flops / (tf * eff * 1e6) if flops else 0.0
    median = (base_us + max(t_mem, t_cmp)) * (1 + rng.gauss(0, 0.005))  # run-to-run drift
    clocks = {"throttled": False, "throttle_reasons": []}
    if timing_extra.pop("throttled", False):
        clocks = {"throttled": True, "throttle_reasons": ["hw_thermal_slowdown"]}
    timing = _timing(rng, median, **timing_extra)
    compute = "fp8" if "fp8" in case["kernel"] else "fp4" if "fp4" in case["kernel"] else "bf16"
    m = metrics(
        timing["median_us"],
        nbytes,
        flops or None,
        ceilings_for(device),
        datasheet_peaks(DEVICES[device]["name"]),
        compute=compute,
    )
    return {
        **case,
        "backend": _backend(backend, case["kernel"]),
        "status": "ok",
        "seed": 1,
        "traffic": {"bytes": nbytes, "flops": flops, "note": ""},
        "check": {"error": 1e-3, "tolerance": 2e-2, "detail": ""},
        "timing": timing,
        "metrics": m,
        "clocks": clocks,
    }


def _bad(case, backend, status, reason) -> dict[str, Any]:
    return {**case, "backend": _backend(backend, case["kernel"]), "status": status, "reason": reason}


def scenario_records(device: str, second: bool, rng: random.Random) -> list[dict[str, Any]]:
    """Result records of one run (`second`: the later commit, with its regressions and fixes)."""
    out: list[dict[str, Any]] = []
    cpu = device == "cpu"
    backends_norm = ["torch-ref"] if cpu else ["sgl_kernel", "flashinfer", "sglang_jit"]
    for phase, ts in (("decode", DECODE_T), ("prefill", PREFILL_T)):
        for t in ts if not cpu else ts[:4]:
            case = _case("rmsnorm", "input_layernorm", phase, {"T": t}, {"T": t, "hidden": H})
            nbytes = 2 * t * H * 2 + H * 2
            for b in backends_norm:
                slow = 1.25 if (second and b == "sgl_kernel") else 1.0
                eff = {"sgl_kernel": 0.8, "flashinfer": 0.85, "sglang_jit": 0.7, "torch-ref": 0.3}[b]
                extra: dict[str, Any] = {}
                if second and b == "flashinfer" and t == 64:
                    extra["throttled"] = True
                if b == "sglang_jit" and t == 2:
                    extra["converged"] = False
                    extra["cv"] = 0.12
                rec = _ok(
                    rng, device, case, b, nbytes, 0, 2.1 * slow if not cpu else 15.0, eff / slow, **extra
                )
                out.append(rec)
            case = _case("silu_and_mul", "mlp.act_fn", phase, {"T": t}, {"T": t, "d": I_TP})
            nbytes = t * 2 * I_TP * 2 + t * I_TP * 2
            for b in ["torch-ref"] if cpu else ["sgl_kernel", "flashinfer", "sglang_jit"]:
                if b == "sglang_jit" and second:
                    out.append(
                        _bad(
                            case,
                            b,
                            "error",
                            "RuntimeError: CUDA error: an illegal memory access was encountered",
                        )
                    )
                    continue
                fast = 0.85 if (second and b == "flashinfer") else 1.0
                out.append(_ok(rng, device, case, b, nbytes, 0, 1.9 * fast, 0.8 / fast))
            if cpu:
                continue
            # FP8 block-scaled GEMM: q_b_proj-like, N=24576, K=1536
            n, k = 24576, 1536
            case = _case("fp8_blockwise_scaled_mm", "q_b_proj", phase, {"T": t}, {"M": t, "N": n, "K": k})
            nbytes = t * k + n * k + t * n * 2 + (t * k // 128 + n * k // 128**2) * 4
            out.append(_ok(rng, device, case, "sgl_kernel", nbytes, 2 * t * n * k, 4.0, 0.7))
            if t in (1, 8):
                out.append(_bad(case, "sglang_triton", "wrong", "relative error 0.31 > tolerance 0.02"))
            else:
                out.append(_ok(rng, device, case, "sglang_triton", nbytes, 2 * t * n * k, 6.0, 0.5))
            case = _case("cutlass_scaled_fp4_mm", "o_proj", phase, {"T": t}, {"M": t, "N": H, "K": 16384})
            if device == "b200":
                nbytes = t * 16384 // 2 + H * 16384 // 2 + t * H * 2
                out.append(_ok(rng, device, case, "sgl_kernel", nbytes, 2 * t * H * 16384, 3.0, 0.75))
            else:
                out.append(_bad(case, "sgl_kernel", "skipped", "needs sm100/sm103 (found sm90)"))
    if cpu:
        return out
    # MLA decode: a B x kv_len grid
    for b_ in (1, 8, 32, 128):
        for kv in (1024, 4096, 16384):
            case = _case(
                "BatchMLAPagedAttentionWrapper", "attn_mqa", "decode", {"B": b_, "kv_len": kv},
                {"B": b_, "kv_len": kv, "heads": 128, "d_ckv": 512, "d_kpe": 64}, variant="absorbed",
            )  # fmt: skip
            nbytes = b_ * kv * 576 * 2 + b_ * 128 * 576 * 2 + b_ * 128 * 512 * 2
            flops = 2 * b_ * 128 * kv * (576 + 512)
            out.append(_ok(rng, device, case, "flashinfer", nbytes, flops, 8.0, 0.6))
            if kv == 16384 and b_ == 128:
                out.append(
                    _bad(
                        case,
                        "sglang_triton",
                        "error",
                        "out of memory: torch.OutOfMemoryError: CUDA out of memory",
                    )
                )
            else:
                out.append(_ok(rng, device, case, "sglang_triton", nbytes, flops, 12.0, 0.4))
    return out


def make_run(run_id: str, device: str, commit: str, created: str, second: bool = False, seed: int = 0) -> Run:
    rng = random.Random(seed)
    env = environment(run_id, device, commit, created)
    recs = [result_record(run_id, r.pop("status"), **r) for r in scenario_records(device, second, rng)]
    plan_skip = {"kernel": "cutlass_mla_get_workspace_size", "case_id": "cutlass_mla_get_workspace_size"}
    recs.insert(
        0,
        result_record(
            run_id, "skipped", backend={"name": "-"}, reason="host-only: a host function", **plan_skip
        ),
    )
    return Run(env, recs)


def fake_runs() -> list[Run]:
    """The full scenario: H200 at two commits, B200 at the second, and a CPU reference run."""
    return [
        make_run("r1", "h200", COMMIT_A, "2026-01-10T10:00:00+00:00", second=False, seed=1),
        make_run("r2", "h200", COMMIT_B, "2026-01-12T10:00:00+00:00", second=True, seed=2),
        make_run("r3", "b200", COMMIT_B, "2026-01-12T12:00:00+00:00", second=True, seed=3),
        make_run("r4", "cpu", COMMIT_B, "2026-01-12T13:00:00+00:00", second=True, seed=4),
    ]


def big_run(n_records: int = 3000, seed: int = 7) -> Run:
    """About n_records ok results over many kernels (for the report-size test)."""
    rng = random.Random(seed)
    env = environment("big", "h200", COMMIT_A, "2026-01-11T00:00:00+00:00")
    recs = []
    ts = DECODE_T + PREFILL_T
    per_kernel = len(ts) * 3 * 4  # T points x backends x ops
    for kernel_i in range(-(-n_records // per_kernel)):
        kernel = f"kernel_{kernel_i:02d}"
        for op_i in range(4):
            for t in ts:
                case = _case(kernel, f"op_{op_i}", "decode" if t < 512 else "prefill", {"T": t}, {"T": t})
                for b in ("sgl_kernel", "flashinfer", "sglang_jit"):
                    rec = _ok(rng, "h200", case, b, t * H * 4, 2 * t * H * H, 3.0, 0.5 + 0.1 * op_i, n=10)
                    recs.append(result_record("big", rec.pop("status"), **rec))
    return Run(env, recs[:n_records])


def write_runs(runs: Iterable[Run], path: str | Path) -> Path:
    """A results file as the runner writes it (validated records, one JSON object a line; no fsync)."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as fh:
        for run in runs:
            for rec in (run.environment, *run.results):
                validate_record(rec)
                fh.write(json.dumps(rec, sort_keys=True) + "\n")
    return path
