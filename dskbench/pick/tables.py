"""A Pick as text tables, built once and written out by the Markdown, HTML and summary renderers (so they
always agree): per phase the picks, the step estimate, where the step goes and the server flags; the
excluded, skipped and unmeasured candidates; what the launch command leaves open.

Cells carry inline Markdown (**bold**, `code`, *italic* rows); the HTML page converts it.
"""

from __future__ import annotations

from collections import defaultdict

from dskbench.analysis.compare import format_number
from dskbench.pick.choose import Cell, Estimate, FlagChoice, Launch, Outcome, PhasePick, Total
from dskbench.pick.index import batch_var

RULE = (
    "winner = lowest median among correct (status ok) candidates; a path sums its kernels' medians and "
    "combines their p10-p90 half-widths in quadrature. 'tie' unless the runner-up is slower beyond "
    "run-to-run noise, dskbench compare's rule: its p10 is above the winner's by more than the noise floor "
    "of the winner's latency band (dskbench/analysis/noise_prior.json) and, when both kept >= 8 raw samples, a "
    "two-sided Mann-Whitney U test gives p < 0.001."
)
SCOPE_NAMES = {
    "step": "once per step",
    "nextn": "NextN layer (speculative decoding)",
    "spec": "EAGLE, per step",
}


def us(x: float) -> str:
    return format_number(x)


def short(s: str, n: int = 140) -> str:
    """One line of at most n characters."""
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def cell_text(c: Cell) -> str:
    w, r = c.winner, c.runner_up
    if w is None:
        if not c.excluded and not c.skipped:
            return "no valid measurement" if _invalid(c) else "no measurement"
        n = [(len(c.excluded), "wrong/error"), (len(c.skipped), "skipped"), (len(c.missing), "unmeasured")]
        return "✗ none correct: " + ", ".join(f"{k} {what}" for k, what in n if k)
    s = f"**{w.name}**{separate_mark(w)} {us(w.median)}"
    if r is not None:
        sign = "≈" if c.tie else "›"
        s += f" {sign} {r.name}{separate_mark(r)} +{c.margin:.1%}" + (" tie" if c.tie else "")
    return s


def _invalid(c: Cell) -> bool:
    """Some candidate was measured, but its timing was impossible (unstable)."""
    return any(o.status == "invalid" for o in c.missing)


def separate_mark(o: Outcome) -> str:
    """A candidate priced with rows its siblings fuse (it runs them on their own)."""
    return f" (+{len(o.separate)} rows)" if o.separate else ""


def total_text(t: Total, names: int = 3) -> str:
    """A sum, or, when rows lack a measurement, the partial sum marked incomplete with what it lacks
    (the first `names` of them; the step table's note lists them all)."""
    if t.complete:
        return us(t.us)
    n = len(t.missing)
    shown = ", ".join(t.missing[:names]) + (", …" if n > names else "")
    what = f"incomplete: lacks {n} op{'s' if n != 1 else ''}: {shown}"
    return f"≥ {us(t.us)} ({what})" if t.us else f"– ({what})"


