"""What a step costs: the winners summed over the layer mix (dense and MoE layers, once-per-step rows, the
NextN layer with speculative decoding), and the server flag values with the lowest per-step total."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from dskbench.pick.deployment import RowSpec
from dskbench.pick.evaluate import Cell
from dskbench.pick.rows import Picker


@dataclass
class Total:
    """Microseconds summed over the measured rows, and the rows that had no measurement."""

    us: float = 0.0
    missing: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """False when some row had no measurement: `us` is then a lower bound, never the total."""
        return not self.missing

    def add(self, us: float, weight: float = 1.0) -> None:
        self.us += us * weight

    def plus(self, other: Total, weight: float = 1.0) -> Total:
        return Total(self.us + other.us * weight, sorted(set(self.missing) | set(other.missing)))


@dataclass
class Estimate:
    batch: int
    kv_len: int
    dense_layer: Total
    moe_layer: Total
    per_step: Total
    step: Total
    contributions: dict[str, float]  # row -> us per step in `step`
    spec_step: Total | None = None
    spec_note: str = ""
    folded: dict[str, str] = field(default_factory=dict)  # row -> why it is 0 in `step` (priced in another)


def multiplicity(row: RowSpec, counts: dict[str, int]) -> int:
    if row.scope != "layer":
        return 1
    if row.layers in counts:
        return counts[row.layers]
    return sum(counts.values())


FUSED_NOTE = "fused into the routed MoE"


def _row_kv(p: Picker, row: RowSpec, kv: int) -> int | None:
    return p.row_kv(row, kv)


def _in_total(row: RowSpec, kind: str, scope: str, skip: frozenset[str]) -> bool:
    return row.scope == scope and (scope != "layer" or row.layers in (None, kind)) and row.name not in skip


def fused_away(p: Picker, rows: list[RowSpec]) -> set[str]:
    """Rows that a row of `rows` prices inside its own cost (`fuses`): 0 in a sum of `rows`."""
    return {n for r in rows for n in p.fused_rows(r)}


def _layer_total(
    p: Picker,
    kind: str,
    batch: int,
    kv: int,
    scope: str = "layer",
    skip: frozenset[str] = frozenset(),
    with_rows: tuple[RowSpec, ...] = (),
) -> Total:
    """Sum of the winners of one layer kind (or of the rows of another scope) at one batch point, leaving
    out the rows named in `skip` and the rows another row of the sum (or of `with_rows`, summed beside it)
    prices with its own (`fuses`)."""
    rows = [r for r in p.rows if _in_total(r, kind, scope, skip)]
    away = fused_away(p, [*rows, *with_rows])
    t = Total()
    for row in rows:
        if row.name in away:
            continue
        cell = p.cell(row, batch, _row_kv(p, row, kv))
        if cell.winner is None:
            t.missing.append(missing_label(row, cell))
        else:
            t.add(cell.winner.median, row.calls)
    return t


def missing_label(row: RowSpec, cell: Cell) -> str:
    """The row, and the ops beyond its own that its SGLang paths lack (e.g. the fused MoE's op)."""
    ops = dict.fromkeys(
        pr.part.op
        for o in cell.missing
        if not o.path.what_if
        for pr in o.parts
        if pr.status in ("missing", "invalid") and pr.part.op not in row.ops
    )
    return f"{row.name} (no {', '.join(ops)} measured)" if ops else row.name


def folded(p: Picker, batch: int, kv: int) -> dict[str, str]:
    """Layer and step rows priced 0 in the step because the row that fuses them is in it -> why."""
    out: dict[str, str] = {}
    for row in p.rows:
        if row.scope not in ("layer", "step"):
            continue
        w = p.cell(row, batch, _row_kv(p, row, kv)).winner
        for name in p.fused_rows(row):
            if w is None:
                out[name] = f"priced with {row.name}"
            elif w.path.fuses:
                out[name] = f"{FUSED_NOTE} ({w.name})"
            else:
                out[name] = f"in {row.name}: {w.name} runs it separately"
    return out


def estimate(p: Picker, batch: int, kv: int) -> Estimate:
    counts = p.dep.layer_counts
    n_dense, n_moe = counts.get("dense", 0), counts.get("moe", 0)
    dense = _layer_total(p, "dense", batch, kv)
    moe = _layer_total(p, "moe", batch, kv)
    per_step = _layer_total(p, "", batch, kv, scope="step")
    step = Total().plus(dense, n_dense).plus(moe, n_moe).plus(per_step)
    contrib: dict[str, float] = {}
    away = folded(p, batch, kv)
    for row in p.rows:
        if row.scope not in ("layer", "step"):
            continue
        w = p.cell(row, batch, _row_kv(p, row, kv)).winner
        if row.name in away:
            contrib[row.name] = 0.0
        elif w is not None:
            contrib[row.name] = multiplicity(row, counts) * row.calls * w.median
    est = Estimate(batch, kv, dense, moe, per_step, step, contrib, folded=away)
    spec = p.dep.speculative
    if p.phase == "decode" and spec.get("target_tokens") and spec.get("draft_forwards"):
        tb = batch * spec["target_tokens"]
        target = Total().plus(_tag(_layer_total(p, "dense", tb, kv), tb), n_dense)
        target = target.plus(_tag(_layer_total(p, "moe", tb, kv), tb), n_moe)
        # the draft layer: the target's layer rows, but for those a NextN row replaces (run in BF16)
        replaced = draft_replaced(p)
        nextn = tuple(r for r in p.rows if r.scope == "nextn")
        draft_layer = _layer_total(p, p.dep.draft_layer, batch, kv, skip=frozenset(replaced), with_rows=nextn)
        draft = draft_layer.plus(_layer_total(p, "", batch, kv, scope="nextn"))
        extra = _layer_total(p, "", batch, kv, scope="spec")
        est.spec_step = target.plus(draft, spec["draft_forwards"]).plus(extra)
        own = f" (in BF16: its own rows in place of {', '.join(replaced)})" if replaced else ""
        est.spec_note = (
            f"target layers at T = {spec['target_tokens']}·B (tokens verified per request), "
            f"{spec['draft_forwards']} NextN draft forwards at T = B{own}, EAGLE kernels once"
        )
    return est


def draft_replaced(p: Picker) -> list[str]:
    """Layer rows the NextN draft layer runs differently: each is replaced by the NextN row naming it
    (SGLang loads the draft model in BF16, so its NVFP4 projections and MoE run BF16 kernels)."""
    return [r.replaces for r in p.rows if r.scope == "nextn" and r.replaces is not None]


def _tag(t: Total, batch: int) -> Total:
    t.missing = [f"{m} @T={batch}" for m in t.missing]
    return t


# -- flags -----------------------------------------------------------------------------------------------


@dataclass
class FlagChoice:
    """One server flag at one batch point: the value with the lowest per-step total over the rows it
    governs (a flag sets every such row at once, so the per-row winners may disagree)."""

    flag: str
    value: str | None
    totals: dict[str, tuple[float, list[str]]]  # value -> (us per step, rows it has no measurement for)
    disagree: list[str]  # rows whose own winner wants another value (or none)


def flag_choices(p: Picker, batch: int, kv: int) -> list[FlagChoice]:
    counts = p.dep.layer_counts
    governed: dict[str, list[RowSpec]] = defaultdict(list)
    fused = {n for n, why in folded(p, batch, kv).items() if why.startswith(FUSED_NOTE)}
    for row in p.rows:
        if row.scope not in ("layer", "step") or row.name in fused:  # a fused row costs nothing to set
            continue
        for flag in sorted({f for c in p.candidates[row.name] if not c.what_if for f in c.flags}):
            governed[flag].append(row)
    out = []
    for flag, rows in sorted(governed.items()):
        values = sorted(
            {c.flags[flag] for r in rows for c in p.candidates[r.name] if flag in c.flags and not c.what_if}
        )
        totals: dict[str, tuple[float, list[str]]] = {}
        cells = {}
        for r in rows:
            cells[r.name] = p.cell(r, batch, _row_kv(p, r, kv))
        for v in values:
            us, lacking = 0.0, []
            for r in rows:
                best = [o for o in cells[r.name].ranked if o.path.flags.get(flag) == v]
                if best:
                    us += multiplicity(r, counts) * r.calls * best[0].median
                else:
                    lacking.append(r.name)
            totals[v] = (us, lacking)
        complete = [v for v in values if not totals[v][1]]
        value = min(complete, key=lambda v: totals[v][0]) if complete else None
        disagree = [
            r.name
            for r in rows
            if cells[r.name].winner is not None and cells[r.name].winner.path.flags.get(flag) != value  # type: ignore[union-attr]
        ]
        out.append(FlagChoice(flag, value, totals, disagree))
    return out
