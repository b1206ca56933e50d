"""`dskbench pick`: the fastest correct backend of each DeepSeek op at each batch size, and what a step costs.

For every row of shapes/deployment.yaml (an op, or ops whose kernels are chosen together) and batch point,
each candidate (one kernel's backend, or a path of several kernels whose medians are summed) is evaluated
from the results: correct only with status ok; wrong/error candidates are excluded with their reason;
candidates without a record are "no measurement". The winner and runner-up are a tie unless the runner-up
is slower beyond run-to-run noise, by dskbench.analysis.verdict's rule (the one dskbench compare uses: its p10 is
beyond the noise floor of the winner's latency band and, with raw samples on both sides, a Mann-Whitney U
test separates them). The step estimate sums the winners over the layer
mix (dense and MoE layers, plus the NextN layer with speculative decoding), listing the rows it lacks.

The model is in layers, each importing only those before it: deployment (the deployment file), index
(the results), evaluate (candidates at one point), rows (a phase's rows), estimate (step and flags), and
this module (the whole pick and its launch command). Rendering is tables, markdown, json_out and page.
"""

from __future__ import annotations

import shlex
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dskbench.analysis.compare_inputs import device_name
from dskbench.pick.deployment import Deployment, load_deployment
from dskbench.pick.estimate import Estimate, FlagChoice, Total, estimate, flag_choices
from dskbench.pick.evaluate import Cell, Outcome, PartResult, combine, eval_part, eval_path, judge_cell
from dskbench.pick.index import PHASES, REFERENCE, Measured, ResultIndex, batch_var, measured_tps
from dskbench.pick.rows import Picker, RowPick
from dskbench.results.io import Run, read_runs
from dskbench.shapes.cases import ModelShapes, default_shapes

__all__ = [  # the pick's model, importable from here as one API (`dskbench insitu`, the tests)
    "PHASES",
    "REFERENCE",
    "Cell",
    "Estimate",
    "FlagChoice",
    "Launch",
    "Measured",
    "Outcome",
    "PartResult",
    "PhasePick",
    "Pick",
    "PickError",
    "Picker",
    "ResultIndex",
    "RowPick",
    "Total",
    "check_tp",
    "combine",
    "eval_part",
    "eval_path",
    "judge_cell",
    "launch_command",
    "load_runs",
    "measured_tps",
    "pick",
    "speculative_picked",
]


class PickError(ValueError):
    """Inputs pick cannot work from (no results, several GPUs mixed)."""


# -- one phase, and the whole pick ------------------------------------------------------------------------


@dataclass
class PhasePick:
    phase: str
    batches: list[int]
    rows: list[RowPick]
    estimates: list[Estimate]
    flags: dict[int, list[FlagChoice]]
    unassigned: list[str]
    picker: Picker = field(repr=False)


@dataclass
class Launch:
    """One SGLang launch command: the deployment's command, `--tp N`, and one value per server flag."""

    argv: list[str]
    varies: list[str] = field(default_factory=list)  # flags whose choice differs across batches/phases
    unset: list[str] = field(default_factory=list)  # flags with no value measured for every row they set
    speculative: list[str] = field(default_factory=list)  # speculative decoding flags, when it was picked

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def speculative_picked(phases: Sequence[PhasePick]) -> bool:
    """True when the decode pick holds a winner for a NextN layer or EAGLE row (scope nextn / spec): the
    step estimate then includes speculative decoding, so the launch command turns it on."""
    return any(
        rp.row.scope in ("nextn", "spec") and any(c.winner is not None for c in rp.cells.values())
        for pp in phases
        if pp.phase == "decode"
        for rp in pp.rows
    )


