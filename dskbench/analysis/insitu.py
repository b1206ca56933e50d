"""In-situ check of the step estimate: one decoder layer's decode kernels back to back in one CUDA graph.

The estimate of `dskbench pick` adds up kernels timed one at a time. Here, for each batch size, the
kernels pick chose for one MoE (or dense) decoder layer are prepared with the adapters
(dskbench.execution.runner.prepare_case: inputs built, output checked against the reference), then timed with the
measurement core (dskbench.measure.measure, same settings for all):
  1. each kernel alone, and
  2. the whole sequence in execution order as one launcher, so the core captures it in one CUDA graph;
and the gap  layer / sum(isolated) - 1  is written as JSON (negative: the layer runs faster than its parts,
e.g. launch gaps hidden, data left in L2). Each kernel keeps its own inputs (no data flows between them),
so this measures back-to-back execution, not fusion. GPU only.

    dskbench insitu RESULTS.jsonl... [--batch 1,16,64,256] [--layer moe] [--mode cold]
        [--tp 1] [--kv-len 4096] [--out results/insitu-layer.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def layer_kernels(
    picker: Any, batch: int, kv_len: int, layer: str
) -> tuple[list[tuple[str, Any]], list[str]]:
    """(row name, Measured record of the chosen kernel) in execution order, and the rows with no pick. Rows
    a picked path fuses (the shared expert in the routed MoE) run inside it, not on their own."""
    steps, missing = [], []
    rows = [r for r in picker.rows if r.scope == "layer" and r.layers in (None, layer)]
    winners = {r.name: picker.cell(r, batch, picker.row_kv(r, kv_len)).winner for r in rows}
    fused = {n for w in winners.values() if w is not None for n in w.path.fuses}
    for row in rows:
        if row.name in fused:
            continue
        w = winners[row.name]
        if w is None:
            missing.append(row.name)
            continue
        for _ in range(row.calls):
            steps += [(row.name, part.chosen) for part in w.parts]
    return steps, missing


def summary(m: Any) -> dict[str, Any]:
    return {"median_us": m.median_us, "p10_us": m.p10_us, "p90_us": m.p90_us, "method": m.method}


def one_point(
    picker: Any, batch: int, args: argparse.Namespace, device: Any, settings: Any
) -> dict[str, Any]:
    import torch

    from dskbench.execution.runner import prepare_case
    from dskbench.measure import measure
    from dskbench.shapes.cases import Case

    steps, missing = layer_kernels(picker, batch, args.kv_len, args.layer)
    # (case_id, backend) -> Prepared: a kernel called twice in the layer is built once
    prepared: dict[tuple[str, str], Any] = {}
    failed: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    for i, (row, m) in enumerate(steps):
        key = (m.record["case_id"], m.backend)
        if key not in prepared:
            try:
                fields, prep = prepare_case(
                    m.kernel, Case.from_json(m.record), m.backend, device, args.seed + i
                )
            except Exception as e:  # noqa: BLE001 - one kernel that fails to build is reported, not fatal
                fields, prep = {"status": "error", "reason": f"{type(e).__name__}: {e}"[:500]}, None
            if prep is None:
                failed.append({"row": row, "kernel": m.kernel, "backend": m.backend, **_why(fields)})
                continue
            prepared[key] = prep
        kernels.append({"row": row, "kernel": m.kernel, "backend": m.backend, "case_id": key[0],
                        "pick_us": m.stat.value, "key": key})  # fmt: skip
    point: dict[str, Any] = {"batch": batch, "kv_len": args.kv_len, "missing_rows": missing, "failed": failed}
    if not kernels:
        return point
    isolated = {}
    for key, p in prepared.items():
        try:
            isolated[key] = measure(
                [p.launch], device="cuda", mode=args.mode, capturable=p.backend.capturable, settings=settings
            )
        except Exception as e:  # noqa: BLE001 - left out of the layer too, so both sides hold the same kernels
            failed.append(
                {
                    "case_id": key[0],
                    "backend": key[1],
                    "status": "error",
                    "reason": f"{type(e).__name__}: {e}"[:500],
                }
            )
    kernels = [k for k in kernels if k["key"] in isolated]
    if not kernels:
        return point
    launches = [prepared[k["key"]].launch for k in kernels]

    def layer() -> None:
        for launch in launches:
            launch()

    capturable = all(prepared[k["key"]].backend.capturable for k in kernels)
    try:
        whole = measure([layer], device="cuda", mode=args.mode, capturable=capturable, settings=settings)
    except Exception as e:  # noqa: BLE001 - the JSON says why instead of losing the other batch sizes
        point["layer_error"] = f"{type(e).__name__}: {e}"[:500]
        return point
    for k in kernels:
        k["isolated"] = summary(isolated[k["key"]])
        del k["key"]
    total = sum(k["isolated"]["median_us"] for k in kernels)
    point.update(
        kernels=kernels,
        sum_isolated_us=total,
        sum_pick_us=sum(k["pick_us"] for k in kernels),
        layer=summary(whole),
        gap=whole.median_us / total - 1.0 if total else None,
    )
    prepared.clear()
    torch.cuda.empty_cache()
    return point


def _why(fields: dict[str, Any]) -> dict[str, Any]:
    return {"status": fields.get("status"), "reason": fields.get("reason")}


def run(args: argparse.Namespace, runs: Any, dev: str) -> int:
    """Time one layer of the picks of `runs` (one device's, `dev`) at each of args.batch on this GPU and
    write args.out. args: batch (sizes), layer, mode, tp, kv_len (None: the deployment's), seed, out."""
    from dskbench.device.info import DeviceInfo
    from dskbench.measure import MeasureSettings
    from dskbench.pick.choose import pick

    device = DeviceInfo.detect("cuda")
    if dev != device.name:
        print(f"dskbench insitu: results are from {dev}, this GPU is {device.name}", file=sys.stderr)
    batches = list(args.batch)
    result = pick(runs, dev, phases=["decode"], batches=batches, tp=args.tp, kv_len=args.kv_len)
    picker = result.phases[0].picker
    args.kv_len = result.kv_len
    settings = MeasureSettings()  # no launch-gap correction on either side: layer and parts alike
    from dskbench.results.environment import environment

    out: dict[str, Any] = {
        "environment": environment(device),  # date, GPU, clocks' context, versions, commit
        "device": device.name,
        "layer": args.layer,
        "mode": args.mode,
        "tp": args.tp,
        "inputs": [str(p) for p in args.results],
        "note": "sum_isolated_us: the chosen kernels timed alone now (same settings); sum_pick_us: their "
        "medians in the results; gap = layer / sum_isolated - 1",
        "points": [],
    }
    for b in batches:
        point = one_point(picker, b, args, device, settings)
        out["points"].append(point)
        gap = point.get("gap")
        print(
            f"B={b}: layer {point.get('layer', {}).get('median_us', float('nan')):.1f} us, "
            f"sum isolated {point.get('sum_isolated_us', float('nan')):.1f} us, "
            f"gap {gap:+.1%}"
            if gap is not None
            else f"B={b}: nothing to run ({point['missing_rows']})"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0
