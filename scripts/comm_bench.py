"""Communication kernels across the GPUs of one host: one process per GPU, started by torchrun.

    torchrun --nproc-per-node 4 scripts/comm_bench.py --out results/comm-tp4.jsonl [--quick]
    python scripts/comm_bench.py --nproc 4 --out results/comm-tp4.jsonl [--quick]   # one torchrun a backend

Kernels: custom_all_reduce (sgl_kernel v1, sglang_jit v2, nccl baseline) and
flashinfer_communication_fusion (flashinfer allreduce_fusion with residual + RMSNorm, and the unfused
NCCL + fused_add_rmsnorm baseline), at [T, 7168] bf16 with TP = the number of processes, T from the
shapes file's decode and prefill token lists (or --tokens). See dskbench/adapters/comm/.

Every rank builds the same inputs (all ranks' contributions, from one agreed seed), runs the backend
once and checks its own result against the sum over ranks (fused: + residual, then RMSNorm); then the
ranks time it together through dskbench.measure.collective (CUDA graphs where the backend allows; the
launch counts are agreed by all ranks, so none waits for a collective the others skip). Rank 0 writes
our results file: one environment record (every rank's GPU), one result per (kernel, backend, case)
with the slowest rank's timing (a collective ends when its last rank does), every rank's median, and
algorithm and bus bandwidth (busbw = 2(n-1)/n x T x H x 2 bytes / t, nccl-tests' convention).

The execution engine (dskbench/execution/) supplies the pieces a process group can share with a
sweep: the gating rule (gate.why_not), the hang limits' parsing (limits: --case-timeout,
--setup-timeout, DSKBENCH_CASE_TIMEOUT_S), rank 0's results file, environment record and Recorder
(sweep.recording), a dead process's reason (process.death_reason) and the kill of a process group.

A failure that every rank sees (an exception in set-up, the first launch, the check or the timing) is
recorded as that case's error and the run goes on; an error that poisons the CUDA context ends the run
(the cases left are recorded as not run). A rank that hangs inside a collective cannot be recovered
from (the others wait in the kernel): a watchdog ends the processes when a backend's set-up
(--setup-timeout) or one case (--case-timeout) runs past its limit, after rank 0 has recorded the case
as timed out. Records already written stay, and --resume skips them on the next run.

Driver mode (not under torchrun): `python scripts/comm_bench.py --nproc 2 --quick --out X` starts one
torchrun of N processes per (kernel, backend), cheapest and safest first (NCCL, sgl_kernel's AOT
custom all-reduce, NCCL + the norm, then the JIT-built sglang and FlashInfer kernels), each in a session
of its own with an outer time limit (a JIT build in a rank does not count against it), so a backend that
hangs or kills its processes costs only its own cases. A torchrun that fails leaves the case it was on
recorded as an error with why (its exit code or signal, the CUDA error; or that it timed out), as the
engine records a dead worker's case; the cases after it keep no record, so --resume runs them.

--device cpu runs the same path on CPU tensors over gloo (the nccl baselines become gloo all-reduces, the
GPU kernels are skipped): for tests, and to try arguments before spending GPU time.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dskbench.device.visible import visible_devices  # noqa: E402 - light: reads the environment only

# DSKBENCH_NO_MULTICAST=1: NVLink multicast off in every rank, set before torch, NCCL or torch's symmetric
# memory read it (for GPUs shared with other tenants); else as the host has it. The same values as
# dskbench.results.environment.NO_MULTICAST_ENV (a test checks); the environment record says which.
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
if os.environ.get("DSKBENCH_NO_MULTICAST", "").strip() not in ("", "0"):
    os.environ.update(NO_MULTICAST_ENV)
# sglang's custom all-reduce set-up runs a P2P test that needs sglang's own world group (not initialised
# here: it asserts); with this it trusts torch.cuda.can_device_access_peer (dskbench/adapters/comm/rank.py)
os.environ.setdefault("SGLANG_SKIP_P2P_CHECK", "1")


def numeric_visible_devices(environ: Any, uuid_index: Any = None) -> str | None:
    """CUDA_VISIBLE_DEVICES given as GPU UUIDs rewritten as NVML indices (with CUDA_DEVICE_ORDER=PCI_BUS_ID,
    which numbers devices as NVML does), before CUDA reads it: sglang's custom all-reduce parses the
    variable as integers (custom_all_reduce_utils) and would fail its set-up on UUIDs. Returns the new
    value, or None when nothing was changed (unset, already numeric, mixed, MIG, or a lookup failed)."""
    tokens = visible_devices(environ) or []
    if not tokens or not all(t.startswith("GPU-") for t in tokens):
        return None
    if environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID") != "PCI_BUS_ID":
        return None
    try:
        value = ",".join(str((uuid_index or _nvml_uuid_index)(t)) for t in tokens)
    except Exception:  # noqa: BLE001 - leave the variable as it is; sglang says why it cannot use it
        return None
    environ["CUDA_VISIBLE_DEVICES"] = value
    environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return value


def _nvml_uuid_index(token: str) -> int:
    """NVML index (PCI bus order) of the GPU whose UUID starts with `token`."""
    import pynvml

    pynvml.nvmlInit()
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            if (uuid.decode() if isinstance(uuid, bytes) else str(uuid)).startswith(token):
                return i
    finally:
        pynvml.nvmlShutdown()
    raise LookupError(f"no GPU with UUID {token}")


numeric_visible_devices(os.environ)

import argparse  # noqa: E402
import collections  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import datetime as dt  # noqa: E402
import faulthandler  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Mapping  # noqa: E402

from dskbench.execution.limits import LimitError, parse_timeout, timeout_from_env  # noqa: E402
from dskbench.execution.process import (  # noqa: E402
    BUILD_GRACE_S,
    POLL_S,
    child_pids,
    compiling,
    death_reason,
    kill_group,
    signal_name,
)

KERNELS = ("custom_all_reduce", "flashinfer_communication_fusion")
PHASES = ("decode", "prefill", "decode_graph")
EXIT_USAGE = 2
EXIT_HUNG = 124  # the watchdog ended the process (as timeout(1) does)
# Backends run cheapest and safest first: the baselines and the AOT kernel before the JIT builds
# (minutes on a fresh machine) and the kernels most likely to hang or crash a run
BACKEND_ORDER = ("nccl", "sgl_kernel", "nccl+fused_add_rmsnorm", "sglang_jit", "flashinfer")
TEARDOWN_S = 90.0  # barrier and destroy_process_group at the end
RANK_GRACE_S = 15.0  # ranks above 0 wait this much longer, so that rank 0 records a hang first
CASE_TIMEOUT_S = 240.0  # --case-timeout's default (first-use JIT included)
SETUP_TIMEOUT_S = 480.0  # --setup-timeout's default (JIT builds included)
START_S = 60.0  # driver mode: a torchrun's start (rendezvous, imports), on top of its phases' limits
STOP_GRACE_S = 45.0  # driver mode: after SIGTERM, how long a torchrun may take to stop its ranks


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
    p.add_argument(
        "--nproc",
        type=int,
        help="driver mode (outside torchrun): one torchrun of this many processes per (kernel, backend)",
    )
    p.add_argument(
        "--no-precompile",
        action="store_true",
        help="driver mode: do not build the later backends' JIT modules in the background",
    )
    p.add_argument(
        "--case-timeout",
        metavar="S",
        help="seconds one case may take (first-use JIT included) before the ranks are ended; 0 = no limit "
        f"(default: DSKBENCH_CASE_TIMEOUT_S when set, else {CASE_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--setup-timeout",
        metavar="S",
        help="seconds a backend's set-up may take (JIT builds included); 0 = no limit "
        f"(default {SETUP_TIMEOUT_S:g}; 0 when DSKBENCH_CASE_TIMEOUT_S is 0)",
    )
    return p


def hang_limits(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> None:
    """--case-timeout and --setup-timeout as seconds (0 = no limit), set on `args`. Unset, the case limit
    is DSKBENCH_CASE_TIMEOUT_S when set (as for `dskbench run`; 0 there turns the watch off, set-up
    included), else the defaults. Raises LimitError (one line) for a value that is not seconds >= 0."""
    env = timeout_from_env(environ)
    if args.case_timeout is None:
        args.case_timeout = env if env is not None else CASE_TIMEOUT_S
    else:
        args.case_timeout = parse_timeout(str(args.case_timeout), "--case-timeout")
    if args.setup_timeout is None:
        args.setup_timeout = 0.0 if env == 0 else SETUP_TIMEOUT_S
    else:
        args.setup_timeout = parse_timeout(str(args.setup_timeout), "--setup-timeout")


@dataclasses.dataclass
class Plan:
    kernel: str
    backends: list[Any]
    cases: list[Any]


def make_plan(args: argparse.Namespace, world: int) -> list[Plan]:
    """(kernel, backends, cases) for this world size; raises ValueError on an unknown backend."""
    from dskbench.adapters import get_adapter
    from dskbench.adapters.comm.allreduce import comm_cases
    from dskbench.execution.gate import applicable
    from dskbench.shapes.cases import default_shapes

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
            c
            for c in comm_cases(shapes, kernel, world, phases, profile, args.tokens)
            if applicable(adapter, c)
        ]
        plans.append(Plan(kernel, backends, cases))
    unknown = sorted(set(args.backend or ()) - known)
    if unknown:
        raise ValueError(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return plans


def check_out(out: Path, resume: bool) -> None:
    """--out must be new or a dskbench results file (and readable, to resume from): checked by every
    process before any starts a process group, so that no rank is left waiting for one that refused.
    Raises ResultsError (a ValueError) naming the file."""
    from dskbench.results.io import prepare_append, read_runs

    prepare_append(out, repair=False)  # rank 0's writer cuts an unfinished last line, and says so
    if resume and out.exists():
        read_runs([out])


def plan_or_usage(args: argparse.Namespace, world: int, need_out: bool = True) -> list[Plan] | None:
    """make_plan (and the --out check), or None after saying why on stderr (the caller exits with
    EXIT_USAGE)."""
    if need_out and args.out is None:
        print("comm_bench.py: --out is required", file=sys.stderr)
        return None
    try:
        if need_out:
            check_out(args.out, args.resume)
        return make_plan(args, world)
    except ValueError as e:
        print(f"comm_bench.py: {e}", file=sys.stderr)
        return None


def ordered(plans: list[Plan]) -> list[tuple[Plan, Any]]:
    """(plan, backend) pairs in BACKEND_ORDER (then plan order)."""
    pairs = [(p, b) for p in plans for b in p.backends]
    pos = {name: i for i, name in enumerate(BACKEND_ORDER)}
    return sorted(pairs, key=lambda pb: pos.get(pb[1].name, len(pos)))


def settings_for(args: argparse.Namespace) -> Any:
    from dskbench.measure import MeasureSettings

    s = MeasureSettings.quick() if args.quick else MeasureSettings()
    return s.with_(max_time_s=args.budget) if args.budget is not None else s


# -- the process group -------------------------------------------------------------------------------------


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


# -- the watchdog ---------------------------------------------------------------------------------------


class Watchdog:
    """Ends this process when the phase it was armed for (a backend's set-up, one case, the teardown)
    runs past its limit: a rank stuck in a collective or a spinning kernel never returns, and every rank
    of the group waits with it. On expiry it calls the phase's `on_expire` (rank 0 records the case),
    dumps every thread's stack to stderr and exits with the phase's code; torchrun then stops the other
    ranks. A Python thread needs the GIL, so faulthandler's C-level timer backs it up 60 s later."""

    BACKSTOP_S = 60.0

    def __init__(
        self,
        exit: Callable[[int], Any] = os._exit,
        period: float = 0.5,
        backstop: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._exit, self._period, self._backstop, self._clock = exit, period, backstop, clock
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._what, self._on_expire, self._code, self._seconds = "", None, EXIT_HUNG, 0.0
        self.fired: str | None = None
        threading.Thread(target=self._loop, name="comm-bench-watchdog", daemon=True).start()

    def arm(
        self, seconds: float, what: str, on_expire: Callable[[], Any] | None = None, code: int = EXIT_HUNG
    ) -> None:
        if seconds is None or seconds <= 0:
            return self.disarm()
        with self._lock:
            self._deadline = self._clock() + seconds
            self._what, self._on_expire, self._code, self._seconds = what, on_expire, code, seconds
        if self._backstop:
            faulthandler.dump_traceback_later(seconds + self.BACKSTOP_S, exit=True)

    def disarm(self) -> None:
        with self._lock:
            self._deadline = None
        if self._backstop:
            faulthandler.cancel_dump_traceback_later()

    def _loop(self) -> None:
        while True:
            time.sleep(self._period)
            with self._lock:
                expired = self._deadline is not None and self._clock() > self._deadline
                what, on_expire, code, seconds = self._what, self._on_expire, self._code, self._seconds
            if expired:
                self.fired = what
                print(
                    f"comm_bench.py: timed out: {what} gave no result within {seconds:g} s; ending this process",
                    file=sys.stderr,
                    flush=True,
                )
                try:
                    if on_expire is not None:
                        on_expire()
                except Exception as e:  # noqa: BLE001 - the exit matters more
                    print(f"comm_bench.py: recording the time-out failed: {e}", file=sys.stderr, flush=True)
                if self._backstop:
                    faulthandler.dump_traceback(all_threads=True)
                sys.stdout.flush()
                sys.stderr.flush()
                self._exit(code)
                return


# -- one case --------------------------------------------------------------------------------------------


def _failure(e: BaseException) -> str:
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

    seed = case_seed(run_seed, case.id, backend.name)
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
        err = _failure(e)
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
        mine_chk = (False, math.inf, 0.0, "", _failure(e))
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
        timing = {"error": _failure(e)}
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


# -- the run ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        hang_limits(args)
    except LimitError as e:
        print(f"comm_bench.py: {e}", file=sys.stderr)
        return EXIT_USAGE
    world = int(os.environ.get("WORLD_SIZE", "0")) or (args.world or 0) or (args.nproc or 0)
    if args.dry_run:
        return dry_run(args, world or 2)
    if "RANK" not in os.environ and args.nproc is not None:
        return drive(args)
    if world < 2 or "RANK" not in os.environ:
        print(
            "comm_bench.py: run under torchrun --nproc-per-node N (N >= 2), or with --nproc N (one torchrun "
            "a backend), or use --dry-run",
            file=sys.stderr,
        )
        return EXIT_USAGE
    plans = plan_or_usage(args, world)
    if plans is None:
        return EXIT_USAGE
    return run(args, plans, world)


def dry_run(args: argparse.Namespace, world: int) -> int:
    plans = plan_or_usage(args, world, need_out=False)
    if plans is None:
        return EXIT_USAGE
    n = 0
    for p, b in ordered(plans):
        for c in p.cases:
            print(f"{c.id}  {b.name}")
            n += 1
    print(f"{n} cases at TP {world}")
    return 0


def work_items(
    plans: list[Plan], done: set[tuple[str, str]]
) -> list[tuple[Plan, Any, list[tuple[Any, Any]]]]:
    """(plan, backend, [(work item, case)]) in BACKEND_ORDER: the cases --resume did not find done, each
    as the engine's WorkItem (its identity in every record; `index`: its place in this run)."""
    from dskbench.execution.items import WorkItem

    out, n = [], 0
    for plan, backend in ordered(plans):
        pairs = []
        for c in plan.cases:
            if (c.id, backend.name) not in done:
                pairs.append((WorkItem(n, plan.kernel, backend.name, c.to_json()), c))
                n += 1
        out.append((plan, backend, pairs))
    return out


def hang_reason(limit_s: float, limit: str) -> str:
    """A phase the watchdog ended, in the engine's words (a worker's time-out)."""
    return (
        f"timed out: no result within {limit_s:g} s ({limit}); a rank hung in a collective or a kernel, "
        "and the ranks were ended"
    )


def run(args: argparse.Namespace, plans: list[Plan], world: int, watchdog: Watchdog | None = None) -> int:
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
            "command": ["torchrun", *sys.argv],
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
                    why = f"setup failed: {_failure(e)}"
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
                    print(f"comm_bench.py: closing {backend.name} failed: {_failure(e)}", file=sys.stderr)
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
            print(f"comm_bench.py: teardown: {_failure(e)}", file=sys.stderr, flush=True)
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


# -- driver mode -----------------------------------------------------------------------------------------

# JIT builds the later backends need, started by the driver in the background while the first backends
# run (minutes on a fresh machine: FlashInfer's trtllm_comm, sglang's all-reduce modules). The builds
# are the ones the ranks would make (same sources, flags and arch) and are file-locked: a rank that
# needs a module still being built waits for it. A failure here only costs the head start.
PRECOMPILE = {
    "sglang_jit": """
import torch
from sglang.jit_kernel import all_reduce as ar
ar._init_communicator()
ar._init_ipc_manager()
ar.get_all_reduce_module(torch.bfloat16, {world})
""",
    "flashinfer": """
from flashinfer.comm.trtllm_ar import get_trtllm_comm_module
get_trtllm_comm_module()
""",
    "nccl+fused_add_rmsnorm": """
import torch
from flashinfer.norm import fused_add_rmsnorm
x = torch.randn(1, 7168, device="cuda", dtype=torch.bfloat16)
fused_add_rmsnorm(x, x.clone(), torch.ones(7168, device="cuda", dtype=torch.bfloat16), 1e-6)
torch.cuda.synchronize()
""",
}


def start_precompile(backends: list[str], world: int) -> list[tuple[str, subprocess.Popen, Any]]:
    """One background process per JIT build the planned backends need (GPU runs only). Their output
    goes to files: a full pipe would stall a build that a rank then waits for."""
    procs = []
    for name in backends:
        code = PRECOMPILE.get(name)
        if code is None:
            continue
        log = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-c", code.format(world=world)]
        # a session of its own: stopping it stops its compilers too
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append((name, proc, log))
        print(f"comm_bench.py: building {name}'s JIT modules in the background", flush=True)
    return procs


def stop_precompile(procs: list[tuple[str, subprocess.Popen, Any]]) -> None:
    for name, proc, log in procs:
        if proc.poll() is None:
            kill_group(proc.pid)
        proc.wait()
        if proc.returncode not in (0, -signal.SIGKILL):
            log.seek(0)
            tail = log.read().strip().splitlines()[-1:] or [""]
            print(
                f"comm_bench.py: background JIT build for {name} failed ({proc.returncode}): {tail[0]}",
                flush=True,
            )
        log.close()


def child_args(args: argparse.Namespace) -> list[str]:
    """The options every per-backend torchrun gets (the driver adds --kernel and --backend)."""
    out = ["--out", str(args.out), "--mode", args.mode, "--device", args.device]
    out += ["--case-timeout", str(args.case_timeout), "--setup-timeout", str(args.setup_timeout)]
    if args.quick:
        out.append("--quick")
    for phase in args.sweep or ():
        out += ["--sweep", phase]
    if args.tokens:
        out += ["--tokens", ",".join(str(t) for t in args.tokens)]
    if args.seed is not None:
        out += ["--seed", str(args.seed)]
    if args.budget is not None:
        out += ["--budget", str(args.budget)]
    if args.resume:
        out.append("--resume")
    return out


# The launcher of one backend's processes, and the clock its outer limit reads (tests put fakes here).
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
CLOCK: Callable[[], float] = time.monotonic
TAIL_LINES = 400  # a torchrun's last stderr lines kept for the reason of its failure


class Terminated(KeyboardInterrupt):
    """SIGTERM to the driver, handled as Ctrl-C is: the running torchrun stopped, the file left whole."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def torchrun_words(stderr: str) -> str:
    """A failed torchrun's stderr as process.last_words should read it: its ranks' output (a CUDA error or
    an exception of theirs says most), with torchrun's own report (its launcher's traceback and the
    ChildFailedError table) cut down to one line first: which rank failed first, and how."""
    head, sep, report = stderr.rpartition("Traceback (most recent call last):")
    if not sep or "ChildFailedError" not in report:
        return stderr
    m = _ROOT_CAUSE.search(report)
    if m is None:
        return head
    code = int(m[2])
    how = f"killed by {signal_name(-code)}" if code < 0 else f"exit code {code}"
    return f"ChildFailedError: rank {m[1]} {how}\n{head}"


def _relay(stream: Any, tail: collections.deque) -> None:
    """Pass a torchrun's stderr through as it comes, keeping its last lines."""
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        tail.append(line)


def stop_child(proc: subprocess.Popen, grace: float = STOP_GRACE_S) -> int:
    """Stop a torchrun: SIGTERM (it stops its ranks), then after `grace` seconds SIGKILL to whatever is
    left: its process group and each rank's (torchrun starts every rank in a session of its own, out of
    reach of a kill of its group). Returns its exit code."""
    ranks = set(child_pids(proc.pid))
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    for pid in sorted(ranks | set(child_pids(proc.pid))):
        kill_group(pid)
    kill_group(proc.pid)
    return proc.wait()


def run_child(
    cmd: list[str],
    limit: float | None,
    what: str = "its limit",
    grace: float = STOP_GRACE_S,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int, str | None]:
    """Run one torchrun in a session of its own, its stderr passed through. Past `limit` seconds (None:
    no limit) it is stopped (stop_child); a JIT build in a rank (a compiler in the rank's process group)
    does not count against the limit, up to process.BUILD_GRACE_S, as for the engine's workers. Returns
    its exit code and, when it failed, why in the engine's words (None when it succeeded)."""
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1, start_new_session=True
    )
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    relay = threading.Thread(target=_relay, args=(proc.stderr, tail), name="torchrun-stderr", daemon=True)
    relay.start()
    deadline = clock() + limit if limit else None
    timed_out = None
    try:
        while True:
            try:
                code = proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            now = clock()
            if deadline is None or now <= deadline:
                continue
            if now - deadline < BUILD_GRACE_S and any(compiling(pid) for pid in child_pids(proc.pid)):
                continue  # a rank is building a JIT module: that time is not the kernel's
            timed_out = (
                f"timed out: no result within {limit:g} s ({what}); the torchrun and its ranks were killed"
            )
            print(f"comm_bench.py: {timed_out}", file=sys.stderr, flush=True)
            code = stop_child(proc, grace)
            break
    except BaseException:  # Ctrl-C, SIGTERM: its ranks must not outlive the driver
        stop_child(proc, grace)
        raise
    finally:
        relay.join(5)
    if timed_out is not None:
        return EXIT_HUNG, timed_out
    if code == 0:
        return 0, None
    return code, death_reason(code, torchrun_words("".join(tail)), who="torchrun")


