"""`dskbench run`: check and time kernels over a sweep, results as JSON lines."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dskbench import paths
from dskbench.frontends.cli import args as types
from dskbench.frontends.cli import common
from dskbench.frontends.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, SWEEPS, Terminated, UsageError
from dskbench.frontends.cli.plan import plan, swept_tp
from dskbench.measure.stopping import DEFAULT as DEFAULT_STOPPING
from dskbench.measure.stopping import POLICIES

if TYPE_CHECKING:
    from dskbench.execution.config import RunConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="check and time kernels over a sweep; results as JSON lines")
    run.add_argument("--kernel", action="append", help="kernel name (repeatable; default: all)")
    run.add_argument(
        "--backend", action="append", help="backend name (repeatable; default: all but torch-ref)"
    )
    run.add_argument("--sweep", action="append", choices=(*SWEEPS, "all"), help="default: decode and prefill")
    run.add_argument(
        "--device", choices=("cuda", "cpu"), help="default: cuda if present, else cpu references"
    )
    run.add_argument("--out", type=Path, help="results file (default: results/<run>.jsonl)")
    run.add_argument("--quick", action="store_true", help="fewer sweep points and a shorter time budget")
    run.add_argument(
        "--tp",
        type=types.positive_ints,
        help="tensor-parallel degrees the shapes file sweeps, e.g. 1 (default: 1,4,8, those the profile sweeps)",
    )
    run.add_argument(
        "--mode", choices=("cold", "hot", "rotate"), default="cold", help="L2 state (default cold)"
    )
    run.add_argument(
        "--flush",
        choices=("write", "read"),
        default="write",
        help="how cold mode flushes L2: zero_ a 2xL2 buffer (default) or read it (experiment)",
    )
    run.add_argument(
        "--shard",
        metavar="K/N",
        help="measure part K of N of the plan, cut by expected cost (one host of a job array; "
        "report, compare and pick read the parts' folder)",
    )
    run.add_argument(
        "--no-batch",
        action="store_true",
        help="time every cold case alone with the event timer (default: cases are sampled in batches, "
        "timed by CUPTI, where the profiler works)",
    )
    run.add_argument(
        "--no-cross-check",
        action="store_true",
        help="skip the second timer's brief reading of each case (default: a case CUPTI timed is also "
        "read with CUDA events, one the events timed with CUPTI, and a disagreement flags the record)",
    )
    run.add_argument(
        "--build-ahead",
        action="store_true",
        help="build the JIT modules in processes beside the measuring one, longest builds first, and "
        "measure each case once its build is done (a fresh box's first run: instead of `dskbench warm`)",
    )
    run.add_argument(
        "--build-jobs",
        type=types.positive_int,
        metavar="N",
        help="with --build-ahead: builds at once (default: half the cores but two)",
    )
    run.add_argument(
        "--defer-builds-over",
        type=types.seconds,
        metavar="S",
        help="with --build-ahead: leave out the JIT builds that dskbench's shipped build times record as "
        "taking S seconds or more; their cases are recorded skipped, with the `dskbench warm` command that "
        "builds them. Builds done before on this box are not left out",
    )
    run.add_argument(
        "--no-dedupe",
        action="store_true",
        help="measure every op's case, also where another op has the same kernel, backend and shape",
    )
    run.add_argument(
        "--seed", type=types.seed, help="input seed, 0 or more (default: fresh inputs every run)"
    )
    run.add_argument("--budget", type=types.seconds, help="time budget per case, seconds (> 0)")
    run.add_argument(
        "--min-time",
        type=types.seconds,
        metavar="S",
        help="sampling a case lasts at least S seconds before its noise target may stop it "
        "(default 0.03; the quick profile 0.02)",
    )
    run.add_argument(
        "--stopping",
        choices=tuple(POLICIES),
        default=DEFAULT_STOPPING,
        help="when a case's sampling stops: the median's 95%% CI within the noise target (default), the "
        "samples' CV within it (nvbench's stdrel), or a fixed number of samples",
    )
    run.add_argument(
        "--no-isolate",
        action="store_true",
        help="run in this process (debugging: no crash isolation, no hang watch)",
    )
    types.add_limits(run, "a case")
    run.add_argument(
        "--gpus",
        type=types.gpus,
        help="shard the cases over this host's GPUs, one worker per GPU: 'all' or a count (default: one GPU)",
    )
    run.add_argument(
        "--costs-from",
        action="append",
        type=Path,
        help="with --gpus: cut the shards by each case's time in these earlier results (repeatable)",
    )
    run.add_argument(
        "--no-multicast",
        action="store_true",
        help="switch NVLink multicast (NCCL NVLS, symmetric-memory multicast) off in the workers, e.g. on "
        "GPUs shared with other tenants; recorded in the environment (env DSKBENCH_NO_MULTICAST=1)",
    )
    run.add_argument(
        "--exclusive",
        action="store_true",
        help="refuse to start (exit 2) while another process uses the GPU(s), as NVML lists them, or when "
        "NVML cannot tell",
    )
    run.add_argument(
        "--wait-exclusive",
        type=types.seconds,
        metavar="S",
        help="like --exclusive, but first wait up to S seconds for the other processes to leave, saying "
        "which ones it waits for",
    )
    types.add_selection(run)
    run.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    run.add_argument(
        "--allow-drift",
        action="store_true",
        help="run even where the registry differs from what traces/ give (registry generate --check)",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="skip the cases --out already holds a record for, errors included (appends a run; needs --out)",
    )
    run.add_argument(
        "--retry-errors",
        action="store_true",
        help="with --resume: run again the cases whose last record is an error (a crash, a time-out) "
        "or unstable (an impossible timing)",
    )
    run.add_argument(
        "--allow-mixed-settings",
        action="store_true",
        help="with --resume: add to a file measured with other settings (sweep, tp, mode, flush, seed, ...)",
    )


def run_config(args: argparse.Namespace, device: str, gpus: int) -> RunConfig:
    """The run configuration `dskbench run`'s flags ask for."""
    from dskbench.execution.config import RunConfig
    from dskbench.execution.items import DEFAULT_TP, SweepOptions
    from dskbench.results.environment import no_multicast_asked

    options = SweepOptions(
        device=device,
        phases=tuple(common.sweeps(args.sweep)),
        profile="cpu" if device == "cpu" else ("quick" if args.quick else "full"),
        tp=args.tp or DEFAULT_TP,
        mode=args.mode,
        flush=args.flush,
        stopping=args.stopping,
        dedupe=not args.no_dedupe,
        batch=not args.no_batch,
        cross_check=not args.no_cross_check,
        build_ahead=args.build_ahead,
        build_jobs=args.build_jobs,
        defer_builds_over_s=args.defer_builds_over,
        seed=args.seed,
        isolate=not args.no_isolate,
        budget_s=args.budget if args.budget is not None else (0.2 if device == "cpu" else None),
        min_time_s=args.min_time,
        gpus=gpus,
        costs_from=tuple(str(p) for p in args.costs_from or ()),
        case_timeout_s=args.case_timeout,
        first_use_allowance_s=args.first_use_allowance,
        no_multicast=args.no_multicast or no_multicast_asked(),
    )
    return RunConfig(
        options=options,
        kernels=tuple(args.kernel or ()),
        backends=tuple(args.backend or ()),
        ops=tuple(args.op or ()),
        points=tuple(args.point or ()),
        models=tuple(dict.fromkeys(args.model or ())),
    )


