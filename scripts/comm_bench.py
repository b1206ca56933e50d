"""Communication kernels across the GPUs of one host: one process per GPU, started by torchrun.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        torchrun --nproc-per-node 4 scripts/comm_bench.py --out results/comm-tp4.jsonl [--quick]

Kernels: custom_all_reduce (sgl_kernel v1, sglang_jit v2, nccl baseline) and
flashinfer_communication_fusion (flashinfer allreduce_fusion with residual + RMSNorm, and the unfused
NCCL + fused_add_rmsnorm baseline), at [T, 7168] bf16 with TP = the number of processes, T from the
shapes file's decode and prefill token lists (or --tokens). See dskbench/adapters/comm.py.

Every rank builds the same inputs (all ranks' contributions, from one agreed seed), runs the backend
once and checks its own result against the sum over ranks (fused: + residual, then RMSNorm); then the
ranks time it together through dskbench.measure.collective (CUDA graphs where the backend allows; the
launch counts are agreed by all ranks, so none waits for a collective the others skip). Rank 0 writes
our results file: one environment record (every rank's GPU), one result per (kernel, backend, case)
with the slowest rank's timing (a collective ends when its last rank does), every rank's median, and
algorithm and bus bandwidth (busbw = 2(n-1)/n x T x H x 2 bytes / t, nccl-tests' convention).

A rank that fails inside a collective cannot be recovered from (the others wait in the kernel): the run
ends there; records already written stay, and --resume skips them on the next run.

--device cpu runs the same path on CPU tensors over gloo (the nccl baselines become gloo all-reduces, the
GPU kernels are skipped): for tests, and to try arguments before spending GPU time.
"""

from __future__ import annotations

import os

# Before torch, NCCL or torch's symmetric memory read them, in every rank: no NVLink multicast (it can
# put shared GPUs out of service). The same values as dskbench.shard.NO_MULTICAST_ENV (a test checks).
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
os.environ.update(NO_MULTICAST_ENV)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime as dt  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KERNELS = ("custom_all_reduce", "flashinfer_communication_fusion")
PHASES = ("decode", "prefill", "decode_graph")
EXIT_USAGE = 2


def _csv_ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="comm_bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", action="append", choices=KERNELS, help="default: both")
    p.add_argument("--backend", action="append", help="backend name (repeatable; default: all)")
    p.add_argument("--sweep", action="append", choices=PHASES, help="default: decode and prefill")
    p.add_argument("--tokens", type=_csv_ints, help="token counts T, e.g. 1,64,512 (default: the sweep's)")
    p.add_argument("--quick", action="store_true", help="the shapes file's quick token lists, short budget")
    p.add_argument(
        "--mode", choices=("hot", "cold"), default="hot", help="L2 state (default hot: see --help)"
    )
    p.add_argument("--seed", type=int, help="input seed (default: fresh)")
    p.add_argument("--budget", type=float, help="sampling time budget per case, seconds")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo, for tests")
    p.add_argument("--out", type=Path, help="results file (rank 0 appends one run)")
    p.add_argument("--resume", action="store_true", help="skip (case, backend) pairs --out already holds")
    p.add_argument("--dry-run", action="store_true", help="print the plan (no process group needed)")
    p.add_argument("--world", type=int, help="TP degree for --dry-run outside torchrun")
    return p


@dataclasses.dataclass
class Plan:
    kernel: str
    backends: list[Any]
    cases: list[Any]


