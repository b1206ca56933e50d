"""The driver of a communication benchmark: one torchrun of N processes per (kernel, backend), cheapest and
safest first, each in a session of its own with an outer time limit (a JIT build in a rank does not count
against it), so a backend that hangs or kills its processes costs only its own cases. A failed torchrun
leaves the case it was on recorded with why, in the engine's words (process.death_reason), and its ranks
ended with the engine's kill of a process group (process.kill_group, child_pids)."""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dskbench.execution.comm_plan import (
    EXIT_HUNG,
    START_S,
    STOP_GRACE_S,
    TEARDOWN_S,
    WHO,
    Plan,
    ordered,
    work_items,
)
from dskbench.execution.process import (
    BUILD_GRACE_S,
    POLL_S,
    child_pids,
    compiling,
    death_reason,
    kill_group,
    signal_name,
)

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
        print(f"{WHO}: building {name}'s JIT modules in the background", flush=True)
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
                f"{WHO}: background JIT build for {name} failed ({proc.returncode}): {tail[0]}",
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
RANK_COMMAND = ["-m", "dskbench", "comm"]  # what each rank runs: this command, under torchrun
CLOCK: Callable[[], float] = time.monotonic
TAIL_LINES = 400  # a torchrun's last stderr lines kept for the reason of its failure


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
    does not count against the limit, up to limits.BUILD_GRACE_S, as for the engine's workers. Returns
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
            print(f"{WHO}: {timed_out}", file=sys.stderr, flush=True)
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
        print(f"{WHO}: {label}: {why}; its results cannot be read: {e}", file=sys.stderr, flush=True)
        return
    if not runs:
        print(f"{WHO}: {label}: {why}; it recorded no run", file=sys.stderr, flush=True)
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
    print(f"{WHO}: {item.case_id} · {backend.name}: error: {why}", file=sys.stderr, flush=True)


def drive(args: argparse.Namespace, plans: list[Plan]) -> int:
    """One torchrun of args.nproc processes per (kernel, backend) of `plans`, in BACKEND_ORDER; each appends
    its own run to --out. A backend that hangs or kills its ranks loses only its own cases. 0 when every
    torchrun succeeded, else 1. An interrupt (Ctrl-C, SIGTERM) stops the running torchrun, ends the
    background builds and propagates."""
    common = child_args(args)
    ended: list[tuple[str, str, int, float]] = []
    names = [b.name for p, b in ordered(plans) if p.cases]
    builds = start_precompile(names, args.nproc) if args.device == "cuda" and not args.no_precompile else []
    try:
        for plan, backend in ordered(plans):
            if plan.cases:
                ended.append(drive_one(args, plan, backend, common))
    finally:
        stop_precompile(builds)
    for kernel, name, rc, wall in ended:
        print(f"{WHO}: {kernel} · {name}: exit code {rc} after {wall:.0f} s", flush=True)
    return 0 if all(rc == 0 for *_k, rc, _w in ended) else 1


def drive_one(
    args: argparse.Namespace, plan: Plan, backend: Any, common: list[str]
) -> tuple[str, str, int, float]:
    """One (kernel, backend) in its own torchrun: (kernel, backend, exit code, seconds). A failed one
    leaves its case recorded with why (record_lost_case)."""
    n = args.nproc
    cmd = [*TORCHRUN, "--nproc-per-node", str(n), *RANK_COMMAND, *common, "--kernel", plan.kernel]
    cmd += ["--backend", backend.name]
    watched = args.setup_timeout > 0 and args.case_timeout > 0
    limit = args.setup_timeout + len(plan.cases) * args.case_timeout + 2 * TEARDOWN_S + START_S
    what = (
        f"--setup-timeout {args.setup_timeout:g} s + {len(plan.cases)} cases x --case-timeout "
        f"{args.case_timeout:g} s + start and teardown"
    )
    print(
        f"{WHO}: {plan.kernel} · {backend.name}: {len(plan.cases)} cases, torchrun x{n}",
        flush=True,
    )
    before = file_state(args.out, args.resume)
    t0 = time.monotonic()
    rc, why = run_child(cmd, limit if watched else None, what, clock=CLOCK)
    if why is not None:
        record_lost_case(args, plan, backend, before, why)
    return plan.kernel, backend.name, rc, time.monotonic() - t0