def tables(pp: PhasePick, layer_counts: dict[str, int]) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(title, head, rows, note) of every table of one phase."""
    v = batch_var(pp.phase)
    cols = [f"{v}={b}" for b in pp.batches]
    out = []
    pick_rows = []
    last_scope = "layer"
    for rp in pp.rows:
        if rp.row.scope != last_scope:
            pick_rows.append([f"*{SCOPE_NAMES.get(rp.row.scope, rp.row.scope)}*"] + [""] * len(cols))
            last_scope = rp.row.scope
        kind = (
            {"dense": " [dense]", "moe": " [MoE]"}.get(rp.row.layers or "", "")
            if rp.row.scope == "layer"
            else ""
        )
        pick_rows.append([rp.label + kind] + [cell_text(rp.cells[b]) for b in pp.batches])
    out.append(
        (
            "Fastest correct backend per op (median µs)",
            ["op"] + cols,
            pick_rows,
            "› runner-up and how much slower; ≈ … tie: inside run-to-run noise. [dense]/[MoE]: rows of "
            "those layers only. (+N rows): a path that leaves the N rows its siblings fuse (the shared "
            "expert) to run on their own, priced with their winners added; rows a picked path fuses count 0 "
            "in the step.",
        )
    )
    n_dense, n_moe = layer_counts.get("dense", 0), layer_counts.get("moe", 0)
    ests = pp.estimates
    kv = ests[0].kv_len if ests else None
    est_rows = [
        [f"dense layer (×{n_dense})"] + [total_text(e.dense_layer) for e in ests],
        [f"MoE layer (×{n_moe})"] + [total_text(e.moe_layer) for e in ests],
    ]
    if any(e.per_step.us or e.per_step.missing for e in ests):
        est_rows.append(["once per step"] + [total_text(e.per_step) for e in ests])
    est_rows.append(
        [f"**step** ({n_dense} dense + {n_moe} MoE layers + per step)"]
        + [f"**{total_text(e.step)}**" for e in ests]
    )
    if any(e.spec_step is not None for e in ests):
        est_rows.append(
            ["step with NextN speculative decoding"]
            + [total_text(e.spec_step) if e.spec_step else "–" for e in ests]
        )
    lacking = lacking_note(ests, pp.phase)
    note = f"µs; attention read at kv_len={kv}. " + (
        "Sums of the winners above. A sum that lacks an op's measurement is a lower bound, marked "
        "≥ … (incomplete: lacks …), never a total. "
    )
    if ests and ests[0].spec_note:
        note += "Speculative: " + ests[0].spec_note + ". "
    out.append((f"Step estimate ({pp.phase})", [""] + cols, est_rows, note + lacking))
    share_rows = []
    for rp in pp.rows:
        if rp.row.scope not in ("layer", "step") or (rp.kv_len is not None and rp.kv_len != kv):
            continue
        cells = []
        for e in ests:
            x = e.contributions.get(rp.row.name)
            why = e.folded.get(rp.row.name)
            if why is not None:
                cells.append(f"0 ({why})")
            else:
                cells.append(f"{us(x)} ({x / e.step.us:.1%})" if x is not None and e.step.us else "–")
        share_rows.append([rp.row.name] + cells)
    share_note = (
        "Where the step is incomplete, the shares are of its measured rows only."
        if any(not e.step.complete for e in ests)
        else ""
    )
    out.append(
        (
            "Where the step goes (µs per step, share of the measured step)",
            ["op"] + cols,
            share_rows,
            share_note,
        )
    )
    flag_rows = []
    flags = sorted({f.flag for b in pp.batches for f in pp.flags.get(b, [])})
    for flag in flags:
        cells = []
        for b in pp.batches:
            fc = next((f for f in pp.flags.get(b, []) if f.flag == flag), None)
            cells.append(flag_cell(fc))
        flag_rows.append([f"`{flag}`"] + cells)
    if flag_rows:
        out.append(
            (
                "SGLang server flags",
                ["flag"] + cols,
                flag_rows,
                "The value with the lowest per-step total over every row the flag sets (one flag sets them "
                "all); rows whose own winner wants another value are named.",
            )
        )
    return out


def flag_cell(fc: FlagChoice | None) -> str:
    if fc is None:
        return "–"
    if fc.value is None:
        return "no value measured for every row"
    s = fc.value
    if fc.disagree:
        s += " (not the winner of " + ", ".join(fc.disagree) + ")"
    return s


def lacking_note(ests: list[Estimate], phase: str) -> str:
    by_row: dict[str, list[int]] = defaultdict(list)
    for e in ests:
        for m in e.step.missing:
            by_row[m].append(e.batch)
    if not by_row:
        return ""
    v = batch_var(phase)
    parts = [f"{r} ({v}={','.join(map(str, bs))})" if len(bs) < len(ests) else r for r, bs in by_row.items()]
    return f"Lacking ({len(by_row)} ops): " + "; ".join(parts) + "."


def details(pp: PhasePick) -> list[tuple[str, list[str]]]:
    """Per row: wrong/error (excluded), skipped and unmeasured candidates with the batch points and the
    first reason, and the fastest what-if where it beats the pick."""
    v = batch_var(pp.phase)

    def at(bs: list[int]) -> str:
        return "at every point" if len(bs) == len(pp.batches) else f"at {v}={','.join(map(str, bs))}"

    out = []
    for rp in pp.rows:
        empty = [
            b
            for b in pp.batches
            if not (c := rp.cells[b]).ranked
            and not c.what_if
            and not c.excluded
            and not c.skipped
            and not _invalid(c)  # those say why: the invalid candidates' reasons
        ]
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        first: dict[tuple[str, str], str] = {}
        faster = []
        for b in pp.batches:
            c = rp.cells[b]
            for o in (*c.excluded, *c.skipped, *([] if b in empty else c.missing)):
                groups[(o.name, o.status)].append(b)
                first.setdefault((o.name, o.status), o.reason)
            w = c.winner
            best = c.what_if[0] if c.what_if else None
            if best is not None and (w is None or best.median < w.median):
                than = f" (pick {us(w.median)})" if w else ""
                faster.append(f"{v}={b}: {best.name}{separate_mark(best)} {us(best.median)}{than}")
        lines = [f"no measurement {at(empty)}"] if empty else []
        for (name, status), bs in groups.items():
            word = {"missing": "no measurement", "invalid": "no valid measurement"}.get(status, status)
            reason = first[(name, status)]
            if status == "missing" and not any(len(c.parts) > 1 for c in rp.candidates if c.name == name):
                reason = ""  # one kernel: its name says it all
            lines.append(f"{name}: {word} {at(bs)}" + (f" — {short(reason, 200)}" if reason else ""))
        if faster:
            lines.append("what-if faster than the pick: " + "; ".join(faster))
        if lines:
            out.append((rp.label, lines))
    return out


def launch_notes(launch: Launch) -> list[str]:
    """What the one command leaves open: flags whose choice depends on the load, flags left unset; and
    where its speculative decoding flags come from."""
    out = []
    if launch.speculative:
        out.append(
            "Speculative decoding (NextN draft layer, EAGLE): "
            + ", ".join(launch.speculative)
            + " take the deployment file's values, the ones the step with NextN speculative decoding assumes."
        )
    if launch.varies:
        out.append(
            "The choice depends on the batch (the command takes the most frequent one; "
            "`dskbench pick --batch N` picks for one load): " + "; ".join(launch.varies) + "."
        )
    if launch.unset:
        out.append(
            "Not set (no value has a measurement for every row it sets; SGLang's default applies): "
            + ", ".join(launch.unset)
            + "."
        )
    return out


def disagreements(pp: PhasePick) -> list[str]:
    """The picked records (every part of each row's winner at each batch) whose two timers disagree: their
    numbers stand, but a second timer read them outside the normal band (dskbench.measure.cross_check)."""
    seen: dict[tuple, str] = {}
    for rp in pp.rows:
        for cell in rp.cells.values():
            win = cell.winner
            for part in win.parts if win is not None else ():
                m = part.chosen
                if m is not None and m.stat.disagree:
                    v = "T" if "T" in (m.record.get("point") or {}) else batch_var(pp.phase)
                    seen.setdefault(
                        (m.kernel, m.backend, m.op, m.variant, m.batch, m.kv_len),
                        f"{m.kernel} · {m.backend} · {m.op}{':' + m.variant if m.variant else ''} at "
                        f"{v}={m.batch}: {m.stat.disagree}",
                    )
    return list(seen.values())