def command(args: argparse.Namespace) -> int:
    from dskbench.execution.runner import run_sweep
    from dskbench.frontends.cli.resume import open_out
    from dskbench.results.environment import NO_MULTICAST_ENV

    for flag in ("retry_errors", "allow_mixed_settings"):
        if getattr(args, flag) and not args.resume:
            print(f"dskbench: --{flag.replace('_', '-')} applies only with --resume", file=sys.stderr)
            return EXIT_USAGE
    for flag in ("build_jobs", "defer_builds_over"):
        if getattr(args, flag) is not None and not args.build_ahead:
            print(f"dskbench: --{flag.replace('_', '-')} applies only with --build-ahead", file=sys.stderr)
            return EXIT_USAGE
    if args.resume and args.out is None:
        print("dskbench: --resume needs --out FILE, the results file to continue", file=sys.stderr)
        return EXIT_USAGE
    device, note = common.device_choice(args.device)
    if note:
        print(note, file=sys.stderr)
    exclusive = args.exclusive or args.wait_exclusive is not None
    if exclusive and device != "cuda":
        print("dskbench: --exclusive and --wait-exclusive apply to GPU runs (--device cuda)", file=sys.stderr)
        return EXIT_USAGE
    gpus = 1
    if args.gpus is not None:
        from dskbench.execution.shard import ShardError, parse_gpus

        if args.no_isolate:
            print(
                "dskbench: --gpus runs one worker process per GPU; it cannot be --no-isolate", file=sys.stderr
            )
            return EXIT_USAGE
        try:
            gpus = parse_gpus(args.gpus, common.visible_gpu_count(device))
        except ShardError as e:
            print(f"dskbench: {e}", file=sys.stderr)
            return EXIT_USAGE
    config = run_config(args, device, gpus)
    opts = config.options
    if opts.no_multicast and not opts.isolate:  # --no-isolate: this process is the worker
        os.environ.update(NO_MULTICAST_ENV)
    for p in opts.costs_from:
        if not Path(p).exists():
            print(f"dskbench: --costs-from {p}: no such file", file=sys.stderr)
            return EXIT_USAGE
    registry, shapes = common.registry_and_shapes()
    if args.tp is None:
        config = swept_tp(config, shapes)
        opts = config.options
    if not args.allow_drift:
        from dskbench.registry.load import drift_message

        if drift := drift_message():
            raise UsageError(drift)
    items, skips = plan(config, registry, shapes)
    if args.shard:
        from dskbench.device.info import DeviceInfo
        from dskbench.execution.job_shard import ShardSpecError, parse_shard, take_part
        from dskbench.execution.shard import sweep_cost

        try:
            k, n = parse_shard(args.shard)
        except ShardSpecError as e:
            print(f"dskbench: {e}", file=sys.stderr)
            return EXIT_USAGE
        items, skips = take_part(items, skips, k, n, sweep_cost(items, opts, DeviceInfo.detect(device)))
    out = args.out or paths.RESULTS_DIR / f"run-{device}-{common.stamp()}.jsonl"
    from dskbench.results.io import ResultsError

    try:
        items, skips = open_out(out, args, opts, items, skips)
    except ResultsError as e:
        print(f"dskbench: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        for it in items:
            print(f"{it.case_id}  {it.backend}")
        for s in skips:
            print(f"{s['kernel']}  skipped: {s['reason']}")
        print(f"{len(items)} cases to run, {len(skips)} kernels skipped at planning")
        if gpus > 1:
            from dskbench.execution.shard import print_shards

            print_shards(items, opts)
        return EXIT_OK
    if exclusive:
        from dskbench.execution.shared_gpu import exclusive_problem

        if problem := exclusive_problem(gpus, args.wait_exclusive):
            print(f"dskbench: {problem}", file=sys.stderr)
            return EXIT_USAGE
    where = f"{gpus} GPUs" if gpus > 1 else device
    print(
        f"{len(items)} cases on {where} ({opts.profile} sweep {', '.join(opts.phases)}) -> {out}",
        file=sys.stderr,
    )
    from dskbench.execution.progress import Progress

    progress = Progress(len(items))
    try:
        summary = run_sweep(items, skips, opts, out, progress=progress)
    except KeyboardInterrupt as e:
        from dskbench.execution.sweep import interrupted_message

        progress.close()
        print(interrupted_message(out, "SIGTERM" if isinstance(e, Terminated) else "SIGINT"), file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
    finally:
        progress.close()
    return finish(out, summary.line(), opts.device, summary.counts)


def finish(out: Path, summary_line: str, device: str, counts: Mapping[str, int]) -> int:
    """End a run's output (stdout): the table of this run (the file's last), the summary line, then the
    cases that were not ok, one line each, what fails the run last; results above a datasheet peak (a
    traffic-model error) named on stderr. The exit status: 1 when a case is wrong, in error or
    unstable, a CPU reference run's time-outs excepted (dskbench.execution.outcome)."""
    from dskbench.analysis.over_peak import over_peak
    from dskbench.analysis.over_peak import summary as over_peak_summary
    from dskbench.execution.outcome import FAILING, expected_timeout, failing, not_ok_lines
    from dskbench.report.run_table import run_table
    from dskbench.results.io import ResultsError, read_runs

    try:
        runs = read_runs([out])
    except ResultsError as e:
        print(f"dskbench: no end-of-run table: {e}", file=sys.stderr)
        print(summary_line)
        return EXIT_FAIL if any(counts.get(k) for k in FAILING) else EXIT_OK
    results = runs[-1].results if runs else []
    if table := run_table(results):
        print(table)
    if line := over_peak_summary(over_peak(results)):
        print(f"dskbench: warning: {line}", file=sys.stderr)
    print(summary_line)
    if timeouts := sum(1 for r in results if expected_timeout(r, device)):
        print(
            f"{timeouts} case{'s' if timeouts != 1 else ''} ran past the time limit: expected on a CPU "
            "reference run, not a failure (--case-timeout S gives them longer)"
        )
    for line in not_ok_lines(results, device):
        print(line)
    return EXIT_FAIL if failing(results, device) else EXIT_OK
