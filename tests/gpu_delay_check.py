"""Real-GPU check of dskbench compare: two runs, the second with known extra delays, must differ exactly
where the delays went.

    python tests/gpu_delay_check.py --out DIR                 # on a GPU box with the stack
    python tests/gpu_delay_check.py --out DIR --device cpu    # the plumbing, on the CPU (torch-ref)

1. Runs a quick sweep of a few small and large kernels (default: rmsnorm/sgl_kernel, a norm of 2-90 us,
   and dsv3_fused_a_gemm/torch.linear, a BF16 cuBLAS GEMM of 12-320 us) with a fixed seed: DIR/base.jsonl.
2. Calibrates the extra delay on the GPU: the cost of one ``torch.cuda._sleep(c)`` launch in a cold
   CUDA graph, measured by dskbench's own timer at two cycle counts (a + b*c).
3. Chooses every other measured case (by latency) for a delay of +5% or +10% of its baseline median
   (cases under 5 us: +30%); where the smallest possible extra launch costs more than that, the case
   gets that smallest delay and the report says so. The others stay unchanged (the controls).
4. Runs the same sweep again with tests/delay_adapters.py wrapping those cases' launches: DIR/delayed.jsonl.
5. Runs ``dskbench compare`` (default threshold, and --threshold 0) and writes, per case, the intended
   and calibrated delay, the measured change and the verdict, and whether each delay was caught and
   no control was flagged: DIR/summary.txt, DIR/verdicts.json, DIR/compare*.txt.

Exit status 0 when every case delayed by >= 10% is caught at the default threshold and no control is
flagged; 1 otherwise; 2 when a run fails. Meant to finish in a few minutes on one H100 once the JIT
caches are warm (the default backends need no JIT).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dskbench.analysis.compare import compare  # noqa: E402
from dskbench.analysis.compare_inputs import Key, load_side  # noqa: E402

DEFAULTS = {
    "cuda": {"kernels": ["rmsnorm", "dsv3_fused_a_gemm"], "backends": ["sgl_kernel", "torch.linear"]},
    "cpu": {"kernels": ["rmsnorm"], "backends": ["torch-ref"]},
}
EFFECTS = (0.05, 0.10)  # cases of at least SMALL_US
SMALL_US = 5.0
SMALL_EFFECT = 0.30  # cases under SMALL_US: their floors are wider (see results/verdicts-*)


def run_sweep(out: Path, args: argparse.Namespace, delays: Path | None, log: Path) -> None:
    """One `dskbench run` of the selection into `out` (delays: the tests/delay_adapters.py spec)."""
    cmd = [sys.executable, "-m", "dskbench", "run", "--out", str(out), "--seed", str(args.seed)]
    cmd += ["--device", args.device, "--quick"]
    for k in args.kernel:
        cmd += ["--kernel", k]
    for b in args.backend:
        cmd += ["--backend", b]
    for s in args.sweep:
        cmd += ["--sweep", s]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    if delays is not None:
        extra = [m for m in env.get("DSKBENCH_EXTRA_ADAPTERS", "").split(",") if m]
        env["DSKBENCH_EXTRA_ADAPTERS"] = ",".join([*extra, "tests.delay_adapters"])
        env["DSKBENCH_TEST_DELAYS"] = str(delays)
    t0 = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=args.run_timeout
        )
    print(f"{out.name}: exit {proc.returncode} in {time.monotonic() - t0:.0f} s ({log.name})", flush=True)
    if proc.returncode not in (0, 1) or not out.exists():  # 1: some case failed; still comparable
        raise SystemExit(f"gpu_delay_check: `{' '.join(cmd)}` failed (exit {proc.returncode}); see {log}")


def calibrate(device: str) -> dict[str, float]:
    """Cost (us) of one extra sleep launch in a cold CUDA graph: a + b * cycles. CPU: a spin, exact."""
    if device == "cpu":
        return {"a_us": 0.0, "b_us_per_cycle": 0.0, "method": "host spin of the given microseconds"}
    import torch

    from dskbench.measure import MeasureSettings, measure
    from dskbench.measure.cuda import sleep_rate

    torch.cuda.init()
    rate = sleep_rate(torch.cuda.current_device())  # cycles per us, from one long sleep
    c1 = int(rate * 20)  # about 20 us of sleep

    def cost(cycles: int) -> float:
        m = measure(
            [lambda: torch.cuda._sleep(cycles)], device="cuda", mode="cold", settings=MeasureSettings()
        )
        return float(m.median_us)

    a, at_c1 = cost(1), cost(c1)
    return {
        "a_us": a,
        "b_us_per_cycle": (at_c1 - a) / (c1 - 1),
        "cycles_per_us": rate,
        "method": "dskbench.measure, cold cuda-graph, raw (no launch gap subtracted): _sleep(1) and "
        f"_sleep({c1})",
    }


def plan_delays(base: Path, cal: dict[str, float], device: str) -> tuple[list[dict[str, Any]], list[Key]]:
    """Every other measured case by latency gets a delay (alternating +5% / +10%; +30% under 5 us)."""
    side = load_side([base])
    twins = side.twins()
    stats = side.stats()
    measured = sorted(
        (k for k, s in stats.items() if k not in twins and s.status == "ok" and s.value),
        key=lambda k: (stats[k].value, k.case, k.backend),
    )
    delays, controls = [], []
    big = 0
    for i, key in enumerate(measured):
        if i % 2:
            controls.append(key)
            continue
        t = float(stats[key].value)  # type: ignore[arg-type]
        if t < SMALL_US:
            effect = SMALL_EFFECT
        else:
            effect = EFFECTS[big % len(EFFECTS)]
            big += 1
        want = effect * t
        a, b = cal["a_us"], cal["b_us_per_cycle"]
        if device == "cpu":
            cycles, got = 0, want
        elif want <= a or b <= 0:
            cycles, got = 1, a
        else:
            cycles = max(1, round((want - a) / b))
            got = a + b * cycles
        delays.append(
            {
                "kernel": key.kernel,
                "backend": key.backend,
                "case_id": key.case,
                "base_us": t,
                "target": effect,
                "cycles": cycles,
                "us": got,
                "expected": got / t,
                "reachable": got <= want * 1.05,
            }
        )
    return delays, controls


def verdicts(base: Path, delayed: Path, delays: list[dict], controls: list[Key], threshold: float) -> dict:
    c = compare(load_side([base]), load_side([delayed]), threshold)
    by_key = {ch.key: ch for ch in c.changes}
    rows, flagged = [], []
    for d in delays:
        ch = by_key.get(Key(_machine(base), d["kernel"], d["case_id"], d["backend"]))
        rows.append(
            {
                **d,
                "verdict": ch.verdict if ch else "missing",
                "change": ch.change if ch else None,
                "effect": ch.judged.effect() if ch else "",
                "floor": ch.judged.floor.describe() if ch and ch.judged.floor else "",
                "caught": bool(ch and ch.verdict == "slower"),
            }
        )
    for key in controls:
        ch = by_key.get(key)
        if ch and ch.verdict in ("slower", "faster", "broke", "fixed"):
            flagged.append(
                {"case_id": key.case, "backend": key.backend, "verdict": ch.verdict, "change": ch.change}
            )
    return {"threshold": threshold, "delayed": rows, "controls": len(controls), "controls_flagged": flagged}


def _machine(path: Path) -> str:
    side = load_side([path])
    return side.machines()[0]


def summarize(doc: dict[str, Any]) -> list[str]:
    lines = []
    for res in doc["results"]:
        lines.append(f"-- dskbench compare, threshold {res['threshold']:.0%}")
        for r in res["delayed"]:
            note = "" if r["reachable"] else " (smallest extra launch: target not reachable)"
            change = "" if r["change"] is None else f"{r['change']:+.1%}"
            lines.append(
                f"  {'CAUGHT' if r['caught'] else 'missed'}  target +{r['target']:.0%}, injected "
                f"+{r['expected']:.1%}{note}; measured {change} {r['effect']} -> {r['verdict']}  "
                f"{r['case_id']} · {r['backend']} ({r['base_us']:.2f} us)"
            )
        for target in sorted({r["target"] for r in res["delayed"]}):
            rs = [r for r in res["delayed"] if r["target"] == target]
            lines.append(f"  target +{target:.0%}: {sum(r['caught'] for r in rs)}/{len(rs)} caught")
        lines.append(
            f"  unchanged cases flagged: {len(res['controls_flagged'])} of {res['controls']}"
            + "".join(
                f"\n    {f['verdict']} {f['change']:+.1%} {f['case_id']} · {f['backend']}"
                for f in res["controls_flagged"]
            )
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="output folder (created)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--kernel", action="append", help="kernels to run (default: see the module docstring)")
    p.add_argument("--backend", action="append", help="backends to run")
    p.add_argument("--sweep", action="append", default=[], help="sweeps (default: decode and prefill)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--run-timeout", type=float, default=240.0, help="seconds per dskbench run")
    args = p.parse_args(argv)
    args.kernel = args.kernel or DEFAULTS[args.device]["kernels"]
    args.backend = args.backend or DEFAULTS[args.device]["backends"]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    base, delayed = out / "base.jsonl", out / "delayed.jsonl"
    for f in (base, delayed):
        f.unlink(missing_ok=True)  # ours: a rerun starts both files afresh
    run_sweep(base, args, None, out / "base.log")
    cal = calibrate(args.device)
    delays, controls = plan_delays(base, cal, args.device)
    spec, bound_log = out / "delays.json", out / "bound.jsonl"
    bound_log.unlink(missing_ok=True)
    spec.write_text(
        json.dumps({"calibration": cal, "delays": delays, "bound_log": str(bound_log)}, indent=1) + "\n"
    )
    run_sweep(delayed, args, spec, out / "delayed.log")
    bound = sorted(
        {json.loads(x)["case_id"] for x in bound_log.read_text().splitlines()}
        if bound_log.exists()
        else set()
    )
    doc: dict[str, Any] = {
        "device": args.device,
        "kernels": args.kernel,
        "backends": args.backend,
        "calibration": cal,
        "delays_bound": bound,  # cases whose launcher the measuring process wrapped
    }
    doc["results"] = [verdicts(base, delayed, delays, controls, t) for t in (0.05, 0.0)]
    for t, name in ((0.05, "compare.txt"), (0.0, "compare-threshold0.txt")):
        cmd = [sys.executable, "-m", "dskbench", "compare", str(base), str(delayed), "--threshold", str(t)]
        cmd += ["--no-fail", "-v"]
        with (out / name).open("w") as fh:
            subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, check=False)
    default = doc["results"][0]
    must = [r for r in default["delayed"] if r["expected"] >= 0.10]
    missing = sorted({d["case_id"] for d in delays} - set(bound))
    ok = all(r["caught"] for r in must) and not default["controls_flagged"] and not missing
    doc["passed"] = ok
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    (out / "verdicts.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        f"gpu_delay_check on {_machine(base)} ({args.device}): {len(delays)} delayed, {len(controls)} unchanged "
        f"measurements; calibration: extra launch {cal['a_us']:.2f} us + {cal['b_us_per_cycle']:.3g} us/cycle",
        f"delays bound in the measuring process: {len(bound)} of {len(delays)} cases"
        + (f" (missing: {', '.join(missing)})" if missing else ""),
        *summarize(doc),
        f"{'PASSED' if ok else 'FAILED'}: every delay of >= 10% caught at the default threshold and no unchanged "
        f"case flagged ({doc['wall_s']} s)",
    ]
    if args.device == "cpu":
        lines.append(
            "note: CPU wall-clock timings of torch references: this checks the plumbing, not the verdicts"
        )
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
