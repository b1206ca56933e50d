"""The run configuration: which cases a run measures and how, built once by every front end.

`dskbench run`/`warm`, the asv suite and the pytest-benchmark suite each turn their own inputs (flags,
environment variables, pytest options) into one `RunConfig` and plan it with `plan_run`; nothing
downstream knows which front end asked.

    selection   kernels, backends, models, ops, points (and through the options: phases, profile, tp)
    options     SweepOptions: what the workers and the results file's `settings` record see
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dskbench.execution.items import DEFAULT_TP, SweepOptions, WorkItem

Planned = tuple[list[WorkItem], list[dict[str, Any]]]
# Plans again under other options; `by_model=False` leaves out the models filter (what it removed).
Replan = Callable[..., Planned]


@dataclass(frozen=True)
class RunConfig:
    """One run's request. Empty selections mean "all": every kernel, the runner's default backends
    (all but torch-ref on a GPU; torch-ref on a CPU), every op and point of the swept phases."""

    options: SweepOptions = field(default_factory=SweepOptions)
    kernels: tuple[str, ...] = ()  # registry names or aliases
    backends: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()  # OP[:VARIANT], as in case ids (shapes-file aliases too)
    points: tuple[dict[str, int], ...] = ()  # each K=V must match; any point may
    models: tuple[str, ...] = ()  # only ops one of these runs (dskbench.shapes.models names)
    # Plan every backend of each kernel even where it cannot run (pytest on a CPU lists the GPU
    # backends as skipped tests with their reason, so nothing disappears silently).
    all_backends: bool = False

    @property
    def device(self) -> str:
        return self.options.device

    @property
    def phases(self) -> tuple[str, ...]:
        return self.options.phases

    @property
    def profile(self) -> str:
        return self.options.profile

    @property
    def tp(self) -> tuple[int, ...]:
        return self.options.tp

    def with_options(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, options=dataclasses.replace(self.options, **changes))

    def with_swept_tp(self, swept: Sequence[int]) -> RunConfig:
        """The default tp (DEFAULT_TP: 1, 4, 8) cut to the degrees the profile sweeps (`swept`, the shapes
        file's: a quick run measures tp 1 and 8, a CPU run tp 1); a tp asked for is kept. Every front end
        (`dskbench run`/`warm`, asv, pytest-benchmark) plans through this, so their defaults agree."""
        if self.tp != DEFAULT_TP:
            return self
        return self.with_options(tp=tuple(t for t in self.tp if t in swept) or tuple(swept[:1]))

    def to_json(self) -> dict[str, Any]:
        return {
            "options": dataclasses.asdict(self.options),
            "kernels": list(self.kernels),
            "backends": list(self.backends),
            "ops": list(self.ops),
            "points": [dict(p) for p in self.points],
            "models": list(self.models),
            "all_backends": self.all_backends,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunConfig:
        return cls(
            options=SweepOptions.from_json(d["options"]),
            kernels=tuple(d["kernels"]),
            backends=tuple(d["backends"]),
            ops=tuple(d["ops"]),
            points=tuple(dict(p) for p in d["points"]),
            models=tuple(d.get("models") or ()),
            all_backends=bool(d["all_backends"]),
        )


def plan_run(
    config: RunConfig,
    registry: dict[str, Any],
    shapes: Any,
    check: Callable[[list[WorkItem], list[dict[str, Any]], Replan], None] | None = None,
) -> Planned:
    """The work items and planning skips `config` selects, numbered from 0.

    `check` sees the plan the models filter left, before --op/--point filter it, with a function that
    plans again under other options (the command line says why a plan is empty). Raises PlanError
    (unknown kernel or backend) or SelectionError (an unknown model, an op or point that selects nothing)."""
    from dskbench.execution.runner import select_kernels

    models = check_models(config.models)
    kernels = select_kernels(registry, list(config.kernels) or None)

    def replan(opts: SweepOptions, by_model: bool = True) -> Planned:
        planned = _plan_kernels(config, registry, shapes, kernels, opts)
        return keep_models(models, registry, shapes, *planned) if by_model else planned

    items, skips = replan(config.options)
    if check is not None:
        check(items, skips, replan)
    return select_cases(config, registry, shapes, items, skips)


def _plan_kernels(
    config: RunConfig, registry: dict[str, Any], shapes: Any, kernels: list[str], opts: SweepOptions
) -> Planned:
    from dskbench.adapters import get_adapter
    from dskbench.execution.runner import plan_sweep

    if not (config.all_backends and not config.backends):
        return plan_sweep(registry, shapes, kernels, list(config.backends) or None, opts)
    items: list[WorkItem] = []
    skips: list[dict[str, Any]] = []
    for name in kernels:
        adapter = get_adapter(name)
        wanted = [b.name for b in adapter.all_backends()] if adapter else None
        more, more_skips = plan_sweep(registry, shapes, [name], wanted, opts)
        items += more
        skips += more_skips
    return items, skips


def check_models(names: tuple[str, ...]) -> tuple[str, ...]:
    """The config's model names as the shapes file's keys; an unknown one is a SelectionError."""
    from dskbench.execution.selection import SelectionError
    from dskbench.shapes.models import ModelError, parse_model

    try:
        return tuple(dict.fromkeys(parse_model(m) for m in names))
    except ModelError as e:
        raise SelectionError(str(e)) from None


def keep_models(
    models: tuple[str, ...], registry: dict[str, Any], shapes: Any, items: list[WorkItem], skips: list
) -> Planned:
    """The planned cases of ops one of `models` runs (the shapes file's `models` of each case's op); a
    kernel skipped at planning by its registry ops, else the ops its adapter picks."""
    from dskbench.adapters import get_adapter
    from dskbench.execution.selection import filter_models
    from dskbench.shapes.models import op_models

    def models_of(op: str) -> tuple[str, ...]:
        spec = shapes.ops.get(op)
        return op_models(spec.models if spec else ())

    def kernel_ops(kernel: str) -> tuple[str, ...]:
        ops = tuple(getattr(registry.get(kernel), "op_names", ()))
        adapter = None if ops else get_adapter(kernel)
        return ops or (tuple(adapter.ops) if adapter else ())

    return filter_models(items, skips, models, models_of, kernel_ops)


def select_cases(
    config: RunConfig, registry: dict[str, Any], shapes: Any, items: list[WorkItem], skips: list
) -> Planned:
    """The planned cases the config's ops and points select (dskbench.execution.selection's rules)."""
    from dskbench.execution.selection import Selection, filter_plan

    sel = Selection.from_args(config.ops, config.points, shapes)
    return filter_plan(items, skips, sel, config.tp, lambda k: getattr(registry.get(k), "op_names", ()))
