"""Several GPUs of one host: a sweep's items sharded over them, one worker process per GPU.

Each GPU is a slot of the execution engine's pool (dskbench/execution/): its workers are started with
CUDA_VISIBLE_DEVICES naming that GPU alone and watched as on one GPU (a hung, crashed or poisoned case
loses only itself). Records go through the engine's one thread-safe writer as they finish, each with the
``gpu_index`` it ran on; the environment record lists every GPU (identity, the CUDA_VISIBLE_DEVICES
token its worker saw, its own measured ceilings).

How items are cut, and why:

* The unit is a kernel: all cases and backends of one kernel run on one GPU, so every curve of the
  report (a kernel's latency over the sweep) and every head-to-head of two backends at one point is
  measured on one GPU, and a kernel's JIT build and autotuning happen in one process. A kernel that
  alone costs more than a GPU's fair share (or a sweep of fewer kernels than GPUs) is cut into cases
  instead, each case keeping all its backends together.
* Units are placed longest first on the least-loaded GPU (LPT): deterministic (ties broken by name and
  GPU index, whatever the plan's order), and no GPU ends more than one unit's cost above another.
* Cost is a rough wall-time model: a fixed per-case overhead plus the sampling budget, plus the case's
  minimum traffic in bytes at a setup rate (inputs, fp32 reference and check scale with it), plus a
  per-unit start-up cost. Cases the GPU will skip (an sm100 kernel on an H200) cost almost nothing.
  Only relative sizes matter for balance.

GPUs of different models are refused: results carry one device name per run (report, compare and
pick group by it), so a run must not hold two kinds of GPU. Two GPUs of one model are one machine for
those tools, as two hosts of one model already are; each case is measured wholly on one GPU, and the
index says which.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dskbench.device.info import DeviceInfo
from dskbench.device.visible import visible_devices
from dskbench.execution.case import measure_settings, timed_ceilings
from dskbench.execution.cost import (
    UNIT_OVERHEAD_S,
    item_cost,
)
from dskbench.execution.items import SweepOptions, WorkItem, sweep_seed
from dskbench.execution.pool import Slot
from dskbench.execution.shared_gpu import start_check
from dskbench.execution.sweep import SweepSummary, case_limits, execute, worker_plan
from dskbench.execution.twins import measure_once
from dskbench.results.environment import (  # noqa: F401 (re-exported)
    NO_MULTICAST_ENV,
    command_line,
    multicast_env,
    worker_env,
)

PROBE_PREFIX = "PROBE "
PROBE_TIMEOUT_S = 600.0  # identity + ceilings + launch-gap calibration of one GPU


class ShardError(ValueError):
    """A --gpus request this host cannot serve."""


# -- which GPUs ------------------------------------------------------------------------------------------


def parse_gpus(spec: str, available: int) -> int:
    """`--gpus all` or `--gpus N` as a GPU count, checked against the GPUs visible here."""
    if available < 1:
        raise ShardError("--gpus: no CUDA GPU is visible to torch")
    if spec.strip().lower() == "all":
        return available
    try:
        n = int(spec)
    except ValueError:
        raise ShardError(f"--gpus: expected 'all' or a number, got {spec!r}") from None
    if not 1 <= n <= available:
        raise ShardError(f"--gpus {n}: this host shows {available} GPU(s)")
    return n


def visible_gpus(n: int, environ: Mapping[str, str] | None = None) -> list[str]:
    """The CUDA_VISIBLE_DEVICES value of each of the first n GPUs this process sees: the parent's own
    list when it has one (indices, UUIDs or MIG ids pass through), else 0..n-1."""
    environ = os.environ if environ is None else environ
    tokens = visible_devices(environ)
    if not tokens:
        return [str(i) for i in range(n)]
    if len(tokens) < n:
        raw = environ.get("CUDA_VISIBLE_DEVICES")
        raise ShardError(f"--gpus {n}: CUDA_VISIBLE_DEVICES={raw!r} names {len(tokens)}")
    return tokens[:n]


# -- cost and assignment ---------------------------------------------------------------------------------


def measured_costs(paths: Sequence[Path]) -> dict[tuple[str, str], float]:
    """(case_id, backend) -> the seconds its item took in earlier results (`stages.item_s`), for a
    balanced cut of the next sweep: the model above is blind to e.g. a slow reference check."""
    from dskbench.results.io import read_runs

    out: dict[tuple[str, str], float] = {}
    for run in read_runs(list(paths)):
        for r in run.results:
            t = (r.get("stages") or {}).get("item_s")
            if isinstance(t, (int, float)) and not r.get("shared_with"):
                out[(r["case_id"], (r.get("backend") or {}).get("name", "-"))] = float(t)
    return out


def blended_cost(
    items: Sequence[WorkItem], model: Callable[[WorkItem], float], known: Mapping[tuple[str, str], float]
) -> Callable[[WorkItem], float]:
    """Measured seconds where an earlier run has the item, else the model's estimate scaled to them
    (the model is right about ratios, not about seconds: the scale is measured / model over the items
    both know)."""
    both = [(known[(it.case_id, it.backend)], model(it)) for it in items if (it.case_id, it.backend) in known]
    model_sum = sum(m for _, m in both)
    scale = sum(k for k, _ in both) / model_sum if both and model_sum > 0 else 1.0

    def cost(it: WorkItem) -> float:
        t = known.get((it.case_id, it.backend))
        return t if t is not None else model(it) * scale

    return cost


def sweep_cost(
    items: Sequence[WorkItem], opts: SweepOptions, device: DeviceInfo
) -> Callable[[WorkItem], float]:
    """The cost a sharded sweep cuts by: the model, or measured times from opts.costs_from."""
    budget = measure_settings(opts).max_time_s

    def model(it: WorkItem) -> float:
        return item_cost(it, device, budget)

    if not opts.costs_from:
        return model
    return blended_cost(items, model, measured_costs([Path(p) for p in opts.costs_from]))


@dataclass(frozen=True)
class Unit:
    """Items that must share a GPU: a kernel, or one case of it (all its backends)."""

    key: str
    items: tuple[WorkItem, ...]
    cost: float


def make_units(items: Sequence[WorkItem], cost: Callable[[WorkItem], float], n: int) -> list[Unit]:
    """One unit per kernel; a kernel above a GPU's fair share (total / n) becomes one unit per case."""
    items = sorted(items, key=lambda it: it.index)  # sums in one order: the same plan, the same floats
    costs = {it.index: round(float(cost(it)), 6) for it in items}
    by_kernel: dict[str, list[WorkItem]] = {}
    for it in items:
        by_kernel.setdefault(it.kernel, []).append(it)
    kernel_cost = {k: UNIT_OVERHEAD_S + sum(costs[i.index] for i in its) for k, its in by_kernel.items()}
    share = sum(kernel_cost.values()) / max(n, 1)
    units: list[Unit] = []
    for k, its in by_kernel.items():
        if kernel_cost[k] <= share or n == 1:
            units.append(Unit(k, tuple(its), kernel_cost[k]))
            continue
        by_case: dict[str, list[WorkItem]] = {}
        for it in its:
            by_case.setdefault(it.case_id, []).append(it)
        for cid, cits in by_case.items():
            units.append(Unit(f"{k}|{cid}", tuple(cits), UNIT_OVERHEAD_S + sum(costs[i.index] for i in cits)))
    return units