def launch_command(
    phases: Sequence[PhasePick], tp: int, prefix: Sequence[str], speculative: Mapping[str, str] | None = None
) -> Launch:
    """One value per flag from the per-batch flag choices. A flag takes its value from the first phase
    (decode before prefill: decode is the steady state of serving) that chose one, and there the value
    chosen at the most batch points (a tie: the one chosen at the largest batch). Flags whose choice
    differs are listed, so the reader can pick again with `--batch` at their own load. `speculative`
    (the deployment's speculative decoding flags) is appended when the NextN/EAGLE rows were picked."""
    seen: dict[str, list[tuple[str, int, str | None]]] = defaultdict(list)
    for pp in phases:
        for b in pp.batches:
            for fc in pp.flags.get(b, []):
                seen[fc.flag].append((pp.phase, b, fc.value))
    argv = [*prefix, "--tp", str(tp)]
    launch = Launch(argv)
    for flag in sorted(seen):
        chosen = [(ph, b, v) for ph, b, v in seen[flag] if v is not None]
        if not chosen:
            launch.unset.append(flag)
            continue
        phase = chosen[0][0]
        votes: dict[str, tuple[int, int]] = {}
        for ph, b, v in chosen:
            if ph == phase:
                n, top = votes.get(v, (0, 0))  # type: ignore[arg-type]
                votes[v] = (n + 1, max(top, b))  # type: ignore[index]
        value = max(votes, key=lambda v: votes[v])
        argv += [flag, value]
        if len({v for _, _, v in chosen}) > 1:
            by: dict[tuple[str, str], list[int]] = defaultdict(list)
            for ph, b, v in chosen:
                by[(ph, v)].append(b)  # type: ignore[index]
            where = "; ".join(
                f"{ph} {batch_var(ph)}={','.join(map(str, bs))}: {v}" for (ph, v), bs in by.items()
            )
            launch.varies.append(f"{flag} {value} ({where})")
    if speculative and speculative_picked(phases):
        for flag, value in speculative.items():
            argv += [flag, value]
            launch.speculative.append(flag)
    return launch


@dataclass
class Pick:
    device: str
    tp: int
    kv_len: int
    inputs: list[str]
    runs: list[str]
    phases: list[PhasePick]
    threshold: float = 0.0
    launch: Launch | None = None

    def measured(self) -> bool:
        """Whether any candidate of any row has a record at the picked points (ok, wrong or error): a
        pick of none (CPU reference timings, other kernels, other batch sizes) has nothing to say."""
        return any(
            c.ranked or c.what_if or c.excluded
            for pp in self.phases
            for rp in pp.rows
            for c in rp.cells.values()
        )


def load_runs(paths: Sequence[str | Path], device: str | None = None) -> tuple[list[Run], str]:
    """The runs of one device (several GPUs are never mixed in one pick)."""
    runs = [r for r in read_runs(paths) if r.results]
    if device:
        runs = [r for r in runs if device_name(r.environment) == device]
    devices = sorted({device_name(r.environment) for r in runs})
    if not devices:
        raise PickError("no results" + (f" for device {device!r}" if device else "") + " in the inputs")
    if len(devices) > 1:
        raise PickError(f"results of several devices ({', '.join(devices)}): pick one with device=")
    return runs, devices[0]


def check_tp(runs: Sequence[Run], tp: int, phases: Sequence[str] = PHASES) -> None:
    """Refuse a tp the results never measured: every tp-dependent row would read "no measurement"."""
    held = measured_tps(runs, phases)
    if held and tp not in held:
        raise PickError(
            f"--tp {tp}: no measurement at tp {tp} in the results (they hold tp "
            f"{', '.join(map(str, sorted(held)))}); measure it with `dskbench run --tp {tp}`"
        )


def pick(
    runs: Sequence[Run],
    device: str,
    phases: Sequence[str] = PHASES,
    batches: Sequence[int] | None = None,
    tp: int = 1,
    kv_len: int | None = None,
    dep: Deployment | None = None,
    shapes: ModelShapes | None = None,
    threshold: float = 0.0,
    inputs: Sequence[str] = (),
) -> Pick:
    shapes = shapes or default_shapes()
    dep = dep or load_deployment(shapes)
    kv = kv_len or dep.kv_len
    out = []
    for phase in phases:
        picker = Picker(ResultIndex(runs, phase, tp), dep, phase, tp, threshold)
        bs = sorted(set(batches)) if batches else picker.batches()
        rows = picker.row_picks(bs)
        ests = [estimate(picker, b, kv) for b in bs]
        flags = {b: flag_choices(picker, b, kv) for b in bs}
        out.append(PhasePick(phase, bs, rows, ests, flags, picker.unassigned(), picker))
    launch = launch_command(out, tp, dep.launch, dep.speculative_flags)
    return Pick(device, tp, kv, list(inputs), [r.run_id for r in runs], out, threshold, launch)
