"""`dskbench comm`: the communication kernels across the GPUs of one host, one process per GPU.

    dskbench comm --nproc 4 --out results/comm-tp4.jsonl [--quick]     # one torchrun per backend
    torchrun --nproc-per-node 4 -m dskbench comm --out results/comm-tp4.jsonl [--quick]

Kernels: custom_all_reduce (sgl_kernel v1, sglang_jit v2, nccl baseline) and
flashinfer_communication_fusion (flashinfer allreduce_fusion with residual + RMSNorm, and the unfused
NCCL + fused_add_rmsnorm baseline), at [T, 7168] bf16 with TP = the number of processes, T from the
shapes file's decode and prefill token lists (or --tokens).

With --nproc N (outside torchrun) the command drives: one torchrun of N processes per (kernel, backend),
cheapest and safest first, each with an outer time limit (dskbench.execution.comm_launch). Under torchrun
each process is one rank (dskbench.execution.comm_rank): every rank builds the same inputs, runs the
backend once and checks its result against the sum over ranks; then the ranks time it together
(dskbench.measure.collective), and rank 0 writes one result per case with the slowest rank's timing and
the algorithm and bus bandwidth. A rank that hangs in a collective is ended by a watchdog after rank 0
has recorded the case as timed out. DSKBENCH_NO_MULTICAST=1 switches NVLink multicast off in every rank.
--device cpu runs the same path over gloo (the GPU kernels skip): to try arguments without a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dskbench.frontends.cli import args as types
from dskbench.frontends.cli.common import Terminated, UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    from dskbench.execution.comm_plan import CASE_TIMEOUT_S, KERNELS, PHASES, SETUP_TIMEOUT_S

    p = sub.add_parser(
        "comm", help="communication kernels across the GPUs of one host, one process per GPU (torchrun)"
    )
    p.add_argument("--kernel", action="append", choices=KERNELS, help="repeatable (default: both)")
    p.add_argument("--backend", action="append", help="backend name (repeatable; default: all)")
    p.add_argument("--sweep", action="append", choices=PHASES, help="default: decode and prefill")
    p.add_argument(
        "--tokens", type=types.positive_ints, help="token counts T, e.g. 1,64,512 (default: the sweep's)"
    )
    p.add_argument("--quick", action="store_true", help="the shapes file's quick token lists, short budget")
    p.add_argument("--mode", choices=("hot", "cold"), default="hot", help="L2 state (default hot)")
    p.add_argument("--seed", type=types.seed, help="input seed (default: fresh)")
    p.add_argument("--budget", type=types.seconds, help="sampling time budget per case, seconds")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo ranks, no GPU")
    p.add_argument("--out", type=Path, help="results file (rank 0 appends one run)")
    p.add_argument("--resume", action="store_true", help="skip (case, backend) pairs --out already holds")
    p.add_argument("--dry-run", action="store_true", help="print the plan (no process group needed)")
    p.add_argument("--world", type=types.positive_int, help="TP degree for --dry-run outside torchrun")
    p.add_argument(
        "--nproc",
        type=int,
        help="outside torchrun: one torchrun of this many processes (>= 2) per (kernel, backend)",
    )
    p.add_argument(
        "--no-precompile",
        action="store_true",
        help="with --nproc: do not build the later backends' JIT modules in the background",
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


def command(args: argparse.Namespace) -> int:
    from dskbench.execution.comm_env import prepare_rank_environment
    from dskbench.execution.comm_plan import hang_limits
    from dskbench.execution.limits import LimitError

    prepare_rank_environment()  # before torch is imported: its ranks and their torchruns read it
    try:
        hang_limits(args)
    except LimitError as e:
        raise UsageError(str(e)) from None
    rank_mode = "RANK" in os.environ
    world = int(os.environ.get("WORLD_SIZE", "0")) or (args.world or 0) or (args.nproc or 0)
    if args.dry_run:
        return dry_run(args, world or 2)
    if not rank_mode and args.nproc is not None:
        if args.nproc < 2:
            raise UsageError(f"--nproc {args.nproc}: expected at least 2 processes")
        return drive(args, checked(args, args.nproc))
    if world < 2 or not rank_mode:
        raise UsageError(
            "comm: run it with --nproc N (N >= 2: one torchrun per backend), or under "
            "`torchrun --nproc-per-node N -m dskbench comm`, or with --dry-run"
        )
    plans = checked(args, world)
    from dskbench.execution.comm_rank import run

    code = run(args, plans, world)
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter teardown: finalizers of sglang/flashinfer objects may start collectives on a
    # destroyed group, and NCCL/gloo threads can hang or abort an exit that is already complete
    os._exit(code)


def checked(args: argparse.Namespace, world: int, need_out: bool = True) -> list:
    """The plan, or a usage error naming the bad input (an unknown backend, an --out that is not ours)."""
    from dskbench.execution.comm_plan import plan_checked

    try:
        return plan_checked(args, world, need_out)
    except ValueError as e:
        raise UsageError(f"comm: {e}") from None


def dry_run(args: argparse.Namespace, world: int) -> int:
    from dskbench.execution.comm_plan import ordered

    n = 0
    for p, b in ordered(checked(args, world, need_out=False)):
        for c in p.cases:
            print(f"{c.id}  {b.name}")
            n += 1
    print(f"{n} cases at TP {world}")
    return 0


def drive(args: argparse.Namespace, plans: list) -> int:
    """The driver (one torchrun per backend); Ctrl-C or SIGTERM stops it with the file left whole."""
    from dskbench.execution.comm_launch import drive as drive_backends
    from dskbench.execution.sweep import interrupted_message

    try:
        return drive_backends(args, plans)
    except KeyboardInterrupt as e:
        stopped = isinstance(e, Terminated)
        print(interrupted_message(args.out, "SIGTERM" if stopped else "SIGINT"), file=sys.stderr, flush=True)
        return 143 if stopped else 130
