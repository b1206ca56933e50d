"""Picking cases on the command line (`--model`, `--op`, `--point`), and the command that picks one case
again.

Every result record carries `repro`: a `dskbench run` command line that selects exactly its case
(kernel, backend, sweep, op and variant, sweep point, tp) and measures it as the run did (device,
profile, L2 mode, flush, NVLink multicast, input seed, time budget, the hang limits it was given). The
filters here are what make one case reachable from the command line; `repro_command` writes that
command for a record.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class SelectionError(ValueError):
    """An --op or --point that selects nothing, or that names something unknown (one line, why)."""


def parse_point(s: str) -> dict[str, int]:
    """`B=64,tp=1` -> {"B": 64, "tp": 1}; ValueError with what was expected otherwise."""
    point: dict[str, int] = {}
    for part in s.split(","):
        key, eq, value = part.strip().partition("=")
        key, value = key.strip(), value.strip()
        if not (eq and _NAME.match(key) and re.fullmatch(r"\d+", value)) or key in point:
            raise ValueError(f"expected K=V[,K=V] with whole-number values, e.g. B=64,tp=1, got {s!r}")
        point[key] = int(value)
    return point


def point_text(point: Mapping[str, Any]) -> str:
    """A sweep point as the case id and --point write it: `B=1,kv_len=1024,tp=1`."""
    return ",".join(f"{k}={v}" for k, v in point.items())


def op_text(op: str, variant: str | None) -> str:
    """An op as the case id and --op write it: `experts:gate_up.fp8`, or the op alone."""
    return f"{op}:{variant}" if variant else op


@dataclass(frozen=True)
class Selection:
    """--op (op or op:variant, any of them) and --point (any of them; each key must match)."""

    ops: tuple[tuple[str, str | None], ...] = ()
    points: tuple[dict[str, int], ...] = ()

    @classmethod
    def from_args(
        cls, ops: Sequence[str] | None, points: Sequence[dict[str, int]] | None, shapes: Any
    ) -> Selection:
        """--op names resolved through the shapes file (aliases too); an unknown one is an error."""
        chosen = []
        for text in ops or ():
            name, _, variant = text.partition(":")
            op = shapes.resolve_op(name)
            if op is None:
                close = difflib.get_close_matches(name, list(shapes.ops), n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else f" (none in {shapes.source})"
                raise SelectionError(f"--op {text}: unknown op {name!r}{hint}")
            chosen.append((op, variant or None))
        return cls(tuple(chosen), tuple(points or ()))

    def __bool__(self) -> bool:
        return bool(self.ops or self.points)

    def op_ok(self, case: Mapping[str, Any]) -> bool:
        return not self.ops or any(
            case["op"] == op and (v is None or case.get("variant") == v) for op, v in self.ops
        )

    def point_ok(self, case: Mapping[str, Any]) -> bool:
        pt = case["point"]
        return not self.points or any(all(pt.get(k) == v for k, v in p.items()) for p in self.points)


def filter_plan(
    items: list[Any],
    skips: list[dict[str, Any]],
    sel: Selection,
    tp: Sequence[int],
    kernel_ops: Callable[[str], Sequence[str]],
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The planned work items (and planning skips) that --op and --point select, renumbered.

    A kernel skipped at planning has no case: it stays when one of its ops (`kernel_ops`) is selected,
    or when no --op is given. Raises SelectionError saying what the plan has when nothing matches."""
    if not sel:
        return items, skips
    for p in sel.points:
        if "tp" in p and p["tp"] not in tp:
            raise SelectionError(
                f"--point {point_text(p)}: the cases at tp {p['tp']} are planned only with --tp {p['tp']}"
            )
    by_op = [i for i in items if sel.op_ok(i.case)]
    if items and not by_op:
        have = sorted({op_text(i.case["op"], i.case.get("variant")) for i in items})
        asked = " ".join(f"--op {op_text(o, v)}" for o, v in sel.ops)
        raise SelectionError(f"nothing to run: no planned case matches {asked}; planned: {_few(have)}")
    kept = [i for i in by_op if sel.point_ok(i.case)]
    if by_op and not kept:
        values: dict[str, set[int]] = {}
        for i in by_op:
            for k, v in i.case["point"].items():
                values.setdefault(k, set()).add(v)
        have = "; ".join(f"{k} in {','.join(map(str, sorted(vs)))}" for k, vs in values.items())
        asked = " ".join(f"--point {point_text(p)}" for p in sel.points)
        raise SelectionError(f"nothing to run: no planned case matches {asked}; planned points: {have}")
    if sel.ops:
        wanted = {op for op, _ in sel.ops}
        skips = [s for s in skips if wanted & set(kernel_ops(s["kernel"]))]
    return [dataclasses.replace(it, index=n) for n, it in enumerate(kept)], skips


