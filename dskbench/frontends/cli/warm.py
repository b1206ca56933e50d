"""`dskbench warm`: build every JIT module a sweep needs, many at once, before timing anything."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dskbench.frontends.cli import args as types
from dskbench.frontends.cli import common
from dskbench.frontends.cli.common import EXIT_OK, EXIT_USAGE, SWEEPS
from dskbench.frontends.cli.plan import plan, swept_tp


def add_parser(sub: argparse._SubParsersAction) -> None:
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
    wm.add_argument(
        "--quick",
        action="store_true",
        help="build for the quick profile's shapes only (what `dskbench run --quick` meets)",
    )
    wm.add_argument(
        "--tp",
        type=types.positive_ints,
        help="tensor-parallel degrees (default: 1,4,8, those the profile sweeps)",
    )
    types.add_selection(wm)
    types.add_limits(wm, "a build")
    wm.add_argument(
        "--jobs",
        type=types.positive_int,
        help="builds at once (default: half the CPU cores, no more than the host's memory holds at 6 GiB each)",
    )
    wm.add_argument(
        "--gpus", type=types.gpus, help="spread the builds' processes over this host's GPUs: 'all' or a count"
    )
    wm.add_argument("--out", type=Path, help="JSON file: each build's status and seconds")
    wm.add_argument(
        "--build-times",
        type=Path,
        metavar="FILE",
        help="an earlier warm's --out file: start the builds that took longest there first (default: the "
        "build times dskbench ships, from one measured warm-up)",
    )
    wm.add_argument(
        "--defer-builds-over",
        type=types.seconds,
        metavar="S",
        help="leave out the builds recorded (--build-times, else the shipped build times) as taking S seconds "
        "or more, as `dskbench run --build-ahead --defer-builds-over S` does; each is reported skipped, with "
        "the `dskbench warm` command that builds it. Builds done before on this box are not left out",
    )
    wm.add_argument(
        "--import",
        dest="import_file",
        type=Path,
        metavar="FILE",
        help="first unpack the JIT caches of FILE (made by --export on a box of the same GPU and stack)",
    )
    wm.add_argument(
        "--export",
        dest="export_file",
        type=Path,
        metavar="FILE",
        help="then write this box's JIT caches to FILE (tar.gz), for other boxes to --import",
    )
    wm.add_argument(
        "--force", action="store_true", help="--import although the archive's GPU or stack differs"
    )


def command(args: argparse.Namespace) -> int:
    from dskbench.setup.jit_cache import CacheError, export_caches, import_caches

    try:
        if args.import_file is not None:
            got = import_caches(args.import_file, force=args.force)
            print(
                f"dskbench: JIT caches imported from {args.import_file} ({sum(got['files'].values())} files)"
            )
        code = _warm(args)
        if code == EXIT_OK and args.export_file is not None:
            info = export_caches(args.export_file)
            print(
                f"dskbench: JIT caches exported to {args.export_file} ({sum(info['files'].values())} files)"
            )
    except CacheError as e:
        print(f"dskbench: {e}", file=sys.stderr)
        return EXIT_USAGE
    return code


def warm_profile(device: str, quick: bool) -> str:
    """The profile whose shapes warm builds for: a CPU's references, or the GPU sweep `run` will time
    (`--quick`: the quick one, whose per-shape compiles are about a third of the full profile's)."""
    if device == "cpu":
        return "cpu"
    return "quick" if quick else "full"


def _warm(args: argparse.Namespace) -> int:
    from dskbench.execution.config import RunConfig
    from dskbench.execution.items import DEFAULT_TP, SweepOptions
    from dskbench.execution.warm import default_jobs
    from dskbench.execution.warm_report import warm

    device, note = common.device_choice(args.device)
    if note:
        print(note, file=sys.stderr)
    tokens = None
    if args.gpus is not None:
        from dskbench.execution.shard import ShardError, parse_gpus, visible_gpus

        try:
            n = parse_gpus(args.gpus, common.visible_gpu_count(device))
            tokens = visible_gpus(n)
        except ShardError as e:
            print(f"dskbench: {e}", file=sys.stderr)
            return EXIT_USAGE
    options = SweepOptions(
        device=device,
        phases=tuple(common.sweeps(args.sweep)),
        profile=warm_profile(device, args.quick),
        tp=args.tp or DEFAULT_TP,
        seed=0,
        measure_ceilings=False,
        case_timeout_s=args.case_timeout,
        first_use_allowance_s=args.first_use_allowance,
        defer_builds_over_s=args.defer_builds_over,
    )
    config = RunConfig(
        options=options,
        kernels=tuple(args.kernel or ()),
        backends=tuple(args.backend or ()),
        ops=tuple(args.op or ()),
        points=tuple(args.point or ()),
        models=tuple(dict.fromkeys(args.model or ())),
    )
    registry, shapes = common.registry_and_shapes()
    if args.tp is None:
        config = swept_tp(config, shapes)
        options = config.options
    items, _skips = plan(config, registry, shapes)
    from dskbench.execution.build_times import WarmError, packaged_build_times, read_build_times

    try:
        build_s = read_build_times(args.build_times) if args.build_times else packaged_build_times()
    except WarmError as e:
        print(f"dskbench: {e}", file=sys.stderr)
        return EXIT_USAGE
    warm(items, options, args.jobs or default_jobs(), tokens, args.out, build_s)
    return EXIT_OK