def file_state(out: Path, resume: bool) -> tuple[set[str], set[tuple[str, str]]]:
    """The runs `out` holds, and the cases a torchrun started now skips (with --resume: finished_cases)."""
    from dskbench.results.io import finished_cases, read_runs

    if not out.exists():
        return set(), set()
    runs = read_runs([out])
    return {r.run_id for r in runs}, finished_cases(runs) if resume else set()


def record_lost_case(
    args: argparse.Namespace,
    plan: Plan,
    backend: Any,
    before: tuple[set[str], set[tuple[str, str]]],
    why: str,
) -> None:
    """After a torchrun that failed: the first case it had to run and left without a record is recorded
    as an error with why (the case it was on, or whose set-up it was in: the engine charges a dead
    worker's case alike). Its later cases keep no record, so --resume runs them. Nothing is recorded
    when the torchrun wrote no run (it measured nothing), or when its last record is a time-out (its
    watchdog recorded the hang and ended the ranks)."""
    from dskbench.execution.sweep import Recorder
    from dskbench.results.io import ResultsError, ResultsWriter, read_runs

    run_ids, done = before
    label = f"{plan.kernel} · {backend.name}"
    try:
        runs = [r for r in read_runs([args.out]) if r.run_id not in run_ids] if args.out.exists() else []
    except ResultsError as e:
        print(f"comm_bench.py: {label}: {why}; its results cannot be read: {e}", file=sys.stderr, flush=True)
        return
    if not runs:
        print(f"comm_bench.py: {label}: {why}; it recorded no run", file=sys.stderr, flush=True)
        return
    run = runs[-1]
    if run.results and str(run.results[-1].get("reason", "")).startswith("timed out:"):
        return
    recorded = {(r.get("case_id"), r["backend"]["name"]) for r in run.results}
    ((_plan, _backend, pairs),) = work_items([Plan(plan.kernel, [backend], plan.cases)], done)
    item = next((it for it, _case in pairs if (it.case_id, backend.name) not in recorded), None)
    if item is None:
        return  # it failed after its last case (closing, teardown): no case to charge
    fields = {"status": "error", "reason": why[:2000], "world": args.nproc}
    with ResultsWriter(args.out) as w:
        Recorder(w, run.run_id)(item, {**item.identity(), **fields})
    print(f"comm_bench.py: {item.case_id} · {backend.name}: error: {why}", file=sys.stderr, flush=True)