def filter_models(
    items: list[Any],
    skips: list[dict[str, Any]],
    models: Sequence[str],
    op_models: Callable[[str], Sequence[str]],
    kernel_ops: Callable[[str], Sequence[str]],
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The planned work items of ops one of `models` runs (`op_models(op)`: the models that run it),
    renumbered; a kernel skipped at planning stays when one of its ops (`kernel_ops`) is such an op.
    No models: the plan as it is. A repro command needs no --model: its --op pins the op."""
    if not models:
        return items, skips
    wanted = set(models)

    def runs(op: str) -> bool:
        return bool(wanted & set(op_models(op)))

    kept = [i for i in items if runs(i.case["op"])]
    skips = [s for s in skips if any(runs(op) for op in kernel_ops(s["kernel"]))]
    return [dataclasses.replace(it, index=n) for n, it in enumerate(kept)], skips


def _few(names: list[str], n: int = 12) -> str:
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def repro_command(rec: Mapping[str, Any], settings: Mapping[str, Any] | None) -> str | None:
    """The `dskbench run` command line that selects exactly this record's case and measures it with the
    run's settings (an environment record's `settings`, or a sweep's options as a dict). The seed is
    the run's seed, fixed or drawn: the case gets the very same inputs again. None without settings."""
    if not settings or not settings.get("device"):
        return None
    args = ["dskbench", "run", "--device", str(settings["device"]), "--kernel", str(rec["kernel"])]
    backend = (rec.get("backend") or {}).get("name")
    if backend and backend != "-":
        args += ["--backend", backend]
    if rec.get("op") is None or rec.get("point") is None:  # a kernel skipped at planning: no case of its own
        return shlex.join(args)
    point = rec["point"]
    args += ["--sweep", rec["phase"], "--op", op_text(rec["op"], rec.get("variant"))]
    args += ["--point", point_text(point)]
    if "tp" in point:
        args += ["--tp", str(point["tp"])]
    if settings.get("profile") == "quick":
        args.append("--quick")
    mode = settings.get("mode") or "cold"
    if mode != "cold":
        args += ["--mode", mode]
    elif (settings.get("flush") or "write") != "write":
        args += ["--flush", settings["flush"]]
    if settings.get("no_multicast"):
        args.append("--no-multicast")
    if settings.get("batch") is False:
        args.append("--no-batch")
    if settings.get("cross_check") is False:
        args.append("--no-cross-check")
    seed = settings.get("run_seed", settings.get("seed"))
    if seed is not None:
        args += ["--seed", str(seed)]
    if settings.get("budget_s") is not None:
        args += ["--budget", f"{settings['budget_s']:g}"]
    if settings.get("min_time_s") is not None:
        args += ["--min-time", f"{settings['min_time_s']:g}"]
    if (settings.get("stopping") or "median-ci") != "median-ci":
        args += ["--stopping", settings["stopping"]]
    for key, flag in (
        ("case_timeout_s", "--case-timeout"),
        ("first_use_allowance_s", "--first-use-allowance"),
    ):
        if settings.get(key) is not None:  # limits the run was given: a time-out reproduces under them
            args += [flag, f"{settings[key]:g}"]
    return shlex.join(args)
