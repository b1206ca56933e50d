"""One case of a communication benchmark on every rank: the process group, each rank's GPU, and the check
then the timing of one case, every stage closed by an agreement all ranks reach."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
from typing import Any

from dskbench.execution.comm_plan import settings_for


def init_ranks(device_kind: str, timeout_s: float = 600.0) -> tuple[Any, Any, Any]:
    """(RankContext fields: rank, world, local rank, device), the device group and the CPU group."""
    import torch
    import torch.distributed as dist

    timeout = dt.timedelta(seconds=timeout_s)
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


def failure(e: BaseException) -> str:
    """The engine's text for a failure (the CUDA error itself, out of memory marked as such)."""
    from dskbench.execution.case import failure_message

    return failure_message(e)


def _agreed_error(base: dict[str, Any], errs: list[tuple[int, str]]) -> dict[str, Any]:
    """An error every rank records alike: the first failing rank's message; `poisoned` when any rank's
    error leaves its CUDA context unusable (the run must end)."""
    from dskbench.execution.case import is_poisoning

    rank, msg = errs[0]
    fields = {**base, "status": "error", "reason": f"rank {rank}: {msg}"[:2000]}
    if any(is_poisoning(m) for _r, m in errs):
        fields["poisoned"] = True
    return fields


def run_case(adapter, backend, setup, case, ctx, agree, args, run_seed: int) -> dict[str, Any]:
    """Check, then time one case on every rank; the record fields (meaningful on rank 0).

    Three stages, each closed by one agreement that every rank reaches (an exception is caught and
    agreed, never raised): inputs, reference and launcher (local work; a skip or an error on any rank
    applies to all); one launch and the check; the timing."""
    import torch

    from dskbench.execution.items import case_seed
    from dskbench.measure.collective import measure_collective

    seed = case_seed(run_seed, case.id)
    base: dict[str, Any] = {"seed": seed}
    dev = str(ctx.device)
    cuda = ctx.device.type == "cuda"

    why = err = detail = launch = ref = None
    try:
        inputs = adapter.make_inputs(case, dev, seed)
        mine = adapter.rank_inputs(inputs, ctx.rank)
        why = setup.skip(mine, case)
        if why is None:
            detail = setup.detail(mine, case)
            ref = adapter.reference(inputs, case)
            launch = setup.bind(mine, case)
        del inputs
    except Exception as e:  # noqa: BLE001 - agreed below, before any rank launches
        err = failure(e)
    votes = agree.gather((why, err))
    errs = [(r, e) for r, (_w, e) in enumerate(votes) if e]
    if errs:
        return _agreed_error(base, errs)
    reasons = [w for w, _e in votes if w]
    if reasons:
        return {**base, "status": "skipped", "reason": reasons[0]}

    out = None
    try:
        out = launch()
        if cuda:
            torch.cuda.synchronize()
        chk = adapter.check(out, ref, case)
        mine_chk = (bool(chk.ok), float(chk.error), float(chk.tolerance), chk.detail, None)
    except Exception as e:  # noqa: BLE001 - agreed below
        mine_chk = (False, math.inf, 0.0, "", failure(e))
    del out, ref
    checks = agree.gather(mine_chk)
    errs = [(r, c[4]) for r, c in enumerate(checks) if c[4]]
    if errs:
        return _agreed_error(base, errs)
    worst = max(range(len(checks)), key=lambda r: checks[r][1] / max(checks[r][2], 1e-30))
    ok, error, tol, chk_detail, _ = checks[worst]
    base["check"] = {"error": error, "tolerance": tol, "detail": f"rank {worst}: {chk_detail}".strip()}
    if detail:
        base["detail"] = detail
    if not all(c[0] for c in checks):
        return {
            **base,
            "status": "wrong",
            "reason": f"rank {worst}: relative error {error:.3g} > tolerance {tol:.1g}",
        }

    try:
        m = measure_collective(
            [launch],
            agree=agree,
            device=dev,
            mode=args.mode,
            capturable=backend.capturable and setup.capturable,
            settings=settings_for(args),
            capture_context=setup.capture,
        )
        timing: dict[str, Any] = dataclasses.asdict(m)
    except Exception as e:  # noqa: BLE001 - agreed below (a rank stuck in the collective: the watchdog)
        timing = {"error": failure(e)}
    timings = agree.gather(timing)
    errs = [(r, t["error"]) for r, t in enumerate(timings) if "error" in t]
    if errs:
        return _agreed_error(base, errs)
    return {**base, **summarize_ranks(timings, case)}


def summarize_ranks(timings: list[dict[str, Any]], case: Any) -> dict[str, Any]:
    """The slowest rank's timing (a collective ends when its last rank does), every rank's median, and
    the metrics at the slowest median."""
    from dskbench.adapters.comm.allreduce import algbw_gbps, bus_bytes, busbw_gbps, payload_bytes
    from dskbench.measure import metrics
    from dskbench.results.records import Clocks, Metrics, Timing

    world = len(timings)
    medians = [t.get("median_us") for t in timings]
    if not all(isinstance(x, int | float) and x == x and x > 0 for x in medians):
        return {"status": "error", "reason": f"a rank produced no timing samples (medians {medians})"}
    slow = max(range(world), key=lambda r: medians[r])
    measured = dict(timings[slow])
    clocks = Clocks.from_json({k: measured.pop(k) for k in Clocks.KEYS})
    timing = Timing.from_json({**measured, "rank": slow})
    payload = payload_bytes(case)
    world_tp = int(case.dims["world"])
    med = medians[slow]
    mets = Metrics.from_json(
        {
            **metrics(med, bytes=bus_bytes(payload, world_tp)),
            "payload_bytes": payload,
            "algbw_gbps": algbw_gbps(payload, med),
            "busbw_gbps": busbw_gbps(payload, world_tp, med),
        }
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
    parts = {"timing": timing.to_json(), "metrics": mets.to_json(), "clocks": clocks.to_json()}
    return {"status": "ok", **parts, "ranks": ranks}