def assign(units: Sequence[Unit], n: int) -> list[list[Unit]]:
    """Longest unit first onto the least-loaded GPU (ties: lower index); the order of `units` does not
    matter, so the same plan always lands the same way."""
    loads = [0.0] * n
    out: list[list[Unit]] = [[] for _ in range(n)]
    for u in sorted(units, key=lambda u: (-u.cost, u.key)):
        g = min(range(n), key=lambda i: (loads[i], i))
        out[g].append(u)
        loads[g] += u.cost
    return out


def shard_items(
    items: Sequence[WorkItem], n: int, cost: Callable[[WorkItem], float]
) -> tuple[list[list[WorkItem]], list[float]]:
    """Items of each GPU, in plan order, and each GPU's estimated seconds."""
    shards = assign(make_units(items, cost, n), n)
    per_gpu = [sorted((it for u in us for it in u.items), key=lambda it: it.index) for us in shards]
    return per_gpu, [round(sum(u.cost for u in us), 3) for us in shards]


def print_shards(items: Sequence[WorkItem], opts: SweepOptions) -> list[list[WorkItem]]:
    """The cut a sharded sweep would make (for --dry-run): each GPU's kernels, cases and estimate."""
    host = DeviceInfo.detect("cuda")
    if opts.dedupe:
        items = measure_once(items)[0]
    shards, loads = shard_items(items, opts.gpus, sweep_cost(items, opts, host))
    for g, (s, load) in enumerate(zip(shards, loads, strict=True)):
        kernels = sorted({it.kernel for it in s})
        print(f"GPU {g}: {len(s)} cases, ~{load:.0f} s estimated: {', '.join(kernels)}")
    return shards


# -- probing each GPU ------------------------------------------------------------------------------------


