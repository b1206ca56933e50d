"""Planning a `run` or `warm`: the run configuration checked against the shapes file, planned, and a
plan with nothing in it explained (which option selected nothing)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from dskbench.frontends.cli.common import SWEEPS, UsageError

if TYPE_CHECKING:
    from dskbench.execution.config import Replan, RunConfig


def plan(config: RunConfig, registry: dict[str, Any], shapes: Any) -> tuple[list[Any], list[dict[str, Any]]]:
    """The work items and the planned skips of `config`; bad options raise UsageError saying which."""
    from dskbench.execution.config import plan_run
    from dskbench.execution.items import DEFAULT_TP, PlanError
    from dskbench.execution.selection import SelectionError

    if config.tp == DEFAULT_TP:  # the default, not a request: the degrees of it the profile sweeps
        config = swept_tp(config, shapes)
    check_tp(config.tp, shapes, config.profile)
    degrees = shapes.values("tp", config.profile)

    def check(items: list[Any], skips: list[Any], replan: Replan) -> None:
        check_plan(items, skips, config.options, replan, degrees, config.models)

    try:
        return plan_run(config, registry, shapes, check)
    except (PlanError, SelectionError) as e:
        raise UsageError(str(e)) from None


def swept_tp(config: RunConfig, shapes: Any) -> RunConfig:
    """The default --tp (execution.items.DEFAULT_TP) cut to the degrees the run's profile sweeps: a quick
    run measures tp 1 and 8, a CPU run tp 1 (an explicit --tp is checked by check_tp instead)."""
    return config.with_swept_tp(shapes.values("tp", config.profile))


def check_tp(tp: tuple[int, ...], shapes: Any, profile: str) -> None:
    """--tp must name degrees the profile sweeps: another one would silently drop every tp-dependent case."""
    swept = shapes.values("tp", profile)
    missing = [t for t in tp if t not in swept]
    if missing:
        where = "sweeps.tp" if profile == "full" else f"{profile}.tp"
        raise UsageError(
            f"--tp {','.join(map(str, missing))}: the {profile} profile sweeps tp "
            f"{', '.join(map(str, swept))} only ({shapes.source} {where})"
        )


def check_plan(
    items: list[Any],
    skips: list[Any],
    opts: Any,
    replan: Replan,
    swept_tp: list[int],
    models: tuple[str, ...] = (),
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
    elif models and any(replan(dataclasses.replace(all_tp, phases=SWEEPS), by_model=False)):
        from dskbench.shapes.schema import MODELS

        names = " or ".join(MODELS[m] for m in models)
        asked_models = " ".join(f"--model {m}" for m in models)
        why = (
            f"none of their ops is one {names} runs ({asked_models}; "
            f"`dskbench list --model {models[0]}` lists its kernels)"
        )
    else:
        why = "no selected backend serves them on this device (`dskbench list` shows the backends)"
    raise UsageError(f"nothing to run: the selected kernels have no case in {asked}: {why}")
