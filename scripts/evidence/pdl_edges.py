"""Which cases launch a kernel with programmatic dependent launch, and where the two cold timers part.

    python3 scripts/evidence/pdl_edges.py probe RESULTS.jsonl[.gz] > pdl.jsonl      (GPU)
    python3 scripts/evidence/pdl_edges.py split pdl.jsonl PER-CASE... -- BATCHED...   (any machine)

probe: every ok record of RESULTS (its kernel, case, backend and seed) is prepared as a sweep prepares
it, captured in a CUDA graph behind the cold flush as the batched timer captures it, and the graph's
edges read from the CUDA driver (cuGraphGetEdges_v2). An edge of programmatic type lets the kernel after
it start before the kernel before it has finished (programmatic dependent launch). One JSON line per
case: its key, node count, and programmatic edges out of the flush and among the case's own nodes.

split: `dskbench compare PER-CASE -- BATCHED` (the same rule and noise floors), its verdicts and the
batched-minus-per-case medians counted separately for the cases whose kernel follows the flush over a
programmatic edge and for the others.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dskbench.measure.pdl_gap import PROGRAMMATIC, flush_launch_edges, programmatic_from_roots  # noqa: E402


def case_edges(launch, flush) -> dict[str, int]:
    """Nodes and programmatic edges of one [flush, launch] graph (the flush: the node nothing precedes)."""
    edges = flush_launch_edges(launch, flush)
    nodes = {a for a, _, _ in edges} | {b for _, b, _ in edges}
    roots = nodes - {b for _, b, _ in edges}
    prog = [(a, b) for a, b, t in edges if t == PROGRAMMATIC]
    return {
        "nodes": len(nodes) or 2,
        "edges": len(edges),
        "programmatic_from_flush": programmatic_from_roots(edges),
        "programmatic_within": sum(1 for a, _ in prog if a not in roots),
    }


def probe(results: Path) -> int:
    import torch

    from dskbench.device.info import DeviceInfo
    from dskbench.execution.fidelity import prepare_named
    from dskbench.measure import batch
    from dskbench.registry.load import load_registry
    from dskbench.results.io import read_runs
    from dskbench.shapes.cases import default_shapes

    device = DeviceInfo.detect("cuda")
    if device.kind != "cuda":
        print("pdl_edges.py probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    shapes, registry = default_shapes(), load_registry()
    buf = batch.flush_buffer(0, 2 * torch.cuda.get_device_properties(0).L2_cache_size)
    seen: set[tuple[str, str]] = set()
    counts: Counter = Counter()
    for run in read_runs([results]):
        for r in run.results:
            backend = (r.get("backend") or {}).get("name")
            key = (str(r.get("case_id")), str(backend))
            if r.get("status") != "ok" or key in seen:
                continue
            seen.add(key)
            op = f"{r['op']}:{r['variant']}" if r.get("variant") else r["op"]
            row = {"kernel": r["kernel"], "case_id": key[0], "backend": key[1]}
            try:
                spec = (r["kernel"], op, r["phase"], r["point"], key[1])
                why, prep = prepare_named(shapes, registry, spec, device, seed=int(r.get("seed") or 7))
                if prep is None:
                    raise LookupError(why)
                row.update(case_edges(prep.launch, buf.zero_))
                counts["pdl" if row["programmatic_from_flush"] else "plain"] += 1
            except Exception as e:  # noqa: BLE001 - one case must not end the probe
                row["error"] = f"{type(e).__name__}: {e}"[:200]
                counts["error"] += 1
            finally:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            print(json.dumps(row), flush=True)
    print(f"pdl_edges.py: {dict(counts)}", file=sys.stderr)
    return 0


def split(pdl: Path, old: list[str], new: list[str]) -> int:
    from dskbench.analysis.compare import compare
    from dskbench.analysis.compare_inputs import load_side
    from dskbench.analysis.verdict import DEFAULT_THRESHOLD, default_prior

    flags = {}
    for n, line in enumerate(pdl.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
            if "error" not in row:
                flags[(row["kernel"], row["case_id"], row["backend"])] = row["programmatic_from_flush"] > 0
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{pdl}:{n}: not a line of `pdl_edges.py probe` output") from None
    result = compare(load_side(old), load_side(new), DEFAULT_THRESHOLD, default_prior(), None)
    labels = {True: "after the flush over a programmatic edge", False: "after the flush over a plain edge"}
    groups: dict[str, list] = {label: [] for label in labels.values()}
    unknown = 0
    for c in result.measured:
        if c.verdict == "skipped":
            continue
        flag = flags.get((c.key.kernel, c.key.case, c.key.backend))
        if flag is None:
            unknown += 1
            continue
        groups[labels[flag]].append(c)
    print(f"cases compared: {sum(len(v) for v in groups.values())} with a probed graph, {unknown} without")
    for label, rows in groups.items():
        n = Counter(c.verdict for c in rows)
        called = n["slower"] + n["faster"]
        diffs = [
            c.new.value - c.old.value
            for c in rows
            if c.old and c.new and c.old.value is not None and c.new.value is not None
        ]
        share = 100.0 * (len(rows) - called) / len(rows) if rows else 0.0
        med = statistics.median(diffs) if diffs else float("nan")
        print(
            f"{label}: {len(rows)} cases, {called} slower/faster ({n['slower']} slower, {n['faster']} faster), "
            f"{share:.1f}% without; median batched - per-case {med:+.3f} us"
        )
        kernels = Counter(c.key.kernel for c in rows if c.verdict in ("slower", "faster"))
        if kernels:
            print("  verdicts by kernel: " + ", ".join(f"{k} {v}" for k, v in kernels.most_common()))
    return 0


def main(argv: list[str]) -> int:
    from dskbench.results.io import ResultsError

    try:
        if len(argv) == 2 and argv[0] == "probe":
            return probe(Path(argv[1]))
        if len(argv) >= 5 and argv[0] == "split" and "--" in argv[2:]:
            i = argv.index("--")
            return split(Path(argv[1]), argv[2:i], argv[i + 1 :])
    except (OSError, ValueError, ResultsError) as e:  # a missing or malformed file: one line, no trace
        print(f"pdl_edges.py: {e}", file=sys.stderr)
        return 2
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