def probe(kind: str, want_ceilings: bool) -> dict[str, Any]:
    """What one GPU's process sees: its identity, and its ceilings (measured there, for its metrics)."""
    from dskbench.results.environment import device_block

    device = DeviceInfo.detect(kind)
    if kind == "cuda" and device.kind != "cuda":
        raise ShardError(
            f"no CUDA GPU visible with CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}"
        )
    ceilings = timed_ceilings() if device.kind == "cuda" and want_ceilings else None
    return {
        "device": device_block(device),
        "ceilings": ceilings,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def probe_gpus(tokens: Sequence[str], kind: str, want_ceilings: bool) -> list[dict[str, Any]]:
    """Probe every GPU at once, each in a process that sees it alone (the parent touches none)."""

    def one(token: str) -> dict[str, Any]:
        cmd = [sys.executable, "-m", "dskbench.execution.shard", "probe", kind, "1" if want_ceilings else "0"]
        try:
            done = subprocess.run(
                cmd, env=worker_env(token), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise ShardError(f"probing GPU {token} took over {PROBE_TIMEOUT_S:.0f} s (stuck?)") from None
        for line in reversed(done.stdout.splitlines()):
            if line.startswith(PROBE_PREFIX):
                return json.loads(line[len(PROBE_PREFIX) :])
        tail = (done.stderr or done.stdout)[-1500:].strip()
        raise ShardError(f"probing GPU {token} failed (exit code {done.returncode}): {tail}")

    with ThreadPoolExecutor(max_workers=max(1, len(tokens))) as pool:
        return list(pool.map(one, tokens))


def check_same_model(probes: Sequence[dict[str, Any]], tokens: Sequence[str]) -> None:
    """Refuse GPUs of different models (name, architecture, memory): one run holds one device name."""
    ident = [tuple(p["device"].get(k) for k in ("name", "sm", "memory_gib")) for p in probes]
    if len(set(ident)) > 1:
        seen = ", ".join(f"{t}: {i[0]} sm{i[1]} {i[2]} GiB" for t, i in zip(tokens, ident, strict=True))
        raise ShardError(f"the GPUs differ ({seen}); pick GPUs of one model with CUDA_VISIBLE_DEVICES")


# -- the sharded sweep -----------------------------------------------------------------------------------


def run_sharded(
    items: list[WorkItem],
    skips: list[dict[str, Any]],
    opts: SweepOptions,
    out: Path,
    progress: Any = None,
) -> SweepSummary:
    """run_sweep over opts.gpus GPUs: one writer, one worker per GPU at a time, records as they finish."""
    from dskbench.results.environment import environment, new_run_id, run_peaks

    n = opts.gpus
    host = DeviceInfo.detect("cuda")
    parse_gpus(str(n), host.count)
    tokens = visible_gpus(n)
    sharing = start_check(n, opts.device) if items else None  # before the probes measure ceilings
    probes = probe_gpus(tokens, opts.device, opts.measure_ceilings and opts.device == "cuda" and bool(items))
    check_same_model(probes, tokens)
    gate = host if opts.device == "cuda" else DeviceInfo("cpu")
    to_run, copies = measure_once(items) if opts.dedupe else (items, {})
    from dskbench.execution.build_ahead import building, start_builder

    builder = start_builder(to_run, opts, tokens, gate)
    settled = builder.deferred_records() if builder is not None else []
    if builder is not None:
        to_run = builder.items
    shards, loads = shard_items(to_run, n, sweep_cost(to_run, opts, gate))
    run_id = new_run_id()
    run_seed = sweep_seed(opts)
    env = environment(DeviceInfo("cpu"), opts.no_multicast)  # the parent opens no CUDA context
    env["device"] = {**probes[0]["device"], "count": n}
    env.update(run_peaks(DeviceInfo(opts.device, env["device"].get("name") or "")))
    if sharing:
        env["shared_gpu"] = sharing
    env["gpus"] = [
        {
            "index": g,
            **p["device"],
            "cuda_visible_devices": p["cuda_visible_devices"],
            "ceilings": p["ceilings"],
        }
        for g, p in enumerate(probes)
    ]
    worker_opts = dataclasses.replace(opts, gpus=1, host_gpus=host.count)
    limits = case_limits(opts, gate)
    env["run_id"] = run_id
    env["ceilings"] = probes[0]["ceilings"]
    env["settings"] = {
        **dataclasses.asdict(opts),
        "run_seed": run_seed,
        "items": len(items),
        "copied_items": sum(len(c) for c in copies.values()),
        "shards": [len(s) for s in shards],
        "shard_estimate_s": loads,
        "case_timeout": limits.describe(),
    }
    env["command"] = command_line()
    extra = builder.plan_extra() if builder else {}
    slots = [
        Slot(
            f"GPU {g}",
            {**worker_plan(worker_opts, run_seed, probes[g]["ceilings"]), **extra},
            env={
                **worker_env(tokens[g], no_multicast=opts.no_multicast),
                **(builder.env_for(tokens[g]) if builder else {}),
            },
            units=[shards[g]] if shards[g] else [],
        )
        for g in range(n)
    ]
    with building(builder):
        return execute(
            out, env, skips, slots, limits, copies, progress, tag=lambda g: {"gpu_index": g}, settled=settled
        )


def main(argv: list[str]) -> int:
    """`python -m dskbench.execution.shard probe KIND WANT_CEILINGS`: one GPU's identity as a PROBE line."""
    if len(argv) != 3 or argv[0] != "probe":
        print("usage: python -m dskbench.execution.shard probe cuda|cpu 0|1", file=sys.stderr)
        return 2
    print(PROBE_PREFIX + json.dumps(probe(argv[1], argv[2] == "1"), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