def drive(args: argparse.Namespace) -> int:
    """One torchrun of args.nproc processes per (kernel, backend), in BACKEND_ORDER; each appends its own
    run to --out. A backend that hangs or kills its ranks loses only its own cases."""
    n = args.nproc
    if n < 2:
        print("comm_bench.py: --nproc needs at least 2 processes", file=sys.stderr)
        return EXIT_USAGE
    plans = plan_or_usage(args, n)
    if plans is None:
        return EXIT_USAGE
    script = str(Path(__file__).resolve())
    common = child_args(args)
    ended: list[tuple[str, str, int, float]] = []
    names = [b.name for p, b in ordered(plans) if p.cases]
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    builds = start_precompile(names, n) if args.device == "cuda" and not args.no_precompile else []
    try:
        for plan, backend in ordered(plans):
            if not plan.cases:
                continue
            ended.append(drive_one(args, plan, backend, script, common))
    except KeyboardInterrupt as e:
        from dskbench.execution.sweep import interrupted_message

        stopped = isinstance(e, Terminated)
        print(interrupted_message(args.out, "SIGTERM" if stopped else "SIGINT"), file=sys.stderr, flush=True)
        return 143 if stopped else 130
    finally:
        stop_precompile(builds)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    for kernel, name, rc, wall in ended:
        print(f"comm_bench.py: {kernel} · {name}: exit code {rc} after {wall:.0f} s", flush=True)
    return 0 if all(rc == 0 for *_k, rc, _w in ended) else 1