def make_plan(args: argparse.Namespace, world: int) -> list[Plan]:
    """(kernel, backends, cases) for this world size; raises ValueError on an unknown backend."""
    from dskbench.adapters import get_adapter
    from dskbench.adapters.comm import comm_cases
    from dskbench.shapes import default_shapes

    shapes = default_shapes()
    profile = "quick" if args.quick else "full"
    phases = tuple(args.sweep or ("decode", "prefill"))
    plans, known = [], set()
    for kernel in args.kernel or KERNELS:
        adapter = get_adapter(kernel)
        backends = [b for b in adapter.backends]  # torch-ref is the oracle, not a contender
        known.update(b.name for b in backends)
        if args.backend:
            backends = [b for b in backends if b.name in args.backend]
        cases = [
            c for c in comm_cases(shapes, kernel, world, phases, profile, args.tokens) if adapter.applies(c)
        ]
        plans.append(Plan(kernel, backends, cases))
    unknown = sorted(set(args.backend or ()) - known)
    if unknown:
        raise ValueError(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return plans


def settings_for(args: argparse.Namespace) -> Any:
    from dskbench.measure import MeasureSettings

    s = MeasureSettings.quick() if args.quick else MeasureSettings()
    return s.with_(max_time_s=args.budget) if args.budget is not None else s


# -- the process group -------------------------------------------------------------------------------------


def init_ranks(device_kind: str) -> tuple[Any, Any, Any]:
    """(RankContext fields: rank, world, local rank, device), the device group and the CPU group."""
    import torch
    import torch.distributed as dist

    timeout = dt.timedelta(minutes=10)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    cpu_group = dist.new_group(backend="gloo", timeout=timeout)
    return device, dist.group.WORLD, cpu_group


def gpu_block(index: int) -> dict[str, Any]:
    """One rank's GPU: what the environment record lists for each."""
    import torch

    props = torch.cuda.get_device_properties(index)
    block: dict[str, Any] = {
        "index": index,
        "name": props.name,
        "sm": props.major * 10 + props.minor,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
    }
    try:
        from dskbench.measure import gpu_identity

        ident = gpu_identity(index) or {}
        block.update({k: ident.get(k) for k in ("uuid", "driver_version", "power_limit_w", "sm_max_mhz")})
    except Exception as e:  # noqa: BLE001 - NVML is optional
        block["nvml_error"] = f"{type(e).__name__}: {e}"
    return block


# -- one case --------------------------------------------------------------------------------------------


def run_case(adapter, backend, setup, case, ctx, agree, args, run_seed: int) -> dict[str, Any]:
    """Check, then time one case on every rank; the record fields (meaningful on rank 0)."""
    import torch

    from dskbench.measure.collective import measure_collective
    from dskbench.runner import case_seed

    seed = case_seed(run_seed, case.id, backend.name)
    base: dict[str, Any] = {"seed": seed}
    dev = str(ctx.device)
    inputs = adapter.make_inputs(case, dev, seed)
    mine = adapter.rank_inputs(inputs, ctx.rank)
    why = setup.skip(mine, case)
    reasons = [r for r in agree.gather(why) if r]
    if reasons:
        return {**base, "status": "skipped", "reason": reasons[0]}
    detail = setup.detail(mine, case)
    ref = adapter.reference(inputs, case)
    del inputs
    try:
        launch, err = setup.bind(mine, case), None
    except Exception as e:  # noqa: BLE001 - agreed below, before any rank launches
        launch, err = None, f"{type(e).__name__}: {e}"
    errs = [e for e in agree.gather(err) if e]
    if errs:
        return {**base, "status": "error", "reason": errs[0][:2000]}
    out = launch()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    chk = adapter.check(out, ref, case)
    del out, ref
    checks = agree.gather((chk.ok, chk.error, chk.tolerance, chk.detail))
    worst = max(range(len(checks)), key=lambda r: checks[r][1] / max(checks[r][2], 1e-30))
    ok, error, tol, chk_detail = checks[worst]
    base["check"] = {"error": error, "tolerance": tol, "detail": f"rank {worst}: {chk_detail}".strip()}
    if detail:
        base["detail"] = detail
    if not all(c[0] for c in checks):
        return {
            **base,
            "status": "wrong",
            "reason": f"rank {worst}: relative error {error:.3g} > tolerance {tol:.1g}",
        }
    m = measure_collective(
        [launch],
        agree=agree,
        device=dev,
        mode=args.mode,
        capturable=backend.capturable and setup.capturable,
        settings=settings_for(args),
        capture_context=setup.capture,
    )
    timings = agree.gather(dataclasses.asdict(m))
    return {**base, **summarize_ranks(timings, case)}


def summarize_ranks(timings: list[dict[str, Any]], case: Any) -> dict[str, Any]:
    """The slowest rank's timing (a collective ends when its last rank does), every rank's median, and
    the metrics at the slowest median."""
    from dskbench.adapters.comm import algbw_gbps, bus_bytes, busbw_gbps, payload_bytes
    from dskbench.measure import metrics

    world = len(timings)
    medians = [t.get("median_us") for t in timings]
    if not all(isinstance(x, int | float) and x == x and x > 0 for x in medians):
        return {"status": "error", "reason": f"a rank produced no timing samples (medians {medians})"}
    slow = max(range(world), key=lambda r: medians[r])
    timing = dict(timings[slow])
    clocks = {k: timing.pop(k) for k in ("clocks_before", "clocks_after", "throttled", "throttle_reasons")}
    timing["rank"] = slow
    payload = payload_bytes(case)
    world_tp = int(case.dims["world"])
    med = medians[slow]
    mets = metrics(med, bytes=bus_bytes(payload, world_tp))
    mets.update(
        payload_bytes=payload,
        algbw_gbps=algbw_gbps(payload, med),
        busbw_gbps=busbw_gbps(payload, world_tp, med),
    )
    ranks = [
        {
            "rank": r,
            "median_us": t["median_us"],
            "p10_us": t["p10_us"],
            "p90_us": t["p90_us"],
            "method": t["method"],
        }
        for r, t in enumerate(timings)
    ]
    return {"status": "ok", "timing": timing, "metrics": mets, "clocks": clocks, "ranks": ranks}


# -- the run ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "0")) or (args.world or 0)
    if args.dry_run:
        return dry_run(args, world or 2)
    if world < 2 or "RANK" not in os.environ:
        print(
            "comm_bench.py: run under torchrun --nproc-per-node N (N >= 2), or use --dry-run", file=sys.stderr
        )
        return EXIT_USAGE
    if args.out is None:
        print("comm_bench.py: --out is required", file=sys.stderr)
        return EXIT_USAGE
    try:
        plans = make_plan(args, world)
    except ValueError as e:
        print(f"comm_bench.py: {e}", file=sys.stderr)
        return EXIT_USAGE
    return run(args, plans, world)


def dry_run(args: argparse.Namespace, world: int) -> int:
    try:
        plans = make_plan(args, world)
    except ValueError as e:
        print(f"comm_bench.py: {e}", file=sys.stderr)
        return EXIT_USAGE
    n = 0
    for p in plans:
        for b in p.backends:
            for c in p.cases:
                print(f"{c.id}  {b.name}")
                n += 1
    print(f"{n} cases at TP {world}")
    return 0


def run(args: argparse.Namespace, plans: list[Plan], world: int) -> int:
    import torch
    import torch.distributed as dist

    from dskbench.adapters import get_adapter
    from dskbench.adapters.comm import RANK_SETUPS, RankContext
    from dskbench.backends import DeviceInfo, Unavailable, resolve
    from dskbench.environment import environment, new_run_id
    from dskbench.measure.collective import Agreement
    from dskbench.results import ResultsWriter, environment_record, read_runs, result_record
    from dskbench.runner import backend_block, finished_keys

    device, device_group, cpu_group = init_ranks(args.device)
    agree = Agreement(cpu_group)
    rank = agree.rank
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little") % 2**31
    run_seed = int(agree.value(seed))
    if device.type == "cuda":
        blocks = agree.gather(gpu_block(device.index))
        info = DeviceInfo("cuda", blocks[0]["name"], blocks[0]["sm"], world)
    else:
        blocks = agree.gather({"index": rank, "name": "cpu"})
        info = DeviceInfo("cpu")
    done = set()
    if args.resume and rank == 0 and args.out.exists():
        done = finished_keys(read_runs([args.out]))
    done = set(agree.gather(sorted(done))[0])
    writer = None
    run_id = new_run_id()
    if rank == 0:
        env = environment(info)
        if device.type == "cuda":
            env["device"]["count"] = world
        settings = {"world": world, "mode": args.mode, "run_seed": run_seed, "quick": args.quick}
        writer = ResultsWriter(args.out)
        writer.write(
            environment_record(run_id, **env, gpus=blocks, settings=settings, command=["torchrun", *sys.argv])
        )
    counts: dict[str, int] = {}
    stranded: list[Any] = []  # setups never closed (kept alive: their __del__ may close collectively)
    try:
        for plan in plans:
            adapter = get_adapter(plan.kernel)
            max_tokens = max((int(c.dims["T"]) for c in plan.cases), default=1)
            for backend in plan.backends:
                cases = [c for c in plan.cases if (c.id, backend.name) not in done]
                if not cases:
                    continue
                ctx = RankContext(
                    rank, world, device, device_group, cpu_group, max_tokens, int(cases[0].dims["H"])
                )
                setup, block, why = None, {"name": backend.name}, backend.requires.reason_unmet(info)
                if why is None:
                    try:
                        resolved = resolve(backend)
                        block = backend_block(backend, resolved)
                        setup = RANK_SETUPS[(plan.kernel, backend.name)](ctx, resolved.fn)
                    except Unavailable as e:
                        why = str(e)
                    except Exception as e:  # noqa: BLE001 - a setup that fails on a rank skips on all
                        why = f"setup failed: {type(e).__name__}: {e}"
                reasons = [r for r in agree.gather(why) if r]
                if reasons and setup is not None:  # failed on another rank: closing here would start
                    stranded.append(setup)  # a collective (a barrier) that rank never joins
                    setup = None
                for case in cases:
                    if reasons:
                        fields = {"status": "skipped", "reason": reasons[0][:2000]}
                    else:
                        fields = run_case(adapter, backend, setup, case, ctx, agree, args, run_seed)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    status = fields.pop("status")
                    counts[status] = counts.get(status, 0) + 1
                    if writer is not None:
                        ident = case.to_json()
                        rec = result_record(
                            run_id, status, case_id=case.id, **ident, backend=block, world=world, **fields
                        )
                        writer.write(rec)
                        print(_line(case, backend.name, status, fields), flush=True)
                if setup is not None:
                    setup.close()
    finally:
        if writer is not None:
            writer.close()
        dist.barrier(group=cpu_group)
        dist.destroy_process_group()
    if rank == 0:
        print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f" -> {args.out}")
    return 0


def _line(case: Any, backend: str, status: str, fields: dict[str, Any]) -> str:
    m = fields.get("metrics") or {}
    if status == "ok":
        return f"{case.id:55} {backend:24} {m['latency_us']:10.2f} us  busbw {m['busbw_gbps']:8.1f} GB/s"
    return f"{case.id:55} {backend:24} {status}: {str(fields.get('reason', ''))[:100]}"


if __name__ == "__main__":
    sys.exit(main())
