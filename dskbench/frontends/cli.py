"""Command line: `dskbench registry generate | list | run | warm | report | compare | pick`."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dskbench import paths
from dskbench.measure.stopping import DEFAULT as DEFAULT_STOPPING
from dskbench.measure.stopping import POLICIES

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_PIPE = 141  # stdout's reader went away (`dskbench list | head`): what a shell reports for SIGPIPE
SWEEPS = ("decode", "prefill", "decode_graph")


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: workers stopped, the results file left whole, a message."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def _case_timeout(s: str) -> float:
    from dskbench.execution.limits import LimitError, parse_timeout

    try:
        return parse_timeout(s, "--case-timeout")
    except LimitError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--case-timeout: ")) from None


class UsageError(Exception):
    """Bad input found below a command: main() prints it as one `dskbench: ...` line and exits 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (`dskbench: argument --tp: ...`) instead of usage + error."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"dskbench: {message} (see `{self.prog} --help`)\n")


def _positive_int(s: str) -> int:
    try:
        n = int(s)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return n


def _positive_ints(s: str) -> tuple[int, ...]:
    """`1,4,8`: comma-separated positive integers, each once."""
    try:
        values = [int(x) for x in s.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {s!r}")
    return tuple(dict.fromkeys(values))


def _seed(s: str) -> int:
    try:
        n = int(s)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {s!r}")
    return n


def _seconds(s: str) -> float:
    try:
        x = float(s)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {s!r}")
    return x


def _gpus(s: str) -> str:
    """'all' or a count (checked against the GPUs visible when the command runs)."""
    if s.strip().lower() != "all":
        try:
            _positive_int(s)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected 'all' or a number of GPUs, got {s!r}") from None
    return s


def _point(s: str) -> dict[str, int]:
    from dskbench.execution.selection import parse_point

    try:
        return parse_point(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_selection(p: argparse.ArgumentParser) -> None:
    """--op and --point: the filters a record's repro command selects its one case with."""
    p.add_argument(
        "--op",
        action="append",
        metavar="OP[:VARIANT]",
        help="only cases of this op (a variant after ':', as in case ids; repeatable)",
    )
    p.add_argument(
        "--point",
        action="append",
        type=_point,
        metavar="K=V[,K=V]",
        help="only cases at this sweep point, e.g. B=64 or B=1,kv_len=1024,tp=1 (repeatable)",
    )


def version() -> str:
    """The installed package's version; the source tree's when dskbench runs uninstalled."""
    from importlib import metadata

    try:
        return metadata.version("dskbench")
    except metadata.PackageNotFoundError:
        from dskbench import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dskbench", description=__doc__)
    p.add_argument("--version", action="version", version=f"dskbench {version()}")
    sub = p.add_subparsers(dest="command", required=True)

    reg = sub.add_parser("registry", help="the kernel registry generated from the trace documents")
    reg_sub = reg.add_subparsers(dest="registry_command", required=True)
    gen = reg_sub.add_parser("generate", help="(re)generate kernels_registry/ from traces/")
    gen.add_argument(
        "--traces",
        nargs="+",
        type=Path,
        help="trace documents (default: every .md in traces/); refused into a folder generated from more",
    )
    gen.add_argument(
        "--out",
        type=Path,
        help="output folder: new, empty, or one generate wrote (default: kernels_registry/)",
    )
    gen.add_argument("--check", action="store_true", help="fail if the committed registry differs")

    ls = sub.add_parser("list", help="kernels in the registry, their status, adapter and backends")
    ls.add_argument("--status", help="only kernels with this status (benchmark, host-only, ...)")
    ls.add_argument("--json", action="store_true", help="machine-readable output")

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
        type=_positive_ints,
        default=(1,),
        help="tensor-parallel degrees the shapes file sweeps, e.g. 1,4,8 (default 1)",
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
        "--no-dedupe",
        action="store_true",
        help="measure every op's case, also where another op has the same kernel, backend and shape",
    )
    run.add_argument("--seed", type=_seed, help="input seed, 0 or more (default: fresh inputs every run)")
    run.add_argument("--budget", type=_seconds, help="time budget per case, seconds (> 0)")
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
    run.add_argument(
        "--case-timeout",
        type=_case_timeout,
        metavar="S",
        help="kill a case's worker after S seconds without its result, plus 120 s on a kernel's first use "
        "(0 = never; default: scaled from the case's expected time; env DSKBENCH_CASE_TIMEOUT_S)",
    )
    run.add_argument(
        "--gpus",
        type=_gpus,
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
    _add_selection(run)
    run.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    run.add_argument(
        "--allow-drift",
        action="store_true",
        help="run even where kernels_registry/ differs from what traces/ give (registry generate --check)",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="skip the cases --out already holds a record for, errors included (appends a run; needs --out)",
    )
    run.add_argument(
        "--retry-errors",
        action="store_true",
        help="with --resume: run again the cases whose last record is an error (a crash, a time-out)",
    )
    run.add_argument(
        "--allow-mixed-settings",
        action="store_true",
        help="with --resume: add to a file measured with other settings (sweep, tp, mode, flush, seed, ...)",
    )

    wm = sub.add_parser(
        "warm",
        help="build every JIT module a sweep needs, many at once, before timing anything (fresh GPU box)",
    )
    wm.add_argument("--kernel", action="append", help="kernel name (repeatable; default: all)")
    wm.add_argument(
        "--backend", action="append", help="backend name (repeatable; default: all but torch-ref)"
    )
    wm.add_argument("--sweep", action="append", choices=(*SWEEPS, "all"), help="default: decode and prefill")
    wm.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if present, else cpu references")
    wm.add_argument("--tp", type=_positive_ints, default=(1,), help="tensor-parallel degrees (default 1)")
    _add_selection(wm)
    wm.add_argument(
        "--case-timeout",
        type=_case_timeout,
        metavar="S",
        help="kill a build's worker after S seconds without its result (0 = never; default: scaled)",
    )
    wm.add_argument(
        "--jobs", type=_positive_int, help="builds at once (default: a quarter of the CPU cores, at most 16)"
    )
    wm.add_argument(
        "--gpus", type=_gpus, help="spread the builds' processes over this host's GPUs: 'all' or a count"
    )
    wm.add_argument("--out", type=Path, help="JSON file: each build's status and seconds")

    cmp_ = sub.add_parser(
        "compare",
        help="which cases got slower, judged against run-to-run noise (ours or asv results)",
        description="dskbench compare OLD NEW, or OLD1 OLD2 ... -- NEW1 NEW2 ... (files, folders, "
        "asv results, ASV_RESULTS_DIR@COMMIT); exit 1 when a measurement regressed",
    )
    cmp_.add_argument("paths", nargs="*", type=Path, help="OLD NEW, or the old side's runs before --")
    cmp_.add_argument("--new-side", nargs="+", type=Path, default=None, help=argparse.SUPPRESS)
    cmp_.add_argument(
        "--threshold",
        type=float,
        default=0.05,
        help="relative change of the median that counts (default 0.05)",
    )
    cmp_.add_argument(
        "--history",
        action="append",
        type=Path,
        default=[],
        help="earlier runs of the same GPU model (file or folder, repeatable): each case's own noise floor",
    )
    cmp_.add_argument(
        "--prior", type=Path, help="noise prior JSON (default: dskbench's, see scripts/noise_prior.py)"
    )
    cmp_.add_argument("--no-fail", action="store_true", help="exit 0 even when something regressed")
    cmp_.add_argument("-v", "--verbose", action="store_true", help="list unchanged cases and twins too")

    pk = sub.add_parser(
        "pick", help="fastest correct backend per DeepSeek op and batch; decode-step estimate"
    )
    pk.add_argument("results", nargs="+", type=Path)
    pk.add_argument("--phase", choices=("decode", "prefill"), help="default: both")
    pk.add_argument(
        "--batch", type=_positive_ints, help="batch points, e.g. 1,8,64,256 (default: all measured)"
    )
    pk.add_argument(
        "--tp", type=_positive_int, default=1, help="tensor-parallel degree of the deployment (default 1)"
    )
    pk.add_argument("--kv-len", type=_positive_int, help="KV context length for attention rows")
    pk.add_argument("--device", help="GPU name, when the results hold several")
    pk.add_argument("--out", type=Path, help="folder for pick.md, pick.html, pick.json")

    rep = sub.add_parser("report", help="HTML and Markdown report of results files")
    rep.add_argument("results", nargs="+", type=Path)
    rep.add_argument("--out", type=Path, required=True, help="output folder")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code. A reader that closes stdout early (`dskbench list | head -3`)
    ends the command quietly with EXIT_PIPE, as a shell reports for a tool stopped by SIGPIPE."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe could only print a warning
        return code
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_PIPE


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null: what its buffer still holds goes nowhere at exit, without an error."""
    import os

    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError):  # stdout is not a file (captured): nothing will flush to the pipe
        pass


def _main(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(_compare_sides(sys.argv[1:] if argv is None else list(argv)))
    except SystemExit as e:  # --help, or a usage error already printed: its exit code
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if args.command == "registry":
            from dskbench.registry.load import cli_generate

            return cli_generate(args.traces, args.out, args.check)
        if args.command == "list":
            return cmd_list(args)
        if args.command in ("run", "warm"):
            from dskbench.execution.limits import LimitError, timeout_from_env

            try:
                timeout_from_env()
            except LimitError as e:
                print(f"dskbench: {e}", file=sys.stderr)
                return EXIT_USAGE
        if args.command == "run":
            return cmd_run(args)
        if args.command == "warm":
            return cmd_warm(args)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "pick":
            from dskbench.analysis.pick import cli_pick

            batch = list(args.batch) if args.batch else None
            return cli_pick(
                args.results, args.phase, batch, args.tp, args.out, kv_len=args.kv_len, device=args.device
            )
        if args.command == "compare":
            from dskbench.analysis.compare import cli_compare

            if args.new_side is not None:
                old_side, new_side = list(args.paths), list(args.new_side)
            elif len(args.paths) == 2:
                old_side, new_side = [args.paths[0]], [args.paths[1]]
            else:
                print("dskbench compare: give OLD NEW, or OLD1 OLD2 ... -- NEW1 NEW2 ...", file=sys.stderr)
                return EXIT_USAGE
            if not old_side:
                print("dskbench compare: no old results before --", file=sys.stderr)
                return EXIT_USAGE
            return cli_compare(
                old_side,
                new_side,
                args.threshold,
                not args.no_fail,
                args.verbose,
                history_paths=args.history,
                prior_path=args.prior,
            )
    except UsageError as e:
        print(f"dskbench: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:
        term = isinstance(e, Terminated)
        print(f"dskbench: interrupted ({'SIGTERM' if term else 'SIGINT'})", file=sys.stderr)
        return 143 if term else 130
    return EXIT_USAGE


def _compare_sides(argv: list[str]) -> list[str]:
    """`compare A1 A2 -- B1 B2`: argparse drops the `--`, so what follows it is passed as --new-side."""
    if argv[:1] == ["compare"] and "--" in argv:
        i = argv.index("--")
        return [*argv[:i], "--new-side", *argv[i + 1 :]] if i + 1 < len(argv) else argv[:i] + ["--new-side"]
    return argv


def _registry_and_shapes():
    from dskbench.registry.load import RegistryError, load_registry
    from dskbench.shapes.cases import ShapeError, default_shapes

    try:
        shapes = default_shapes()
        return load_registry(paths.REGISTRY_DIR), shapes
    except (RegistryError, ShapeError) as e:
        raise UsageError(str(e)) from None


def _plan(
    args: argparse.Namespace, opts: Any, registry: dict[str, Any], shapes: Any
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Check the options against the shapes file, then plan: the work items and the planned skips."""
    from dskbench.execution.runner import PlanError, plan_sweep, select_kernels

    _check_tp(args.tp, shapes, opts.profile)
    try:
        kernels = select_kernels(registry, args.kernel)
        items, skips = plan_sweep(registry, shapes, kernels, args.backend, opts)
    except PlanError as e:
        raise UsageError(str(e)) from None
    replan = functools.partial(plan_sweep, registry, shapes, kernels, args.backend)
    _check_plan(items, skips, opts, replan, shapes.values("tp", opts.profile))
    return _select(args, opts, registry, shapes, items, skips)


def _select(
    args: argparse.Namespace, opts: Any, registry: dict[str, Any], shapes: Any, items: list, skips: list
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The planned cases --op and --point select."""
    from dskbench.execution.selection import Selection, SelectionError, filter_plan

    try:
        sel = Selection.from_args(args.op, args.point, shapes)
        return filter_plan(items, skips, sel, opts.tp, lambda k: getattr(registry.get(k), "op_names", ()))
    except SelectionError as e:
        raise UsageError(str(e)) from None


def _check_tp(tp: tuple[int, ...], shapes: Any, profile: str) -> None:
    """--tp must name degrees the profile sweeps: another one would silently drop every tp-dependent case."""
    swept = shapes.values("tp", profile)
    missing = [t for t in tp if t not in swept]
    if missing:
        where = "sweeps.tp" if profile == "full" else f"{profile}.tp"
        raise UsageError(
            f"--tp {','.join(map(str, missing))}: the {profile} profile sweeps tp "
            f"{', '.join(map(str, swept))} only ({shapes.source} {where})"
        )


def _check_plan(
    items: list[Any],
    skips: list[Any],
    opts: Any,
    replan: Callable[[Any], tuple[list[Any], Any]],
    swept_tp: list[int],
) -> None:
    """A plan with nothing to run and nothing to record is a mistake in the options: say which one."""
    if items or skips:
        return
    tp = ",".join(map(str, opts.tp))
    asked = f"the {'/'.join(opts.phases)} sweep at --tp {tp}"
    all_tp = dataclasses.replace(opts, tp=tuple(swept_tp))
    with_tp = sorted({int(i.case["point"]["tp"]) for i in replan(all_tp)[0] if "tp" in i.case["point"]})
    if with_tp:
        why = f"their cases depend on tp and exist at --tp {','.join(map(str, with_tp))} only"
    elif replan(dataclasses.replace(all_tp, phases=SWEEPS))[0]:
        why = "they run in another sweep (--sweep all)"
    else:
        why = "no selected backend serves them on this device (`dskbench list` shows the backends)"
    raise UsageError(f"nothing to run: the selected kernels have no case in {asked}: {why}")


def cmd_list(args: argparse.Namespace) -> int:
    from dskbench.adapters import adapters

    registry, _shapes = _registry_and_shapes()
    known = adapters()
    rows = []
    for name in sorted(registry):
        e = registry[name]
        if args.status and e.status != args.status:
            continue
        a = known.get(name)
        rows.append(
            {
                "kernel": name,
                "category": e.category,
                "source": e.source,
                "status": e.status,
                "ops": len(e.op_names),
                "adapter": a.__name__ if a else None,
                "backends": [b.name for b in a.backends] if a else [],
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1))
        return EXIT_OK
    print(f"{'kernel':42} {'category':14} {'source':11} {'status':16} ops  backends")
    for r in rows:
        b = ", ".join(r["backends"]) if r["adapter"] else "(no adapter)"
        print(
            f"{r['kernel']:42} {r['category'] or '':14} {r['source'] or '':11} {r['status']:16} {r['ops']:3}  {b}"
        )
    print(f"{len(rows)} kernels, {sum(1 for r in rows if r['adapter'])} with an adapter")
    return EXIT_OK


def _device_choice(requested: str | None) -> tuple[str, str | None]:
    """The device to run on, and a message to print (or an error)."""
    from dskbench.adapters.backends import DeviceInfo

    found = DeviceInfo.detect("cuda")
    if requested == "cuda" and found.kind != "cuda":
        raise SystemExit(
            "dskbench: --device cuda, but no CUDA GPU is visible to torch (torch.cuda.is_available() is False).\n"
            "Run `dskbench run --device cpu` to time the torch references on the CPU instead."
        )
    if requested is None and found.kind != "cuda":
        return (
            "cpu",
            "no CUDA GPU found: timing the torch reference implementations on the CPU (capped sweep)",
        )
    return requested or "cuda", None


def _sweeps(asked: list[str] | None) -> list[str]:
    """--sweep as given (repeatable; 'all' = every sweep); decode and prefill by default."""
    if not asked:
        return ["decode", "prefill"]
    return list(SWEEPS) if "all" in asked else asked


def cmd_run(args: argparse.Namespace) -> int:
    from dskbench.execution.runner import SweepOptions, run_sweep
    from dskbench.results.environment import NO_MULTICAST_ENV, no_multicast_asked

    for flag in ("retry_errors", "allow_mixed_settings"):
        if getattr(args, flag) and not args.resume:
            print(f"dskbench: --{flag.replace('_', '-')} applies only with --resume", file=sys.stderr)
            return EXIT_USAGE
    if args.resume and args.out is None:
        print("dskbench: --resume needs --out FILE, the results file to continue", file=sys.stderr)
        return EXIT_USAGE
    device, note = _device_choice(args.device)
    if note:
        print(note, file=sys.stderr)
    gpus = 1
    if args.gpus is not None:
        from dskbench.adapters.backends import DeviceInfo
        from dskbench.execution.shard import ShardError, parse_gpus

        if args.no_isolate:
            print(
                "dskbench: --gpus runs one worker process per GPU; it cannot be --no-isolate", file=sys.stderr
            )
            return EXIT_USAGE
        try:
            gpus = parse_gpus(args.gpus, DeviceInfo.detect("cuda").count if device == "cuda" else 0)
        except ShardError as e:
            print(f"dskbench: {e}", file=sys.stderr)
            return EXIT_USAGE
    sweeps = _sweeps(args.sweep)
    profile = "cpu" if device == "cpu" else ("quick" if args.quick else "full")
    opts = SweepOptions(
        device=device,
        phases=tuple(sweeps),
        profile=profile,
        tp=args.tp,
        mode=args.mode,
        flush=args.flush,
        stopping=args.stopping,
        dedupe=not args.no_dedupe,
        seed=args.seed,
        isolate=not args.no_isolate,
        budget_s=args.budget if args.budget is not None else (0.2 if device == "cpu" else None),
        gpus=gpus,
        costs_from=tuple(str(p) for p in args.costs_from or ()),
        case_timeout_s=args.case_timeout,
        no_multicast=args.no_multicast or no_multicast_asked(),
    )
    if opts.no_multicast and not opts.isolate:  # --no-isolate: this process is the worker
        os.environ.update(NO_MULTICAST_ENV)
    for p in opts.costs_from:
        if not Path(p).exists():
            print(f"dskbench: --costs-from {p}: no such file", file=sys.stderr)
            return EXIT_USAGE
    registry, shapes = _registry_and_shapes()
    if not args.allow_drift:
        from dskbench.registry.load import drift_message

        if drift := drift_message():
            raise UsageError(drift)
    items, skips = _plan(args, opts, registry, shapes)
    out = args.out or paths.RESULTS_DIR / f"run-{device}-{_stamp()}.jsonl"
    from dskbench.results.io import ResultsError

    try:
        items, skips = _open_out(out, args, opts, items, skips)
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
    where = f"{gpus} GPUs" if gpus > 1 else device
    print(f"{len(items)} cases on {where} ({profile} sweep {', '.join(sweeps)}) -> {out}", file=sys.stderr)
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
    _print_table(out)
    print(summary.line())
    return EXIT_FAIL if summary.counts["wrong"] or summary.counts["error"] else EXIT_OK


def _print_table(out: Path) -> None:
    """The end-of-run table of this run (the file's last) on stdout."""
    from dskbench.report.run_table import run_table
    from dskbench.results.io import ResultsError, read_runs

    try:
        runs = read_runs([out])
    except ResultsError as e:
        print(f"dskbench: no end-of-run table: {e}", file=sys.stderr)
        return
    if runs and (table := run_table(runs[-1].results)):
        print(table)


def _open_out(out: Path, args: argparse.Namespace, opts: Any, items: list, skips: list) -> tuple[list, list]:
    """Check --out before anything runs (ours or new; an unfinished last line cut off) and, with
    --resume, drop the cases it already holds. Raises ResultsError with a one-line reason."""
    from dskbench.results.io import (
        ResultsError,
        finished_cases,
        latest_by_case,
        prepare_append,
        read_runs,
        settings_differences,
    )

    dropped = prepare_append(out, repair=not args.dry_run)
    if dropped and args.dry_run:
        print(f"{out}: its unfinished last line ({dropped} bytes) would be cut off", file=sys.stderr)
    if not args.resume:
        return items, skips
    if not out.exists():
        print(f"resuming {out}: no such file yet, starting it", file=sys.stderr)
        return items, skips
    try:
        runs = read_runs([out])
    except ResultsError as e:
        raise ResultsError(f"cannot resume: {e}") from None
    differ = "; ".join(settings_differences(runs, dataclasses.asdict(opts)))
    if differ and not args.allow_mixed_settings:
        raise ResultsError(
            f"cannot resume {out}: it was measured with other settings ({differ}); "
            "pass --allow-mixed-settings to add to it anyway"
        )
    if differ:
        print(f"resuming {out} with other settings than its earlier runs ({differ})", file=sys.stderr)
    done = finished_cases(runs, args.retry_errors)
    latest = latest_by_case(runs)
    before = len(items)
    kept = [i for i in items if (i.case_id, i.backend) not in done]
    errors = sum(1 for i in items if latest.get((i.case_id, i.backend), {}).get("status") == "error")
    items = [dataclasses.replace(i, index=n) for n, i in enumerate(kept)]
    skips = [s for s in skips if (s["case_id"], "-") not in done]
    if args.retry_errors:
        note = f", {errors} errors to run again" if errors else ""
    else:
        note = f" ({errors} of them errors, kept: --retry-errors runs them again)" if errors else ""
    print(f"resuming {out}: {before - len(items)} cases already done{note}", file=sys.stderr)
    return items, skips


def cmd_warm(args: argparse.Namespace) -> int:
    from dskbench.execution.runner import SweepOptions
    from dskbench.execution.warm import default_jobs, warm

    device, note = _device_choice(args.device)
    if note:
        print(note, file=sys.stderr)
    tokens = None
    if args.gpus is not None:
        from dskbench.adapters.backends import DeviceInfo
        from dskbench.execution.shard import ShardError, parse_gpus, visible_gpus

        try:
            n = parse_gpus(args.gpus, DeviceInfo.detect("cuda").count if device == "cuda" else 0)
            tokens = visible_gpus(n)
        except ShardError as e:
            print(f"dskbench: {e}", file=sys.stderr)
            return EXIT_USAGE
    sweeps = _sweeps(args.sweep)
    opts = SweepOptions(
        device=device,
        phases=tuple(sweeps),
        profile="cpu" if device == "cpu" else "full",
        tp=args.tp,
        seed=0,
        measure_ceilings=False,
        case_timeout_s=args.case_timeout,
    )
    registry, shapes = _registry_and_shapes()
    items, _skips = _plan(args, opts, registry, shapes)
    warm(items, opts, args.jobs or default_jobs(), tokens, args.out)
    return EXIT_OK


def _stamp() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def cmd_report(args: argparse.Namespace) -> int:
    from dskbench.report import write_report
    from dskbench.report.csv_out import write_csv
    from dskbench.results.io import ResultsError, read_runs

    try:
        runs = read_runs(args.results)
    except ResultsError as e:
        print(f"dskbench: {e}", file=sys.stderr)
        return EXIT_USAGE
    written = write_report(runs, args.out, csv_href="results.csv")
    written.append(write_csv(runs, args.out / "results.csv"))
    for p in written:
        print(p)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
