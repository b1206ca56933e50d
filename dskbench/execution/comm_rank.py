"""One rank of a communication benchmark under torchrun: the cases of every planned (kernel, backend) run
together by all ranks, gated by the engine's rule, watched for hangs; rank 0 records them through the
engine's `recording` (one environment record, one result per case)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any

from dskbench.execution.comm_case import failure, gpu_block, init_ranks, run_case
from dskbench.execution.comm_plan import EXIT_HUNG, TEARDOWN_S, WHO, Plan, hang_reason, work_items
from dskbench.execution.comm_watchdog import Watchdog

RANK_GRACE_S = 15.0  # ranks above 0 wait this much longer, so that rank 0 records a hang first


def run(args: argparse.Namespace, plans: list[Plan], world: int, watchdog: Watchdog | None = None) -> int:
    """This rank's part of the run: every planned case, in BACKEND_ORDER; 0 once the run has ended (a
    case's failure is recorded, not this rank's exit code)."""
    import torch
    import torch.distributed as dist

    from dskbench.adapters import get_adapter
    from dskbench.adapters.backends import Unavailable, resolve
    from dskbench.adapters.comm.rank import RankContext
    from dskbench.adapters.comm.setups import RANK_SETUPS
    from dskbench.device.info import DeviceInfo
    from dskbench.execution.case import backend_block
    from dskbench.execution.gate import why_not
    from dskbench.execution.items import SweepOptions, sweep_seed
    from dskbench.execution.sweep import SweepSummary, recording
    from dskbench.measure.collective import Agreement
    from dskbench.results.environment import environment, new_run_id
    from dskbench.results.io import finished_cases, read_runs

    t0 = time.monotonic()
    # collectives give up after the longest phase the watchdog allows (it should act first)
    watched = args.setup_timeout > 0 and args.case_timeout > 0
    pg_timeout = max(args.setup_timeout, args.case_timeout) + 2 * RANK_GRACE_S + 60 if watched else 1800.0
    device, device_group, cpu_group = init_ranks(args.device, pg_timeout)
    agree = Agreement(cpu_group)
    rank = agree.rank
    wd = watchdog or Watchdog()
    grace = RANK_GRACE_S if rank else 0.0

    def limit(seconds: float) -> float:
        """A phase's watchdog limit on this rank (0: not watched)."""
        return seconds + grace if seconds > 0 else 0.0

    run_seed = int(agree.value(sweep_seed(SweepOptions(seed=args.seed))))
    if device.type == "cuda":
        blocks = agree.gather(gpu_block(device.index))
        info = DeviceInfo("cuda", blocks[0]["name"], blocks[0]["sm"], world)
    else:
        blocks = agree.gather({"index": rank, "name": "cpu"})
        info = DeviceInfo("cpu")
    done = set()
    if args.resume and rank == 0 and args.out.exists():
        done = finished_cases(read_runs([args.out]))
    work = work_items(plans, {tuple(k) for k in agree.gather(sorted(done))[0]})
    n_items = sum(len(pairs) for _p, _b, pairs in work)
    files = contextlib.ExitStack()
    record = None  # rank 0 alone writes the results file, through the engine's Recorder
    if rank == 0:
        env = environment(info)
        if device.type == "cuda":
            env["device"]["count"] = world
        settings = {
            "world": world,
            "mode": args.mode,
            "run_seed": run_seed,
            "quick": args.quick,
            "items": n_items,
            "case_timeout_s": args.case_timeout,
            "setup_timeout_s": args.setup_timeout,
        }
        environment_fields = {
            "run_id": new_run_id(),
            **env,
            "gpus": blocks,
            "settings": settings,
            "command": ["torchrun", "-m", "dskbench", *sys.argv[1:]],
        }
        record = files.enter_context(recording(args.out, environment_fields, progress=_print_line))

    def emit(item: Any, block: dict[str, Any], fields: dict[str, Any]) -> None:
        """Rank 0 records the case (the watchdog's thread too: the Recorder is thread-safe)."""
        if record is not None:
            record(item, {**item.identity(), "backend": block, "world": world, **fields})

    def timed_out(pairs: list[Any], block: dict[str, Any], limit_s: float, what: str) -> Callable[[], None]:
        def on_expire() -> None:
            for item, _case in pairs:
                emit(item, block, {"status": "error", "reason": hang_reason(limit_s, what)})

        return on_expire

    stranded: list[Any] = []  # setups never closed (kept alive: their __del__ may close collectively)
    poisoned: str | None = None
    completed = False
    try:
        for plan, backend, pairs in work:
            adapter = get_adapter(plan.kernel)
            if not pairs:
                continue
            block: dict[str, Any] = {"name": backend.name}
            if poisoned:
                for item, _case in pairs:
                    emit(item, block, {"status": "error", "reason": f"not run: {poisoned}"[:2000]})
                continue
            # the engine's gating rule, rank 0's answer for all (one answer keeps the ranks in step)
            gated = agree.gather([why_not(adapter, backend, c, info, ranks=world) for _i, c in pairs])[0]
            runnable = [pair for pair, gate in zip(pairs, gated, strict=True) if not gate]
            setup, why, reasons = None, None, []
            if runnable:
                max_tokens = max(int(c.dims["T"]) for _i, c in runnable)
                ctx = RankContext(
                    rank, world, device, device_group, cpu_group, max_tokens, int(runnable[0][1].dims["H"])
                )
                what = f"the set-up of {plan.kernel} · {backend.name}"
                wd.arm(
                    limit(args.setup_timeout),
                    what,
                    timed_out(runnable, block, args.setup_timeout, f"{what}, --setup-timeout"),
                )
                try:
                    resolved = resolve(backend)
                    block = backend_block(backend, resolved)
                    setup = RANK_SETUPS[(plan.kernel, backend.name)](ctx, resolved.fn)
                except Unavailable as e:
                    why = str(e)
                except Exception as e:  # noqa: BLE001 - a setup that fails on a rank skips on all
                    why = f"setup failed: {failure(e)}"
                reasons = [r for r in agree.gather(why) if r]
                wd.disarm()
                if reasons and setup is not None:  # failed on another rank: closing here would start
                    stranded.append(setup)  # a collective (a barrier) that rank never joins
                    setup = None
            for (item, case), gate in zip(pairs, gated, strict=True):
                if gate:
                    fields = {"status": "skipped", "reason": gate}
                elif reasons:
                    fields = {"status": "skipped", "reason": reasons[0][:2000]}
                elif poisoned:
                    fields = {"status": "error", "reason": f"not run: {poisoned}"[:2000]}
                else:
                    what = f"{case.id} · {backend.name}"
                    wd.arm(
                        limit(args.case_timeout),
                        what,
                        timed_out([(item, case)], block, args.case_timeout, "--case-timeout"),
                    )
                    fields = run_case(adapter, backend, setup, case, ctx, agree, args, run_seed)
                    wd.disarm()
                    if fields.pop("poisoned", False):
                        poisoned = (
                            f"{case.id} · {backend.name} poisoned the CUDA context ({fields['reason']})"
                        )
                    elif device.type == "cuda":
                        torch.cuda.empty_cache()
                emit(item, block, fields)
            if setup is not None and poisoned:
                stranded.append(setup)  # a broken context: closing could hang
            elif setup is not None:
                wd.arm(limit(args.case_timeout), f"closing {backend.name}")
                try:
                    setup.close()
                except Exception as e:  # noqa: BLE001 - the next backend may still run
                    print(f"{WHO}: closing {backend.name} failed: {failure(e)}", file=sys.stderr)
                wd.disarm()
        completed = True
    finally:
        # everything is on disk: a teardown that hangs (NCCL) ends the process, with success if the run was
        wd.arm(TEARDOWN_S + grace, "the end of the run", code=0 if completed else EXIT_HUNG)
        files.close()
        try:
            dist.barrier(group=cpu_group)
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 - the results are written; say so and end
            print(f"{WHO}: teardown: {failure(e)}", file=sys.stderr, flush=True)
        wd.disarm()
    if record is not None:
        print(SweepSummary(args.out, record.counts, time.monotonic() - t0, n_items).line())
    return 0


def _print_line(item: Any, status: str, fields: dict[str, Any]) -> None:
    print(_line(item, status, fields), flush=True)


def _line(item: Any, status: str, fields: dict[str, Any]) -> str:
    """Rank 0's progress line for a recorded case."""
    m = fields.get("metrics") or {}
    backend = fields["backend"]["name"]
    if status == "ok":
        return f"{item.case_id:55} {backend:24} {m['latency_us']:10.2f} us  busbw {m['busbw_gbps']:8.1f} GB/s"
    return f"{item.case_id:55} {backend:24} {status}: {str(fields.get('reason', ''))[:100]}"