def drive_one(
    args: argparse.Namespace, plan: Plan, backend: Any, script: str, common: list[str]
) -> tuple[str, str, int, float]:
    """One (kernel, backend) in its own torchrun: (kernel, backend, exit code, seconds). A failed one
    leaves its case recorded with why (record_lost_case)."""
    n = args.nproc
    cmd = [*TORCHRUN, "--nproc-per-node", str(n), script, *common, "--kernel", plan.kernel]
    cmd += ["--backend", backend.name]
    watched = args.setup_timeout > 0 and args.case_timeout > 0
    limit = args.setup_timeout + len(plan.cases) * args.case_timeout + 2 * TEARDOWN_S + START_S
    what = (
        f"--setup-timeout {args.setup_timeout:g} s + {len(plan.cases)} cases x --case-timeout "
        f"{args.case_timeout:g} s + start and teardown"
    )
    print(
        f"comm_bench.py: {plan.kernel} · {backend.name}: {len(plan.cases)} cases, torchrun x{n}",
        flush=True,
    )
    before = file_state(args.out, args.resume)
    t0 = time.monotonic()
    rc, why = run_child(cmd, limit if watched else None, what, clock=CLOCK)
    if why is not None:
        record_lost_case(args, plan, backend, before, why)
    return plan.kernel, backend.name, rc, time.monotonic() - t0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter teardown: finalizers of sglang/flashinfer objects may start collectives on a
    # destroyed group, and NCCL/gloo threads can hang or abort an exit that is already complete
    os._exit(code)
